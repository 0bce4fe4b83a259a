"""Lookaside stores: a local directory and its index, and the set a user has added.

A :class:`LookasideStore` is any local directory (a USB stick, an older copy of a data
set, a previous release of a source tree) with its :class:`LookasideIndex`; it reads
the bytes the index points at and says nothing about whether they are right (the
reader verifies them against the node's hashes).

A :class:`StoreSet` is the list of stores one user has added with ``shuttle lookaside
add``, kept under the user's Shuttle home: ``$SHUTTLE_HOME/lookaside/`` if set, else
``$XDG_DATA_HOME/shuttle/lookaside/``, else ``~/.local/share/shuttle/lookaside/``. It
holds ``stores.json`` (the roots, in the order they were added) and one SQLite index
per store (``<blake3 of the root's path>.sqlite``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import blake3

from shuttle.client.lookaside.index import (
    IndexProgress,
    IndexReport,
    IndexSummary,
    Location,
    LookasideIndex,
)
from shuttle.errors import InvalidArgumentError

log = logging.getLogger(__name__)

#: Where the user's Shuttle state lives (the lookaside stores and their indexes).
HOME_ENV = "SHUTTLE_HOME"
#: The registry of added stores, inside the lookaside directory.
STORES_FILE = "stores.json"
#: ``1`` (or ``on``, ``yes``, ``true``): clients made by :func:`shuttle.connect` (and so
#: every CLI command, the FUSE mount and the fsspec filesystem) read through the
#: user's added stores. Unset or anything else: no lookaside unless asked for.
LOOKASIDE_ENV = "SHUTTLE_LOOKASIDE"


def default_home() -> Path:
    """``$SHUTTLE_HOME``, else ``$XDG_DATA_HOME/shuttle``, else ``~/.local/share/shuttle``."""
    home = os.environ.get(HOME_ENV)
    if home:
        return Path(home)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "shuttle"


def stores_from_env() -> StoreSet | None:
    """The user's :class:`StoreSet` if ``$SHUTTLE_LOOKASIDE`` turns lookaside on."""
    value = os.environ.get(LOOKASIDE_ENV, "").strip().lower()
    return StoreSet() if value in ("1", "on", "yes", "true") else None


class LookasideStore:
    """One local directory ``root`` and its index (in ``index_path``)."""

    def __init__(self, root: Path, index_path: Path) -> None:
        self.root = root
        self.index = LookasideIndex(index_path, root)

    @classmethod
    def open(cls, root: str | Path, index_path: str | Path | None = None) -> LookasideStore:
        """The store at ``root`` (its index at ``index_path``, by default a file named
        after the root in the user's lookaside directory), not refreshed: call
        :meth:`refresh` to index it."""
        path = _checked_dir(root)
        where = Path(index_path) if index_path is not None else _index_path(default_home(), path)
        return cls(path, where)

    def refresh(self, progress: IndexProgress | None = None) -> IndexReport:
        """Index new and changed files, forget removed ones (see :class:`LookasideIndex`)."""
        _checked_dir(self.root)
        return self.index.refresh(progress) if progress else self.index.refresh()

    def lookup(self, hashes: list[bytes]) -> dict[bytes, Location]:
        return self.index.lookup(hashes)

    def read(self, loc: Location) -> bytes | None:
        """The bytes at ``loc``, or None if they cannot be what was indexed: the file is
        gone or unreadable (the store went away: nothing is dropped, it may come back),
        or its size or mtime changed (its entries are dropped until re-indexed)."""
        try:
            fd = os.open(
                self.root / loc.path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            )
        except OSError as exc:
            log.debug("lookaside %s: cannot open %s: %s", self.root, loc.path, exc)
            return None
        try:
            st = os.fstat(fd)
            if (st.st_size, st.st_mtime_ns) != (loc.size, loc.mtime_ns):
                log.info("lookaside %s: %s changed since it was indexed", self.root, loc.path)
                self._drop(loc.path)
                return None
            data = os.pread(fd, loc.length, loc.offset)
        except OSError as exc:
            log.debug("lookaside %s: cannot read %s: %s", self.root, loc.path, exc)
            return None
        finally:
            os.close(fd)
        return data if len(data) == loc.length else None

    def drop(self, loc: Location) -> None:
        """``loc``'s bytes did not match their hash: forget its file until re-indexed."""
        self._drop(loc.path)

    def _drop(self, path: str) -> None:
        """Forget ``path``'s chunks; an index that cannot be written (read-only, full,
        closed) leaves them, to be caught by the same check next time: a read never
        fails because a store's index did."""
        try:
            self.index.drop_file(path)
        except sqlite3.Error as exc:
            log.warning(
                "lookaside %s: cannot drop the stale entries of %s from its index (%s); "
                "run `shuttle lookaside index` to re-index the store",
                self.root,
                path,
                exc,
            )

    def summary(self) -> IndexSummary:
        return self.index.summary()

    def close(self) -> None:
        self.index.close()

    def __repr__(self) -> str:
        return f"LookasideStore({str(self.root)!r})"


@dataclass(frozen=True, slots=True)
class StoreEntry:
    """One added store: its root and when it was added (seconds since the epoch)."""

    root: Path
    added: float


class StoreSet:
    """The lookaside stores a user has added (``shuttle lookaside add|index|ls|rm``).

    ``home`` is the user's Shuttle home (:func:`default_home` if None).
    """

    def __init__(self, home: Path | None = None) -> None:
        self.home = home if home is not None else default_home()
        self.dir = self.home / "lookaside"

    def entries(self) -> list[StoreEntry]:
        """The added stores, in the order they were added."""
        path = self.dir / STORES_FILE
        try:
            raw = json.loads(path.read_text())
            return [StoreEntry(Path(e["root"]), float(e["added"])) for e in raw["stores"]]
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgumentError(
                f"the lookaside store list {path} is unreadable ({exc}); "
                "remove it and add the stores again"
            ) from exc

    def find(self, root: str | Path) -> StoreEntry | None:
        want = Path(os.path.abspath(root))
        return next((e for e in self.entries() if e.root == want), None)

    def add(self, root: str | Path) -> LookasideStore:
        """Add the directory ``root`` (not yet indexed: call ``refresh`` on the result).
        Adding a store twice is harmless."""
        path = _checked_dir(root)
        entries = self.entries()
        if all(e.root != path for e in entries):
            self._save([*entries, StoreEntry(path, time.time())])
        return LookasideStore(path, _index_path(self.home, path))

    def remove(self, root: str | Path) -> None:
        """Forget the store at ``root`` and delete its index (not the directory)."""
        want = Path(os.path.abspath(root))
        entries = self.entries()
        if all(e.root != want for e in entries):
            known = ", ".join(str(e.root) for e in entries) or "none"
            raise InvalidArgumentError(
                f"{want} is not a lookaside store (added stores: {known}); "
                "`shuttle lookaside ls` lists them"
            )
        self._save([e for e in entries if e.root != want])
        index = _index_path(self.home, want)
        for suffix in ("", "-wal", "-shm"):
            Path(f"{index}{suffix}").unlink(missing_ok=True)

    def store(self, entry: StoreEntry) -> LookasideStore:
        """The store of ``entry`` (its directory need not be there: a USB stick may be
        out; reads from it then miss)."""
        return LookasideStore(entry.root, _index_path(self.home, entry.root))

    def stores(self) -> list[LookasideStore]:
        """Every added store whose directory is there now, in the order added."""
        out = []
        for entry in self.entries():
            if not entry.root.is_dir():
                log.warning("lookaside store %s is not there; reading without it", entry.root)
                continue
            try:
                out.append(self.store(entry))
            except (OSError, sqlite3.Error) as exc:  # an unreadable index: read without it
                log.warning("lookaside store %s: cannot open its index: %s", entry.root, exc)
        return out

    def _save(self, entries: list[StoreEntry]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / STORES_FILE
        tmp = path.with_name(f".{STORES_FILE}.tmp")
        body = {"stores": [{"root": str(e.root), "added": e.added} for e in entries]}
        tmp.write_text(json.dumps(body, indent=2) + "\n")
        tmp.replace(path)


def _checked_dir(root: str | Path) -> Path:
    """``root`` as an absolute path, if it is a directory; else a clear error."""
    path = Path(os.path.abspath(root))
    if not path.exists():
        raise InvalidArgumentError(f"lookaside store {path} does not exist; give a directory")
    if not path.is_dir():
        raise InvalidArgumentError(
            f"lookaside store {path} is not a directory; give the directory that holds "
            "the files (a release's source tree, a copy of a data set)"
        )
    return path


def _index_path(home: Path, root: Path) -> Path:
    name = blake3.blake3(str(root).encode()).hexdigest()[:24]
    return home / "lookaside" / f"{name}.sqlite"
