"""The object store: a flat namespace of objects kept as real files under a data
directory, with attributes, atomic durable changes, and a block cache in front.

The public operations live here; :mod:`shuttle.store.core` has the machinery they share
(recovery, checkpoints, the change protocol, version checks).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    ShuttleError,
    VersionMismatchError,
)
from shuttle.store.attrs import ObjectAttrs, StoredAttrs, WriteResult
from shuttle.store.cache import Fetch
from shuttle.store.chunking import (
    ChunkRef,
    RechunkStats,
    chunk_buffer,
    object_hash,
    rechunk_file,
)
from shuttle.store.core import (
    OBJECT_SIZE_BYTES_MAX,
    READ_BYTES_MAX,
    WRITE_BYTES_MAX,
    StoreConfig,
    StoreCore,
    is_out_of_descriptors,
)
from shuttle.store.keys import no_object, validate_key, validate_prefix
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing, list_page
from shuttle.store.paths import BytesLike, pread_exact, pwrite_all
from shuttle.store.recovery import (
    overwrite_object,
    rename_into_place,
    unlink_object,
    write_staging_file,
)
from shuttle.store.space import footprint_bytes
from shuttle.store.uploads import discard_all

#: A journal record's header and metadata, about (the key is at most 1 KiB).
_RECORD_BYTES = 1024 + 256

__all__ = [
    "OBJECT_SIZE_BYTES_MAX",
    "READ_BYTES_MAX",
    "WRITE_BYTES_MAX",
    "ObjectStore",
    "StoreConfig",
]


class ObjectStore(StoreCore):
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
                raise no_object(k)
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
        return isinstance(rec, StoredAttrs) and rec.hash is not None and not rec.stale_chunks

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

    def read_cached(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | None:
        """:meth:`read` of ``[offset, offset+length)`` if the block cache holds all of
        it, else None. Never touches the disk and never waits for the key's lock, so an
        event loop may call it (the node answers hits there and sends the rest to its
        thread pool); never raises: None for anything unusual too (a miss, a bad
        argument, a read at or past the end, a change under way), which :meth:`read`
        then answers or raises."""
        # The lookup is CachedReads.read (shuttle.store.fastread, compiled, where the
        # argument for reading without the key's lock is), which a node's read lane
        # calls directly; the checks here make "never raises" hold for any argument
        # (the compiled method would refuse a non-int with TypeError).
        if (
            type(key) is str
            and type(offset) is int
            and type(length) is int
            and (expected_version is None or type(expected_version) is int)
        ):
            return self.cached_reads.read(key, offset, length, expected_version)
        return None

    def read_nowait(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | None:
        """:meth:`read` of ``[offset, offset+length)`` when the kernel's page cache holds
        the blocks it needs, else None; never waits for the disk or for a writer, so an
        event loop may call it after :meth:`read_cached` missed (a node does, and sends
        only what this declines to its thread pool). Never raises: None for anything
        unusual too, which :meth:`read` then answers or raises.

        Exactly the thread path's read, but for how the file is read: under the key's
        lock held shared (taken only if no writer holds it or waits), the same checks,
        and the same :meth:`BlockCache.read <shuttle.blockcache.BlockCache.read>` call,
        whose fetch hands over the blocks read beforehand with ``RWF_NOWAIT``
        (:mod:`shuttle.store.nowait`): the cache's fill rules and counters see a fetch
        like any other. A read the kernel could not answer whole counts nothing here.
        """
        nowait = self.nowait
        if not (
            nowait.enabled
            and type(key) is str
            and type(offset) is int
            and type(length) is int
            and (expected_version is None or type(expected_version) is int)
            and 0 < length <= self.config.cache_read_bytes_max
            and offset >= 0
            and not self._closed
        ):
            return None
        # The key is not validated: only a valid key has attributes in memory, and any
        # other declines here and is checked on the usual way (as in read_cached).
        if not isinstance(self.attrs.peek(key), StoredAttrs):
            return None  # unknown, absent, or attributes still on disk: the usual way
        lock = self._locks.lock_for(key)
        if not lock.try_acquire_read():
            return None  # a change under way or waiting: it may take a while
        try:
            rec = self.attrs.peek(key)  # again, now that no change can run
            if not isinstance(rec, StoredAttrs) or rec.stale_chunks:
                return None
            if expected_version is not None and expected_version != rec.version:
                return None  # the usual way raises the mismatch
            end = min(rec.size, offset + length)
            if offset >= end:
                return None
            cached = bool(self.cache.capacity_bytes)
            if cached:  # the blocks the cache would fetch, read whole
                bsz = self.cache.block_size_bytes
                start, stop = offset // bsz * bsz, min(((end - 1) // bsz + 1) * bsz, rec.size)
            else:
                start, stop = offset, end
            files = self.open_files
            try:
                lease = files.borrow(key, rec.version, self._open_for_read)
            except (ShuttleError, OSError) as exc:
                if isinstance(exc, OSError) and is_out_of_descriptors(exc):
                    files.clear()
                return None  # the usual way says what is wrong
            try:
                blocks = nowait.read(lease.fd, start, stop)
            except OSError:
                return None
            finally:
                files.give_back(lease)
            if blocks is None:
                return None  # not (all) resident: the thread pool reads it
            if not cached:
                data = blocks
            else:
                data = self.cache.read(
                    key,
                    offset,
                    end - offset,
                    rec.size,
                    lambda lo, hi: blocks[lo - start : hi - start],
                )
            self.counters.read_done(len(data))
            return data
        finally:
            lock.release_read()

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
        if use_cache and length is not None:
            data = self.read_cached(key, offset, length, expected_version)
            if data is not None:
                return data
        k = validate_key(key)
        with self._op("read"), self._locks.read(k):
            rec = self._current(k)
            if rec is None:
                raise no_object(k)
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
                data = self.cache.read(k, offset, n, rec.size, self._fetcher(k, rec.version))
            else:
                fd = self.paths.open_file(k, os.O_RDONLY)
                try:
                    data = pread_exact(fd, n, offset)
                finally:
                    os.close(fd)
            self.counters.add(bytes_read=len(data))
            return data

    def _fetcher(self, key: str, version: int) -> Fetch:
        """The block cache's fetch of ``key`` at ``version``, through the kept open file
        (:class:`~shuttle.store.openfiles.OpenFiles`). Caller holds the key's lock."""

        def fetch(start: int, stop: int) -> bytes:
            files = self.open_files
            lease = files.borrow(key, version, self._open_for_read)
            try:
                return pread_exact(lease.fd, stop - start, start)
            finally:
                files.give_back(lease)

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
        mtime_ns: int | None = None,
    ) -> ObjectAttrs:
        """Create or replace ``key`` with ``data`` (bytes, or an iterable of byte pieces
        that is consumed once). Atomic: readers and a crash see the old or the new object.
        ``mtime_ns``: the modification time to record (a copy keeps its source's, as
        ``cp -p`` does); None: now.

        Returns the new attributes (durable when this returns).

        Raises:
            VersionMismatchError: ``expected_version`` given and different.
            LimitExceededError: more than ``StoreConfig.object_bytes_max`` bytes.
            DiskFullError: the disk cannot hold it (nothing changed).
        """
        k = validate_key(key)
        with self._op("put"):
            self._check_usable()
            if isinstance(data, (bytes, bytearray, memoryview)):
                self._check_size(len(data), "this put")
                blob: BytesLike | None = data
                staged = None
            else:
                blob, staged = self._spool(data)
            if blob is not None and len(blob) <= self.config.inline_put_bytes_max:
                whole, chunks = object_hash(blob), chunk_buffer(blob)
                return self._commit_put(
                    k, expected_version, len(blob), whole, chunks, blob, None, mtime_ns
                )
            if staged is None:
                assert blob is not None
                self._make_room(len(blob))
                with self.space.admit(len(blob), f"a put of {k!r}"):
                    staged = write_staging_file(self.layout, blob)
            try:
                size, whole, chunks = self._seal(staged)
                return self._commit_put(
                    k, expected_version, size, whole, chunks, b"", staged, mtime_ns
                )
            finally:
                # After a failure past the journal record, recovery needs the staged file.
                if self._broken is None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(staged)

    def _commit_put(
        self,
        key: str,
        expected_version: int | None,
        size: int,
        whole: bytes,
        chunks: builtins.list[ChunkRef],
        inline: BytesLike,
        staged: str | None,
        mtime_ns: int | None = None,
    ) -> ObjectAttrs:
        # A staged put's bytes are on disk already (the rename moves them).
        need = footprint_bytes(
            data_bytes=len(inline), journal_bytes=len(inline) + _RECORD_BYTES, size_bytes=size
        )
        self._make_room(need)
        with self._change_lock(key):
            rec = self._current(key, create_ok=True)
            self._check_version(key, rec, expected_version)
            self._check_usable()
            if mtime_ns is None:
                mtime_ns = time.time_ns()
            meta: dict[str, Any] = {"op": "put", "key": key, "mtime_ns": mtime_ns}
            if staged is not None:
                meta["staged"] = os.path.relpath(staged, self.layout.internal)
            admit = self.space.admit(need, f"a put of {key!r}")
            with admit, self._gate.read(), self._reserve(key, rec):
                seq = self._append(meta, inline if staged is None else b"")

                def apply() -> StoredAttrs:
                    if staged is None:
                        overwrite_object(self.paths, key, inline)
                    else:
                        rename_into_place(self.paths, staged, key)
                    new = StoredAttrs(key, size, seq, mtime_ns, whole, tuple(chunks))
                    self.attrs.set(key, new)
                    self.cache.invalidate(key)
                    return new

                new = self._apply(apply)
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
        with self._change_lock(k):
            rec = self._current(k)
            if rec is None:
                raise NotFoundError(f"no object {k!r} to remove.")
            self._check_version(k, rec, expected_version)
            self._check_usable()
            with self._gate.read():
                meta = {"op": "remove", "key": k, "mtime_ns": time.time_ns()}
                self._append(meta, frees_space=True)

                def apply() -> None:
                    unlink_object(self.paths, k)
                    self.attrs.remove(k)
                    self.cache.invalidate(k)
                    if "/" in k:
                        self._prune.add(k.rpartition("/")[0])

                self._apply(apply)

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

    def set_mtime(
        self, key: str, mtime_ns: int, *, expected_version: int | None = None
    ) -> ObjectAttrs:
        """Record ``mtime_ns`` as the object's modification time (what ``touch -d``,
        ``utime`` and ``rsync -t`` set): a change like any other (a new version, durable
        when it returns, promises broken first); the contents, hash and chunks stay.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different.
            InvalidArgumentError: ``mtime_ns`` negative.
        """
        k = validate_key(key)
        if mtime_ns < 0:
            raise InvalidArgumentError(
                f"mtime_ns must be >= 0 (ns since the epoch), got {mtime_ns}"
            )
        with self._op("set_mtime"), self._change_lock(k):
            rec = self._current(k)
            if rec is None:
                raise NotFoundError(f"no object {k!r} to set the mtime of.")
            self._check_version(k, rec, expected_version)
            self._check_usable()
            with self._gate.read():
                # Redo does nothing: recovery takes the mtime of a key's last record.
                seq = self._append({"op": "set_mtime", "key": k, "mtime_ns": mtime_ns})

                def apply() -> StoredAttrs:
                    new = StoredAttrs(k, rec.size, seq, mtime_ns, rec.hash, rec.chunks)
                    self.attrs.set(k, new)
                    return new

                new = self._apply(apply)
            done = self._complete(new)
        self._maybe_checkpoint()
        return done

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
                would pass ``StoreConfig.object_bytes_max``.
            DiskFullError: the disk cannot hold it (nothing changed).
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
            self._check_size(offset + len(data), f"a write at offset {offset}")
            self._make_room(self._write_footprint(offset, len(data)))
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
        with self._change_lock(k):
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
            admit = self.space.admit(self._write_footprint(offset, len(data)), f"a write to {k!r}")
            with admit, self._gate.read(), self._reserve(k, rec):
                seq = self._append(meta, data)

                def apply() -> None:
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

                self._apply(apply)
            self.counters.add(bytes_written=len(data))
            return WriteResult(k, new_size, seq, mtime_ns)

    @staticmethod
    def _write_footprint(offset: int, length: int) -> int:
        # A gap before ``offset`` is a hole: it takes no blocks.
        return footprint_bytes(
            data_bytes=length, journal_bytes=length + _RECORD_BYTES, size_bytes=offset + length
        )

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
            LimitExceededError: size above ``StoreConfig.object_bytes_max``.
            DiskFullError: an extending truncate on a full disk (a shrinking one always
                works: it frees space).

        Extending costs what the chunk list costs, not what the zeros would: the new
        range is a hole, chunked without reading it (and recovered the same way).
        """
        k = validate_key(key)
        with self._op("truncate"):
            if size < 0:
                raise InvalidArgumentError(f"size must be >= 0, got {size}")
            self._check_size(size, f"a truncate to {size} bytes")
            with self._change_lock(k):
                rec = self._current(k)
                if rec is None:
                    raise NotFoundError(f"no object {k!r} to truncate.")
                self._check_version(k, rec, expected_version)
                self._check_usable()
                mtime_ns = time.time_ns()
                meta = {"op": "truncate", "key": k, "mtime_ns": mtime_ns, "size": size}
                shrinks = size <= rec.size
                need = (
                    0
                    if shrinks
                    else footprint_bytes(data_bytes=0, journal_bytes=_RECORD_BYTES, size_bytes=size)
                )
                admit = (
                    contextlib.nullcontext()
                    if shrinks
                    else self.space.admit(need, f"a truncate of {k!r} to {size} bytes")
                )
                with admit, self._gate.read():
                    seq = self._append(meta, frees_space=shrinks)

                    def apply() -> None:
                        fd = self.paths.open_file(k, os.O_RDWR)
                        try:
                            os.ftruncate(fd, size)
                            start = min(size, rec.size)
                            chunks = self._rechunk(fd, rec, rec.size, size, start, 0)
                        finally:
                            os.close(fd)
                        self.attrs.set(k, StoredAttrs(k, size, seq, mtime_ns, None, chunks))
                        self.cache.truncate(k, rec.size, size)

                    self._apply(apply)
                result = WriteResult(k, size, seq, mtime_ns)
        self._maybe_checkpoint()
        return result

    # --- upload sessions ---------------------------------------------------------------

    def begin_upload(
        self, key: str, *, expected_version: int | None = None, owner: int | None = None
    ) -> str:
        """Start streaming a whole new version of ``key``; returns the upload id.

        Nothing is visible until :meth:`commit_upload`. ``expected_version`` is checked
        at commit. Sessions do not survive a restart of the node; those of an ``owner``
        (a client connection) end when :meth:`release_uploads` is called for it.

        Raises:
            LimitExceededError: the owner has too many sessions open.
            NodeBusyError: the node's sessions are all in use.
        """
        k = validate_key(key)
        with self._op("begin_upload"):
            self._check_usable()
            return self.uploads.begin(k, expected_version, owner).upload_id

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
            self._check_size(offset + len(data), f"an upload write at offset {offset}")
            with upload.lock, self.space.admit(len(data), f"an upload write to {upload.key!r}"):
                if upload.fd < 0:
                    raise NotFoundError(
                        f"upload session {upload_id!r} was committed or aborted meanwhile."
                    )
                pwrite_all(upload.fd, data, offset)
                upload.size = max(upload.size, offset + len(data))
                upload.bytes_written += len(data)
                return upload.size

    def commit_upload(self, upload_id: str, *, mtime_ns: int | None = None) -> ObjectAttrs:
        """Make the upload the object's new contents, atomically and durably; the session
        ends whatever the outcome. ``mtime_ns`` as for :meth:`put`.

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
                    upload.key,
                    upload.expected_version,
                    size,
                    whole,
                    chunks,
                    b"",
                    upload.path,
                    mtime_ns,
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

    def uploads_owned_by(self, owner: int) -> int:
        """How many open upload sessions ``owner`` (a connection) has."""
        return self.uploads.owned_by(owner)

    def release_uploads(self, owner: int) -> int:
        """Abort the sessions ``owner`` opened (its connection closed); returns how many."""
        theirs = self.uploads.release(owner)
        discard_all(theirs)
        return len(theirs)

    def expire_uploads(self, idle_s: float) -> int:
        """Abort sessions idle for more than ``idle_s`` seconds; returns how many."""
        stale = self.uploads.expire(idle_s)
        discard_all(stale)
        return len(stale)

    # --- node services -------------------------------------------------------------

    def drop_caches(self, keys: Sequence[str]) -> dict[str, int]:
        """Empty the block cache, close the object files kept open for reads, and drop
        ``keys`` from the OS page cache (cold runs).
        Returns ``block_cache_bytes_dropped`` and ``files_dropped``.

        Raises NotFoundError (or InvalidKeyError) for a key that names no object file."""
        before = self.cache.stats().bytes_cached
        self.cache.clear()
        self.open_files.clear()  # cold: no file kept open either
        dropped = 0
        for key in keys:
            fd = self.paths.open_file(validate_key(key), os.O_RDONLY)
            try:
                # Written back first: the kernel keeps dirty pages through DONTNEED, and
                # a node reads what the page cache holds on its event loop (nowait.py),
                # so a "cold" read of a just-written object would not be cold at all.
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                dropped += 1
            finally:
                os.close(fd)
        return {"block_cache_bytes_dropped": before, "files_dropped": dropped}

    # --- counters --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of the store, its journal and its block cache, and the space on its
        file system (``space``: total, used and free bytes, the reserve, and the
        journal's bytes and share of the used space), as plain types."""
        out = self.counters.snapshot()
        out["journal"] = {
            "records": self.journal.records_appended,
            "syncs": self.journal.syncs,
            "bytes": self.journal.bytes_appended,
            "pending_bytes": self.journal.size_bytes,
        }
        out["cache"] = self.cache.stats().as_dict()
        out["nowait"] = self.nowait.stats()
        out["open_files"] = self.open_files.stats()
        out["uploads_open"] = len(self.uploads)
        space = self.space.snapshot()
        # The journal's share of the used space: a second copy of small puts and range
        # writes, freed at the next checkpoint (docs/operations.md).
        space["journal_bytes"] = self.journal.size_bytes
        space["journal_share"] = self.journal.size_bytes / max(1, space["used_bytes"])
        out["space"] = space
        return out
