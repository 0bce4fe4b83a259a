"""Free space on the data directory's file system: which changes may use it, and the
reserve that keeps a full disk emptiable (docs/operations.md, "Capacity and a full disk").

Two mechanisms, because one alone is not enough:

* **Admission.** A change that adds bytes (put, range write, upload commit, extending
  truncate) asks for its estimated footprint before anything is journaled, and is
  refused with :class:`DiskFullError` when the free space, less what admitted changes
  in flight may still use, cannot hold it. Nothing was written, so nothing needs
  undoing and the store carries on. Removes and shrinking truncates are never refused.
* **The reserve.** ``.shuttle/reserve`` is a preallocated file of
  :data:`RESERVE_BYTES_DEFAULT` (at most 1/16 of the file system). Admission keeps new
  data out of it, and so does anything else filling the file system (a log, another
  program), since its blocks are allocated. When a remove, a shrinking truncate, a
  checkpoint or recovery meets ``ENOSPC``, the store releases the reserve and tries
  again; the reserve is allocated again once there is room.

``ENOSPC`` is not ``EIO``: a full disk refuses the change that did not fit and nothing
else; the store never stops taking changes because of it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from shuttle.errors import DiskFullError

log = logging.getLogger(__name__)

#: The reserve's size. What it must cover when the disk is full: a remove's journal
#: record (~150 B; a checkpoint follows every 4,096 records, so ~600 KiB at most), a
#: checkpoint (the checkpoint file, attribute files of changed objects, directory
#: blocks) and recovery's redo of changes acknowledged just before a crash. 8 MiB
#: covers that with room to spare; ext4 keeps 5% for root for the same reason.
RESERVE_BYTES_DEFAULT = 8 * 1024 * 1024
#: On a small file system the reserve is at most this fraction of it (a 20 MiB test
#: file system keeps 1.25 MiB back, not 8).
RESERVE_FRACTION_MAX = 1 / 16
#: Attribute file and directory blocks a new object version may need at the next
#: checkpoint (one 4 KiB block for the file, one for its directory's growth).
ATTR_BYTES_BASE = 8 * 1024
#: Chunk list bytes per object byte, at worst: 36 bytes per chunk and chunks of at
#: least 16 KiB make 1/455; 1/400 is a round bound above it.
ATTR_BYTES_PER_OBJECT_BYTE = 1 / 400


def is_disk_full(exc: BaseException) -> bool:
    """True for the errors a full file system (or a full quota) raises."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def footprint_bytes(*, data_bytes: int, journal_bytes: int, size_bytes: int) -> int:
    """What a change may add to the file system until the next checkpoint: the bytes it
    writes into the object, its journal record, and the object's attribute file."""
    attrs = ATTR_BYTES_BASE + int(size_bytes * ATTR_BYTES_PER_OBJECT_BYTE)
    return data_bytes + journal_bytes + attrs


#: What :meth:`SpaceGuard.free_bytes` answers for a file system that reports no size
#: (``f_blocks == 0``): more than any change asks for.
UNMEASURED_FREE_BYTES = 1 << 62


class SpaceGuard:
    """Admission of space-using changes and the reserve file. Thread-safe."""

    def __init__(
        self,
        root: str,
        reserve_path: str,
        reserve_bytes: int,
        owed_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        """``owed_bytes()``: what changes already made will still write (attribute files
        at the next checkpoint); admission keeps it free so a checkpoint always fits."""
        self.root = root
        self._owed_bytes = owed_bytes
        self.reserve_path = reserve_path
        total = self.total_bytes()
        #: The reserve this store keeps (the configured size, bounded by the fraction).
        self.reserve_target_bytes = min(reserve_bytes, int(total * RESERVE_FRACTION_MAX))
        self._lock = threading.Lock()
        self._in_flight_bytes = 0
        self.refused = 0
        self.reserve_releases = 0
        self._held_bytes = self._reserve_file_bytes()

    # --- measurements -------------------------------------------------------------

    def _statvfs(self) -> os.statvfs_result:
        return os.statvfs(self.root)

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer may still allocate on the file system."""
        st = self._statvfs()
        if st.f_blocks == 0:
            # A file system that reports no size at all (a FUSE file system without
            # statfs, such as LazyFS under the power-loss tier): space cannot be
            # measured, so admission cannot refuse; ENOSPC is still handled when it comes.
            return UNMEASURED_FREE_BYTES
        return st.f_bavail * st.f_frsize

    def total_bytes(self) -> int:
        st = self._statvfs()
        return st.f_blocks * st.f_frsize

    def _reserve_file_bytes(self) -> int:
        try:
            return os.stat(self.reserve_path).st_blocks * 512
        except FileNotFoundError:
            return 0

    @property
    def reserve_held_bytes(self) -> int:
        return self._held_bytes

    def _missing_reserve_bytes(self) -> int:
        return max(0, self.reserve_target_bytes - self._held_bytes)

    # --- admission ----------------------------------------------------------------

    def short_of(self, need_bytes: int) -> bool:
        """True if :meth:`admit` of ``need_bytes`` would be refused now."""
        with self._lock:
            return not self._fits(need_bytes, self.free_bytes())

    def _fits(self, need_bytes: int, free: int) -> bool:
        promised = self._in_flight_bytes + self._owed_bytes()
        return free - promised - need_bytes >= self._missing_reserve_bytes()

    @contextlib.contextmanager
    def admit(self, need_bytes: int, what: str) -> Iterator[None]:
        """Hold ``need_bytes`` of free space for the change ``what`` while it runs.

        Raises:
            DiskFullError: the space is not there (the reserve does not count as free).
        """
        with self._lock:
            free = self.free_bytes()
            if not self._fits(need_bytes, free) and self._missing_reserve_bytes():
                self._restore_locked()  # a reserve given up earlier may fit again
                free = self.free_bytes()
            if not self._fits(need_bytes, free):
                self.refused += 1
                raise DiskFullError(
                    f"the node's disk is full: {what} needs about {need_bytes} bytes, the "
                    f"file system holding {self.root} has {free} free, "
                    f"{self._in_flight_bytes + self._owed_bytes()} promised to changes made "
                    "or under way and "
                    f"{self._missing_reserve_bytes()} more to set aside for removes. "
                    "Nothing was changed. Remove objects (removes always work) or give the "
                    "file system more space, then retry."
                )
            self._in_flight_bytes += need_bytes
        try:
            yield
        finally:
            with self._lock:
                self._in_flight_bytes -= need_bytes

    # --- the reserve --------------------------------------------------------------

    def release_reserve(self) -> bool:
        """Give the reserve's blocks back to the file system (a change that frees space,
        a checkpoint or recovery met ENOSPC). False if there was nothing to release."""
        with self._lock:
            if self._held_bytes == 0:
                return False
            with contextlib.suppress(FileNotFoundError):
                os.truncate(self.reserve_path, 0)
            self._held_bytes = 0
            self.reserve_releases += 1
            return True

    def restore_reserve(self) -> bool:
        """Allocate the reserve again if the file system has room; True if it is whole."""
        with self._lock:
            return self._restore_locked()

    def _restore_locked(self) -> bool:
        missing = self._missing_reserve_bytes()
        if missing == 0:
            return True
        if self.free_bytes() - self._in_flight_bytes < missing:
            return False
        fd = os.open(self.reserve_path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, self.reserve_target_bytes)
        except OSError as exc:
            if not is_disk_full(exc):
                # Cannot preallocate here: run without a reserve rather than refuse
                # every put for want of one.
                log.warning("cannot preallocate %s (%s): no reserve", self.reserve_path, exc)
                self.reserve_target_bytes = 0
        finally:
            os.close(fd)
        self._held_bytes = self._reserve_file_bytes()
        return self._missing_reserve_bytes() == 0

    def snapshot(self) -> dict[str, Any]:
        """Plain numbers for the node's stats (``journal_*`` are added by the store)."""
        st = self._statvfs()
        total = st.f_blocks * st.f_frsize
        with self._lock:
            return {
                # Which file system: nodes on one disk report the same (df sums per disk).
                "fsid": st.f_fsid,
                "total_bytes": total,
                "used_bytes": total - st.f_bfree * st.f_frsize,
                "free_bytes": st.f_bavail * st.f_frsize,
                "reserve_bytes": self.reserve_target_bytes,
                "reserve_held_bytes": self._held_bytes,
                "in_flight_bytes": self._in_flight_bytes,
                "refused": self.refused,
                "reserve_releases": self.reserve_releases,
            }
