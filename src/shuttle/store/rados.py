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
every replica when it returns, announced to the other gateways first
(:mod:`shuttle.store.rados_changes`); this module plans each kind of change. There is
no journal, no recovery and no checkpoint here: RADOS is the
durability, and a gateway keeps nothing that a restart needs.

The node's block cache stays in front, kept coherent between gateways by watch/notify
(:mod:`shuttle.store.rados_watch`): a change of an existing key is announced to every
gateway, which drops the key, before it is written, so while its watch is healthy a
gateway serves cached blocks without asking RADOS (on the node's event loop when they
are resident), and otherwise confirms the version with a ``stat`` first
(:mod:`shuttle.store.rados_read`); a miss is read on the node's event loop, only the
bytes asked for when a whole block would not stay in the cache
(:mod:`shuttle.store.rados_miss`). Streaming reads skip the cache and are pipelined.

Limits: an object is at most :data:`RADOS_OBJECT_BYTES_MAX` (one RADOS object; no
striping yet). Range writes and truncates re-read the object to re-chunk it.
Callback promises are broken by changes made through this node only.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
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
from shuttle.store.attrs import ObjectAttrs, StoredAttrs, WriteResult
from shuttle.store.cache import BlockCache
from shuttle.store.chunking import chunk_buffer, object_hash, rechunk
from shuttle.store.core import WRITE_BYTES_MAX, ChangeHook, StoreConfig
from shuttle.store.keys import no_object, validate_key, validate_prefix
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing
from shuttle.store.paths import BytesLike
from shuttle.store.rados_aio import AioClient
from shuttle.store.rados_changes import CAS_ATTEMPTS_MAX, Changes, check_attrs_version
from shuttle.store.rados_conn import CephOptions, RadosConnection, raise_storage_error
from shuttle.store.rados_index import list_index, omap_fetcher
from shuttle.store.rados_miss import LoopReads
from shuttle.store.rados_read import Raced, VersionedReader
from shuttle.store.rados_uploads import RadosUpload, RadosUploads
from shuttle.store.rados_watch import Coherence
from shuttle.store.stats import StoreCounters

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Largest object: one RADOS object, written whole in one operation, must stay under
#: the OSDs' ``osd_max_write_size`` (90 MiB) and ``osd_max_object_size`` (128 MiB).
RADOS_OBJECT_BYTES_MAX = 64 << 20


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
        self.aio = self._aio_client(pool, namespace, ceph or CephOptions())
        #: Its reads on the node's event loop: trusted cache hits, and misses.
        self.loop_reads = LoopReads(self.reader, self.aio)
        self.changes = Changes(self.conn, self.reader, self.coherence, self.counters)
        self.coherence.start()
        self._fetch_keys = omap_fetcher(self.conn.ioctx, self._rados)
        #: Reads started again because the object changed under them.
        self.races = 0

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

    # --- reads -----------------------------------------------------------------------

    def stat(self, key: str, *, expected_version: int | None = None) -> ObjectAttrs:
        k = validate_key(key)
        with self._op("stat", k):
            rec = self.changes.load(k)
            if rec is None:
                raise no_object(k)
            check_attrs_version(k, rec, expected_version)
            return _complete(rec)

    def stat_is_cached(self, key: str) -> bool:
        return False  # the version lives in RADOS: every stat asks it

    def stat_many(self, keys: Sequence[str]) -> builtins.list[ObjectAttrs | None]:
        checked = [validate_key(k) for k in keys]
        with self._op("stat_many"):
            out: builtins.list[ObjectAttrs | None] = []
            for k in checked:
                rec = self.changes.load(k)
                out.append(None if rec is None else _complete(rec))
            return out

    def read_cached(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | None:
        return self.loop_reads.read_cached(key, offset, length, expected_version)

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
        thread answers it). See :meth:`LoopReads.read_async
        <shuttle.store.rados_miss.LoopReads.read_async>`."""
        return self.loop_reads.read_async(key, offset, length, expected_version, wrap)

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

        done = self.changes.change(k, expected, plan, self.change_hook)
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
            self.changes.remove(k, expected_version, self.change_hook)

    def remove_many(self, keys: Sequence[str]) -> builtins.list[bool]:
        checked = [validate_key(k) for k in keys]
        out = []
        with self._op("remove_many"):
            for k in checked:
                try:
                    self.changes.remove(k, None, self.change_hook)
                    out.append(True)
                except NotFoundError:
                    out.append(False)
        return out

    # --- in-place changes ------------------------------------------------------------------

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

            return _complete(self.changes.change(k, expected_version, plan, self.change_hook))

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
                old = self.changes.contents(rec) if rec is not None else bytearray()
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

            done = self.changes.change(k, expected_version, plan, self.change_hook)
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
                old = self.changes.contents(rec)
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

            done = self.changes.change(k, expected_version, plan, self.change_hook)
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
            "races": self.races + self.changes.races + self.reader.races,
            "object_bytes_max": self.object_bytes_max,
            **self.conn.stats(),  # reads in flight
            **self.reader.stats(),
            **self.loop_reads.stats(),
            # Reads started on the event loop now (None: every miss takes the pool).
            "aio_in_flight": None if self.aio is None else self.aio.in_flight(),
            # How librados hands those reads back: "c" (an eventfd) or "ctypes".
            "aio_completion": None if self.aio is None else self.aio.completion,
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
