"""The store's machinery under :class:`~shuttle.store.objects.ObjectStore`: opening and
recovery, checkpoints, attribute lookup, version checks, and the steps every change
takes (what wraps each call and each change, its errors and its lock, is in
:mod:`shuttle.store.guards`). The public operations are in :mod:`shuttle.store.objects`.

Every change follows one protocol (docs/storage-format.md has the details):

1. check the request (key, version, limits) under the key's exclusive lock;
2. append a redo record to the journal and wait until it is durable (group commit);
3. apply the change to the object file (no fsync) and the in-memory attributes;
4. return. A checkpoint later writes attribute files, makes every change since the
   last one durable (:mod:`shuttle.store.durability`) and empties the journal.

A change that adds bytes is admitted first (:mod:`shuttle.store.space`): on a full
disk it is refused before step 2 with :class:`DiskFullError`, and the store carries
on. Removes and shrinking truncates are never refused; if their record meets
``ENOSPC`` the store releases its reserve and appends again.

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
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Self, TypeVar, cast

from shuttle.errors import (
    DiskFullError,
    InvalidArgumentError,
    KeyConflictError,
    LimitExceededError,
    NotFoundError,
    StorageIOError,
    VersionMismatchError,
)
from shuttle.store.attrs import ABSENT, AttrTable, ObjectAttrs, StoredAttrs
from shuttle.store.cache import (
    BlockCache,
)
from shuttle.store.chunking import (
    ChunkRef,
    chunk_file,
    hash_file,
    hash_file_only,
)
from shuttle.store.config import READ_BYTES_MAX as READ_BYTES_MAX  # for rados_read
from shuttle.store.config import WRITE_BYTES_MAX as WRITE_BYTES_MAX  # for rados
from shuttle.store.config import ChangeHook as ChangeHook  # for rados
from shuttle.store.config import StoreConfig as StoreConfig  # for rados, rados_read
from shuttle.store.durability import CheckpointSync
from shuttle.store.fastread import CachedReads
from shuttle.store.guards import OpScope, forgetting, hooked, retry_while_out_of_descriptors
from shuttle.store.journal import Journal
from shuttle.store.keys import parent_keys
from shuttle.store.layout import Layout
from shuttle.store.locks import KeyLocks, RWLock
from shuttle.store.loopreads import StoreView
from shuttle.store.missread import MissReads
from shuttle.store.nowait import NowaitReads
from shuttle.store.openfiles import (
    OpenFiles,
    is_out_of_descriptors,
    open_files_max,
)
from shuttle.store.paths import SafeRoot, fsync_dir, pwrite_all
from shuttle.store.recovery import (
    RecoveryReport,
    replay,
    write_staging_file,
)
from shuttle.store.space import (
    ATTR_BYTES_BASE,
    SpaceGuard,
    is_disk_full,
)
from shuttle.store.stats import StoreCounters
from shuttle.store.uploads import UploadTable

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: The reserve file inside the internal directory (see :mod:`shuttle.store.space`).
RESERVE_FILE_NAME = "reserve"


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
        #: Told of every change before it happens (None: nobody is).
        self.change_hook: ChangeHook | None = None
        self._gate = RWLock()  # changes hold it shared; a checkpoint holds it exclusive
        self._ckpt_lock = threading.Lock()
        self._ns_lock = threading.Lock()  # directory creation versus new keys in flight
        self._pending_new: set[str] = set()
        self._adopt_lock = threading.Lock()
        self._prune: set[str] = set()
        self._broken: str | None = None
        try:
            self.layout.create()
            self._lock_fd = self.layout.lock()
        except OSError as exc:
            raise StorageIOError(f"cannot open data directory {self.layout.root!r}: {exc}") from exc
        try:
            self.paths = SafeRoot(self.layout.root)
            self.attrs = AttrTable(self.layout.attrs_dir, self.layout.staging_dir)
            dirty, clean = self.attrs.maps()
            # The two reads an event loop may call look at the same parts of the store.
            view = StoreView(
                self,
                self._locks,
                cast(dict[str, Any], dirty),
                cast(dict[str, Any], clean),
                self.cache,
                self.counters,
            )
            #: What the loop-side reads look at; its ``closed`` is the store's (close()).
            self._view = view
            #: The lock-free cache-hit read (ObjectStore.read_cached, a node's read lane).
            self.cached_reads = CachedReads(view, self.config.cache_read_bytes_max)
            #: Block-cache misses read on the event loop when the page cache has them
            #: (ObjectStore.read_nowait, a node's read lane).
            self.nowait = NowaitReads()
            #: Object files kept open across reads, one version each; every change
            #: forgets its key's (_change_lock).
            self.open_files = OpenFiles(open_files_max(self.config.open_files_max))
            #: The miss read itself (ObjectStore.read_nowait; a node's read lane calls
            #: it directly, compiled): reads nowait and open_files above at every call.
            self.miss_reads = MissReads(view, self.config.cache_read_bytes_max)
            self.durability = CheckpointSync(self.paths, self.attrs.path_of, self.config.sync_mode)
            log.info("store %s: checkpoints sync by %s", self.layout.root, self.durability.mode)
            self.uploads = UploadTable(self.layout.uploads_dir)
            self.space = SpaceGuard(
                self.layout.root,
                os.path.join(self.layout.internal, RESERVE_FILE_NAME),
                self.config.reserve_bytes,
                owed_bytes=lambda: self.attrs.dirty_count() * ATTR_BYTES_BASE,
            )
            self.recovery = self._recover()
            self.space.restore_reserve()
        except BaseException as exc:
            os.close(self._lock_fd)
            if isinstance(exc, OSError):
                # One clear line for the operator, not a traceback from deep inside.
                cls = DiskFullError if is_disk_full(exc) else StorageIOError
                raise cls(
                    f"cannot open data directory {self.layout.root!r}: {exc}. Nothing "
                    "acknowledged is lost (the journal keeps it); fix the disk and start "
                    "again"
                    + (" after freeing space on its file system." if cls is DiskFullError else ".")
                ) from exc
            raise

    @property
    def lock_fd(self) -> int:
        """The descriptor holding the data directory's lock: a node's worker processes
        inherit it, so no other store opens the directory while one of them lives."""
        return self._lock_fd

    # --- lifecycle -------------------------------------------------------------------

    def _recover(self) -> RecoveryReport:
        ckpt_seq = self.layout.read_checkpoint_seq()
        self.journal = Journal(self.layout.journal_file, next_seq=ckpt_seq + 1)
        records = list(self.journal.read_valid(after_seq=ckpt_seq))
        try:
            report = replay(records, self.paths, self.layout, self.attrs)
        except OSError as exc:
            # A redo met a full disk: give it the reserve (every record is redoable).
            if not (is_disk_full(exc) and self.space.release_reserve()):
                raise
            report = replay(records, self.paths, self.layout, self.attrs)
        self.layout.clear_dir(self.layout.staging_dir)
        self.layout.clear_dir(self.layout.uploads_dir)
        if records or self.journal.size_bytes:
            try:
                self.checkpoint()
            except DiskFullError as exc:
                # The journal keeps every change and the attributes are in memory: the
                # node serves, and the next checkpoint runs once removes made room.
                log.warning("store %s: recovered without a checkpoint: %s", self.layout.root, exc)
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
        if self._view.closed:
            return
        try:
            if checkpoint and self._broken is None:
                self.checkpoint()
        finally:
            self._view.closed = True  # the loop-side reads decline from here on
            self.open_files.close()
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

        On a full disk it uses the reserve; if that is not enough it raises
        :class:`DiskFullError` and leaves the journal as it was (nothing is lost; the
        next checkpoint tries again).
        """
        try:
            self._checkpoint()
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            if not self.space.release_reserve():
                raise DiskFullError(
                    f"checkpoint of {self.layout.root!r} postponed: its file system is full "
                    f"({exc}). Remove objects or give it more space."
                ) from exc
            try:
                self._checkpoint()
            except OSError as again:
                if not is_disk_full(again):
                    raise
                raise DiskFullError(
                    f"checkpoint of {self.layout.root!r} postponed: its file system is full "
                    f"even without the reserve ({again}). Remove objects or give it more space."
                ) from again
        self.space.restore_reserve()

    def _checkpoint(self) -> None:
        with self._ckpt_lock, self._gate.write():
            if self._broken is not None:
                # A journaled change may be unapplied: emptying the journal would lose it.
                # Only reopening (which redoes the journal) may checkpoint now.
                return
            if self.journal.size_bytes == 0 and self.attrs.dirty_count() == 0:
                return
            changed = self.attrs.dirty_keys()  # every object changed since the last one
            self.attrs.flush()
            for dir_key in sorted(self._prune, key=len, reverse=True):
                self.paths.prune_empty_dirs(dir_key)
            self._prune.clear()
            self._make_durable(changed)
            self.layout.write_checkpoint_seq(self.journal.next_seq - 1)
            self.journal.reset()
            self.counters.add(checkpoints=1)

    def _make_durable(self, keys: list[str]) -> None:
        """Sync what changed since the last checkpoint (object files, attribute files,
        directories: :mod:`shuttle.store.durability`). A failed sync cannot be retried
        (the kernel may have dropped the pages and cleared the error), so it poisons the
        store: the journal stays, and reopening redoes it. Caller holds the gate."""
        try:
            self.durability.sync(keys)
        except OSError as exc:
            self._broken = f"checkpoint sync failed: {exc}"
            log.error("store %s: %s", self.layout.root, self._broken)
            raise StorageIOError(
                f"a checkpoint could not make changes durable on the node's disk ({exc}). "
                "The journal keeps every change; the store refuses changes until the node "
                "restarts, and recovery then redoes them. Check the disk and restart."
            ) from exc

    def _maybe_checkpoint(self) -> None:
        cfg = self.config
        if (
            self.journal.size_bytes > cfg.journal_bytes_max
            or self.journal.records_since_reset > cfg.journal_records_max
        ) and not self._ckpt_lock.locked():
            try:
                self.checkpoint()
            except DiskFullError as exc:
                # The change that got us here is durable; the journal just grows.
                log.warning("store %s: %s", self.layout.root, exc)

    def _make_room(self, need_bytes: int) -> None:
        """Before admitting a change of ``need_bytes``: if the disk is short of it and the
        journal holds bytes (a second copy of small puts), checkpoint to free them.
        Caller holds no key lock."""
        if self.journal.size_bytes and self.space.short_of(need_bytes):
            with contextlib.suppress(DiskFullError):
                self.checkpoint()

    def _check_size(self, size: int, what: str) -> None:
        """Refuse an object size above this store's limit, naming the limit and the flag."""
        limit = self.config.object_bytes_max
        if size > limit:
            raise LimitExceededError(
                f"{what} would make an object of {size} bytes; objects on this node are "
                f"limited to {limit} bytes ({limit / (1 << 30):g} GiB, set by `shuttle serve "
                "--object-bytes-max`). Split the data into several objects, or raise the limit."
            )

    def _append(self, meta: dict[str, Any], data: Any = b"", *, frees_space: bool = False) -> int:
        """Journal a change (step 2). A change that frees space (remove, shrinking
        truncate) is never refused for want of it: on ENOSPC the reserve goes and the
        append is retried. Caller holds the gate shared."""
        try:
            return self.journal.append(meta, data)
        except OSError as exc:
            if not (frees_space and is_disk_full(exc) and self.space.release_reserve()):
                raise
        return self.journal.append(meta, data)

    # --- attributes ------------------------------------------------------------------

    def _current(self, key: str, *, create_ok: bool = False) -> StoredAttrs | None:
        """The attributes of ``key`` or None; adopts a file that has none. Caller holds
        the key's lock (either mode) and not the gate."""
        rec = self.attrs.get(key)
        if isinstance(rec, StoredAttrs):
            return rec if not rec.stale_chunks else self._rechunk_stale(rec)
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

    def _rechunk_stale(self, rec: StoredAttrs) -> StoredAttrs:
        """Re-chunk an object whose record predates the chunking in use (format 1): once,
        on first use after an upgrade; the record is written at the next checkpoint. The
        version, mtime and whole-object hash stay (the bytes did not change)."""
        fd = self.paths.open_file(rec.key, os.O_RDONLY)
        try:
            chunks = chunk_file(fd, rec.size)
        finally:
            os.close(fd)
        fresh = StoredAttrs(rec.key, rec.size, rec.version, rec.mtime_ns, rec.hash, tuple(chunks))
        self.attrs.set(rec.key, fresh)
        self.counters.add(objects_rechunked=1)
        return fresh

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
                self._check_size(written + len(piece), "this put")
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
        if self._view.closed:
            raise StorageIOError("the store is closed. Open it again.")
        if self._broken is not None:
            raise StorageIOError(
                f"the store refuses changes after a disk error ({self._broken}). Restart the "
                "node: recovery completes every acknowledged change."
            )

    def _change_lock(self, key: str) -> AbstractContextManager[object]:
        """The key's exclusive lock for a change, entered after the change hook (if
        any) let the change go ahead. Once it is held, the key's kept open file is
        forgotten (closed): no read through it can then outlive the change."""
        locked = forgetting(self.open_files, key, self._locks.write(key))
        hook = self.change_hook
        if hook is None:
            return locked
        return hooked(hook, key, locked)

    def _open_for_read(self, key: str) -> int:
        """A new read-only descriptor of ``key``'s file (what :class:`OpenFiles` keeps)."""
        return self.paths.open_file(key, os.O_RDONLY)

    def _op(self, name: str) -> OpScope:
        """Count an operation and turn OSErrors into StorageIOError."""
        self.counters.op(name)
        return OpScope(self.counters, name)

    def _apply(self, change: Callable[[], _T]) -> _T:
        """Step 3, ``change()``: it must be redoable (the journal's records are). On a
        full disk the reserve goes and the change runs again; any other failure after
        the record is durable poisons the store (reopening redoes the record)."""
        try:
            try:
                return change()
            except OSError as exc:
                if is_out_of_descriptors(exc):
                    self.open_files.clear()  # the files kept open for reads first
                    return retry_while_out_of_descriptors(change)
                if not (is_disk_full(exc) and self.space.release_reserve()):
                    raise
                log.warning("store %s: used the reserve to finish a change", self.layout.root)
            return change()
        except BaseException as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            log.error("store %s: change failed after journaling: %s", self.layout.root, exc)
            if isinstance(exc, OSError):
                raise StorageIOError(
                    f"a change failed on the node's disk after it was journaled ({exc}); it "
                    "may or may not show until the node restarts, and the store refuses "
                    "changes until then. Restart the node (free space first if the disk is "
                    "full): recovery completes the change."
                ) from exc
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
