"""The object store: a flat namespace of objects kept as real files under a data
directory, with attributes, atomic durable changes, and a block cache in front.

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

import builtins
import contextlib
import logging
import os
import stat as stat_mod
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    KeyConflictError,
    LimitExceededError,
    NotFoundError,
    ShuttleError,
    StorageIOError,
    VersionMismatchError,
)
from shuttle.store.attrs import ABSENT, AttrTable, ObjectAttrs, StoredAttrs, WriteResult
from shuttle.store.cache import (
    DEFAULT_BLOCK_SIZE_BYTES,
    DEFAULT_CAPACITY_BYTES,
    BlockCache,
    Fetch,
)
from shuttle.store.chunking import (
    ChunkRef,
    RechunkStats,
    chunk_buffer,
    hash_file,
    hash_file_only,
    object_hash,
    rechunk_file,
)
from shuttle.store.journal import Journal
from shuttle.store.keys import parent_keys, validate_key, validate_prefix
from shuttle.store.layout import Layout, sync_filesystem
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing, list_page
from shuttle.store.locks import KeyLocks, RWLock
from shuttle.store.paths import BytesLike, SafeRoot, fsync_dir, pread_exact, pwrite_all
from shuttle.store.recovery import (
    RecoveryReport,
    overwrite_object,
    rename_into_place,
    replay,
    unlink_object,
    write_staging_file,
)
from shuttle.store.stats import StoreCounters
from shuttle.store.uploads import Upload, UploadTable

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


class ObjectStore:
    """An object store over the data directory ``root``.

    Opening runs recovery (redo of the journal), so an instance always starts from a
    consistent state. One process at a time may open a directory. All methods are
    thread-safe; operations on different keys run in parallel, and on one key reads
    share and changes exclude.

    Conditional operations take ``expected_version``: None means unconditional, 0
    means "the object must not exist", any other value must equal the current version
    (else :class:`VersionMismatchError`, and nothing changes).

    Errors common to all methods: :class:`InvalidKeyError` (bad key, or a symlink on
    its path), :class:`KeyConflictError` (the key's path clashes with another object),
    :class:`StorageIOError` (the disk failed). If a change fails with StorageIOError
    after its journal record was written, the store refuses further changes until it
    is reopened, and reopening completes that change; the caller should treat the
    change as "maybe applied" and stat after restart.
    """

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

    def __enter__(self) -> ObjectStore:
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

    # --- reads -----------------------------------------------------------------------

    def stat(self, key: str, *, expected_version: int | None = None) -> ObjectAttrs:
        """The attributes of ``key``: size, version, mtime, whole-object blake3 hash and
        chunk list.

        The first stat after a range write or truncate hashes the whole object once.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different.
        """
        k = validate_key(key)
        with self._op("stat"), self._locks.read(k):
            rec = self._current(k)
            if rec is None:
                raise NotFoundError(f"no object {k!r}. Check the key, or list its prefix.")
            self._check_version(k, rec, expected_version)
            return self._complete(rec)

    def stat_is_cached(self, key: str) -> bool:
        """True if :meth:`stat` of ``key`` would be answered from memory (attributes cached,
        whole-object hash known). An event-loop server can run such stats inline and send
        the others to a thread: the first stat after a range write hashes the whole object
        (about 0.15 s per 256 MiB here), and a stat of an uncached key reads its attribute
        file. Never raises; an invalid key gives False."""
        try:
            rec = self.attrs.peek(validate_key(key))
        except ShuttleError:
            return False
        return isinstance(rec, StoredAttrs) and rec.hash is not None

    def stat_many(self, keys: Sequence[str]) -> builtins.list[ObjectAttrs | None]:
        """:meth:`stat` of each key, None for a missing object.

        Every key is validated first: one invalid key fails the whole call
        (InvalidKeyError) before any is looked up.
        """
        checked = [validate_key(k) for k in keys]
        out: builtins.list[ObjectAttrs | None] = []
        with self._op("stat_many"):
            for k in checked:
                with self._locks.read(k):
                    rec = self._current(k)
                    out.append(None if rec is None else self._complete(rec))
        return out

    def read(
        self,
        key: str,
        offset: int = 0,
        length: int | None = None,
        *,
        expected_version: int | None = None,
        use_cache: bool = True,
    ) -> bytes:
        """Up to ``length`` bytes of ``key`` from ``offset`` (to the end if None).

        Returns fewer bytes only at the end of the object (``b""`` at or past it).
        Reads up to ``cache_read_bytes_max`` go through the block cache.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different (nothing read).
            InvalidArgumentError: negative offset or length.
            LimitExceededError: more than :data:`READ_BYTES_MAX` requested at once.
        """
        k = validate_key(key)
        with self._op("read"), self._locks.read(k):
            rec = self._current(k)
            if rec is None:
                raise NotFoundError(f"no object {k!r}. Check the key, or list its prefix.")
            self._check_version(k, rec, expected_version)
            if offset < 0 or (length is not None and length < 0):
                raise InvalidArgumentError(
                    f"offset and length must be >= 0, got offset={offset} length={length}"
                )
            end = rec.size if length is None else min(rec.size, offset + length)
            if end - offset > READ_BYTES_MAX:
                raise LimitExceededError(
                    f"a read may return at most {READ_BYTES_MAX} bytes; asked for "
                    f"{end - offset}. Read the object in pieces."
                )
            if offset >= end:
                return b""
            n = end - offset
            if use_cache and self.cache.capacity_bytes and n <= self.config.cache_read_bytes_max:
                data = self.cache.read(k, offset, n, rec.size, self._fetcher(k))
            else:
                fd = self.paths.open_file(k, os.O_RDONLY)
                try:
                    data = pread_exact(fd, n, offset)
                finally:
                    os.close(fd)
            self.counters.add(bytes_read=len(data))
            return data

    def _fetcher(self, key: str) -> Fetch:
        def fetch(start: int, stop: int) -> bytes:
            fd = self.paths.open_file(key, os.O_RDONLY)
            try:
                return pread_exact(fd, stop - start, start)
            finally:
                os.close(fd)

        return fetch

    def list(
        self,
        prefix: str = "",
        *,
        delimiter: str | None = None,
        start_after: str | None = None,
        limit: int = LIST_PAGE_ENTRIES_MAX,
    ) -> Listing:
        """A page of the keys that start with ``prefix``, in string order.

        With ``delimiter="/"`` keys below the next ``/`` are folded into ``prefixes``
        ("directories"). Keep calling with ``start_after=page.next_start_after`` until
        it is None. A listing is not a snapshot: keys changed meanwhile may or may not
        appear.

        Raises:
            InvalidKeyError: malformed prefix.
            InvalidArgumentError: delimiter other than "/" or limit out of range.
        """
        p = validate_prefix(prefix)
        with self._op("list"):
            return list_page(self.paths, p, delimiter, start_after, limit)

    # --- whole-object changes ----------------------------------------------------------

    def put(
        self,
        key: str,
        data: BytesLike | Iterable[bytes],
        *,
        expected_version: int | None = None,
    ) -> ObjectAttrs:
        """Create or replace ``key`` with ``data`` (bytes, or an iterable of byte pieces
        that is consumed once). Atomic: readers and a crash see the old or the new object.

        Returns the new attributes (durable when this returns).

        Raises:
            VersionMismatchError: ``expected_version`` given and different.
            LimitExceededError: more than :data:`OBJECT_SIZE_BYTES_MAX` bytes.
        """
        k = validate_key(key)
        with self._op("put"):
            self._check_usable()
            if isinstance(data, (bytes, bytearray, memoryview)):
                blob: BytesLike | None = data
                staged = None
            else:
                blob, staged = self._spool(data)
            if blob is not None and len(blob) <= self.config.inline_put_bytes_max:
                whole, chunks = object_hash(blob), chunk_buffer(blob)
                return self._commit_put(k, expected_version, len(blob), whole, chunks, blob, None)
            if staged is None:
                assert blob is not None
                staged = write_staging_file(self.layout, blob)
            try:
                size, whole, chunks = self._seal(staged)
                return self._commit_put(k, expected_version, size, whole, chunks, b"", staged)
            finally:
                # After a failure past the journal record, recovery needs the staged file.
                if self._broken is None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(staged)

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

    def _seal(self, path: str) -> tuple[int, bytes, builtins.list[ChunkRef]]:
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

    def _commit_put(
        self,
        key: str,
        expected_version: int | None,
        size: int,
        whole: bytes,
        chunks: builtins.list[ChunkRef],
        inline: BytesLike,
        staged: str | None,
    ) -> ObjectAttrs:
        with self._locks.write(key):
            rec = self._current(key, create_ok=True)
            self._check_version(key, rec, expected_version)
            self._check_usable()
            mtime_ns = time.time_ns()
            meta: dict[str, Any] = {"op": "put", "key": key, "mtime_ns": mtime_ns}
            if staged is not None:
                meta["staged"] = os.path.relpath(staged, self.layout.internal)
            with self._gate.read(), self._reserve(key, rec):
                seq = self.journal.append(meta, inline if staged is None else b"")
                with self._applying():
                    if staged is None:
                        overwrite_object(self.paths, key, inline)
                    else:
                        rename_into_place(self.paths, staged, key)
                    new = StoredAttrs(key, size, seq, mtime_ns, whole, tuple(chunks))
                    self.attrs.set(key, new)
                    self.cache.invalidate(key)
            self.counters.add(bytes_written=size)
        self._maybe_checkpoint()
        return new.complete(whole)

    def create(self, key: str, *, exclusive: bool = True) -> ObjectAttrs:
        """Create an empty object.

        With ``exclusive`` an existing object is an error; without, an existing object is
        left as it is and its attributes are returned.

        Raises:
            AlreadyExistsError: ``exclusive`` and the object exists.
        """
        k = validate_key(key)
        with self._op("create"):
            try:
                return self._commit_put(k, 0, 0, object_hash(b""), [], b"", None)
            except VersionMismatchError:
                if exclusive:
                    raise AlreadyExistsError(
                        f"{k!r} already exists. Use create(exclusive=False) or put to replace it."
                    ) from None
            return self.stat(k)

    def remove(self, key: str, *, expected_version: int | None = None) -> None:
        """Delete ``key``. Its version number is never reused.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different.
        """
        k = validate_key(key)
        with self._op("remove"):
            self._remove(k, expected_version)
        self._maybe_checkpoint()

    def _remove(self, k: str, expected_version: int | None) -> None:
        with self._locks.write(k):
            rec = self._current(k)
            if rec is None:
                raise NotFoundError(f"no object {k!r} to remove.")
            self._check_version(k, rec, expected_version)
            self._check_usable()
            with self._gate.read():
                self.journal.append({"op": "remove", "key": k, "mtime_ns": time.time_ns()})
                with self._applying():
                    unlink_object(self.paths, k)
                    self.attrs.remove(k)
                    self.cache.invalidate(k)
                    if "/" in k:
                        self._prune.add(k.rpartition("/")[0])

    def remove_many(self, keys: Sequence[str]) -> builtins.list[bool]:
        """Remove each key; True where it existed. Keys are validated first (one invalid
        key fails the call before anything is removed); the removals that happened before
        a disk error stay done."""
        checked = [validate_key(k) for k in keys]
        out = []
        with self._op("remove_many"):
            for k in checked:
                try:
                    self._remove(k, None)
                    out.append(True)
                except NotFoundError:
                    out.append(False)
        self._maybe_checkpoint()
        return out

    # --- in-place changes ------------------------------------------------------------------

    def write(
        self,
        key: str,
        offset: int,
        data: BytesLike,
        *,
        expected_version: int | None = None,
        create: bool = False,
    ) -> WriteResult:
        """Write ``data`` at ``offset``, extending the object if needed (a gap reads as
        zeros). Atomic and durable when it returns.

        The chunk list is updated from the chunk before the change until the cut points
        fall back into step; the whole-object hash is recomputed on the next stat.

        Raises:
            NotFoundError: no such object and not ``create``.
            VersionMismatchError: ``expected_version`` given and different.
            InvalidArgumentError: negative offset.
            LimitExceededError: more than :data:`WRITE_BYTES_MAX` bytes, or the object
                would pass :data:`OBJECT_SIZE_BYTES_MAX`.
        """
        k = validate_key(key)
        with self._op("write"):
            if offset < 0:
                raise InvalidArgumentError(f"offset must be >= 0, got {offset}")
            if len(data) > WRITE_BYTES_MAX:
                raise LimitExceededError(
                    f"a range write carries at most {WRITE_BYTES_MAX} bytes, got {len(data)}. "
                    "Write in pieces, or use an upload session for a whole large object."
                )
            if offset + len(data) > OBJECT_SIZE_BYTES_MAX:
                raise LimitExceededError(f"objects are limited to {OBJECT_SIZE_BYTES_MAX} bytes.")
            result = self._write(k, offset, data, expected_version, create)
        self._maybe_checkpoint()
        return result

    def _write(
        self,
        k: str,
        offset: int,
        data: BytesLike,
        expected_version: int | None,
        create: bool,
    ) -> WriteResult:
        with self._locks.write(k):
            rec = self._current(k, create_ok=create)
            if rec is None and not create:
                raise NotFoundError(f"no object {k!r} to write; pass create=True to make it.")
            self._check_version(k, rec, expected_version)
            self._check_usable()
            mtime_ns = time.time_ns()
            old_size = 0 if rec is None else rec.size
            # Like pwrite(2), writing nothing extends nothing (but still bumps the version).
            new_size = max(old_size, offset + len(data)) if data else old_size
            meta = {"op": "write", "key": k, "mtime_ns": mtime_ns, "offset": offset}
            if rec is None:
                meta["create"] = True
            with self._gate.read(), self._reserve(k, rec):
                seq = self.journal.append(meta, data)
                with self._applying():
                    flags = os.O_RDWR | (os.O_CREAT if rec is None else 0)
                    fd = self.paths.open_file(k, flags, create_dirs=rec is None)
                    try:
                        pwrite_all(fd, data, offset)
                        chunks = self._rechunk(fd, rec, old_size, new_size, offset, len(data))
                    finally:
                        os.close(fd)
                    new = StoredAttrs(k, new_size, seq, mtime_ns, None, chunks)
                    self.attrs.set(k, new)
                    self.cache.write(k, offset, data, old_size)
            self.counters.add(bytes_written=len(data))
            return WriteResult(k, new_size, seq, mtime_ns)

    def _rechunk(
        self,
        fd: int,
        rec: StoredAttrs | None,
        old_size: int,
        new_size: int,
        changed_start: int,
        changed_len: int,
    ) -> tuple[ChunkRef, ...]:
        stats = RechunkStats()
        chunks = rechunk_file(
            fd,
            rec.chunks if rec is not None else (),
            old_size=old_size,
            new_size=new_size,
            changed_start=min(changed_start, old_size),
            changed_end=changed_start + changed_len,
            stats=stats,
        )
        self.counters.add(bytes_rechunked=stats.bytes_rechunked, chunks_reused=stats.chunks_reused)
        return tuple(chunks)

    def truncate(self, key: str, size: int, *, expected_version: int | None = None) -> WriteResult:
        """Set the size of ``key`` (cut, or extend with zeros). Atomic and durable.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different.
            InvalidArgumentError: negative size.
            LimitExceededError: size above :data:`OBJECT_SIZE_BYTES_MAX`.
        """
        k = validate_key(key)
        with self._op("truncate"):
            if size < 0:
                raise InvalidArgumentError(f"size must be >= 0, got {size}")
            if size > OBJECT_SIZE_BYTES_MAX:
                raise LimitExceededError(f"objects are limited to {OBJECT_SIZE_BYTES_MAX} bytes.")
            with self._locks.write(k):
                rec = self._current(k)
                if rec is None:
                    raise NotFoundError(f"no object {k!r} to truncate.")
                self._check_version(k, rec, expected_version)
                self._check_usable()
                mtime_ns = time.time_ns()
                meta = {"op": "truncate", "key": k, "mtime_ns": mtime_ns, "size": size}
                with self._gate.read():
                    seq = self.journal.append(meta)
                    with self._applying():
                        fd = self.paths.open_file(k, os.O_RDWR)
                        try:
                            os.ftruncate(fd, size)
                            start = min(size, rec.size)
                            chunks = self._rechunk(fd, rec, rec.size, size, start, 0)
                        finally:
                            os.close(fd)
                        self.attrs.set(k, StoredAttrs(k, size, seq, mtime_ns, None, chunks))
                        self.cache.truncate(k, rec.size, size)
                result = WriteResult(k, size, seq, mtime_ns)
        self._maybe_checkpoint()
        return result

    # --- upload sessions ---------------------------------------------------------------

    def begin_upload(self, key: str, *, expected_version: int | None = None) -> str:
        """Start streaming a whole new version of ``key``; returns the upload id.

        Nothing is visible until :meth:`commit_upload`. ``expected_version`` is checked
        at commit. Sessions do not survive a restart of the node.

        Raises:
            LimitExceededError: too many sessions open.
        """
        k = validate_key(key)
        with self._op("begin_upload"):
            self._check_usable()
            return self.uploads.begin(k, expected_version).upload_id

    def upload_write(self, upload_id: str, offset: int, data: BytesLike) -> int:
        """Write a range of the upload (any order; gaps read as zeros). Returns the
        session's size so far (its highest written end). Not durable until commit.

        Raises:
            NotFoundError: no such open session.
            InvalidArgumentError / LimitExceededError: bad offset, or too large.
        """
        with self._op("upload_write"):
            upload = self.uploads.get(upload_id)
            if offset < 0:
                raise InvalidArgumentError(f"offset must be >= 0, got {offset}")
            if offset + len(data) > OBJECT_SIZE_BYTES_MAX:
                raise LimitExceededError(f"objects are limited to {OBJECT_SIZE_BYTES_MAX} bytes.")
            with upload.lock:
                if upload.fd < 0:
                    raise NotFoundError(
                        f"upload session {upload_id!r} was committed or aborted meanwhile."
                    )
                pwrite_all(upload.fd, data, offset)
                upload.size = max(upload.size, offset + len(data))
                upload.bytes_written += len(data)
                return upload.size

    def commit_upload(self, upload_id: str) -> ObjectAttrs:
        """Make the upload the object's new contents, atomically and durably; the session
        ends whatever the outcome.

        Raises:
            NotFoundError: no such open session.
            VersionMismatchError: the session's ``expected_version`` no longer holds.
        """
        with self._op("commit_upload"):
            upload = self.uploads.pop(upload_id)
            try:
                with upload.lock:
                    os.ftruncate(upload.fd, upload.size)  # a no-op unless writes were sparse
                    upload.close()
                    size, whole, chunks = self._seal(upload.path)
                return self._commit_put(
                    upload.key, upload.expected_version, size, whole, chunks, b"", upload.path
                )
            finally:
                if self._broken is None:
                    upload.discard()

    def abort_upload(self, upload_id: str) -> None:
        """End a session and delete its staging file. Raises NotFoundError if not open."""
        with self._op("abort_upload"):
            upload = self.uploads.pop(upload_id)
            with upload.lock:
                upload.discard()

    def expire_uploads(self, idle_s: float) -> int:
        """Abort sessions idle for more than ``idle_s`` seconds; returns how many."""
        stale: builtins.list[Upload] = self.uploads.expire(idle_s)
        for upload in stale:
            with upload.lock:
                upload.discard()
        return len(stale)

    # --- counters --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of the store, its journal and its block cache (plain types)."""
        out = self.counters.snapshot()
        out["journal"] = {
            "records": self.journal.records_appended,
            "syncs": self.journal.syncs,
            "bytes": self.journal.bytes_appended,
            "pending_bytes": self.journal.size_bytes,
        }
        out["cache"] = self.cache.stats().as_dict()
        out["uploads_open"] = len(self.uploads)
        return out


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
