"""The store's internal directory (``ROOT/.shuttle``): its files, the single-opener lock,
the checkpoint record, and making the file system durable.

See docs/storage-format.md for the format and the recovery procedure.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
from dataclasses import dataclass

import msgpack

from shuttle.errors import StorageIOError
from shuttle.store.keys import INTERNAL_DIR_NAME
from shuttle.store.paths import fsync_dir

#: Format of the internal directory; bump on an incompatible change.
STORE_FORMAT = 1


@dataclass(frozen=True)
class Layout:
    """Paths inside one data directory."""

    root: str

    @property
    def internal(self) -> str:
        return os.path.join(self.root, INTERNAL_DIR_NAME)

    @property
    def format_file(self) -> str:
        return os.path.join(self.internal, "FORMAT")

    @property
    def lock_file(self) -> str:
        return os.path.join(self.internal, "lock")

    @property
    def checkpoint_file(self) -> str:
        return os.path.join(self.internal, "checkpoint")

    @property
    def journal_file(self) -> str:
        return os.path.join(self.internal, "journal")

    @property
    def attrs_dir(self) -> str:
        return os.path.join(self.internal, "attrs")

    @property
    def staging_dir(self) -> str:
        return os.path.join(self.internal, "staging")

    @property
    def uploads_dir(self) -> str:
        return os.path.join(self.internal, "uploads")

    def create(self) -> None:
        """Make the internal directories (idempotent) and check the format marker."""
        os.makedirs(self.root, exist_ok=True)
        fresh = not os.path.exists(self.format_file)
        for path in (self.internal, self.attrs_dir, self.staging_dir, self.uploads_dir):
            os.makedirs(path, exist_ok=True)
        if fresh:
            tmp = self.format_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"format": STORE_FORMAT}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.format_file)
            fsync_dir(self.internal)
            fsync_dir(self.root)
            return
        with open(self.format_file) as f:
            found = json.load(f).get("format")
        if found != STORE_FORMAT:
            raise StorageIOError(
                f"data directory {self.root!r} has store format {found}, this build reads "
                f"format {STORE_FORMAT}. Use a matching Shuttle version or a new directory."
            )

    def lock(self) -> int:
        """Take the exclusive lock that lets one process at a time open this store."""
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise StorageIOError(
                    f"data directory {self.root!r} is already open in another process (or "
                    "another store object in this one). Stop that node or use another --data."
                ) from None
            raise
        return fd

    def read_checkpoint_seq(self) -> int:
        try:
            with open(self.checkpoint_file, "rb") as f:
                return int(msgpack.unpackb(f.read())["seq"])
        except FileNotFoundError:
            return 0

    def write_checkpoint_seq(self, seq: int) -> None:
        """Durably record that every change up to ``seq`` is in the files themselves."""
        tmp = self.checkpoint_file + ".tmp"
        with open(tmp, "wb") as f:
            f.write(msgpack.packb({"seq": seq}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.checkpoint_file)
        fsync_dir(self.internal)

    def clear_dir(self, path: str) -> int:
        """Delete everything in ``path`` (staging leftovers); returns the entry count."""
        count = 0
        for entry in os.scandir(path):
            count += 1
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        return count


def _load_syncfs() -> object | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return libc.syncfs
    except (OSError, AttributeError):
        return None


_SYNCFS = _load_syncfs()


def sync_filesystem(fd: int) -> None:
    """Make every write, rename and unlink on the file system holding ``fd`` durable.

    ``syncfs(2)`` on Linux (one call covers data files, attribute files and directories
    changed since the last checkpoint); ``sync()`` where it is missing. Sound only on
    file systems that honour it: FUSE never sees it, so :mod:`shuttle.store.durability`
    decides when to call it.
    """
    if _SYNCFS is None:
        os.sync()
        return
    if _SYNCFS(fd) != 0:  # type: ignore[operator]
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs failed: {os.strerror(err)}")
