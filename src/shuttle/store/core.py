"""The store's machinery under :class:`~shuttle.store.objects.ObjectStore`: opening and
recovery, checkpoints, attribute lookup, version checks, and the guards every change
goes through. The public operations are in :mod:`shuttle.store.objects`.

Every change follows one protocol (docs/storage-format.md has the details):

1. check the request (key, version, limits) under the key's exclusive lock;
2. append a redo record to the journal and wait until it is durable (group commit);
3. apply the change to the object file (no fsync) and the in-memory attributes;
4. return. A checkpoint later writes attribute files, syncs the file system once and
   empties the journal.

A crash at any instant leaves each object as it was before the change or after it:
before step 2 completes the record is torn or absent and the change never happened;
after it, recovery on the next open redoes the record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat as stat_mod
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Self

from shuttle.errors import (
    InvalidArgumentError,
    KeyConflictError,
    LimitExceededError,
    NotFoundError,
    ShuttleError,
    StorageIOError,
    VersionMismatchError,
)
from shuttle.store.attrs import ABSENT, AttrTable, ObjectAttrs, StoredAttrs
from shuttle.store.cache import (
    DEFAULT_BLOCK_SIZE_BYTES,
    DEFAULT_CAPACITY_BYTES,
    BlockCache,
)
from shuttle.store.chunking import (
    ChunkRef,
    hash_file,
    hash_file_only,
)
from shuttle.store.journal import Journal
from shuttle.store.keys import parent_keys
from shuttle.store.layout import Layout, sync_filesystem
from shuttle.store.locks import KeyLocks, RWLock
from shuttle.store.paths import SafeRoot, fsync_dir, pwrite_all
from shuttle.store.recovery import (
    RecoveryReport,
    replay,
    write_staging_file,
)
from shuttle.store.stats import StoreCounters
from shuttle.store.uploads import UploadTable

log = logging.getLogger(__name__)

#: One range write or one read moves at most this much. The journal holds a range
#: write's bytes until the next checkpoint, so the bound keeps it small; bigger objects
#: stream in through an upload session, and reads come in pieces.
WRITE_BYTES_MAX = 64 * 1024 * 1024
READ_BYTES_MAX = 64 * 1024 * 1024
#: Largest object (sparse offsets included): 1 TiB, far above the data sets we move and
#: below every file system's file size limit.
OBJECT_SIZE_BYTES_MAX = 1 << 40


@dataclass(frozen=True)
class StoreConfig:
    """Tunables of one store (the node's configuration fills it in)."""

    #: Block cache size; 0 disables the cache.
    cache_capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    cache_block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES
    #: Reads longer than this bypass the cache (a streaming read of a large object would
    #: otherwise evict everything for data read once).
    cache_read_bytes_max: int = 256 * 1024
    #: Puts up to this size carry their data inside the journal record: one fdatasync
    #: per put. Larger ones go through a staging file (one more fsync, no double write).
    inline_put_bytes_max: int = 1024 * 1024
    #: A checkpoint runs when the journal passes either bound. Recovery time is bounded
    #: by the work since the last checkpoint; 64 MiB replays in well under a second.
    journal_bytes_max: int = 64 * 1024 * 1024
    journal_records_max: int = 4096


class StoreCore:
    """Lifecycle and shared machinery of an object store (see :class:`ObjectStore`)."""

    def __init__(self, root: str | os.PathLike[str], config: StoreConfig | None = None) -> None:
        self.config = config or StoreConfig()
        self.layout = Layout(os.path.abspath(os.fspath(root)))
        self.counters = StoreCounters()
        self.cache = BlockCache(
            self.config.cache_capacity_bytes, self.config.cache_block_size_bytes
        )
        self._locks = KeyLocks()
        self._gate = RWLock()  # changes hold it shared; a checkpoint holds it exclusive
        self._ckpt_lock = threading.Lock()
        self._ns_lock = threading.Lock()  # directory creation versus new keys in flight
        self._pending_new: set[str] = set()
        self._adopt_lock = threading.Lock()
        self._prune: set[str] = set()
        self._broken: str | None = None
        self._closed = False
        try:
            self.layout.create()
            self._lock_fd = self.layout.lock()
        except OSError as exc:
            raise StorageIOError(f"cannot open data directory {self.layout.root!r}: {exc}") from exc
        try:
            self.paths = SafeRoot(self.layout.root)
            self.attrs = AttrTable(self.layout.attrs_dir, self.layout.staging_dir)
            self.uploads = UploadTable(self.layout.uploads_dir)
            self.recovery = self._recover()
        except BaseException:
            os.close(self._lock_fd)
            raise

    # --- lifecycle -------------------------------------------------------------------

    def _recover(self) -> RecoveryReport:
        ckpt_seq = self.layout.read_checkpoint_seq()
        self.journal = Journal(self.layout.journal_file, next_seq=ckpt_seq + 1)
        records = list(self.journal.read_valid(after_seq=ckpt_seq))
        report = replay(records, self.paths, self.layout, self.attrs)
        self.layout.clear_dir(self.layout.staging_dir)
        self.layout.clear_dir(self.layout.uploads_dir)
        if records or self.journal.size_bytes:
            sync_filesystem(self.paths.fd)
            self.layout.write_checkpoint_seq(self.journal.next_seq - 1)
            self.journal.reset()
        self.counters.add(recovered_records=report.records)
        if report.records:
            log.info(
                "store %s: redid %d journal records over %d objects",
                self.layout.root,
                report.records,
                report.keys,
            )
        return report

    def close(self, *, checkpoint: bool = True) -> None:
        """Checkpoint, discard open upload sessions and release the directory. Idempotent.

        ``checkpoint=False`` leaves the journal as it is, exactly as a crash would (every
        change is still durable; the next open redoes the journal). Tests use it, and a
        node may use it to stop fast.
        """
        if self._closed:
            return
        try:
            if checkpoint and self._broken is None:
                self.checkpoint()
        finally:
            self._closed = True
            self.uploads.close_all()
            self.journal.close()
            self.paths.close()
            os.close(self._lock_fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def checkpoint(self) -> None:
        """Write attribute files, sync the file system and empty the journal.

        Runs by itself when the journal passes its bounds; callers may also run it (on
        shutdown, or when idle). Changes wait while it runs.
        """
        with self._ckpt_lock, self._gate.write():
            if self._broken is not None:
                # A journaled change may be unapplied: emptying the journal would lose it.
                # Only reopening (which redoes the journal) may checkpoint now.
                return
            if self.journal.size_bytes == 0 and self.attrs.dirty_count() == 0:
                return
            self.attrs.flush()
            for dir_key in sorted(self._prune, key=len, reverse=True):
                self.paths.prune_empty_dirs(dir_key)
            self._prune.clear()
            sync_filesystem(self.paths.fd)
            self.layout.write_checkpoint_seq(self.journal.next_seq - 1)
            self.journal.reset()
            self.counters.add(checkpoints=1)

    def _maybe_checkpoint(self) -> None:
        cfg = self.config
        if (
            self.journal.size_bytes > cfg.journal_bytes_max
            or self.journal.records_since_reset > cfg.journal_records_max
        ) and not self._ckpt_lock.locked():
            self.checkpoint()

    # --- attributes ------------------------------------------------------------------

    def _current(self, key: str, *, create_ok: bool = False) -> StoredAttrs | None:
        """The attributes of ``key`` or None; adopts a file that has none. Caller holds
        the key's lock (either mode) and not the gate."""
        rec = self.attrs.get(key)
        if isinstance(rec, StoredAttrs):
            return rec
        if rec is ABSENT:
            return None
        try:
            if not self.paths.is_object_file(key):
                return None
        except NotFoundError:
            if create_ok:
                return None  # a directory: _reserve reports the conflict
            raise
        return self._adopt(key)

    def _adopt(self, key: str) -> StoredAttrs | None:
        """Give attributes to a file that appeared in the data tree without any (an
        operator copied it in): a fresh version, and hashes from its contents."""
        with self._adopt_lock:
            rec = self.attrs.get(key)
            if isinstance(rec, StoredAttrs):
                return rec
            try:
                fd = self.paths.open_file(key, os.O_RDONLY)
            except NotFoundError:
                return None
            try:
                size = os.fstat(fd).st_size
                whole, chunks = hash_file(fd, size)
            finally:
                os.close(fd)
            self._check_usable()
            mtime_ns = time.time_ns()
            with self._gate.read():
                seq = self.journal.append({"op": "adopt", "key": key, "mtime_ns": mtime_ns})
                adopted = StoredAttrs(key, size, seq, mtime_ns, whole, tuple(chunks))
                self.attrs.set(key, adopted)
            self.counters.add(adopted_objects=1)
            return adopted

    def _complete(self, rec: StoredAttrs) -> ObjectAttrs:
        """Fill in a pending whole-object hash (computed once per version)."""
        if rec.hash is not None:
            return rec.complete(rec.hash)
        fd = self.paths.open_file(rec.key, os.O_RDONLY)
        try:
            whole = hash_file_only(fd, rec.size)
        finally:
            os.close(fd)
        done = StoredAttrs(rec.key, rec.size, rec.version, rec.mtime_ns, whole, rec.chunks)
        self.attrs.set(rec.key, done)
        self.counters.add(hashes_deferred_computed=1)
        return done.complete(whole)

    def _spool(self, pieces: Iterable[bytes]) -> tuple[bytearray | None, str | None]:
        """Collect an iterable in memory up to the inline bound, then in a staging file."""
        buf = bytearray()
        fd = -1
        path = None
        written = 0
        try:
            for piece in pieces:
                if fd < 0 and len(buf) + len(piece) <= self.config.inline_put_bytes_max:
                    buf += piece
                    continue
                if fd < 0:
                    path = write_staging_file(self.layout, b"")
                    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                    pwrite_all(fd, buf, 0)
                    written = len(buf)
                    buf = bytearray()
                if written + len(piece) > OBJECT_SIZE_BYTES_MAX:
                    raise LimitExceededError(
                        f"object exceeds {OBJECT_SIZE_BYTES_MAX} bytes; split it into objects."
                    )
                pwrite_all(fd, piece, written)
                written += len(piece)
        except BaseException:
            if path is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            raise
        finally:
            if fd >= 0:
                os.close(fd)
        return (None, path) if path is not None else (buf, None)

    def _seal(self, path: str) -> tuple[int, bytes, list[ChunkRef]]:
        """Make a staging file durable (contents and name) and hash it."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
            size = os.fstat(fd).st_size
            whole, chunks = hash_file(fd, size)
        finally:
            os.close(fd)
        fsync_dir(os.path.dirname(path))
        return size, whole, chunks

    @staticmethod
    def _check_version(key: str, rec: StoredAttrs | None, expected: int | None) -> None:
        if expected is None:
            return
        if expected < 0:
            raise InvalidArgumentError(f'"expected_version" must be >= 0, got {expected}')
        have = 0 if rec is None else rec.version
        if have != expected:
            state = "does not exist" if rec is None else f"is at version {have}"
            want = "not to exist" if expected == 0 else f"version {expected}"
            raise VersionMismatchError(
                f"{key!r} {state}, but the caller expected {want}. Stat it and retry "
                "with the current version."
            )

    def _check_usable(self) -> None:
        if self._closed:
            raise StorageIOError("the store is closed. Open it again.")
        if self._broken is not None:
            raise StorageIOError(
                f"the store refuses changes after a disk error ({self._broken}). Restart the "
                "node: recovery completes every acknowledged change."
            )

    def _op(self, name: str) -> _OpScope:
        """Count an operation and turn OSErrors into StorageIOError."""
        self.counters.op(name)
        return _OpScope(self.counters, name)

    @contextlib.contextmanager
    def _applying(self) -> Iterator[None]:
        """Around step 3: a failure after the record is durable poisons the store."""
        try:
            yield
        except BaseException as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            log.error("store %s: change failed after journaling: %s", self.layout.root, exc)
            raise

    @contextlib.contextmanager
    def _reserve(self, key: str, rec: StoredAttrs | None) -> Iterator[None]:
        """Make the directories above a key about to be created, and keep other new keys
        from turning its path into a file (``a``) or a directory (``a/b``) meanwhile."""
        if rec is not None:
            yield
            return
        with self._ns_lock:
            for parent in parent_keys(key):
                if parent in self._pending_new:
                    raise KeyConflictError(
                        f"key {key!r} cannot be created while {parent!r} is being created as "
                        "an object. Use another key."
                    )
            dir_fd, leaf = self.paths.open_parent(key, create=True)
            try:
                st = self.paths.lstat_leaf(dir_fd, leaf)
            finally:
                os.close(dir_fd)
            if st is not None and not _is_reg(st.st_mode):
                raise KeyConflictError(
                    f"key {key!r} names a directory (a prefix of other keys) or a special "
                    "file. Use another key."
                )
            self._pending_new.add(key)
        try:
            yield
        finally:
            with self._ns_lock:
                self._pending_new.discard(key)


def _is_reg(mode: int) -> bool:
    return stat_mod.S_ISREG(mode)


class _OpScope:
    """Around each public call: count its error, turn an OSError into StorageIOError.
    A plain class, not a generator context manager: it is on every call's path."""

    __slots__ = ("_counters", "_name")

    def __init__(self, counters: StoreCounters, name: str) -> None:
        self._counters = counters
        self._name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        if isinstance(exc, ShuttleError):
            self._counters.error(exc.code)
        elif isinstance(exc, OSError):
            self._counters.error(StorageIOError.code)
            raise StorageIOError(f"{self._name} failed on the node's disk: {exc}") from exc
