"""The asyncio client: what the run-time (and any asyncio program) uses.

:class:`AsyncClient` is :class:`~shuttle.client.client.Client` for an event loop: the
same requests and answers (both are built and parsed by :mod:`shuttle.client.calls`),
conditional writes (``expected_version``), the same limits, retry of idempotent calls
on a dropped connection, and the client cache validated at open (``check``). Each
node has one :class:`~shuttle.net.aio.AsyncConnection`, shared by every coroutine.

Validation at open: ``check`` (a stat first) and ``speculative`` (open at once on the
cached copy, the stat runs alongside as a task; the reader's ``checkpoint()`` and
``close()`` raise ``StaleDataError`` if the copy was stale), as docs/consistency.md
states them. What the sync client has and this one does not: the ``callback`` mode (a
listener thread per node long-polls on a blocking connection of its own, and its
promise bookkeeping is guarded by thread locks; choosing it raises
:class:`~shuttle.errors.InvalidArgumentError` saying so), ``speculate`` (thread and
fork branches), lookaside stores (SQLite connections used from threads) and ``get_to``.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from shuttle.client import calls
from shuttle.client.cache import (
    CLIENT_BLOCK_BYTES_DEFAULT,
    CLIENT_CACHE_BYTES_DEFAULT,
    VERSIONS_KEPT_MAX,
    ClientCache,
    _blocks_name,
)
from shuttle.client.calls import PIECE_BYTES_DEFAULT, WINDOW_DEFAULT, Op, Pieces
from shuttle.client.connections import counter_totals
from shuttle.client.integrity import (
    CheckedPieces,
    RangeVerifier,
    UploadHasher,
    check_written,
)
from shuttle.client.model import Chunk, NodeAddress, ObjectInfo, WriteInfo
from shuttle.client.rados_direct import CephOptions, DirectReads
from shuttle.client.routing import node_for_key, node_named, positions_by_node
from shuttle.client.validation import MODES, VALIDATION_DEFAULT
from shuttle.client.validation.speculative import SpeculativeCheck
from shuttle.errors import ClosedFileError, InvalidArgumentError, NotFoundError, ShuttleError
from shuttle.net.aio import AsyncConnection as AsyncConnection  # re-exported: its old home
from shuttle.net.blocking_stream import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S
from shuttle.net.shaping import Link
from shuttle.net.tls import ClientTls
from shuttle.wire import Response
from shuttle.wire.events import Payload

#: Validation modes an :class:`AsyncClient` can open with (see the module docstring).
ASYNC_MODES = frozenset({"check", "speculative"})

Source = Pieces | str | Path


class AsyncClient:
    """The asyncio file API over a cluster's nodes (one shared connection per node).

    The arguments are :class:`~shuttle.client.client.Client`'s: ``key`` is the
    cluster key, if the nodes require one; ``validation`` the mode :meth:`open`
    validates the cache with (``check`` or ``speculative`` here); ``rados_direct``
    the user's own Ceph credentials, with which :meth:`read` reads a small range that
    misses a RADOS node's cache from the OSDs itself (its librados reads in the loop's
    default executor).
    """

    def __init__(
        self,
        nodes: Sequence[NodeAddress],
        *,
        cache_bytes: int = CLIENT_CACHE_BYTES_DEFAULT,
        cache_block_bytes: int = CLIENT_BLOCK_BYTES_DEFAULT,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        client_name: str = "shuttle-async-client",
        piece_bytes: int = PIECE_BYTES_DEFAULT,
        window: int = WINDOW_DEFAULT,
        key: bytes | None = None,
        principal: str | None = None,
        validation: str = VALIDATION_DEFAULT,
        tls: ClientTls | None = None,
        rados_direct: CephOptions | None = None,
    ) -> None:
        if not nodes:
            raise InvalidArgumentError("a client needs at least one node address")
        calls.check_tuning(piece_bytes, window)
        self.nodes = list(nodes)
        #: Reads of RADOS node misses from RADOS itself (None: off, the default;
        #: :class:`~shuttle.client.client.Client`'s ``rados_direct``).
        self.rados_direct = DirectReads(rados_direct) if rados_direct is not None else None
        self.cache = ClientCache(cache_bytes, cache_block_bytes)
        self.piece_bytes, self.window = piece_bytes, window
        self.request_timeout_s = request_timeout_s
        #: The key this client proves it holds (None: it has none): the cluster key,
        #: or principal ``principal``'s.
        self.key = key
        self.principal = principal
        #: TLS to the nodes (the cluster's CA), or None for plain connections.
        self.tls = tls
        self.validation = _check_mode(validation)
        self._validations: dict[str, dict[str, int]] = {}
        #: The attributes each key was last validated at (the ``speculative`` copy).
        self._known: dict[str, ObjectInfo] = {}
        self._conns = {
            n.node_id: AsyncConnection(
                n.host,
                n.port,
                link=Link(n.link) if n.link is not None and not n.link.is_unshaped else None,
                client_name=client_name,
                connect_timeout_s=connect_timeout_s,
                request_timeout_s=request_timeout_s,
                key=key,
                principal=principal,
                tls=tls,
            )
            for n in self.nodes
        }

    # --- connections -----------------------------------------------------------------

    def connection(self, node: NodeAddress) -> AsyncConnection:
        return self._conns[node.node_id]

    def node_for(self, key: str) -> NodeAddress:
        """The node that holds ``key``."""
        return node_for_key(self.nodes, key)

    def node(self, node_id: str) -> NodeAddress:
        """The node called ``node_id`` (or addressed ``host:port``)."""
        return node_named(self.nodes, node_id)

    async def call(
        self,
        node: NodeAddress,
        op: str,
        args: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = True,
    ) -> Response:
        """Make one request of ``node`` (the escape hatch for any registered operation)."""
        return await self._conns[node.node_id].call(op, args, payload, idempotent=idempotent)

    async def _send(self, op: Op, node: NodeAddress | None = None) -> Response:
        """Make the request ``op`` of ``node`` (by default the node of its key)."""
        conn = self._conns[(node or self.node_for(op.key)).node_id]
        return await conn.call(op.op, op.args, op.payload, idempotent=op.idempotent)

    async def _pipeline(self, node: NodeAddress, ops: Iterator[Op]) -> AsyncIterator[Response]:
        """The answers to ``ops``, in order, keeping ``window`` of them in flight."""
        conn = self._conns[node.node_id]
        loop = asyncio.get_running_loop()
        pending: deque[asyncio.Task[Response]] = deque()
        try:
            for op in ops:
                if len(pending) >= self.window:
                    yield await pending.popleft()
                call = conn.call(op.op, op.args, op.payload, idempotent=op.idempotent)
                pending.append(loop.create_task(call))
            while pending:
                yield await pending.popleft()
        finally:
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    def forget(self, key: str) -> None:
        """This client changed or removed ``key``: drop what it cached of it."""
        self.cache.forget(key)
        self._known.pop(key, None)

    async def close(self) -> None:
        """Close every connection (the client reconnects if used again)."""
        for conn in self._conns.values():
            await conn.close()
        if self.rados_direct is not None:
            self.rados_direct.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- attributes --------------------------------------------------------------------

    async def stat(self, key: str) -> ObjectInfo:
        """Attributes of ``key`` (size, version, mtime, content hash, chunks)."""
        return calls.object_info(await self._send(calls.stat(key)))

    async def chunks(self, key: str) -> builtins.list[Chunk]:
        """The whole chunk list of ``key`` (paged; ``VersionMismatchError`` if it changes)."""
        info = await self.stat(key)
        out = builtins.list(info.chunks)
        while len(out) < info.chunks_total:
            out += calls.chunks(await self._send(calls.chunks_page(key, len(out), info.version)))
        return out

    async def exists(self, key: str) -> bool:
        try:
            await self.stat(key)
        except NotFoundError:
            return False
        return True

    def by_node(self, keys: Sequence[str]) -> dict[str, builtins.list[int]]:
        """The positions in ``keys`` of the keys each node holds, by node id."""
        return positions_by_node(keys, self.node_for)

    async def stat_many(self, keys: Sequence[str]) -> builtins.list[ObjectInfo | None]:
        """Attributes of many keys (None where missing): the nodes are asked at once."""
        out: builtins.list[ObjectInfo | None] = [None] * len(keys)
        groups = builtins.list(self.by_node(keys).items())
        answers = await asyncio.gather(
            *(
                self._send(calls.stat_many([keys[i] for i in idxs]), self.node(n))
                for n, idxs in groups
            )
        )
        for (_, idxs), res in zip(groups, answers, strict=True):
            for i, info in zip(idxs, calls.infos(res, [keys[i] for i in idxs]), strict=True):
                out[i] = info
        return out

    # --- reading -------------------------------------------------------------------------

    async def read(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[offset, offset+length)`` of ``key`` (to its end if ``length`` is None):
        one round trip up to the piece size, else pipelined pieces of one version."""
        if length is not None and length <= self.piece_bytes:
            direct = self.rados_direct
            if direct is not None:
                conn = self._conns[self.node_for(key).node_id]
                return await direct.read_async(
                    lambda args: conn.call("read", args), key, offset, length
                )
            return bytes((await self._send(calls.read(key, offset, length))).payload)
        return b"".join([bytes(p) async for p in self.iter_read(key, offset, length)])

    async def get(self, key: str) -> bytes:
        """The whole object ``key`` as bytes."""
        return await self.read(key)

    async def iter_read(
        self,
        key: str,
        offset: int = 0,
        length: int | None = None,
        *,
        info: ObjectInfo | None = None,
    ) -> AsyncIterator[bytes | bytearray]:
        """Pieces of one version of ``key``, ``window`` requests in flight, in order
        (``VersionMismatchError`` if the object changes meanwhile), checked as
        :meth:`Client.iter_read <shuttle.Client.iter_read>` checks them
        (``IntegrityError``)."""
        info = info or await self.stat(key)
        end = info.size if length is None else min(info.size, offset + length)
        if offset >= end:
            return
        checked = CheckedPieces(RangeVerifier.for_object(info, offset, end))
        ops = calls.read_pieces(key, offset, end, self.piece_bytes, info.version)
        async for res in self._pipeline(self.node_for(key), ops):
            for out in checked.add(calls.piece(res)):
                yield out
        for out in checked.finish():
            yield out

    async def open(self, key: str, *, validation: str | None = None) -> AsyncReader:
        """A reader of ``key`` through the client cache, validated by the mode
        ``validation`` (the client's own if None): ``check`` stats it now and keeps
        cached blocks only if the version still matches; ``speculative`` opens at once
        on a cached copy while the stat runs, and the reader's ``checkpoint()`` (and
        ``close()``) raise ``StaleDataError`` if that copy was stale."""
        name = _check_mode(validation or self.validation)
        counts = self._validations.setdefault(
            name, {"opens": 0, "opens_checked": 0, "opens_stale": 0}
        )
        counts["opens"] += 1
        cached = self._known.get(key)
        if name == "speculative" and cached and self.cache.version(key) == cached.version:
            check = asyncio.get_running_loop().create_task(self._check(cached, counts))
            check.add_done_callback(_retrieve)  # a reader never checkpointed: no warning
            return AsyncReader(self, cached, True, check)
        info = await self.stat(key)
        valid = self.cache.validate(info)
        if len(self._known) >= VERSIONS_KEPT_MAX:
            for old in builtins.list(self._known)[: len(self._known) // 2]:
                del self._known[old]
        self._known[key] = info
        return AsyncReader(self, info, valid)

    async def _check(self, cached: ObjectInfo, counts: dict[str, int]) -> tuple[ObjectInfo, bool]:
        """The check of a speculative open: the node's attributes, and whether the copy
        at ``cached`` was stale (the next open then checks first and drops it)."""
        info = await self.stat(cached.key)
        stale = info.version != cached.version
        counts["opens_checked"] += 1
        counts["opens_stale"] += stale
        if stale:
            self._known[cached.key] = info
        return info, stale

    async def _read_cached(self, info: ObjectInfo, offset: int, length: int) -> bytes:
        """Bytes of the validated ``info`` through the cache; one pinned range read (in
        pipelined pieces) fetches the blocks of a read that is not all hits."""
        end = min(offset + length, info.size)
        if offset >= end:
            return b""
        if not self.cache.enabled:
            parts = self.iter_read(info.key, offset, end - offset, info=info)
            return b"".join([bytes(p) async for p in parts])
        hit = self.cache.blocks.read_hit(_blocks_name(info.key, info.version), offset, end)
        if hit is not None:
            return hit
        bsz = self.cache.blocks.block_size_bytes
        base = offset // bsz * bsz
        stop = min(((end - 1) // bsz + 1) * bsz, info.size)
        parts = self.iter_read(info.key, base, stop - base, info=info)
        span = b"".join([bytes(p) async for p in parts])
        return self.cache.read(info, offset, end - offset, lambda a, b: span[a - base : b - base])

    # --- writing -------------------------------------------------------------------------

    async def put(
        self, key: str, source: Source, *, expected_version: int | None = None
    ) -> ObjectInfo:
        """Create or replace ``key`` atomically with ``source`` (bytes, a local path, a
        binary file or an iterable of byte pieces): one request up to
        :data:`~shuttle.client.calls.SINGLE_PUT_BYTES_MAX` (4 MiB) of bytes, else an
        upload session streamed in pieces and made visible at commit. With
        ``expected_version``, only if the object is still at that version
        (``VersionMismatchError`` otherwise). A path or file is read on the loop's thread.
        """
        if isinstance(source, bytes | bytearray | memoryview) and calls.single_put(source):
            op = calls.put(key, source, expected_version)
            res = await self._send(op)
            self.forget(key)
            return calls.put_info(res, op)
        if isinstance(source, str | os.PathLike):
            with open(source, "rb") as f:
                return await self.put(key, f, expected_version=expected_version)
        return await self._upload(key, calls.pieces(source, self.piece_bytes), expected_version)

    async def _upload(
        self, key: str, pieces: Iterator[bytes], expected_version: int | None
    ) -> ObjectInfo:
        node = self.node_for(key)
        upload = calls.upload_id(await self._send(calls.upload_begin(key, expected_version), node))
        sent = UploadHasher()  # the object's hash, to check the commit's answer against

        def writes() -> Iterator[Op]:
            offset = 0
            for piece in pieces:
                sent.update(piece)
                yield calls.upload_write(upload, offset, piece, key=key)
                offset += len(piece)

        try:
            async for _ in self._pipeline(node, writes()):
                pass
            info = calls.object_info(await self._send(calls.upload_commit(upload), node))
        except BaseException:
            with contextlib.suppress(ShuttleError):  # else the node expires it itself
                await self._send(calls.upload_abort(upload), node)
            raise
        self.forget(key)
        return check_written(info, key, sent.size, sent.digest())

    async def write(
        self,
        key: str,
        offset: int,
        data: Payload,
        *,
        expected_version: int | None = None,
        create: bool = False,
    ) -> WriteInfo:
        """Write ``data`` at ``offset`` of ``key`` (extending it); durable when it returns."""
        res = await self._send(calls.write(key, offset, data, expected_version, create))
        self.forget(key)
        return calls.write_info(res)

    async def create(self, key: str, *, exclusive: bool = True) -> ObjectInfo:
        """Create an empty object (``exclusive``: fail with AlreadyExistsError if present)."""
        return calls.object_info(await self._send(calls.create(key, exclusive)))

    async def truncate(
        self, key: str, size: int, *, expected_version: int | None = None
    ) -> WriteInfo:
        res = await self._send(calls.truncate(key, size, expected_version))
        self.forget(key)
        return calls.write_info(res)

    async def remove(self, key: str, *, expected_version: int | None = None) -> None:
        await self._send(calls.remove(key, expected_version))
        self.forget(key)

    async def remove_many(self, keys: Sequence[str]) -> builtins.list[bool]:
        """Remove many keys (the nodes at once); per key, whether it existed."""
        out = [False] * len(keys)
        groups = builtins.list(self.by_node(keys).items())
        answers = await asyncio.gather(
            *(
                self._send(calls.remove_many([keys[i] for i in idxs]), self.node(n))
                for n, idxs in groups
            )
        )
        for (_, idxs), res in zip(groups, answers, strict=True):
            for i, existed in zip(idxs, calls.existed(res), strict=True):
                out[i] = existed
                self.forget(keys[i])
        return out

    # --- listing -------------------------------------------------------------------------

    async def list(self, prefix: str = "") -> builtins.list[str]:
        """Every key under ``prefix``, in order, across all nodes."""
        keys, _ = await self._list(prefix, None)
        return keys

    async def listdir(self, prefix: str = "") -> tuple[builtins.list[str], builtins.list[str]]:
        """``(prefixes, keys)`` directly under ``prefix`` (``/`` separates levels)."""
        keys, prefixes = await self._list(prefix, "/")
        return prefixes, keys

    async def _list(
        self, prefix: str, delimiter: str | None
    ) -> tuple[builtins.list[str], builtins.list[str]]:
        keys: set[str] = set()
        prefixes: set[str] = set()
        for node in self.nodes:
            start_after: str | None = None
            while True:
                op = calls.list_page(prefix, delimiter, start_after)
                page = calls.page(await self._send(op, node))
                keys.update(page.keys)
                prefixes.update(page.prefixes)
                if (start_after := page.next) is None:
                    break
        return sorted(keys), sorted(prefixes)

    # --- nodes and counters ----------------------------------------------------------------

    async def ping(self, node: NodeAddress) -> dict[str, Any]:
        result: dict[str, Any] = (await self.call(node, "ping")).result
        return result

    async def node_stats(self, node: NodeAddress) -> dict[str, Any]:
        result: dict[str, Any] = (await self.call(node, "node.stats")).result
        return result

    async def drop_caches(self, keys: Sequence[str] = ()) -> None:
        """Empty every node's block cache, the OS page cache of ``keys`` on their nodes,
        and this client's cache (for cold-cache measurements)."""
        for node in self.nodes:
            mine = [k for k in keys if self.node_for(k).node_id == node.node_id]
            await self._send(calls.cache_drop(mine), node)
        self.cache.clear()

    def counters(self) -> dict[str, Any]:
        """Requests, round trips, bytes and cache hits so far (``Client.counters``'s keys)."""
        totals = counter_totals(self._conns.values())
        cache = self.cache.stats()
        return {
            **totals,
            "cache_hits": cache["hits"],
            "cache_misses": cache["misses"],
            "cache": cache,
            "validation": {name: dict(n) for name, n in self._validations.items()},
        }


class AsyncReader:
    """A seekable reader over one version of a remote object (``await client.open(key)``)."""

    def __init__(
        self,
        client: AsyncClient,
        info: ObjectInfo,
        cache_was_valid: bool,
        pending: asyncio.Task[tuple[ObjectInfo, bool]] | None = None,
    ) -> None:
        self.client = client
        self.key = info.key
        #: The attributes reads are pinned to (a change on the node makes them fail).
        self.info = info
        self.cache_was_valid = cache_was_valid
        self.closed = False
        self._pos = 0
        #: The check still out (``speculative``), confirmed by :meth:`checkpoint`.
        self._pending = pending

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.info.size}[whence]
        if base + offset < 0:
            raise InvalidArgumentError(f"cannot seek to {base + offset}, before the start")
        self._pos = base + offset
        return self._pos

    async def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes from the position (to the end if negative)."""
        if self.closed:
            raise ClosedFileError(f"read of {self.key!r} after its file was closed; open it again")
        if size < 0:
            size = self.info.size - self._pos
        data = await self.client._read_cached(self.info, self._pos, size)
        self._pos += len(data)
        return data

    async def checkpoint(self) -> None:
        """Wait until the open's validation is in: at once after ``check``; after a
        ``speculative`` open, the check it sent, raising ``StaleDataError`` if the copy
        opened was stale (what was read must not be used)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            done: Future[tuple[ObjectInfo, bool]] = Future()
            done.set_result(await pending)
            SpeculativeCheck(self.info, done).confirm()  # the sync file's words

    async def close(self) -> None:
        """Close, then confirm the open's validation (see :meth:`checkpoint`)."""
        self.closed = True
        await self.checkpoint()

    async def __aenter__(self) -> AsyncReader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _check_mode(name: str) -> str:
    """``name`` if an :class:`AsyncClient` can validate with it, else a clear error."""
    if name in ASYNC_MODES:
        return name
    if name in MODES:
        raise InvalidArgumentError(
            f"validation mode {name!r} is not available on AsyncClient: its machinery is "
            "threads with blocking connections (shuttle.client.validation); use "
            f"{', '.join(sorted(ASYNC_MODES))} here, or Client for {name!r}"
        )
    known = ", ".join(sorted(MODES))
    raise InvalidArgumentError(f"no validation mode {name!r}; choose one of: {known}")
