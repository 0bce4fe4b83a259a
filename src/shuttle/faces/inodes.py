"""Inode numbers for the FUSE mount: which key (or directory) each number names.

Objects have no inode numbers of their own, so the mount hands them out: the root is
``ROOT_INODE`` (1), and every other path gets the next free number the first time
the kernel looks it up. A number stays bound to its path while the kernel holds a
reference to it (its *lookup count*, raised by lookup, create, mkdir and readdir,
lowered by forget); when the count reaches zero the number is dropped, and the next
lookup of that path gets a new one. Numbers are never reused within one mount, so a
program comparing ``st_ino`` never mistakes one file for another.

Rename moves a path (and for a directory, every path below it) to its new name and
keeps its number; unlink and rmdir detach a number from its path so that a new
object of the same name gets a fresh one, while open handles on the old number keep
working until they are released.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The root directory's inode, as FUSE fixes it.
ROOT_INODE = 1


@dataclass(slots=True)
class Entry:
    """What one inode number names."""

    path: str
    is_dir: bool
    lookups: int = 0
    #: False once unlinked or replaced: the number no longer names any path.
    attached: bool = True


class InodeTable:
    """Paths (keys; ``""`` is the root) to inode numbers and back."""

    def __init__(self) -> None:
        self._entries: dict[int, Entry] = {ROOT_INODE: Entry("", True, lookups=1)}
        self._by_path: dict[str, int] = {"": ROOT_INODE}
        self._next = ROOT_INODE + 1

    def __len__(self) -> int:
        return len(self._entries)

    def entry(self, ino: int) -> Entry | None:
        return self._entries.get(ino)

    def path(self, ino: int) -> str | None:
        entry = self._entries.get(ino)
        return entry.path if entry is not None and entry.attached else None

    def ino(self, path: str) -> int | None:
        return self._by_path.get(path)

    def bind(self, path: str, is_dir: bool) -> int:
        """The inode of ``path`` (a new one if it has none, or if its old one was a
        file and the path is now a directory, or the other way round)."""
        ino = self._by_path.get(path)
        if ino is not None:
            entry = self._entries[ino]
            if entry.is_dir == is_dir:
                return ino
            self.detach(path)
        ino = self._next
        self._next += 1
        self._entries[ino] = Entry(path, is_dir)
        self._by_path[path] = ino
        return ino

    def looked_up(self, ino: int) -> None:
        """The kernel took one more reference to ``ino``."""
        self._entries[ino].lookups += 1

    def forget(self, ino: int, count: int) -> None:
        """The kernel dropped ``count`` references; the last one frees the number."""
        entry = self._entries.get(ino)
        if entry is None or ino == ROOT_INODE:
            return
        entry.lookups -= count
        if entry.lookups <= 0:
            del self._entries[ino]
            if entry.attached and self._by_path.get(entry.path) == ino:
                del self._by_path[entry.path]

    def detach(self, path: str) -> None:
        """``path`` is gone (unlinked, removed, or replaced by a rename): its number,
        if any, names nothing any more."""
        ino = self._by_path.pop(path, None)
        if ino is None:
            return
        entry = self._entries[ino]
        entry.attached = False
        if entry.lookups <= 0:
            del self._entries[ino]

    def rename(self, src: str, dst: str) -> None:
        """``src`` (and everything below it) is now ``dst``; what ``dst`` named before is
        detached."""
        for path in [p for p in self._by_path if p == dst or p.startswith(dst + "/")]:
            self.detach(path)
        moved = [p for p in self._by_path if p == src or p.startswith(src + "/")]
        for path in moved:
            ino = self._by_path.pop(path)
            new = dst + path[len(src) :]
            self._entries[ino].path = new
            self._by_path[new] = ino
