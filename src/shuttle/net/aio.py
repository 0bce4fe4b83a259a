"""An asyncio connection to one node: the asyncio client's (and the run-time's) transport.

:class:`AsyncConnection` keeps one connection with a reader task that matches
responses to waiting calls by request id, so any number of coroutines can call
concurrently over it (up to the node's in-flight limit) and answers come back in
whatever order the node produces them. Link profiles are applied with
:class:`~shuttle.net.shaping.ShapedStream` on this side, as the blocking transport
does with its shaped socket; the cluster key answers the node's challenge
(:mod:`shuttle.net.auth`). Plain asyncio streams: it runs on uvloop as well.

The retry policy is :class:`~shuttle.net.blocking.BlockingConnection`'s: a call that
fails because an established connection dropped is sent once more on a fresh one if
it is idempotent, or whatever it is if the node said GOODBYE before taking it. Only
the default differs: a call here is taken as not idempotent unless the caller says so.

With TLS (:class:`~shuttle.net.tls.ClientTls`) the stream is asyncio's own TLS (over
uvloop too), the node's certificate is checked against the cluster's CA, and the key
proofs cover the channel's binding. ``verify=False`` is for peers without a
certificate from the CA (an application's run-time, called by a node): their
certificate is not checked, and they must prove they hold the key over this very
channel instead, before anything but the HELLO is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any, Protocol

from shuttle.errors import (
    RemoteProtocolError,
    RequestTimeoutError,
    ShuttleError,
    UnreachableError,
)
from shuttle.net import auth
from shuttle.net.blocking_stream import CONNECT_TIMEOUT_S, REQUEST_TIMEOUT_S, ConnectionCounters
from shuttle.net.shaping import Link
from shuttle.net.tls import CHANNEL_BINDING, ClientTls, client_failure, record_failure
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

#: Bytes asked of the stream per read by the reader task (1 MiB: a streamed piece
#: arrives in one or two reads).
READ_BYTES = 1 << 20


class NotRun(UnreachableError):
    """The node ended the connection (GOODBYE) before taking the request: it may be
    sent again even if it is not idempotent."""


class _ClosedHere(UnreachableError):
    """This side closed the connection while the call waited: not retried (reopening
    a connection the program just closed would leak it)."""


class _Stream(Protocol):
    async def read(self, n: int = -1) -> bytes: ...
    def write(self, data: bytes | bytearray | memoryview) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...
    async def wait_closed(self) -> None: ...


class _PlainStream:
    """A StreamReader/StreamWriter pair behind the same methods as ShapedStream."""

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
    """One connection to a node, shared by any number of concurrent calls; opened on
    first use and reopened after a failure.

    ``key`` (the cluster key, or principal ``principal``'s key) answers the node's
    challenge, as in
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
        principal: str | None = None,
        tls: ClientTls | None = None,
        verify: bool = True,
    ) -> None:
        self.host, self.port = host, port
        self.link = link
        self.key = key
        #: Whose ``key`` is (None: the cluster key).
        self.principal = principal
        #: TLS settings (the cluster's CA), or None for a plain connection; ``verify``
        #: False: the peer's certificate is not checked, its key proof is required.
        self.tls = tls
        self.verify = verify
        self.client_name = client_name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.node_id: str | None = None
        #: What this connection has done (the same counters as the blocking transport).
        self.counters = ConnectionCounters()
        self._conn: Connection | None = None
        self._stream: _Stream | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[Response | ErrorResponse]] = {}
        self._slots: asyncio.Semaphore | None = None
        self._connecting = asyncio.Lock()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def requests(self) -> int:
        """Requests sent so far (``counters.requests``)."""
        return self.counters.requests

    @property
    def connected(self) -> bool:
        return self._conn is not None

    async def connect(self) -> None:
        """Open the connection and handshake (no-op if open); reconnects after a failure.

        Raises :class:`UnreachableError`, or :class:`AuthenticationError` when the node
        and this client do not share the cluster key (see :mod:`shuttle.net.auth`).
        """
        async with self._connecting:
            if self._conn is not None:
                return
            tls = self.tls
            context: ssl.SSLContext | None = None
            if tls is not None:
                context = tls.context() if self.verify else tls.unverified()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(
                        self.host,
                        self.port,
                        ssl=context,
                        server_hostname=self.host if context is not None and self.verify else None,
                    ),
                    self.connect_timeout_s,
                )
            except ssl.SSLError as exc:
                raise client_failure(
                    exc, self.address, tls.ca_file if tls is not None else None, None
                ) from None
            except (OSError, TimeoutError) as exc:
                raise UnreachableError(
                    f"cannot reach node {self.address} ({exc}); is it running?"
                    + (" Does it serve TLS?" if tls is not None else "")
                ) from exc
            binding = b""
            if context is not None:
                ssl_object = writer.get_extra_info("ssl_object")
                binding = ssl_object.get_channel_binding(CHANNEL_BINDING) if ssl_object else b""
            stream: _Stream = (
                self.link.wrap(reader, writer)
                if self.link is not None
                else _PlainStream(reader, writer)
            )
            conn = Connection(Role.CLIENT)
            self.counters.connects += 1
            try:
                welcome = await asyncio.wait_for(
                    self._handshake(stream, conn, binding), self.connect_timeout_s
                )
            except TimeoutError:
                stream.close()
                raise UnreachableError(
                    f"node {self.address} did not complete the handshake within "
                    f"{self.connect_timeout_s:g} s; is it a Shuttle node, and running?"
                    + (
                        " (a node that serves TLS waits for the client to speak first: "
                        "connect with TLS)"
                        if tls is None
                        else ""
                    )
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

    async def _handshake(self, stream: _Stream, conn: Connection, binding: bytes) -> Welcome:
        """The node's challenge, our HELLO answering it, the node's WELCOME (checked);
        ``binding``: the TLS channel's (b"" on a plain connection)."""
        try:
            challenge = await self._next_event(stream, conn)
        except ssl.SSLError as exc:
            tls = self.tls
            raise client_failure(
                exc, self.address, tls.ca_file if tls is not None else None, None
            ) from None
        if not isinstance(challenge, Challenge):
            raise UnreachableError(
                f"node {self.address} closed the connection before its challenge "
                f"({type(challenge).__name__}); is it shutting down?"
            )
        hello, client_nonce = auth.client_hello(
            challenge,
            self.key,
            self.client_name,
            self.address,
            principal=self.principal,
            binding=binding,
        )
        stream.write(conn.send_bytes(hello))
        await stream.drain()
        ev = await self._next_event(stream, conn)
        if isinstance(ev, ErrorResponse):
            raise ev.to_exception()
        if not isinstance(ev, Welcome):
            raise RemoteProtocolError(f"node {self.address} answered Hello with {ev!r:.100}")
        auth.check_welcome(
            ev,
            challenge,
            self.key,
            client_nonce,
            f"{ev.node_id} ({self.address})",
            binding=binding,
            require_proof=self.tls is not None and not self.verify,
        )
        return ev

    @staticmethod
    async def _next_event(stream: _Stream, conn: Connection) -> Event:
        while isinstance(ev := conn.next_event(), NeedData):
            conn.receive_data(await stream.read(READ_BYTES))
        return ev

    async def _read_loop(self, stream: _Stream, conn: Connection) -> None:
        failure: ShuttleError = UnreachableError(
            f"node {self.address} ended the connection while a request was in flight; if "
            "it changed data, stat the key to see whether it took effect"
        )
        try:
            while True:
                data = await stream.read(READ_BYTES)
                self.counters.bytes_received += len(data)
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
                    elif isinstance(ev, Goodbye):
                        # A node says goodbye only after answering every request it
                        # took: those still waiting never ran.
                        failure = NotRun(
                            f"node {self.address} ended the connection ({ev.reason}) before "
                            "taking the request"
                        )
                        return
                    elif isinstance(ev, ConnectionClosed):
                        return
                if not data:
                    return
        except ShuttleError as exc:
            failure = exc
        except ssl.SSLError as exc:  # a record that failed its authentication
            failure = record_failure(exc, self.address)
        except OSError as exc:
            failure = UnreachableError(f"lost the connection to node {self.address} ({exc})")
        finally:
            self._fail_all(conn, failure)

    def _fail_all(self, conn: Connection, failure: ShuttleError) -> None:
        """The connection ``conn`` is over: fail what waits on it (if still current)."""
        if self._conn is not conn:
            return
        self._conn = None
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(failure)

    async def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = False,
    ) -> Response:
        """One request; raises the node's typed error, :class:`UnreachableError` or
        :class:`RequestTimeoutError`. A call the node never took (it said GOODBYE
        first) is sent once more on a fresh connection; so is one on a connection that
        dropped with it in flight, if the caller says it is ``idempotent``. Not by
        default (unlike the blocking transport): the run-time's calls through this
        transport (``object.invoke``, migrations) must not run twice;
        :class:`~shuttle.client.aio.AsyncClient` says per request."""
        for attempt in range(2):
            fresh = self._conn is None
            try:
                ev = await self._call_once(op, args or {}, payload)
            except UnreachableError as exc:
                retry = idempotent or isinstance(exc, NotRun)
                if attempt or fresh or isinstance(exc, _ClosedHere) or not retry:
                    raise
                continue
            self.counters.round_trips += 1
            if isinstance(ev, ErrorResponse):
                self.counters.errors += 1
                raise ev.to_exception()
            return ev
        raise AssertionError("unreachable: the loop returns or raises")

    async def _call_once(
        self, op: str, args: dict[str, Any], payload: Payload
    ) -> Response | ErrorResponse:
        await self.connect()
        assert self._slots is not None
        async with self._slots:
            conn, stream = self._conn, self._stream
            if conn is None or stream is None:
                raise UnreachableError(f"lost the connection to node {self.address}")
            rid = conn.next_request_id()
            buffers = conn.send(Request(rid, op, args, payload))  # limits: raises, sends nothing
            fut: asyncio.Future[Response | ErrorResponse] = (
                asyncio.get_running_loop().create_future()
            )
            waiting = self._waiting  # this connection's (a reconnect starts a new one)
            waiting[rid] = fut
            for buffer in buffers:
                stream.write(buffer)
            counters = self.counters
            counters.requests += 1
            counters.bytes_sent += sum(memoryview(b).nbytes for b in buffers)
            counters.by_op[op] = counters.by_op.get(op, 0) + 1
            try:
                await stream.drain()
                return await asyncio.wait_for(fut, self.request_timeout_s)
            except TimeoutError:
                raise RequestTimeoutError(
                    f"node {self.address} did not answer {op!r} within {self.request_timeout_s:g} s"
                ) from None
            except OSError as exc:
                self._fail_all(conn, UnreachableError(f"lost the connection to {self.address}"))
                raise UnreachableError(
                    f"lost the connection to node {self.address} while sending ({exc})"
                ) from exc
            finally:
                waiting.pop(rid, None)

    async def wait_lost(self) -> None:
        """Return once the connection open now has ended, however it ended (at once
        if none is open). The next call reconnects."""
        task = self._reader_task
        if task is not None and not task.done():
            await asyncio.wait({task})

    async def close(self) -> None:
        """Close the connection (the next call reconnects)."""
        conn, stream, task = self._conn, self._stream, self._reader_task
        self._reader_task = None
        if conn is not None:
            self._fail_all(conn, _ClosedHere(f"the connection to node {self.address} was closed"))
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if stream is not None:
            stream.close()
            await stream.wait_closed()
