"""The RADOS store: objects in a Ceph pool through librados, so that several nodes
("gateways") can serve one pool and a node's death loses nothing.

Layout (docs/storage-format.md, "The RADOS store"): each Shuttle object is one RADOS
object named by its key, holding the data, with the attributes (size, mtime, blake3 of
the whole, content-defined chunks) in its xattr ``shuttle.attrs``, written in the same
operation as the data. The version is RADOS's own object version (``user_version``):
librados reports it after every operation, every change bumps it, and it grows per
placement group, so it never repeats for a key even across remove and re-create.

Every change is one RADOS write operation guarded by ``assert_version`` (or an
exclusive create for a new key): a compare-and-set, atomic on the OSDs, durable on
every replica when it returns. A change that loses a race with another gateway is
redone from the new state (unconditional) or fails with VersionMismatchError
(conditional). There is no journal, no recovery and no checkpoint here: RADOS is the
durability, and a gateway keeps nothing that a restart needs.

The node's block cache stays in front, kept coherent between gateways by watch/notify
(:mod:`shuttle.store.rados_watch`): a change of an existing key is announced to every
gateway, which drops the key, before it is written, so while its watch is healthy a
gateway serves cached blocks without asking RADOS (on the node's event loop when they
are resident), and otherwise confirms the version with a ``stat`` first
(:mod:`shuttle.store.rados_read`). Streaming reads skip the cache and are pipelined.

Limits: an object is at most :data:`RADOS_OBJECT_BYTES_MAX` (one RADOS object; no
striping yet). Range writes and truncates re-read the object to re-chunk it.
Callback promises are broken by changes made through this node only.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    ShuttleError,
    StorageIOError,
    VersionMismatchError,
)
from shuttle.store.attrs import ObjectAttrs, StoredAttrs, WriteResult, decode_attrs, encode_attrs
from shuttle.store.cache import BlockCache
from shuttle.store.chunking import ChunkRef, chunk_buffer, object_hash, rechunk
from shuttle.store.core import WRITE_BYTES_MAX, ChangeHook, StoreConfig
from shuttle.store.keys import no_object, validate_key, validate_prefix
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing
from shuttle.store.paths import BytesLike
from shuttle.store.rados_aio import AioClient
from shuttle.store.rados_conn import (
    VERSION_ERRNOS,
    CephOptions,
    RadosConnection,
    error_errno,
    raise_storage_error,
)
from shuttle.store.rados_index import list_index, omap_fetcher, shard_of
from shuttle.store.rados_read import Raced, VersionedReader, check_version_number
from shuttle.store.rados_uploads import RadosUpload, RadosUploads
from shuttle.store.rados_watch import Coherence
from shuttle.store.stats import StoreCounters

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Largest object: one RADOS object, written whole in one operation, must stay under
#: the OSDs' ``osd_max_write_size`` (90 MiB) and ``osd_max_object_size`` (128 MiB).
RADOS_OBJECT_BYTES_MAX = 64 << 20

#: The xattr that holds an object's attributes.
ATTRS_XATTR = "shuttle.attrs"

#: Times a change is redone after losing a race with another gateway before giving up.
#: Each loss means another change succeeded, so a livelock needs that many writers.
CAS_ATTEMPTS_MAX = 64
#: Chunk lists of pre-upgrade records kept in memory (a few KiB each for small
#: objects; the memo only spares re-reading an object each stat until it changes).
RECHUNK_MEMO_ENTRIES_MAX = 4096


class RadosStore:
    """An object store in the RADOS pool ``pool`` (namespace ``namespace``): the
    :class:`~shuttle.store.interface.Store` contract, shared by every node opened on the
    same pool and namespace. Thread-safe."""

    def __init__(
        self,
        pool: str,
        *,
        namespace: str = "",
        config: StoreConfig | None = None,
        ceph: CephOptions | None = None,
    ) -> None:
        self.config = config or StoreConfig()
        self.object_bytes_max = min(self.config.object_bytes_max, RADOS_OBJECT_BYTES_MAX)
        self.conn = RadosConnection(pool, namespace, ceph or CephOptions())
        self._rados = self.conn.rados
        self._timeout_s = self.conn.op_timeout_s
        self.counters = StoreCounters()
        self.cache = BlockCache(
            self.config.cache_capacity_bytes, self.config.cache_block_size_bytes
        )
        self.change_hook: ChangeHook | None = None
        self._uploads = RadosUploads()
        self.reader = VersionedReader(self.conn, self.cache, self.config, self.counters)
        self.coherence = Coherence(self.conn, self.reader)
        self.reader.trust = self.coherence
        self.reader.aio = self.aio = self._aio_client(pool, namespace, ceph or CephOptions())
        self.coherence.start()
        self._fetch_keys = omap_fetcher(self.conn.ioctx, self._rados)
        self.races = 0
        #: Chunk lists of objects whose records predate the chunking, by (key, version).
        self._rechunk_memo: dict[tuple[str, int], tuple[ChunkRef, ...]] = {}
        self._rechunk_lock = threading.Lock()

    @property
    def uploads(self) -> RadosUploads:
        return self._uploads

    def _aio_client(self, pool: str, namespace: str, ceph: CephOptions) -> AioClient | None:
        """The client of the reads started on the node's event loop, or None (then the
        thread pool reads every miss, as before): its failure to connect, where the
        store's own client connected, is logged, not fatal."""
        try:
            return AioClient(pool, namespace, ceph)
        except ShuttleError as exc:
            log.warning("RADOS reads will all take the thread pool: %s", exc)
            return None

    # --- RADOS primitives ------------------------------------------------------------

    @contextlib.contextmanager
    def _op(self, name: str, key: str = "") -> Iterator[None]:
        """Count an operation; turn librados errors into Shuttle's."""
        self.counters.op(name)
        try:
            yield
        except ShuttleError as exc:
            self.counters.error(exc.code)
            raise
        except self._rados.Error as exc:
            self.counters.error("storage_io")
            raise_storage_error(f"{name} of {key!r}" if key else name, exc, self._timeout_s)

    def _load(self, k: str) -> StoredAttrs | None:
        """The attributes of ``k`` with its current version, or None if it is missing."""
        io = self.conn.ioctx()
        try:
            # All xattrs in one operation: get_xattr's binding may ask twice for a
            # record over 4 KiB (it grows its buffer), and measured slower even below.
            blob = dict(io.get_xattrs(k)).get(ATTRS_XATTR)
        except self._rados.ObjectNotFound:
            return None
        if blob is None:
            raise StorageIOError(
                f"RADOS object {k!r} has no Shuttle attributes: another tool wrote it. "
                "Remove it with `rados rm`, or write it through Shuttle."
            )
        version = io.get_last_version()
        rec = decode_attrs(blob)
        chunks = rec.chunks
        if rec.stale_chunks:
            chunks = self._rechunked(StoredAttrs(k, rec.size, version, rec.mtime_ns, None, ()))
        return StoredAttrs(k, rec.size, version, rec.mtime_ns, rec.hash, chunks)

    def _rechunked(self, rec: StoredAttrs) -> tuple[ChunkRef, ...]:
        """The chunk list of an object whose record predates the chunking in use (an
        older Shuttle wrote it): computed from its contents, kept in memory by version
        (a gateway cannot rewrite the record without a new version that every other
        gateway would have to be told of); the object's next change writes a fresh one."""
        known = self._rechunk_memo.get((rec.key, rec.version))
        if known is not None:
            return known
        chunks = tuple(chunk_buffer(self._contents(rec)))
        with self._rechunk_lock:
            self._rechunk_memo[(rec.key, rec.version)] = chunks
            while len(self._rechunk_memo) > RECHUNK_MEMO_ENTRIES_MAX:
                self._rechunk_memo.pop(next(iter(self._rechunk_memo)))
        self.counters.add(objects_rechunked=1)
        return chunks

    def _commit(
        self, k: str, rec: StoredAttrs | None, build: Callable[[Any], None], new: StoredAttrs
    ) -> int:
        """One guarded write operation on ``k``: ``build(op)`` plus the new attributes,
        if ``k`` is still as ``rec`` says. Returns the new version; raises _Raced."""
        io = self.conn.ioctx()
        with self._rados.WriteOpCtx() as op:
            if rec is None:
                op.new(self._rados.LIBRADOS_CREATE_EXCLUSIVE)
            else:
                op.assert_version(rec.version)
            build(op)
            op.set_xattr(ATTRS_XATTR, encode_attrs(new))
            try:
                io.operate_write_op(op, k)
            except self._rados.Error as exc:
                if error_errno(exc) in VERSION_ERRNOS:
                    raise Raced from exc
                raise
        return int(io.get_last_version())

    def _index(self, k: str, *, add: bool) -> None:
        io = self.conn.ioctx()
        with self._rados.WriteOpCtx() as op:
            if add:
                io.set_omap(op, (k,), (b"",))
            else:
                io.remove_omap_keys(op, (k,))
            # Removing from a shard that was never written finds no object: fine.
            with contextlib.suppress(self._rados.ObjectNotFound):
                io.operate_write_op(op, shard_of(k))

    def _changed(self, k: str) -> None:
        """After a change through this node: drop the key's cached blocks."""
        self.reader.forget(k)

    def _hooked(self, k: str) -> contextlib.AbstractContextManager[object]:
        hook = self.change_hook
        return hook.changing(k) if hook is not None else contextlib.nullcontext()

    def _change(
        self,
        k: str,
        expected: int | None,
        plan: Callable[[StoredAttrs | None], tuple[Callable[[Any], None], StoredAttrs]],
    ) -> StoredAttrs:
        """Compare-and-set loop of every change but remove: look, plan, write guarded."""
        with self._hooked(k):
            for _attempt in range(CAS_ATTEMPTS_MAX):
                rec = self._load(k)
                _check_version(k, rec, expected)
                try:
                    build, new = plan(rec)
                except Raced:  # it changed while the plan read it
                    self.races += 1
                    continue
                if rec is None:
                    self._index(k, add=True)  # listed before it exists (rados_index)
                else:  # every gateway drops the key first (rados_watch)
                    announced_s = self.coherence.announce(k, rec.version + 1)
                try:
                    version = self._commit(k, rec, build, new)
                except Raced:
                    self.races += 1
                    if expected is not None:
                        _check_version(k, self._load(k), expected)  # raises: it changed
                    continue
                if rec is None:
                    self._index(k, add=True)  # and after, should a remove have raced
                self._changed(k)
                if rec is not None:  # last: it may raise, and the change is made already
                    self.coherence.committed(k, version, announced_s)
                return StoredAttrs(k, new.size, version, new.mtime_ns, new.hash, new.chunks)
        raise StorageIOError(
            f"{k!r} changed {CAS_ATTEMPTS_MAX} times under this change (other gateways "
            "write it constantly); nothing was changed by this call: retry later"
        )

    # --- reads -----------------------------------------------------------------------

    def stat(self, key: str, *, expected_version: int | None = None) -> ObjectAttrs:
        k = validate_key(key)
        with self._op("stat", k):
            rec = self._load(k)
            if rec is None:
                raise no_object(k)
            _check_version(k, rec, expected_version)
            return _complete(rec)

    def stat_is_cached(self, key: str) -> bool:
        return False  # the version lives in RADOS: every stat asks it

    def stat_many(self, keys: Sequence[str]) -> builtins.list[ObjectAttrs | None]:
        checked = [validate_key(k) for k in keys]
        with self._op("stat_many"):
            out: builtins.list[ObjectAttrs | None] = []
            for k in checked:
                rec = self._load(k)
                out.append(None if rec is None else _complete(rec))
            return out

    def read_cached(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | None:
        data = self.reader.read_cached(key, offset, length, expected_version)
        if data is not None:
            self.counters.read_done(len(data))
        return data

    def read_async(
        self,
        key: str,
        offset: int,
        length: int,
        expected_version: int | None,
        wrap: Callable[[bytes], T],
    ) -> asyncio.Future[T] | None:
        """A read that missed :meth:`read_cached`, started on the running event loop: a
        future of ``wrap(bytes)`` that the loop completes, or None (:meth:`read` in a
        thread answers it). See :meth:`VersionedReader.read_async
        <shuttle.store.rados_read.VersionedReader.read_async>`."""
        return self.reader.read_async(key, offset, length, expected_version, wrap)

    def read(
        self,
        key: str,
        offset: int = 0,
        length: int | None = None,
        *,
        expected_version: int | None = None,
        use_cache: bool = True,
    ) -> bytes:
        k = validate_key(key)
        with self._op("read", k):
            if offset < 0 or (length is not None and length < 0):
                raise InvalidArgumentError(
                    f"offset and length must be >= 0, got offset={offset} length={length}"
                )
            for _attempt in range(CAS_ATTEMPTS_MAX):
                try:
                    data = self.reader.read_once(k, offset, length, expected_version, use_cache)
                except Raced:
                    self.races += 1
                    continue
                self.counters.add(bytes_read=len(data))
                return data
            raise StorageIOError(f"{k!r} kept changing while read; retry later")

    def list(
        self,
        prefix: str = "",
        *,
        delimiter: str | None = None,
        start_after: str | None = None,
        limit: int = LIST_PAGE_ENTRIES_MAX,
    ) -> Listing:
        p = validate_prefix(prefix)
        with self._op("list"):
            return list_index(self._fetch_keys, p, delimiter, start_after, limit)

    # --- whole-object changes ----------------------------------------------------------

    def _check_size(self, size: int, what: str) -> None:
        if size > self.object_bytes_max:
            raise LimitExceededError(
                f"{what} would make an object of {size} bytes; objects in this RADOS store "
                f"are limited to {self.object_bytes_max} bytes (one RADOS object each; "
                "striping is not done yet). Split the data into several objects."
            )

    def _put(
        self, k: str, blob: bytes, expected: int | None, given_mtime_ns: int | None = None
    ) -> StoredAttrs:
        whole, chunks = object_hash(blob), tuple(chunk_buffer(blob))
        mtime_ns = time.time_ns() if given_mtime_ns is None else given_mtime_ns

        def plan(rec: StoredAttrs | None) -> tuple[Callable[[Any], None], StoredAttrs]:
            new = StoredAttrs(k, len(blob), 0, mtime_ns, whole, chunks)
            return (lambda op: op.write_full(blob)), new

        done = self._change(k, expected, plan)
        self.counters.add(bytes_written=len(blob))
        return done

    def put(
        self,
        key: str,
        data: BytesLike | Iterable[bytes],
        *,
        expected_version: int | None = None,
        mtime_ns: int | None = None,
    ) -> ObjectAttrs:
        k = validate_key(key)
        with self._op("put", k):
            if isinstance(data, (bytes, bytearray, memoryview)):
                blob = bytes(data)
            else:
                buf = bytearray()
                for piece in data:
                    buf += piece
                    self._check_size(len(buf), "this put")
                blob = bytes(buf)
            self._check_size(len(blob), "this put")
            return _complete(self._put(k, blob, expected_version, mtime_ns))

    def create(self, key: str, *, exclusive: bool = True) -> ObjectAttrs:
        k = validate_key(key)
        try:
            with self._op("create", k):
                return _complete(self._put(k, b"", 0))
        except VersionMismatchError:
            if exclusive:
                raise AlreadyExistsError(
                    f"{k!r} already exists. Use create(exclusive=False) or put to replace it."
                ) from None
        return self.stat(k)

    def remove(self, key: str, *, expected_version: int | None = None) -> None:
        k = validate_key(key)
        with self._op("remove", k):
            self._remove(k, expected_version)

    def _remove(self, k: str, expected: int | None) -> None:
        with self._hooked(k):
            for _attempt in range(CAS_ATTEMPTS_MAX):
                rec = self._load(k)
                if rec is None:
                    self._index(k, add=False)  # a dangling entry (rados_index) goes
                    raise NotFoundError(f"no object {k!r} to remove.")
                _check_version(k, rec, expected)
                announced_s = self.coherence.announce(k, rec.version + 1)
                io = self.conn.ioctx()
                with self._rados.WriteOpCtx() as op:
                    op.assert_version(rec.version)
                    op.remove()
                    try:
                        io.operate_write_op(op, k)
                    except self._rados.Error as exc:
                        if error_errno(exc) not in VERSION_ERRNOS:
                            raise
                        self.races += 1
                        continue
                self._changed(k)
                self._index(k, add=False)
                if self._load(k) is not None:
                    self._index(k, add=True)  # re-created meanwhile: keep it listed
                # Last: it may raise, and the key must be unlisted whatever it says.
                self.coherence.committed(k, rec.version + 1, announced_s)
                return
        raise StorageIOError(f"{k!r} kept changing under a remove; retry later")

    def remove_many(self, keys: Sequence[str]) -> builtins.list[bool]:
        checked = [validate_key(k) for k in keys]
        out = []
        with self._op("remove_many"):
            for k in checked:
                try:
                    self._remove(k, None)
                    out.append(True)
                except NotFoundError:
                    out.append(False)
        return out

    # --- in-place changes ------------------------------------------------------------------

    def _contents(self, rec: StoredAttrs) -> bytearray:
        """The whole current contents of ``rec``'s version (raises _Raced if it moved)."""
        if rec.size == 0:
            return bytearray()
        return bytearray(self.reader.pipelined(rec.key, 0, rec.size, rec.version))

    def set_mtime(
        self, key: str, mtime_ns: int, *, expected_version: int | None = None
    ) -> ObjectAttrs:
        k = validate_key(key)
        with self._op("set_mtime", k):
            if mtime_ns < 0:
                raise InvalidArgumentError(
                    f"mtime_ns must be >= 0 (ns since the epoch), got {mtime_ns}"
                )

            def plan(rec: StoredAttrs | None) -> tuple[Callable[[Any], None], StoredAttrs]:
                if rec is None:
                    raise NotFoundError(f"no object {k!r} to set the mtime of.")
                # Only the attributes change: the guarded write op sets them (a new
                # RADOS version), the data stays as it is.
                new = StoredAttrs(k, rec.size, 0, mtime_ns, rec.hash, rec.chunks)
                return (lambda op: None), new

            return _complete(self._change(k, expected_version, plan))

    def write(
        self,
        key: str,
        offset: int,
        data: BytesLike,
        *,
        expected_version: int | None = None,
        create: bool = False,
    ) -> WriteResult:
        k = validate_key(key)
        with self._op("write", k):
            if offset < 0:
                raise InvalidArgumentError(f"offset must be >= 0, got {offset}")
            if len(data) > WRITE_BYTES_MAX:
                raise LimitExceededError(
                    f"a range write carries at most {WRITE_BYTES_MAX} bytes, got {len(data)}. "
                    "Write in pieces, or use an upload session for a whole large object."
                )
            self._check_size(offset + len(data), f"a write at offset {offset}")
            piece = bytes(data)
            mtime_ns = time.time_ns()

            def plan(rec: StoredAttrs | None) -> tuple[Callable[[Any], None], StoredAttrs]:
                if rec is None and not create:
                    raise NotFoundError(f"no object {k!r} to write; pass create=True to make it.")
                old = self._contents(rec) if rec is not None else bytearray()
                old_size = len(old)
                new = old
                if piece:
                    if offset > len(new):
                        new += bytes(offset - len(new))
                    new[offset : offset + len(piece)] = piece
                chunks = rechunk(
                    rec.chunks if rec is not None else (),
                    new,
                    old_size=old_size,
                    changed_start=min(offset, old_size),
                    changed_end=offset + len(piece),
                )
                attrs = StoredAttrs(k, len(new), 0, mtime_ns, object_hash(new), tuple(chunks))

                def build(op: Any) -> None:
                    if piece:
                        op.write(piece, offset)

                return build, attrs

            done = self._change(k, expected_version, plan)
            self.counters.add(bytes_written=len(piece))
            return WriteResult(k, done.size, done.version, done.mtime_ns)

    def truncate(self, key: str, size: int, *, expected_version: int | None = None) -> WriteResult:
        k = validate_key(key)
        with self._op("truncate", k):
            if size < 0:
                raise InvalidArgumentError(f"size must be >= 0, got {size}")
            self._check_size(size, f"a truncate to {size} bytes")
            mtime_ns = time.time_ns()

            def plan(rec: StoredAttrs | None) -> tuple[Callable[[Any], None], StoredAttrs]:
                if rec is None:
                    raise NotFoundError(f"no object {k!r} to truncate.")
                old = self._contents(rec)
                new = old[:size] + bytes(max(0, size - len(old)))
                chunks = rechunk(
                    rec.chunks,
                    new,
                    old_size=len(old),
                    changed_start=min(size, len(old)),
                    changed_end=min(size, len(old)),
                )
                attrs = StoredAttrs(k, size, 0, mtime_ns, object_hash(new), tuple(chunks))
                return (lambda op: op.truncate(size)), attrs

            done = self._change(k, expected_version, plan)
            return WriteResult(k, done.size, done.version, done.mtime_ns)

    # --- upload sessions ---------------------------------------------------------------

    def begin_upload(
        self, key: str, *, expected_version: int | None = None, owner: int | None = None
    ) -> str:
        k = validate_key(key)
        with self._op("begin_upload", k):
            return self._uploads.begin(k, expected_version, owner).upload_id

    def upload_write(self, upload_id: str, offset: int, data: BytesLike) -> int:
        with self._op("upload_write"):
            up = self._uploads.get(upload_id)
            if offset < 0:
                raise InvalidArgumentError(f"offset must be >= 0, got {offset}")
            self._check_size(offset + len(data), f"an upload write at offset {offset}")
            with up.lock:
                if up.closed:
                    raise NotFoundError(
                        f"upload session {upload_id!r} was committed or aborted meanwhile."
                    )
                self.conn.ioctx().write(up.staging, bytes(data), offset)
                up.size = max(up.size, offset + len(data))
                return up.size

    def commit_upload(self, upload_id: str, *, mtime_ns: int | None = None) -> ObjectAttrs:
        with self._op("commit_upload"):
            up = self._uploads.pop(upload_id)
            try:
                with up.lock:
                    up.closed = True
                    blob = self.reader.pipelined(up.staging, 0, up.size) if up.size else b""
                    if len(blob) < up.size:
                        blob += bytes(up.size - len(blob))  # a sparse tail reads as zeros
                return _complete(self._put(up.key, blob, up.expected_version, mtime_ns))
            finally:
                self._discard([up])

    def abort_upload(self, upload_id: str) -> None:
        with self._op("abort_upload"):
            self._discard([self._uploads.pop(upload_id)])

    def _discard(self, uploads: builtins.list[RadosUpload]) -> None:
        for up in uploads:
            with up.lock:
                up.closed = True
                with contextlib.suppress(self._rados.Error):
                    self.conn.ioctx().remove_object(up.staging)

    def uploads_owned_by(self, owner: int) -> int:
        return self._uploads.owned_by(owner)

    def release_uploads(self, owner: int) -> int:
        theirs = self._uploads.take(lambda u: u.owner == owner)
        self._discard(theirs)
        return len(theirs)

    def expire_uploads(self, idle_s: float) -> int:
        cutoff = time.monotonic() - idle_s
        stale = self._uploads.take(lambda u: u.touched_s < cutoff)
        self._discard(stale)
        return len(stale)

    # --- node services and counters --------------------------------------------------

    def drop_caches(self, keys: Sequence[str]) -> dict[str, int]:
        """Empty the block cache (the OSDs' caches are theirs: ``files_dropped`` is 0)."""
        before = self.cache.stats().bytes_cached
        self.reader.clear()
        return {"block_cache_bytes_dropped": before, "files_dropped": 0}

    def stats(self) -> dict[str, Any]:
        out = self.counters.snapshot()
        out["cache"] = self.cache.stats().as_dict()
        out["uploads_open"] = len(self._uploads)
        out["rados"] = {
            "pool": self.conn.pool,
            "namespace": self.conn.namespace,
            **self.conn.where(),  # conf, keyring, user: what an OSD site needs here
            "races": self.races + self.reader.races,
            "object_bytes_max": self.object_bytes_max,
            **self.conn.stats(),  # reads in flight
            **self.reader.stats(),
            # Reads started on the event loop now (None: every miss takes the pool).
            "aio_in_flight": None if self.aio is None else self.aio.in_flight(),
            "coherence": self.coherence.stats(),
        }
        return out

    def close(self) -> None:
        """Abort open upload sessions and disconnect. Idempotent."""
        self._discard(self._uploads.take(lambda u: True))
        if self.aio is not None:
            self.aio.close()
        # librados aborts the process if shut down with a watch still registered.
        self.conn.close(shutdown=self.coherence.close())

    def __enter__(self) -> RadosStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _complete(rec: StoredAttrs) -> ObjectAttrs:
    assert rec.hash is not None, "the RADOS store writes the whole hash with every change"
    return rec.complete(rec.hash)


def _check_version(k: str, rec: StoredAttrs | None, expected: int | None) -> None:
    check_version_number(k, 0 if rec is None else rec.version, expected)
