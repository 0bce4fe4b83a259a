"""One client connection of a node: bytes → codec events → handlers → bytes.

The per-connection half of :mod:`shuttle.net.server`: it answers every request it
takes exactly once, and enforces what one connection may make the node hold
(:mod:`shuttle.net.admission`): it stops taking requests while its client is not
reading replies or its store requests fill its share of the pool, and the server's
housekeeping sweep closes it when a frame stalls, its client stops reading or it
idles. A connection over the node's cap is answered ``busy`` and closed; one that
does not finish its handshake within the node's deadline, or waits longest when too
many are in their handshake, is closed too. A principal's connection and its requests in flight
count against that principal's share of the node (:mod:`shuttle.net.principal_limits`):
past it, ``busy`` naming the limit.

The connection is one class in five modules, one concept each (all compiled with the
mypyc group): this one holds its state, the asyncio callbacks, the read lane (a warm
read answered with no codec object) and the replies; :mod:`shuttle.net.node_handshake`
the challenge, the HELLO and the connections refused on the way;
:mod:`shuttle.net.node_dispatch` a request run the general way (guards, inline
answers, the thread pool); :mod:`shuttle.net.node_tls_edge` TLS at its edges;
:mod:`shuttle.net.node_closing` how it ends (a protocol error answered, the sweep's
timeouts, a revoked principal, GOODBYE).

On a TLS node the connection's ciphertext goes through a
:class:`~shuttle.net.tls.TlsChannel` at its two edges (:meth:`data_received` and
:meth:`NodeProtocol.send_bytes`): everything between them, the read lane included,
handles plaintext exactly as on a plain node.

A client that breaks the protocol (a request id already in flight, garbage bytes)
gets nothing more of its stream read, but every request taken before is answered
before the node says why and closes: a request that ran always has its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shuttle.blockcache import SpanReader
from shuttle.errors import RemoteProtocolError, ShuttleError
from shuttle.net.node_closing import fatal
from shuttle.net.node_dispatch import dispatch
from shuttle.net.node_handshake import challenge, evict, greet, handshake_expired
from shuttle.net.node_tls_edge import decrypt
from shuttle.net.principals import Principal
from shuttle.net.registry import ReadLocated, ReadMiss
from shuttle.net.tls import TlsChannel
from shuttle.wire import (
    ConnectionClosed,
    ErrorResponse,
    Goodbye,
    Hello,
    Request,
    RequestRejected,
    Role,
)
from shuttle.wire.connection import Connection
from shuttle.wire.events import NEED_DATA, Payload
from shuttle.wire.readlane import read_args

if TYPE_CHECKING:
    from shuttle.net.server import CpuAccount, RpcServer
    from shuttle.net.server_stats import ServerCounters

log = logging.getLogger("shuttle.node")

#: How long a closing connection may take to send what is buffered for it before it
#: is dropped (a client that does not read would keep it forever).
CLOSE_GRACE_S = 10.0

#: Replies with payloads below this are sent as one joined buffer.
SMALL_REPLY_BYTES = 64 << 10


class NodeProtocol(asyncio.Protocol):
    """One client connection: bytes → codec events → handlers → bytes."""

    def __init__(self, server: RpcServer) -> None:
        self.server = server
        #: The server's counters, held here typed: the compiled read lane bumps them
        #: as native fields.
        self.counters: ServerCounters = server.counters
        self.conn = Connection(Role.SERVER, server.limits)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.pending: set[asyncio.Future[Any]] = set()
        self.closed = False
        #: This connection's challenge nonce: a HELLO's proof must answer it.
        self.nonce = b""
        #: The principal its HELLO authenticated as, whose caps every request is
        #: checked against; None: unrestricted (the cluster key, or a keyless node).
        self.principal: Principal | None = None
        #: Whether it speaks TLS (the node serves TLS); its TLS state, made when its
        #: first bytes arrive (a connection that never sends any costs no TLS object),
        #: and the channel binding the key proofs answer (b"" on a plain connection).
        self.encrypted = server.tls is not None
        self.tls: TlsChannel | None = None
        self.binding = b""
        #: The principal whose share of the node's connections and requests it counts
        #: against (``RpcServer.load``), once its HELLO is taken; None: the cluster key's
        #: (not limited) or not yet authenticated.
        self.load_name: str | None = None
        #: True once its handshake is done (WELCOME sent): from then on it no longer
        #: counts against the node's cap on connections in their handshake.
        self.authenticated = False
        #: Closes the connection if its handshake is not done in time.
        self.handshake_timer: asyncio.TimerHandle | None = None
        #: The first bytes a plain node received (a TLS client's are a ClientHello).
        self.first_bytes = b""
        #: Set when the client broke the protocol while requests it sent before were
        #: running: they are answered, then this error is sent and the connection closes.
        self.failing: RemoteProtocolError | None = None
        #: Its number, for operations that open things a connection owns.
        self.number = server.next_connection_number()
        #: True once it called a per-connection operation (disconnect hooks then run).
        self.owns_sessions = False
        #: Requests running in the thread pool (store operations).
        self.executing = 0
        #: Requests taken off the wire (the housekeeping sweep watches it for progress).
        self.requests = 0
        #: True while its requests are held back (reading paused): its client is not
        #: reading replies, it has the most requests running, or the node holds too
        #: many unsent replies.
        self.held = False
        #: Since when its unsent replies have been over the high mark (asyncio paused
        #: writing), or None while they are under it.
        self.writing_paused_since: float | None = None
        #: A connection over the node's cap is answered ``busy`` and closed.
        self.refused = False
        #: True once asyncio reported the connection gone (``closed`` is set earlier).
        self.lost = False
        #: True while it drains what its client sends after a protocol error (``linger``).
        self.lingering = False
        #: Bytes received on it (the sweep watches a partial frame for progress).
        self.bytes_in = 0
        #: ``read``'s read for the read lane, called natively (None: reads go the
        #: general way).
        read_op = server.registry.find("read")
        self.read_lane: SpanReader | None = None if read_op is None else read_op.read_lane
        #: ``read``'s call for a miss of the lane's block cache (None: the pool reads it).
        self.read_miss: ReadMiss | None = None if read_op is None else read_op.read_miss
        #: ``read``'s location of a ``direct`` read's miss (None: the usual way reads it).
        self.read_located: ReadLocated | None = None if read_op is None else read_op.read_located
        #: The transport's ``write``, held from ``connection_made`` on (None before): a
        #: reply is written with one call of it, not a look-up of the method by name
        #: on the transport's type and then a call, for every reply.
        self._write: Callable[[Any], object] | None = None
        #: The server's CPU account around protocol work (None: a full-speed node),
        #: held here: the server is an interpreted object, each look-up a dict's.
        self.account: CpuAccount | None = server._account
        # What the housekeeping sweep last saw (node_closing.check_timeouts): since
        # when a partial frame has not grown, since when nothing has happened.
        now = time.monotonic()
        self.frame_since, self.frame_bytes = now, 0
        self.idle_since, self.idle_requests = now, 0

    # asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but behaves as one.
        tcp: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = tcp
        self._write = tcp.write
        server = self.server
        tcp.set_write_buffer_limits(high=server.admission.unsent_high_bytes)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        counters = server.counters
        counters.connections_total += 1
        counters.connections_open += 1
        server._protocols.add(self)
        self.handshake_timer = asyncio.get_running_loop().call_later(
            server.admission.handshake_timeout_s, handshake_expired, self
        )
        server.admit(self)  # may close the connection that has waited longest
        if self.encrypted:
            return  # the client speaks first in TLS: the challenge follows the handshake
        challenge(self)

    def evict(self, waiting_max: int) -> None:
        """Close this connection, still in its handshake, to make room for a newer one
        (the node's cap on connections in their handshake: see ``RpcServer.admit``)."""
        evict(self, waiting_max)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = True
        server = self.server
        server.counters.connections_open -= 1
        server._protocols.discard(self)
        server.authenticated(self)  # no longer waiting, whatever it was
        if self.load_name is not None:
            server.load.give_back("connections", self.load_name)
        if self.handshake_timer is not None:
            self.handshake_timer.cancel()
            self.handshake_timer = None
        for fut in self.pending:
            fut.cancel()  # threads finish their call; only the reply is dropped
        if self.owns_sessions:
            # Release what this connection opened (upload sessions) now, not at an
            # idle timeout: a client that went away must not keep them from others.
            loop = asyncio.get_running_loop()
            for hook in server.registry.disconnect_hooks:
                with contextlib.suppress(RuntimeError):  # the pool is shut down
                    loop.run_in_executor(server._executor, hook, self.number)

    # backpressure: requests are taken off the wire only while the node can answer
    # them without holding more than a few replies for this client.

    def pause_writing(self) -> None:
        self.writing_paused_since = time.monotonic()
        self.hold()

    def resume_writing(self) -> None:
        self.writing_paused_since = None
        self.release()

    def unsent(self) -> int:
        """Reply bytes written and not yet taken by the client's socket (a closing
        connection's too, until it is gone)."""
        transport = self.transport
        if transport is None or self.lost:
            return 0
        return transport.get_write_buffer_size()

    def hold(self) -> None:
        """Stop taking this connection's requests (they wait in the socket)."""
        if not self.held and not self.closed and self.transport is not None:
            self.held = True
            self.server.counters.holds += 1
            self.transport.pause_reading()

    def release(self) -> None:
        """Take requests again if nothing holds them back any more."""
        if (
            not self.held
            or self.closed
            or self.failing is not None
            or self.writing_paused_since is not None
            or self.executing >= self.server.admission.executing_max
            or (self.server.unsent_over and (self.unsent() or self.executing))
        ):
            return
        self.held = False
        assert self.transport is not None
        self.transport.resume_reading()
        self._process(b"")  # requests already buffered

    def data_received(self, data: bytes) -> None:
        self.counters.bytes_in += len(data)
        self.bytes_in += len(data)  # ciphertext too: any byte arriving is progress
        if self.refused or self.failing is not None:
            return
        if self.encrypted:
            data = decrypt(self, data)
            if not data:
                return
        elif not self.authenticated and len(self.first_bytes) < 8:
            self.first_bytes += data[:8]
        account = self.account
        if account is None:
            self.receive(data)
        else:
            with account():  # protocol work is node CPU too
                self.receive(data)

    def receive(self, data: bytes) -> None:
        """Act on a chunk of bytes from the client.

        The usual chunk is one whole request: a small ``read`` is taken by the read
        lane and answered by :meth:`_read`; any other by the codec's request lane
        without an event object, and :func:`~shuttle.net.node_dispatch.dispatch`
        answers it (inline when it can). Anything else goes through :meth:`_process`."""
        if self.held:
            self._process(data)
            return
        conn = self.conn
        if self.read_lane is not None:
            read = conn.receive_read_request(data)
            if read is not None:
                self.requests += 1
                self._read(read)
                return
        parts = conn.receive_request(data)
        if parts is None:
            self._process(data)
            return
        self.requests += 1
        dispatch(self, parts[0], parts[1], parts[2], parts[3])

    def _read(self, read: tuple[Any, ...]) -> None:
        """Answer a ``read`` the read lane took, ``(rid, key, offset, length, version,
        direct)`` (:meth:`Connection.receive_read_request`): from the block cache, the
        reply made as bytes (what :func:`~shuttle.net.node_dispatch.dispatch` would do,
        without its objects) with the page copied once, from the cached block into the
        frame; a ``direct`` read's miss with where its bytes are, if the store says
        (``read_located``, the reply the inline call gives); or else the usual way
        through ``dispatch``.

        The request's values stay the Python objects the parser made (typed ``Any``):
        the compiled build would otherwise unbox each int and box it again, an
        allocation, for every call they are passed on to."""
        rid: Any = read[0]
        key: Any = read[1]
        offset: Any = read[2]
        length: Any = read[3]
        version: Any = read[4]
        lane = self.read_lane
        assert lane is not None
        principal = self.principal
        if principal is not None and not principal.caps.may_read(key):
            # Not the lane's to refuse: the usual way's guard says what is missing.
            dispatch(self, rid, "read", read_args(key, offset, length, version, read[5]), b"")
            return
        data = b""
        start = stop = 0
        where: Any = None
        try:
            # The span of the bytes, buffer[start:stop]: usually the cached block
            # itself, whose range the reply's packer copies straight into the frame;
            # stop 0: none. A native call (lane is a SpanReader), its span a C struct.
            data, start, stop = lane.lane_span(key, offset, length, version)
            if stop == 0:
                # Not all in the block cache: read it here if the page cache has it all,
                # which costs far less than the hop to the pool and back.
                miss = self.read_miss
                if miss is not None:
                    got = miss(key, offset, length, version)
                    if got:
                        data, start, stop = got, 0, len(got)
                if stop == 0 and read[5]:
                    # A client that reads the miss with its own Ceph credentials: told
                    # where the bytes are, if the store would not keep them (after the
                    # guard above: a principal that may not read the key never learns
                    # its object's name).
                    located = self.read_located
                    if located is not None:
                        where = located(key, offset, length, version)
        except Exception:  # it should not raise; the usual way answers what went wrong
            stop = 0
            where = None
        if where is not None and not self.closed:
            counters = self.counters
            counters.requests += 1
            counters.inline += 1
            counters.read_lane += 1
            self.send_reply(rid, {"rados": where}, b"")
            return
        if stop == 0 or self.closed:
            # Both tries made: the usual way goes straight to the pool.
            args = read_args(key, offset, length, version, read[5])
            dispatch(self, rid, "read", args, b"", inline_tried=True)
            return
        counters = self.counters
        counters.requests += 1
        counters.inline += 1
        counters.read_lane += 1  # by_op's "read" too, in the snapshot
        try:
            reply = self.conn.send_read_reply(rid, data, start, stop)
        except ShuttleError as exc:  # e.g. a reply over the client's payload limit
            self.send_error(rid, exc)
            return
        counters.bytes_out += len(reply)
        self.send_bytes(reply)

    def eof_received(self) -> bool | None:
        if self.failing is not None:
            return None
        self.conn.receive_data(b"")
        self._process(b"")
        return None

    # events ---------------------------------------------------------------------------

    def _process(self, data: bytes) -> None:
        """Feed ``data`` (b"": nothing new) to the codec and act on every event."""
        conn = self.conn
        try:
            if self.held:  # keep the bytes; the requests in them wait for release()
                if data:
                    conn.receive_data(data)
                return
            ev = conn.receive_event(data) if data else conn.next_event()
        except RemoteProtocolError as exc:
            fatal(self, exc)
            return
        while not self.closed:
            kind = type(ev)
            if kind is Request:
                assert isinstance(ev, Request)
                self.requests += 1
                dispatch(self, ev.rid, ev.op, ev.args, ev.payload)
            elif ev is NEED_DATA:
                return
            elif kind is RequestRejected:
                assert isinstance(ev, RequestRejected)
                self.send_error(ev.rid, ev.error)
            elif kind is Hello:
                assert isinstance(ev, Hello)
                greet(self, ev)
            elif kind is Goodbye or kind is ConnectionClosed:
                self.close()
                return
            if not conn.pending():
                return  # the usual case: the chunk held one whole request
            if self.held:
                return  # the rest waits for release()
            try:
                ev = conn.next_event()
            except RemoteProtocolError as exc:
                fatal(self, exc)
                return

    # output ---------------------------------------------------------------------------

    def send_reply(self, rid: int, result: Any, payload: Payload) -> None:
        if self.closed:
            return
        try:
            buffers = self.conn.send_response(rid, result, payload, join_below=SMALL_REPLY_BYTES)
        except ShuttleError as exc:  # e.g. a reply over the client's payload limit
            self.send_error(rid, exc)
            return
        self.write_frames(buffers)

    def send_error(self, rid: int, exc: ShuttleError) -> None:
        counters = self.server.counters
        counters.errors += 1
        counters.errors_by_code[exc.code] += 1
        if not self.closed:
            self.write_frames(self.conn.send(ErrorResponse.from_exception(rid, exc)))

    def write_frames(self, buffers: list[Any]) -> None:
        transport = self.transport
        assert transport is not None
        counters = self.server.counters
        if len(buffers) == 1:  # small replies come joined: the client wakes once, not twice
            data = buffers[0]
        elif len(buffers[1]) < SMALL_REPLY_BYTES:
            data = b"".join(buffers)
        else:
            counters.bytes_out += sum(len(b) for b in buffers)
            tls = self.tls
            if tls is None:
                transport.writelines(buffers)
            else:
                transport.writelines([tls.encrypt(b) for b in buffers])
            return
        counters.bytes_out += len(data)
        self.send_bytes(data)

    def send_bytes(self, data: Any) -> None:
        """Write ``data`` (encrypted first on a TLS connection)."""
        write = self._write
        assert write is not None
        tls = self.tls
        write(data if tls is None else tls.encrypt(data))

    def write_raw(self, data: bytes) -> None:
        """Write bytes as they are (TLS handshake records)."""
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            if self.tls is not None and not self.lost:
                with contextlib.suppress(ssl.SSLError):
                    goodbye = self.tls.close()  # close_notify: a clean end, not a cut
                    if goodbye:
                        self.transport.write(goodbye)
            self.transport.close()  # sends what is buffered first...
            if self.transport.get_write_buffer_size():
                # ...which a client that does not read never lets finish.
                asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.abort)

    def abort(self) -> None:
        """Drop the connection now, unsent bytes and all."""
        self.closed = True
        if self.transport is not None and not self.lost:
            self.transport.abort()
