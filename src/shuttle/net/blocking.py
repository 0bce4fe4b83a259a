"""A blocking-socket connection to one node: the synchronous client's transport.

No event loop and no thread hop: a call is one ``sendall`` and the ``recv`` calls that
complete its response, which keeps a small read's round trip as short as the
protocol allows. Many requests can be in flight (:meth:`BlockingConnection.call_many`
keeps a window of them outstanding), and responses are matched by request id.

Concepts: the protocol over one connection's bytes: the handshake (the node's
challenge, our HELLO, its WELCOME and proof), calls with their retry rule (an
idempotent call, or one the node never took, is sent once more on a fresh
connection), the read lane and the one-send-one-receive fast lane, pipelining, and
matching responses to requests. The bytes themselves (the socket, TLS, an emulated
link, typed failures) are :class:`~shuttle.net.blocking_stream.BlockingStream`'s,
which this connection extends.

An emulated link (bandwidth + latency, see :mod:`shuttle.net.shaping`) can sit on
the connection: a :class:`~shuttle.net.shaped_socket.ShapedSocket` releases each
request when it would have arrived at the node and each response when it would have
arrived back, without serialising the latency of pipelined requests; nodes need no
knowledge of it.

With TLS (:class:`~shuttle.net.tls.ClientTls`) the connection verifies the node's
certificate against the cluster's CA and runs the same code over a
:class:`~shuttle.net.tls.TlsChannel`: ciphertext still moves with ``os.write`` and
``os.read`` on the socket's descriptor (so kernel timeouts and the idle probe work as
on a plain one), and the read lane's request and reply are encrypted and decrypted
around them. The plain path is untouched: the descriptor's reader and writer are
chosen once per connection.
"""

from __future__ import annotations

import socket
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from shuttle.errors import (
    RemoteProtocolError,
    RequestTimeoutError,
    ShuttleError,
    UnreachableError,
)
from shuttle.net import auth
from shuttle.net.blocking_stream import (
    CONNECT_TIMEOUT_S,
    RECV_BYTES,
    REQUEST_TIMEOUT_S,
    SMALL_PAYLOAD_BYTES,
    BlockingStream,
    set_kernel_timeout,
)
from shuttle.net.shaped_socket import ShapedSocket
from shuttle.net.shaping import Link
from shuttle.net.tls import ClientTls
from shuttle.wire import (
    NEED_DATA,
    Challenge,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Goodbye,
    NeedData,
    Response,
    Role,
    Welcome,
)
from shuttle.wire.events import Event, Payload
from shuttle.wire.limits import PREFIX_BYTES
from shuttle.wire.readlane import pack_read_reply, read_args, recv_read_reply

#: A read reply's bytes beyond its payload: the frame's prefix and its header
#: ``[rid, nil]`` (at most 7 bytes), with room to spare.
READ_REPLY_OVERHEAD: Final = 32
#: A ``direct`` read's room for a RADOS node's location instead of the bytes,
#: ``{"rados": {pool, namespace, object, version}}``, beyond its key's UTF-8 (a larger
#: one is read whole by the general loop).
LOCATION_REPLY_BYTES: Final = 512
#: Requests kept in flight by call_many unless told otherwise.
WINDOW_DEFAULT = 16
#: A connection unused for this long is checked before a request goes out: a node
#: closes idle connections (with GOODBYE), and a request sent into a closed one could
#: not be retried safely if it is not idempotent.
IDLE_PROBE_S = 1.0
#: The clock of :data:`IDLE_PROBE_S`, held as a final name: the compiled build reads
#: it from a C variable, where a module global is looked up in a dict on every call.
_monotonic: Final = time.monotonic
#: The read lane's receive and its reply's packer, held as final names the same way.
_recv_read_reply: Final = recv_read_reply
_pack_read_reply: Final = pack_read_reply


@dataclass(frozen=True, slots=True)
class Call:
    """One request to make: operation name, msgpack arguments, raw payload."""

    op: str
    args: dict[str, Any] = field(default_factory=dict)
    payload: Payload = b""


#: A read for the read lane: ``(key, offset, length, expected_version or None,
#: direct)``, the ints typed ``Any`` so that the compiled build passes the tuple's
#: objects on to the lane's packer as they are (a typed ``int`` is unboxed, and boxed
#: into a new object again, an allocation for any value over 256, at each Python call
#: it is passed to).
ReadArgs = tuple[str, Any, Any, Any, bool]


def _reply_head_bytes(rid: int) -> int:
    """A read reply's bytes before its payload: the prefix and ``[rid, nil]`` as the
    lane packs them (an id is at most 32 bits: a msgpack int of 1, 2, 3 or 5 bytes)."""
    return PREFIX_BYTES + 2 + (1 if rid < 128 else 2 if rid < 256 else 3 if rid < 65536 else 5)


class _NotRun(UnreachableError):
    """The node closed the connection before taking the request (it said GOODBYE
    first): the request may be sent again even if it is not idempotent."""


class BlockingConnection(BlockingStream):
    """A connection to the node at ``host:port``, opened lazily and reopened if lost.

    With ``key`` (the cluster key, or principal ``principal``'s key) the handshake
    answers the node's challenge and checks the node's proof; a node that requires a
    key refuses a client without one (:class:`AuthenticationError`, never retried: the
    same call would fail again).
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
        key: bytes | None = None,
        principal: str | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        super().__init__(
            host,
            port,
            connect_timeout_s=connect_timeout_s,
            request_timeout_s=request_timeout_s,
            link=link,
            tls=tls,
        )
        self.client_name = client_name
        self.key = key
        #: Whose ``key`` is (None: the cluster key).
        self.principal = principal
        self.node_id: str | None = None
        #: Responses that arrived while waiting for another request id.
        self._early: dict[int, Response | ErrorResponse] = {}
        #: When the last call finished (monotonic), for :data:`IDLE_PROBE_S`.
        self._used = 0.0
        #: :data:`IDLE_PROBE_S` as the connection was made (a field, not a module
        #: global looked up in a dict each call).
        self._idle_probe_s = IDLE_PROBE_S

    # --- lifecycle -----------------------------------------------------------------

    def connect(self) -> None:
        """Open the socket and do the handshake (no-op if already connected).

        Raises :class:`UnreachableError` or :class:`RequestTimeoutError` if the node
        cannot be reached or does not answer, :class:`AuthenticationError` if it
        requires a key this client lacks, refuses this client's key, or fails to prove
        it holds the same key; :class:`TlsError` when the TLS handshake fails (the
        node's certificate is not the cluster CA's, or one side does not speak TLS).
        """
        if self._sock is not None:
            return
        sock = self._open_socket()
        self._conn = Connection(Role.CLIENT)
        self._early.clear()
        self.counters.connects += 1
        binding = b""
        try:
            if self.tls is not None:
                # Before any shaping: the handshake's records go straight to the node.
                binding = self._tls_handshake(self.tls)
            self._shaped = ShapedSocket(sock, self.link) if self.link is not None else None
            # The node speaks first: its challenge, which our HELLO answers.
            try:
                challenge = self._next_event(self.connect_timeout_s)
            except RequestTimeoutError:
                raise UnreachableError(
                    f"node {self.address} sent no challenge within {self.connect_timeout_s:g} "
                    "s of connecting"
                    + (
                        ": a node that serves TLS waits for the client to speak first; "
                        "connect with TLS (--tls and the cluster's CA, or its cluster file)"
                        if self.tls is None
                        else "; is it a Shuttle node, and not overloaded?"
                    )
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
            self._sendall(self._conn.send(hello))
            ev = self._next_event(self.connect_timeout_s)
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
            )
            self.node_id = ev.node_id
            set_kernel_timeout(sock, socket.SO_RCVTIMEO, self.request_timeout_s)
        except BaseException:
            self.close()
            raise

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
        out = self._call(op, args or {}, payload, idempotent, None)
        assert type(out) is Response
        return out

    def read(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes:
        """The bytes of ``call("read", {"key": key, "offset": offset, "length": length})``
        (``expected_version`` too unless None), with the same errors and retries. On an
        open, unshaped connection its request and reply go by the read lane
        (:mod:`shuttle.wire.readlane`): made and taken as bytes, no header objects."""
        out = self._call("read", {}, b"", True, (key, offset, length, expected_version, False))
        return out if type(out) is bytes else bytes(out.payload)  # type: ignore[union-attr]

    def read_direct(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | Response:
        """:meth:`read` with ``direct: true`` (a client that reads a RADOS node's miss
        from the OSD itself, docs/ceph.md), by the read lane too: the bytes when they
        came by it, else the Response (a RADOS node's ``{"rados": location}``, or the
        bytes as the general path answered them)."""
        return self._call("read", {}, b"", True, (key, offset, length, expected_version, True))

    def _call(
        self,
        op: str,
        args: dict[str, Any],
        payload: Payload,
        idempotent: bool,
        read: ReadArgs | None,
    ) -> Response | bytes:
        """:meth:`call`, or with ``read`` the read ``(key, offset, length, version,
        direct)`` (``op``, ``args`` and ``payload`` then unused): its payload comes back as bytes
        when it came by the read lane, else its Response."""
        now = _monotonic()
        if now - self._used > self._idle_probe_s:
            self._drop_if_closed_by_node()
        for attempt in range(2):
            fresh = self._sock is None
            try:
                if self._conn is not None and self._shaped is None and not self._early:
                    ev = self._exchange(op, args, payload, read)
                else:
                    if read is not None:
                        op, args = "read", read_args(*read)
                    ev = self._wait_for(self._send_request(op, args, payload))
            except UnreachableError as exc:
                self.close()
                if attempt or fresh or not (idempotent or isinstance(exc, _NotRun)):
                    raise
                continue
            self.counters.round_trips += 1
            self._used = now
            if type(ev) is ErrorResponse:
                self.counters.errors += 1
                raise ev.to_exception()
            return ev  # type: ignore[return-value]
        raise AssertionError("unreachable: the loop returns or raises")

    def _drop_if_closed_by_node(self) -> None:
        """Close an idle connection the node has said goodbye on (or closed), so the
        next request opens a fresh one instead of failing in a dead one."""
        sock = self._sock
        if sock is None or self._conn is None or self._conn.in_flight:
            return
        if self._tls is not None and self._tls.pending():
            self.close()  # a record arrived with nothing in flight: GOODBYE, or an error
            return
        try:
            sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return  # nothing to read: the connection is as we left it
        except OSError:
            pass
        # Readable with nothing in flight: only GOODBYE, an error or the end of stream.
        self.close()

    def _send_request(self, op: str, args: dict[str, Any], payload: Payload) -> int:
        conn = self._conn
        if conn is None:
            self.connect()
            conn = self._conn
            assert conn is not None
        rid: int = conn.next_request_id()
        self._sendall(conn.send_request(rid, op, args, payload, join_below=SMALL_PAYLOAD_BYTES))
        counters = self.counters
        counters.requests += 1
        by_op = counters.by_op
        by_op[op] = by_op.get(op, 0) + 1
        return rid

    def _exchange(
        self, op: str, args: dict[str, Any], payload: Payload, read: ReadArgs | None
    ) -> Response | ErrorResponse | bytes:
        """:meth:`_send_request` then :meth:`_wait_for` on an open, unshaped connection,
        with the usual case in line: one send, one receive holding the whole response,
        one event (for a ``read`` by the read lane: a request and a reply as bytes,
        the payload returned). Anything else (a partial frame, other events, failures)
        is handed to the general loop, so the outcome is the same either way."""
        conn, sock = self._conn, self._sock
        assert conn is not None and sock is not None
        rid = conn.next_request_id()
        request = None
        reply_bytes = RECV_BYTES
        if read is not None:
            request = conn.send_read_request(rid, read[0], read[1], read[2], read[3], read[4])
            room = int(read[2])
            if read[4] and room < LOCATION_REPLY_BYTES + 4 * len(read[0]):
                room = LOCATION_REPLY_BYTES + 4 * len(read[0])
            reply_bytes = min(RECV_BYTES, READ_REPLY_OVERHEAD + room)
            op = "read"
            if request is None:
                args = read_args(*read)
        if request is not None:
            # os.write and os.read on the descriptor take their arguments faster than
            # socket.sendall and recv (the socket is in blocking mode with kernel
            # timeouts, so they behave the same). On TLS, the channel's equivalents.
            try:
                sent = self._write_fd(self._fd, request)
                if sent < len(request):  # a signal cut it short: send the rest
                    sock.sendall(request[sent:])
                    sent = len(request)
            except OSError as exc:
                self._send_failed(exc)
                raise
        else:
            buffers = conn.send_request(rid, op, args, payload, join_below=SMALL_PAYLOAD_BYTES)
            if len(buffers) == 1 and self._tls is None:
                try:
                    sock.sendall(buffers[0])
                except OSError as exc:
                    self._send_failed(exc)
                    raise
                sent = len(buffers[0])
            else:
                self._sendall(buffers)
                sent = 0  # counted there
        counters = self.counters
        counters.requests += 1
        counters.bytes_sent += sent
        if read is not None:
            counters.count_read()  # by_op's "read", as an int: no dict item a read
        else:
            by_op = counters.by_op
            by_op[op] = by_op.get(op, 0) + 1
        if conn.pending():
            return self._wait_for(rid)
        # On a plain socket, a read lane request's reply is received straight into its
        # payload's bytes object (recv_read_reply), not copied out of the frame's.
        lane_recv = False
        if read is not None and request is not None and self._tls is None:
            length: int = read[2]  # unboxed once: compared as C ints, not objects
            lane_recv = 0 <= length <= conn.read_reply_payload_bytes
        arrived: bytes | bytearray
        try:
            if lane_recv:
                assert read is not None
                arrived = _recv_read_reply(self._fd, rid, read[2], conn.read_reply_payload_max)
            else:
                # For a read, just the reply it expects (a bigger one, such as an error,
                # leaves its rest in the kernel for the general loop): the bytes object
                # is allocated at its size, not at RECV_BYTES and then shrunk.
                arrived = self._read_fd(self._fd, reply_bytes)
        except OSError as exc:
            # It blocked for the whole request timeout (SO_RCVTIMEO), or failed: with no
            # time left, _recv_failed raises the typed error.
            self._recv_failed(exc, 0.0, self.request_timeout_s)
            raise
        if lane_recv and type(arrived) is bytes:
            if conn.take_read_reply(rid):
                counters.bytes_received += _reply_head_bytes(rid) + len(arrived)
                counters.read_lane += 1
                return arrived
            # Refused: the frame as it came, for the general path to say why.
            arrived = _pack_read_reply(rid, arrived)
        data = bytes(arrived)  # (the same object when it is bytes)
        if not data:
            conn.receive_data(b"")  # end of stream: the loop reports how it ended
            return self._wait_for(rid)
        counters.bytes_received += len(data)
        if request is not None:
            got = conn.receive_read_reply(data, rid)
            if got is not None:
                counters.read_lane += 1
                return got
        res = conn.receive_response(data)  # the whole response in one chunk, usually
        if res is not None and res.rid == rid:
            return res
        if res is not None:  # another request's answer (not sent by this path, but legal)
            return self._wait_for(rid, res)
        try:
            ev = conn.receive_event(data)
        except RemoteProtocolError:
            self.close()
            raise
        if (type(ev) is Response or type(ev) is ErrorResponse) and ev.rid == rid:  # type: ignore[union-attr]
            return ev  # type: ignore[return-value]
        return self._wait_for(rid, ev)

    def call_many(
        self, calls: Iterable[Call], *, window: int = WINDOW_DEFAULT, idempotent: bool = True
    ) -> Iterator[Response]:
        """Pipeline ``calls``, keeping up to ``window`` in flight; yields responses in order.

        The first error response raises its typed error (requests still in flight are
        drained so the connection stays usable).
        """
        attempts = 2 if idempotent else 1
        if time.monotonic() - self._used > self._idle_probe_s:
            self._drop_if_closed_by_node()
        for attempt in range(attempts):
            fresh = self._sock is None
            try:
                yield from self._pipeline(iter(calls), window)
                self._used = time.monotonic()
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

    def _wait_for(
        self, rid: int, first: Event | NeedData | None = None
    ) -> Response | ErrorResponse:
        """Events until the response to ``rid`` (``first``: one already taken from the
        codec); responses to other requests are kept for their callers."""
        if self._early:
            early = self._early.pop(rid, None)
            if early is not None:
                return early
        conn = self._conn
        assert conn is not None
        next_event = conn.next_event
        deadline = 0.0
        if first is None and not conn.pending():
            # Nothing can be waiting in the codec: receive first (the usual case).
            deadline = time.monotonic() + self.request_timeout_s
            self._receive(conn, deadline, self.request_timeout_s)
        while True:
            if first is not None:
                ev, first = first, None
            else:
                try:
                    ev = next_event()
                except RemoteProtocolError:
                    self.close()
                    raise
            kind = type(ev)
            if kind is Response or kind is ErrorResponse:
                assert isinstance(ev, Response | ErrorResponse)
                if ev.rid == rid:
                    return ev
                if ev.rid == 0 and isinstance(ev, ErrorResponse):
                    self.close()
                    raise UnreachableError(
                        f"node {self.address} closed the connection: {ev.message}"
                    ) from ev.to_exception()
                self._early[ev.rid] = ev
            elif ev is NEED_DATA:
                if not deadline:
                    deadline = time.monotonic() + self.request_timeout_s
                self._receive(conn, deadline, self.request_timeout_s)
            elif kind is Goodbye:
                self.close()
                # A node says goodbye only after answering every request it took, so
                # this one never ran: it may be sent again, whatever it does.
                assert isinstance(ev, Goodbye)
                raise _NotRun(
                    f"node {self.address} ended the connection ({ev.reason}) before taking "
                    f"request {rid}"
                )
            elif kind is ConnectionClosed:
                self.close()
                raise UnreachableError(
                    f"node {self.address} ended the connection while request {rid} was in "
                    "flight; if it changed data, stat the key to see whether it took effect"
                )

    def _next_event(self, timeout_s: float) -> Event:
        """The next event, receiving as needed (the handshake's path)."""
        conn = self._conn
        assert conn is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                ev = conn.next_event()
            except RemoteProtocolError:
                self.close()
                raise
            if not isinstance(ev, NeedData):
                return ev
            self._receive(conn, deadline, timeout_s)
