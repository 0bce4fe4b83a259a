"""The asyncio client: what the run-time (and any asyncio program) uses.

:class:`AsyncConnection` keeps one connection to a node with a reader task that
matches responses to waiting calls by request id, so any number of coroutines can
call concurrently over it (up to the node's in-flight limit) and answers come back in
whatever order the node produces them. Link profiles are applied with
:class:`~shuttle.net.shaping.ShapedStream` on this side, as in the sync client.
:class:`AsyncClient` is the file API over a cluster's nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from shuttle.client.model import NodeAddress, ObjectInfo, WriteInfo
from shuttle.client.routing import node_for_key
from shuttle.errors import (
    InvalidArgumentError,
    RemoteProtocolError,
    RequestTimeoutError,
    ShuttleError,
    UnreachableError,
)
from shuttle.net import auth
from shuttle.net.blocking import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S
from shuttle.net.shaping import Link
from shuttle.wire import (
    Challenge,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Event,
    Goodbye,
    NeedData,
    Request,
    Response,
    Role,
    Welcome,
)
from shuttle.wire.events import Payload

#: Bytes asked of the stream per read by the reader task.
READ_BYTES = 1 << 20
#: Pieces kept in flight by iter_read (as the sync client's window).
WINDOW_DEFAULT = 8
PIECE_BYTES_DEFAULT = 1 << 20


class _Stream(Protocol):
    async def read(self, n: int = -1) -> bytes: ...
    def write(self, data: bytes | bytearray | memoryview) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...
    async def wait_closed(self) -> None: ...


class _PlainStream:
    """A StreamReader/StreamWriter pair behind the same four methods as ShapedStream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def read(self, n: int = -1) -> bytes:
        return await self.reader.read(n)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()

    def close(self) -> None:
        self.writer.close()

    async def wait_closed(self) -> None:
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


class AsyncConnection:
    """One connection to a node, shared by any number of concurrent calls.

    ``key`` (the cluster key) answers the node's challenge, as in
    :class:`~shuttle.net.blocking.BlockingConnection`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        link: Link | None = None,
        client_name: str = "shuttle-async-client",
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        key: bytes | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.link = link
        self.key = key
        self.client_name = client_name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.node_id: str | None = None
        self.requests = 0
        self._conn: Connection | None = None
        self._stream: _Stream | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[Response | ErrorResponse]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._connecting = asyncio.Lock()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def connect(self) -> None:
        """Open the connection and handshake (no-op if open); reconnects after a failure.

        Raises :class:`UnreachableError`, or :class:`AuthenticationError` when the node
        and this client do not share the cluster key (see :mod:`shuttle.net.auth`).
        """
        async with self._connecting:
            if self._conn is not None:
                return
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), self.connect_timeout_s
                )
            except (OSError, TimeoutError) as exc:
                raise UnreachableError(
                    f"cannot reach node {self.address} ({exc}); is it running?"
                ) from exc
            stream: _Stream = (
                self.link.wrap(reader, writer)
                if self.link is not None
                else _PlainStream(reader, writer)
            )
            conn = Connection(Role.CLIENT)
            try:
                welcome = await asyncio.wait_for(
                    self._handshake(stream, conn), self.connect_timeout_s
                )
            except TimeoutError:
                stream.close()
                raise UnreachableError(
                    f"node {self.address} did not complete the handshake within "
                    f"{self.connect_timeout_s:g} s; is it a Shuttle node, and running?"
                ) from None
            except OSError as exc:
                stream.close()
                raise UnreachableError(
                    f"lost the connection to node {self.address} during the handshake ({exc})"
                ) from exc
            except BaseException:
                stream.close()
                raise
            self.node_id = welcome.node_id
            self._conn, self._stream = conn, stream
            self._slots = asyncio.Semaphore(conn.peer_limits.in_flight_max)
            self._reader_task = asyncio.get_running_loop().create_task(
                self._read_loop(stream, conn)
            )

    async def _handshake(self, stream: _Stream, conn: Connection) -> Welcome:
        """The node's challenge, our HELLO answering it, the node's WELCOME (checked)."""
        challenge = await self._next_event(stream, conn)
        if not isinstance(challenge, Challenge):
            raise UnreachableError(
                f"node {self.address} closed the connection before its challenge "
                f"({type(challenge).__name__}); is it shutting down?"
            )
        hello, client_nonce = auth.client_hello(challenge, self.key, self.client_name, self.address)
        stream.write(conn.send_bytes(hello))
        await stream.drain()
        ev = await self._next_event(stream, conn)
        if isinstance(ev, ErrorResponse):
            raise ev.to_exception()
        if not isinstance(ev, Welcome):
            raise RemoteProtocolError(f"node {self.address} answered Hello with {ev!r:.100}")
        auth.check_welcome(ev, challenge, self.key, client_nonce, f"{ev.node_id} ({self.address})")
        return ev

    @staticmethod
    async def _next_event(stream: _Stream, conn: Connection) -> Event:
        while isinstance(ev := conn.next_event(), NeedData):
            conn.receive_data(await stream.read(READ_BYTES))
        return ev

    async def _read_loop(self, stream: _Stream, conn: Connection) -> None:
        failure: ShuttleError = UnreachableError(f"node {self.address} closed the connection")
        try:
            while True:
                data = await stream.read(READ_BYTES)
                conn.receive_data(data)
                while not isinstance(ev := conn.next_event(), NeedData):
                    if isinstance(ev, Response | ErrorResponse) and ev.rid != 0:
                        fut = self._waiting.pop(ev.rid, None)
                        if fut is not None and not fut.done():
                            fut.set_result(ev)
                    elif isinstance(ev, ErrorResponse):
                        failure = UnreachableError(
                            f"node {self.address} closed the connection: {ev.message}"
                        )
                        return
                    elif isinstance(ev, Goodbye | ConnectionClosed):
                        return
                if not data:
                    return
        except ShuttleError as exc:
            failure = exc
        except OSError as exc:
            failure = UnreachableError(f"lost the connection to node {self.address} ({exc})")
        finally:
            self._fail_all(failure)

    def _fail_all(self, failure: ShuttleError) -> None:
        self._conn = None
        if self._stream is not None:
            self._stream.close()
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(failure)

    async def call(
        self, op: str, args: dict[str, Any] | None = None, payload: Payload = b""
    ) -> Response:
        """One request; raises the node's typed error, UnreachableError or RequestTimeoutError."""
        await self.connect()
        assert self._slots is not None
        async with self._slots:
            conn, stream = self._conn, self._stream
            if conn is None or stream is None:
                raise UnreachableError(f"lost the connection to node {self.address}")
            rid = conn.next_request_id()
            fut: asyncio.Future[Response | ErrorResponse] = (
                asyncio.get_running_loop().create_future()
            )
            self._waiting[rid] = fut
            for buffer in conn.send(Request(rid, op, args or {}, payload)):
                stream.write(buffer)
            self.requests += 1
            try:
                await stream.drain()
                ev = await asyncio.wait_for(fut, self.request_timeout_s)
            except TimeoutError:
                self._waiting.pop(rid, None)
                raise RequestTimeoutError(
                    f"node {self.address} did not answer {op!r} within {self.request_timeout_s:g} s"
                ) from None
            except OSError as exc:
                raise UnreachableError(
                    f"lost the connection to node {self.address} ({exc})"
                ) from exc
        if isinstance(ev, ErrorResponse):
            raise ev.to_exception()
        return ev

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        self._conn = None
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader_task
        if stream is not None:
            stream.close()
            await stream.wait_closed()


class AsyncClient:
    """The asyncio file API over a cluster's nodes (one shared connection per node);
    ``key`` is the cluster key, if the nodes require one."""

    def __init__(
        self,
        nodes: Sequence[NodeAddress],
        *,
        piece_bytes: int = PIECE_BYTES_DEFAULT,
        window: int = WINDOW_DEFAULT,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        key: bytes | None = None,
    ) -> None:
        if not nodes:
            raise InvalidArgumentError("a client needs at least one node address")
        self.nodes = list(nodes)
        self.piece_bytes, self.window = piece_bytes, window
        #: The cluster key this client proves it holds (None: it has none).
        self.key = key
        self._conns = {
            n.node_id: AsyncConnection(
                n.host,
                n.port,
                link=Link(n.link) if n.link is not None and not n.link.is_unshaped else None,
                request_timeout_s=request_timeout_s,
                key=key,
            )
            for n in self.nodes
        }

    def connection(self, node: NodeAddress) -> AsyncConnection:
        return self._conns[node.node_id]

    def node_for(self, key: str) -> NodeAddress:
        return node_for_key(self.nodes, key)

    async def call(
        self, node: NodeAddress, op: str, args: dict[str, Any] | None = None, payload: Payload = b""
    ) -> Response:
        return await self._conns[node.node_id].call(op, args, payload)

    async def _call_key(
        self, key: str, op: str, args: dict[str, Any], payload: Payload = b""
    ) -> Response:
        return await self.call(self.node_for(key), op, {"key": key, **args}, payload)

    async def stat(self, key: str) -> ObjectInfo:
        return ObjectInfo.from_wire((await self._call_key(key, "stat", {})).result)

    async def read(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Bytes of ``key``; ranges beyond one piece are fetched as concurrent pieces."""
        if length is not None and length <= self.piece_bytes:
            res = await self._call_key(key, "read", {"offset": offset, "length": length})
            return bytes(res.payload)
        return b"".join([bytes(p) async for p in self.iter_read(key, offset, length)])

    async def iter_read(
        self, key: str, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes | bytearray]:
        """Pieces of one version of ``key``, ``window`` requests in flight, in order."""
        info = await self.stat(key)
        end = info.size if length is None else min(info.size, offset + length)
        starts = list(range(offset, end, self.piece_bytes))
        pending: list[asyncio.Task[Response]] = []
        loop = asyncio.get_running_loop()

        def launch(start: int) -> None:
            args = {
                "offset": start,
                "length": min(self.piece_bytes, end - start),
                "expected_version": info.version,
            }
            pending.append(loop.create_task(self._call_key(key, "read", args)))

        try:
            for start in starts[: self.window]:
                launch(start)
            nxt = self.window
            while pending:
                res = await pending.pop(0)
                if nxt < len(starts):
                    launch(starts[nxt])
                    nxt += 1
                payload = res.payload
                yield payload if isinstance(payload, bytes | bytearray) else bytes(payload)
        finally:
            for task in pending:
                task.cancel()

    async def get(self, key: str) -> bytes:
        return await self.read(key)

    async def put(self, key: str, data: Payload) -> ObjectInfo:
        """Create or replace ``key`` atomically (one request up to 16 MiB, else an upload)."""
        view = memoryview(data).cast("B")
        if view.nbytes <= 4 * self.piece_bytes:
            return ObjectInfo.from_wire((await self._call_key(key, "put", {}, data)).result)
        node = self.node_for(key)
        upload = (await self.call(node, "upload.begin", {"key": key})).result["upload"]
        try:
            sem = asyncio.Semaphore(self.window)

            async def piece(start: int) -> None:
                async with sem:
                    await self.call(
                        node,
                        "upload.write",
                        {"upload": upload, "offset": start},
                        view[start : start + self.piece_bytes],
                    )

            await asyncio.gather(*(piece(s) for s in range(0, view.nbytes, self.piece_bytes)))
            return ObjectInfo.from_wire(
                (await self.call(node, "upload.commit", {"upload": upload})).result
            )
        except BaseException:
            with contextlib.suppress(ShuttleError):
                await self.call(node, "upload.abort", {"upload": upload})
            raise

    async def write(self, key: str, offset: int, data: Payload) -> WriteInfo:
        return WriteInfo.from_wire(
            (await self._call_key(key, "write", {"offset": offset}, data)).result
        )

    async def remove(self, key: str) -> None:
        await self._call_key(key, "remove", {})

    async def list(self, prefix: str = "") -> list[str]:
        keys: set[str] = set()
        for node in self.nodes:
            start_after: str | None = None
            while True:
                args: dict[str, Any] = {"prefix": prefix}
                if start_after is not None:
                    args["start_after"] = start_after
                page = (await self.call(node, "list", args)).result
                keys.update(page["keys"])
                if (start_after := page["next"]) is None:
                    break
        return sorted(keys)

    async def close(self) -> None:
        for conn in self._conns.values():
            await conn.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
