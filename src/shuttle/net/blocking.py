"""A blocking-socket connection to one node: the synchronous client's transport.

No event loop and no thread hop: a call is one ``sendall`` and the ``recv`` calls that
complete its response, which keeps a small read's round trip as short as the
protocol allows. Many requests can be in flight (:meth:`BlockingConnection.call_many`
keeps a window of them outstanding), and responses are matched by request id.

An emulated link (bandwidth + latency, see :mod:`shuttle.net.shaping`) can sit on
the connection: a :class:`~shuttle.net.shaped_socket.ShapedSocket` releases each
request when it would have arrived at the node and each response when it would have
arrived back, without serialising the latency of pipelined requests; nodes need no
knowledge of it.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from shuttle.errors import (
    RemoteProtocolError,
    RequestTimeoutError,
    ShuttleError,
    UnreachableError,
)
from shuttle.net.shaped_socket import ShapedSocket
from shuttle.net.shaping import Link
from shuttle.wire import (
    PROTOCOL_VERSION_MAX,
    PROTOCOL_VERSION_MIN,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Goodbye,
    Hello,
    NeedData,
    Request,
    Response,
    Role,
    Welcome,
)
from shuttle.wire.events import Event, Payload

#: Seconds to wait for a TCP connection and handshake before calling a node unreachable.
CONNECT_TIMEOUT_S = 5.0
#: Seconds a request may take before the call fails (a 16 MiB frame over a 1 Mb/s
#: emulated link takes ~134 s, so shaped clusters should raise it).
REQUEST_TIMEOUT_S = 60.0
#: Bytes asked of the kernel per recv; large enough that streaming reads are not
#: dominated by syscalls.
RECV_BYTES = 1 << 20
#: Payloads below this are joined with their frame header into one send.
SMALL_PAYLOAD_BYTES = 64 << 10
#: Requests kept in flight by call_many unless told otherwise.
WINDOW_DEFAULT = 16


@dataclass
class ConnectionCounters:
    """What this connection has done (the client's observable API)."""

    requests: int = 0
    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    connects: int = 0
    errors: int = 0
    by_op: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Call:
    """One request to make: operation name, msgpack arguments, raw payload."""

    op: str
    args: dict[str, Any] = field(default_factory=dict)
    payload: Payload = b""


class BlockingConnection:
    """A connection to the node at ``host:port``, opened lazily and reopened if lost.

    Thread-compatible, not thread-safe: use one per thread.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_name: str = "shuttle-client",
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        link: Link | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.client_name = client_name
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.link = link
        self.counters = ConnectionCounters()
        self.node_id: str | None = None
        self._sock: socket.socket | None = None
        self._shaped: ShapedSocket | None = None
        self._conn: Connection | None = None
        # One receive buffer for the connection's life: recv(n) would allocate (and
        # for large n mmap and unmap) a fresh n-byte object on every call.
        self._recv_buf = bytearray(RECV_BYTES)
        self._recv_view = memoryview(self._recv_buf)
        #: Responses that arrived while waiting for another request id.
        self._early: dict[int, Response | ErrorResponse] = {}

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # --- lifecycle -----------------------------------------------------------------

    def connect(self) -> None:
        """Open the socket and do the handshake (no-op if already connected)."""
        if self._sock is not None:
            return
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except TimeoutError as exc:
            raise UnreachableError(
                f"node {self.address} did not accept a connection within "
                f"{self.connect_timeout_s:g} s; is it running and reachable?"
            ) from exc
        except OSError as exc:
            raise UnreachableError(
                f"cannot reach node {self.address} ({exc.strerror or exc}); is it running? "
                "(`shuttle cluster status` shows a cluster's nodes)"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking mode with kernel timeouts: one syscall per recv, where a Python-level
        # socket timeout costs a failed recv, a poll and a second recv.
        sock.settimeout(None)
        _set_kernel_timeout(sock, socket.SO_SNDTIMEO, self.request_timeout_s)
        _set_kernel_timeout(sock, socket.SO_RCVTIMEO, self.connect_timeout_s)
        self._sock = sock
        self._shaped = ShapedSocket(sock, self.link) if self.link is not None else None
        self._conn = Connection(Role.CLIENT)
        self._early.clear()
        self.counters.connects += 1
        try:
            self._sendall(
                self._conn.send(Hello(PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX, self.client_name))
            )
            ev = self._next_event(self.connect_timeout_s)
            if isinstance(ev, ErrorResponse):
                raise ev.to_exception()
            if not isinstance(ev, Welcome):
                raise RemoteProtocolError(f"node {self.address} answered Hello with {ev!r:.100}")
            self.node_id = ev.node_id
            _set_kernel_timeout(sock, socket.SO_RCVTIMEO, self.request_timeout_s)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the socket; the next call reconnects."""
        sock, shaped = self._sock, self._shaped
        self._sock, self._shaped, self._conn = None, None, None
        with contextlib.suppress(OSError):
            if shaped is not None:
                shaped.close()
            elif sock is not None:
                sock.close()

    def __enter__(self) -> BlockingConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- calls ---------------------------------------------------------------------

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = True,
    ) -> Response:
        """Send one request and wait for its response.

        Raises the typed error the node answered with, :class:`UnreachableError` if
        the connection fails (an ``idempotent`` call is retried once on a fresh
        connection first; a non-idempotent one may or may not have taken effect,
        which the message says), or :class:`RequestTimeoutError`.
        """
        attempts = 2 if idempotent else 1
        for attempt in range(attempts):
            fresh = self._sock is None
            try:
                rid = self._send_request(op, args or {}, payload)
                ev = self._wait_for(rid)
            except UnreachableError:
                self.close()
                if attempt + 1 >= attempts or fresh:
                    raise
                continue
            self.counters.round_trips += 1
            if isinstance(ev, ErrorResponse):
                self.counters.errors += 1
                raise ev.to_exception()
            return ev
        raise AssertionError("unreachable: the loop returns or raises")

    def _send_request(self, op: str, args: dict[str, Any], payload: Payload) -> int:
        self.connect()
        conn = self._conn
        assert conn is not None
        rid = conn.next_request_id()
        self._sendall(conn.send(Request(rid, op, args, payload)))
        counters = self.counters
        counters.requests += 1
        counters.by_op[op] = counters.by_op.get(op, 0) + 1
        return rid

    def call_many(
        self, calls: Iterable[Call], *, window: int = WINDOW_DEFAULT, idempotent: bool = True
    ) -> Iterator[Response]:
        """Pipeline ``calls``, keeping up to ``window`` in flight; yields responses in order.

        The first error response raises its typed error (requests still in flight are
        drained so the connection stays usable).
        """
        attempts = 2 if idempotent else 1
        for attempt in range(attempts):
            fresh = self._sock is None
            try:
                yield from self._pipeline(iter(calls), window)
                return
            except UnreachableError:
                self.close()
                if attempt + 1 >= attempts or fresh:
                    raise
                if not isinstance(calls, list | tuple):
                    raise  # cannot replay a consumed iterator

    def _pipeline(self, calls: Iterator[Call], window: int) -> Iterator[Response]:
        self.connect()
        conn = self._conn
        assert conn is not None
        window = max(1, min(window, conn.peer_limits.in_flight_max))
        outstanding: deque[int] = deque()
        exhausted = False
        failure: ShuttleError | None = None
        while True:
            while not exhausted and len(outstanding) < window:
                call = next(calls, None)
                if call is None:
                    exhausted = True
                    break
                outstanding.append(self._send_request(call.op, call.args, call.payload))
            if not outstanding:
                if failure is not None:
                    raise failure
                return
            rid = outstanding.popleft()
            ev = self._wait_for(rid)
            self.counters.round_trips += 1
            if isinstance(ev, ErrorResponse):
                self.counters.errors += 1
                if failure is None:
                    failure = ev.to_exception()
                exhausted = True  # stop sending; drain what is in flight
                continue
            if failure is None:
                yield ev

    def _wait_for(self, rid: int) -> Response | ErrorResponse:
        early = self._early.pop(rid, None)
        if early is not None:
            return early
        while True:
            ev = self._next_event(self.request_timeout_s)
            if isinstance(ev, Response | ErrorResponse):
                if ev.rid == 0 and isinstance(ev, ErrorResponse):
                    self.close()
                    raise UnreachableError(
                        f"node {self.address} closed the connection: {ev.message}"
                    ) from ev.to_exception()
                if ev.rid == rid:
                    return ev
                self._early[ev.rid] = ev
            elif isinstance(ev, Goodbye | ConnectionClosed):
                self.close()
                reason = ev.reason if isinstance(ev, Goodbye) else "connection closed"
                raise UnreachableError(
                    f"node {self.address} ended the connection ({reason}) while request {rid} "
                    "was in flight; if it changed data, stat the key to see whether it took effect"
                )

    # --- bytes ---------------------------------------------------------------------

    def _sendall(self, buffers: list[Payload]) -> None:
        sock = self._sock
        assert sock is not None
        try:
            if self._shaped is not None:
                self._shaped.sendall(buffers)  # queued; leaves when the link says
            elif len(buffers) == 1:
                sock.sendall(buffers[0])
            elif len(buffers[-1]) < SMALL_PAYLOAD_BYTES:
                sock.sendall(b"".join(buffers))  # one syscall beats saving a small copy
            else:
                for buffer in buffers:
                    sock.sendall(buffer)
        except (TimeoutError, BlockingIOError) as exc:  # SO_SNDTIMEO expired
            self.close()
            raise RequestTimeoutError(
                f"node {self.address} did not accept data for {self.request_timeout_s:g} s"
            ) from exc
        except OSError as exc:
            self.close()
            raise UnreachableError(
                f"lost the connection to node {self.address} while sending ({exc.strerror or exc})"
            ) from exc
        self.counters.bytes_sent += sum(map(len, buffers))

    def _next_event(self, timeout_s: float) -> Event:
        conn, sock = self._conn, self._sock
        assert conn is not None and sock is not None
        deadline = time.monotonic() + timeout_s
        eof = False
        while True:
            try:
                ev = conn.next_event()
            except RemoteProtocolError:
                self.close()
                raise
            if not isinstance(ev, NeedData):
                return ev
            if self._shaped is not None:
                self._recv_shaped(conn, deadline)
                continue
            direct = conn.receive_buffer()  # a large payload: receive it in place
            try:
                n = sock.recv_into(direct if direct is not None else self._recv_buf)
            except BlockingIOError:  # SO_RCVTIMEO expired
                if time.monotonic() < deadline:
                    continue
                self.close()
                raise RequestTimeoutError(
                    f"node {self.address} did not answer within {timeout_s:g} s; "
                    "it may be overloaded, or raise the request timeout"
                ) from None
            except OSError as exc:
                self.close()
                raise UnreachableError(
                    f"lost the connection to node {self.address} ({exc.strerror or exc})"
                ) from exc
            if not n:
                if eof:
                    self.close()
                    raise UnreachableError(f"node {self.address} closed the connection")
                eof = True
                conn.receive_data(b"")  # end of stream: the codec says how it ended
                continue
            self.counters.bytes_received += n
            if direct is not None:
                conn.received_into(n)
            else:
                conn.receive_data(self._recv_view[:n])  # the codec copies what it keeps

    def _recv_shaped(self, conn: Connection, deadline: float) -> None:
        assert self._shaped is not None
        try:
            data = self._shaped.recv(RECV_BYTES, timeout_s=max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            self.close()
            raise RequestTimeoutError(
                f"node {self.address} did not answer in time over the emulated link; "
                "a slow profile may need a longer request timeout"
            ) from None
        except OSError as exc:
            self.close()
            raise UnreachableError(
                f"lost the connection to node {self.address} ({exc.strerror or exc})"
            ) from exc
        self.counters.bytes_received += len(data)
        conn.receive_data(data)  # b"" (end of stream) included: the codec says how it ended


def _set_kernel_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET, option, struct.pack("ll", whole, int((seconds - whole) * 1e6))
    )
