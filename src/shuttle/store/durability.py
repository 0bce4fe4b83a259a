"""Making a checkpoint durable: what must reach stable storage before the journal may be
emptied, and the two ways of getting it there.

Between checkpoints the store applies changes to object files without syncing them
(the journal holds every change). Before a checkpoint empties the journal, every file
and directory entry changed since the last one must be durable: object contents,
attribute files, and the directory entries made by creates, renames, unlinks, mkdir and
rmdir. Two ways, chosen once per open (:func:`choose_sync_mode`):

* ``syncfs``: one ``syncfs(2)`` of the data directory's file system. It is a
  superblock operation, honoured by the local journaling file systems in
  :data:`SYNCFS_FILESYSTEMS`. FUSE (where it is a no-op: the daemon never hears of it;
  LazyFS showed acknowledged objects coming back empty after a power cut), network file
  systems and stacked ones may not honour it, so it is never chosen for them.
* ``fsync``: ``fsync`` of each object file and attribute file changed since the last
  checkpoint, then of every directory above them (as PostgreSQL's and RocksDB's
  checkpoints do). Correct on any POSIX file system, per-file errors, but slower:
  on ext4 here a checkpoint after 4,096 changed small objects took 3.2-5.4 s against
  0.95-1.7 s with one ``syncfs`` (benchmarks/README.md, "Checkpoint sync"), and a
  checkpoint holds up every change while it runs. Hence ``auto``.

A failed ``fsync`` cannot be retried (Linux may have dropped the dirty pages and
cleared the error), so the caller must keep the journal and stop taking changes until
a reopen redoes it (docs/storage-format.md, "Checkpoints").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from shuttle.errors import ConfigError, InvalidKeyError, KeyConflictError, NotFoundError
from shuttle.store.layout import sync_filesystem
from shuttle.store.paths import SafeRoot

SyncMode = Literal["auto", "syncfs", "fsync"]
SYNC_MODES: tuple[SyncMode, ...] = ("auto", "syncfs", "fsync")

#: File system types (``/proc/self/mountinfo``) whose ``syncfs`` writes back every
#: dirty page and commits every metadata change of the file system, and reports
#: writeback errors (Linux >= 5.8): the local journaling file systems we test on or
#: that document it. tmpfs has nothing to sync. Anything else gets per-file fsync.
SYNCFS_FILESYSTEMS = frozenset({"ext3", "ext4", "xfs", "btrfs", "tmpfs"})

#: Threads that fsync files at a checkpoint. Concurrent fsyncs share the file system's
#: journal commits: 8,192 small files on ext4 took 2.9-7.5 s one by one, 1.8-2.6 s with
#: 8 threads and 1.3-1.4 s with 32; 16 keeps most of the gain with few threads.
SYNC_THREADS = 16
#: Below this many paths, a thread pool costs more than it saves.
SYNC_THREADS_MIN_PATHS = 8

_MOUNTINFO = "/proc/self/mountinfo"


def filesystem_type(mountinfo: str, dev: int) -> str | None:
    """The type of the file system mounted with device number ``dev`` according to the
    text of ``/proc/self/mountinfo`` (``fuse.lazyfs``, ``ext4``, ...), or None."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    found = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 7 or fields[2] != want or "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if sep + 1 < len(fields):
            found = fields[sep + 1]  # the last mount of that device wins (mount order)
    return found


def choose_sync_mode(mode: SyncMode, root_fd: int, *, mountinfo: str | None = None) -> str:
    """Resolve ``mode`` for the file system holding ``root_fd``: ``auto`` becomes
    ``syncfs`` on a file system in :data:`SYNCFS_FILESYSTEMS` and ``fsync`` anywhere
    else (including when the type cannot be found)."""
    if mode not in SYNC_MODES:
        raise ConfigError(f'"sync_mode" must be one of {", ".join(SYNC_MODES)}, got {mode!r}')
    if mode != "auto":
        return mode
    if mountinfo is None:
        try:
            with open(_MOUNTINFO) as f:
                mountinfo = f.read()
        except OSError:
            return "fsync"
    fstype = filesystem_type(mountinfo, os.fstat(root_fd).st_dev)
    return "syncfs" if fstype in SYNCFS_FILESYSTEMS else "fsync"


def _fsync_fd(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class CheckpointSync:
    """Makes the changes since the last checkpoint durable, in the chosen mode.

    ``attr_path`` maps a key to its attribute file. Counters: ``files_synced`` and
    ``dirs_synced`` (fsyncs), ``filesystem_syncs`` (syncfs calls).
    """

    def __init__(
        self,
        root: SafeRoot,
        attr_path: Callable[[str], str],
        mode: SyncMode = "auto",
        *,
        mountinfo: str | None = None,
    ) -> None:
        self.root = root
        self.attr_path = attr_path
        self.mode = choose_sync_mode(mode, root.fd, mountinfo=mountinfo)
        self._lock = threading.Lock()
        self.files_synced = 0
        self.dirs_synced = 0
        self.filesystem_syncs = 0

    def sync(self, keys: Iterable[str], extra_dirs: Iterable[str] = ()) -> None:
        """Make durable every change to the objects ``keys`` (present or removed), their
        attribute files, the directories above both, and the directories
        ``extra_dirs`` (absolute paths).

        Raises OSError if any fsync fails (after trying all of them); nothing can be
        assumed durable then.
        """
        if self.mode == "syncfs":
            sync_filesystem(self.root.fd)
            with self._lock:
                self.filesystem_syncs += 1
            return
        files: list[Callable[[], int]] = []
        dir_keys: set[str] = {""}
        attr_dirs: set[str] = set(extra_dirs)
        for key in keys:
            files.append(_opener(self.root, key))
            parts = key.split("/")
            dir_keys.update("/".join(parts[:i]) for i in range(1, len(parts)))
            attr = self.attr_path(key)
            files.append(_path_opener(attr, os.O_RDONLY))
            attr_dirs.add(os.path.dirname(attr))
            attr_dirs.add(os.path.dirname(os.path.dirname(attr)))
        dirs = [_dir_opener(self.root, d) for d in sorted(dir_keys)]
        dirs += [_path_opener(d, os.O_RDONLY | os.O_DIRECTORY) for d in sorted(attr_dirs)]
        # Files before directories: an entry made durable must name durable contents.
        synced_files = self._run(files)
        synced_dirs = self._run(dirs)
        with self._lock:
            self.files_synced += synced_files
            self.dirs_synced += synced_dirs

    def _run(self, openers: list[Callable[[], int]]) -> int:
        """Open and fsync each path (missing ones are skipped: removed since); returns
        how many were synced. Raises the first fsync error once all have been tried."""
        if len(openers) < SYNC_THREADS_MIN_PATHS:
            results = [_sync_one(o) for o in openers]
        else:
            with ThreadPoolExecutor(min(SYNC_THREADS, len(openers))) as pool:
                results = list(pool.map(_sync_one, openers))
        errors = [r for r in results if isinstance(r, OSError)]
        if errors:
            raise errors[0]
        return sum(1 for r in results if r is True)


def _sync_one(opener: Callable[[], int]) -> bool | OSError:
    """fsync what ``opener`` opens: True if synced, False if it no longer exists."""
    try:
        fd = opener()
    except (FileNotFoundError, NotFoundError):
        return False
    except OSError as exc:
        return exc
    try:
        _fsync_fd(fd)
    except OSError as exc:
        return exc
    return True


def _opener(root: SafeRoot, key: str) -> Callable[[], int]:
    def open_object() -> int:
        try:
            return root.open_file(key, os.O_RDONLY)
        except (InvalidKeyError, KeyConflictError) as exc:
            raise NotFoundError(str(exc)) from exc  # not an object file any more

    return open_object


def _dir_opener(root: SafeRoot, dir_key: str) -> Callable[[], int]:
    return lambda: root.open_dir(dir_key)


def _path_opener(path: str, flags: int) -> Callable[[], int]:
    return lambda: os.open(path, flags | os.O_CLOEXEC)
