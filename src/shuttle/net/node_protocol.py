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

On a TLS node the connection's ciphertext goes through a
:class:`~shuttle.net.tls.TlsChannel` at its two edges (:meth:`data_received` and
:meth:`NodeProtocol._send_bytes`): everything between them, the read lane included,
handles plaintext exactly as on a plain node.

A client that breaks the protocol (a request id already in flight, garbage bytes)
gets nothing more of its stream read, but every request taken before is answered
before the node says why and closes: a request that ran always has its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from shuttle.errors import (
    AuthenticationError,
    NodeBusyError,
    RemoteProtocolError,
    ShuttleError,
)
from shuttle.net import auth
from shuttle.net.admission import ServerLimits
from shuttle.net.principals import Principal
from shuttle.net.registry import (
    CONNECTION_ARG,
    PRINCIPAL_ARG,
    Mode,
    Operation,
    ReadLane,
    Reply,
)
from shuttle.net.tls import TlsChannel, looks_like_tls
from shuttle.wire import (
    NONCE_BYTES,
    Challenge,
    ConnectionClosed,
    ErrorResponse,
    Goodbye,
    Hello,
    Request,
    RequestRejected,
    Role,
    Welcome,
    choose_version,
)
from shuttle.wire.connection import Connection
from shuttle.wire.events import NEED_DATA, FrameKind, Payload
from shuttle.wire.frames import encode_frame
from shuttle.wire.readlane import read_args

if TYPE_CHECKING:
    from shuttle.net.server import RpcServer
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
        self._handshake_timer: asyncio.TimerHandle | None = None
        #: The first bytes a plain node received (a TLS client's are a ClientHello).
        self._first_bytes = b""
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
        #: Bytes received on it (the sweep watches a partial frame for progress).
        self.bytes_in = 0
        #: ``read``'s call for the read lane (None: reads go the general way).
        read_op = server.registry.find("read")
        self.read_lane: ReadLane | None = None if read_op is None else read_op.read_lane
        #: ``read``'s call for a miss of the lane's block cache (None: the pool reads it).
        self.read_miss: ReadLane | None = None if read_op is None else read_op.read_miss
        # What the housekeeping sweep last saw: since when a partial frame has not
        # grown, since when nothing has happened.
        now = time.monotonic()
        self._frame_since, self._frame_bytes = now, 0
        self._idle_since, self._idle_requests = now, 0

    # asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCPTransport is not an asyncio.Transport subclass, but behaves as one.
        tcp: asyncio.Transport = transport  # type: ignore[assignment]
        self.transport = tcp
        server = self.server
        tcp.set_write_buffer_limits(high=server.admission.unsent_high_bytes)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        counters = server.counters
        counters.connections_total += 1
        counters.connections_open += 1
        server._protocols.add(self)
        self._handshake_timer = asyncio.get_running_loop().call_later(
            server.admission.handshake_timeout_s, self._handshake_expired
        )
        server.admit(self)  # may close the connection that has waited longest
        if self.encrypted:
            return  # the client speaks first in TLS: the challenge follows the handshake
        self._challenge()

    def _challenge(self) -> None:
        """Open the Shuttle handshake (the node speaks first), or refuse as ``busy``."""
        server = self.server
        # A fresh nonce per connection, so a HELLO captured on another connection cannot
        # answer this one.
        self.nonce = os.urandom(NONCE_BYTES)
        challenge = Challenge(self.nonce, server.requires_key, auth.SCHEME)
        self._write(self.conn.send(challenge))
        if server.counters.connections_open > server.connections_max:
            self._refuse_busy()

    def evict(self, waiting_max: int) -> None:
        """Close this connection, still in its handshake, to make room for a newer one
        (the node's cap on connections in their handshake: see ``RpcServer.admit``)."""
        if self.closed:
            return
        self.server.counters.unauthenticated_evicted += 1
        if not self.encrypted or (self.tls is not None and self.tls.established):
            busy = NodeBusyError(
                f"node {self.server.node_id} has {waiting_max} connections in their handshake, "
                "and this one had waited longest; retry (a flood of connections that never "
                "authenticate may be under way)"
            )
            with contextlib.suppress(ShuttleError):
                self._write(self.conn.send(ErrorResponse.from_exception(0, busy)))
            self._close()
        else:
            self.abort()  # it has not even finished TLS: nothing it could read

    def _handshake_expired(self) -> None:
        """The deadline for the handshake passed: close the connection unless it is done."""
        self._handshake_timer = None
        if self.authenticated or self.closed:
            return
        server = self.server
        server.counters.handshake_timeouts += 1
        server.authenticated(self)
        limit = server.admission.handshake_timeout_s
        log.info("closing %s: no handshake within %g s", self.peer, limit)
        if self.encrypted and (self.tls is None or not self.tls.established):
            self.abort()
            return
        late = RemoteProtocolError(
            f"the handshake (HELLO) did not finish within {limit:g} s of connecting; "
            "closing the connection"
        )
        with contextlib.suppress(ShuttleError):
            self._write(self.conn.send(ErrorResponse.from_exception(0, late)))
        self._close()

    def _refuse_busy(self) -> None:
        """Over the cap: say ``busy`` right after the challenge (where a client reads
        it, even if its HELLO then meets a closed socket) and close."""
        server = self.server
        server.counters.connections_refused += 1
        self.refused = True
        busy = NodeBusyError(
            f"node {server.node_id} is serving its maximum of {server.connections_max} "
            "connections; retry shortly, close idle connections, or start the node with a "
            "higher --connections-max"
        )
        if server.counters.connections_refused % 1000 == 1:
            log.warning("refusing %s: %s", self.peer, busy)
        self._write(self.conn.send(ErrorResponse.from_exception(0, busy)))
        # Closed at once (after the two frames are flushed): a refused connection must
        # give its descriptor back, or a flood of them would take what the cap protects.
        self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.lost = True
        server = self.server
        server.counters.connections_open -= 1
        server._protocols.discard(self)
        server.authenticated(self)  # no longer waiting, whatever it was
        if self.load_name is not None:
            server.load.give_back("connections", self.load_name)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
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

    def check_timeouts(self, now: float, limits: ServerLimits) -> None:
        """Close the connection if a frame stopped arriving, its client stopped reading
        replies, or it idled (from the sweep)."""
        if self.closed or self.refused or self.failing is not None:
            return  # (a failing one closes once the requests it had running are answered)
        # A partial frame with no byte arriving for the timeout (progress resets it:
        # a big upload on a slow link is never cut while it moves).
        partial = self.conn.partial_frame
        if not partial or self.bytes_in != self._frame_bytes:
            self._frame_since, self._frame_bytes = now, self.bytes_in
        elif not self.held and now - self._frame_since > limits.frame_timeout_s:
            self.server.counters.frame_timeouts += 1
            self._fatal(
                RemoteProtocolError(
                    f"a frame has been incomplete with nothing arriving for over "
                    f"{limits.frame_timeout_s:g} s ({self.conn.buffered_bytes} bytes of it "
                    "arrived); closing the connection"
                )
            )
            return
        # Unsent replies over the high mark that have not drained to the low mark for
        # the timeout (nothing is added meanwhile): the client stopped reading.
        unsent = self.unsent()
        if (
            self.writing_paused_since is not None
            and now - self.writing_paused_since > limits.frame_timeout_s
        ):
            self.server.counters.send_timeouts += 1
            log.warning(
                "closing %s: its client has not read its %d unsent reply bytes for over %g s",
                self.peer,
                unsent,
                limits.frame_timeout_s,
            )
            self.abort()
            return
        if partial or self.pending or self.held or unsent or self._idle_requests != self.requests:
            self._idle_since, self._idle_requests = now, self.requests
        elif self.owns_sessions and self.server.registry.owns_anything(self.number):
            self._idle_since = now  # a slow writer keeps its upload session
        elif now - self._idle_since > limits.idle_timeout_s:
            self.server.counters.idle_closed += 1
            log.info("closing %s: idle for over %g s", self.peer, limits.idle_timeout_s)
            self.goodbye(f"idle for over {limits.idle_timeout_s:g} s; reconnect when needed")

    def data_received(self, data: bytes) -> None:
        server = self.server
        server.counters.bytes_in += len(data)
        self.bytes_in += len(data)  # ciphertext too: any byte arriving is progress
        if self.refused or self.failing is not None:
            return
        if self.encrypted:
            data = self._decrypt(data)
            if not data:
                return
        elif not self.authenticated and len(self._first_bytes) < 8:
            self._first_bytes += data[:8]
        account = server._account
        if account is None:
            self._receive(data)
        else:
            with account():  # protocol work is node CPU too
                self._receive(data)

    def _receive(self, data: bytes) -> None:
        """Act on a chunk of bytes from the client.

        The usual chunk is one whole request: a small ``read`` is taken by the read
        lane and answered by :meth:`_read`; any other by the codec's request lane
        without an event object, and :meth:`_dispatch` answers it (inline when it
        can). Anything else goes through :meth:`_process`."""
        if self.held:
            self._process(data)
            return
        conn = self.conn
        if self.read_lane is not None:
            read = conn.receive_read_request(data)
            if read is not None:
                self.requests += 1
                self._read(read[0], read[1], read[2], read[3], read[4])
                return
        parts = conn.receive_request(data)
        if parts is None:
            self._process(data)
            return
        self.requests += 1
        self._dispatch(parts[0], parts[1], parts[2], parts[3])

    def _read(self, rid: int, key: str, offset: int, length: int, version: int | None) -> None:
        """Answer a ``read`` the read lane took: from the block cache, the reply made as
        bytes (what :meth:`_dispatch` would do, without its objects), or else the
        usual way through :meth:`_dispatch`."""
        lane = self.read_lane
        assert lane is not None
        principal = self.principal
        if principal is not None and not principal.caps.may_read(key):
            # Not the lane's to refuse: the usual way's guard says what is missing.
            self._dispatch(rid, "read", read_args(key, offset, length, version), b"")
            return
        try:
            data = lane(key, offset, length, version)
            if data is None:
                # Not all in the block cache: read it here if the page cache has it all,
                # which costs far less than the hop to the pool and back.
                miss = self.read_miss
                if miss is not None:
                    data = miss(key, offset, length, version)
        except Exception:  # it should not raise; the usual way answers what went wrong
            data = None
        if data is None or self.closed:
            # Both tries made: the usual way goes straight to the pool.
            self._dispatch(
                rid, "read", read_args(key, offset, length, version), b"", inline_tried=True
            )
            return
        counters = self.counters
        counters.requests += 1
        counters.inline += 1
        counters.read_lane += 1  # by_op's "read" too, in the snapshot
        try:
            reply = self.conn.send_read_reply(rid, data)
        except ShuttleError as exc:  # e.g. a reply over the client's payload limit
            self._send_error(rid, exc)
            return
        counters.bytes_out += len(reply)
        self._send_bytes(reply)

    def _decrypt(self, data: bytes) -> bytes:
        """A TLS connection's ciphertext in, its plaintext out (b"": nothing yet). Drives
        the TLS handshake, then opens the Shuttle one; a TLS failure closes the
        connection (after the alert that says why)."""
        tls = self.tls
        if tls is None:
            server_tls = self.server.tls
            assert server_tls is not None
            tls = self.tls = TlsChannel(server_tls.context(), server_side=True)
        try:
            # The usual case is one call: decrypt what came.
            plain = tls.decrypt(data) if tls.established else self._tls_handshake(tls, data)
        except ssl.SSLError as exc:
            self._tls_failed(exc)
            return b""
        if tls.peer_closed:  # close_notify: the client ended its side
            if plain:
                self._receive(plain)
            self.eof_received()
            return b""
        return plain

    def _tls_handshake(self, tls: TlsChannel, data: bytes) -> bytes:
        """Advance the TLS handshake with ``data``; once it is done, open the Shuttle
        handshake and return any plaintext that came with the client's last flight."""
        tls.feed(data)
        done = tls.handshake()
        out = tls.output()
        if out:
            self._raw_write(out)
        if not done:
            return b""
        self.binding = tls.binding()
        self._challenge()
        if self.closed:
            return b""
        return tls.read()

    def _tls_failed(self, exc: ssl.SSLError) -> None:
        """Count and log a TLS failure, send the alert TLS made for it, and close."""
        server = self.server
        server.counters.tls_failures += 1
        tls = self.tls
        assert tls is not None
        reason = getattr(exc, "reason", None) or str(exc)
        if tls.established:
            log.warning(
                "closing %s: a TLS record failed its authentication (%s): bytes changed on "
                "the way?",
                self.peer,
                reason,
            )
        elif server.counters.tls_failures % 1000 == 1:
            log.warning("TLS handshake with %s failed: %s", self.peer, reason)
        with contextlib.suppress(ssl.SSLError):
            alert = tls.output()
            if alert and self.transport is not None and not self.closed:
                self.transport.write(alert)
        self.refused = True  # nothing more of its stream is read
        self.server.authenticated(self)
        self._close()

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
            self._fatal(exc)
            return
        while not self.closed:
            kind = type(ev)
            if kind is Request:
                assert isinstance(ev, Request)
                self.requests += 1
                self._dispatch(ev.rid, ev.op, ev.args, ev.payload)
            elif ev is NEED_DATA:
                return
            elif kind is RequestRejected:
                assert isinstance(ev, RequestRejected)
                self._send_error(ev.rid, ev.error)
            elif kind is Hello:
                assert isinstance(ev, Hello)
                self._greet(ev)
            elif kind is Goodbye or kind is ConnectionClosed:
                self._close()
                return
            if not conn.pending():
                return  # the usual case: the chunk held one whole request
            if self.held:
                return  # the rest waits for release()
            try:
                ev = conn.next_event()
            except RemoteProtocolError as exc:
                self._fatal(exc)
                return

    def _greet(self, hello: Hello) -> None:
        """Answer the HELLO: WELCOME (with the node's proof when it has a key), or an
        ERROR on the connection (rid 0) and close when versions or credentials fail."""
        server = self.server
        try:
            version = choose_version(hello)
            key, principal = server.credentials_for(hello)
            proof = auth.check_hello(hello, key, self.nonce, server.node_id, binding=self.binding)
        except (RemoteProtocolError, AuthenticationError) as exc:
            if isinstance(exc, AuthenticationError):
                server.counters.auth_failures += 1
            log.warning("refusing %s (client %r): %s", self.peer, hello.client_name[:80], exc)
            self._write(self.conn.send(ErrorResponse.from_exception(0, exc)))
            self._close()
            return
        if principal is not None:
            try:  # its share of the node's connections (net/principal_limits.py)
                server.load.take("connections", principal.name)
            except NodeBusyError as exc:
                log.info("refusing %s: %s", self.peer, exc)
                self._write(self.conn.send(ErrorResponse.from_exception(0, exc)))
                self._close()
                return
            self.load_name = principal.name
            self.principal = principal
        welcome = Welcome(version, server.node_id, server.limits.to_wire(), proof)
        self._write(self.conn.send(welcome))
        self.authenticated = True
        server.authenticated(self)
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def _dispatch(
        self,
        rid: int,
        name: str,
        args: dict[str, Any],
        payload: Payload,
        inline_tried: bool = False,
    ) -> None:
        """Run request ``rid`` (operation ``name``) and answer it, now or when it is done;
        ``inline_tried``: the read lane has just tried what the inline call would."""
        server = self.server
        counters = server.counters
        counters.requests += 1
        counters.by_op[name] += 1
        op = server.registry.find(name)
        if op is None:
            try:
                server.registry.get(name)  # raises the error naming the known operations
            except ShuttleError as exc:
                self._send_error(rid, exc)
            return
        principal = self.principal
        if principal is not None:
            guard = op.guard
            try:
                if guard is None:
                    principal.require_admin(f"call {name}, a cluster operation")
                else:
                    guard(principal, args)
            except ShuttleError as exc:  # NotPermittedError, naming what is missing
                self._send_error(rid, exc)
                return
        if op.wants_principal:
            args[PRINCIPAL_ARG] = principal  # whatever the client put there
        inline = op.inline
        if inline is not None:
            if not inline_tried:
                # The node's one inline-answer path. On the event loop, inside
                # data_received's CPU account: no second account, no Future, no closure.
                try:
                    out = inline(args, payload if type(payload) is bytes else bytes(payload))
                except Exception as exc:  # every failure is answered, typed
                    self._send_error(rid, server.error_for(op.name, exc))
                    return
                if out is not None:
                    counters.inline += 1
                    self._send_reply(rid, out.result, out.payload)
                    return
            # Not answerable from memory (a block-cache miss, a large read, a stat that
            # must read its attributes): the operation runs its usual way.
            counters.inline_declined[name] += 1
        load_name = self.load_name
        if load_name is not None:
            try:  # its principal's share of the node's requests in flight
                server.load.take("requests", load_name)
            except NodeBusyError as exc:
                self._send_error(rid, exc)
                return
        if op.per_connection:
            args[CONNECTION_ARG] = self.number  # whatever the client put there
            self.owns_sessions = True
        req = Request(rid, name, args, payload)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any]
        if op.mode is Mode.THREAD:
            started: asyncio.Future[Any] | None = None
            try:
                wait = None if op.before is None else op.before(args)
                start = op.start  # without a thread when it can (op.start's docstring)
                if wait is None and start is not None:
                    started = start(args, payload if type(payload) is bytes else bytes(payload))
            except Exception as exc:  # every failure is answered, typed
                if load_name is not None:
                    server.load.give_back("requests", load_name)
                self._send_error(rid, server.error_for(op.name, exc))
                return
            if wait is None:
                if started is None:
                    counters.threaded += 1
                    fut = loop.run_in_executor(server._executor, server.call_sync, op, req)
                else:
                    counters.started += 1
                    fut = started
            else:  # wait on the loop, then hop: a waiting request holds no thread
                counters.threaded += 1
                fut = loop.create_task(self._call_after(wait, op, req))
            fut.add_done_callback(lambda f: self._finished(f, rid, op.name, True))
            self.executing += 1
            if self.executing >= server.admission.executing_max or server.unsent_over:
                self.hold()
        else:
            # Not counted: an object's call may wait for another request on this same
            # connection (nested calls between run-times), which a cap could deadlock.
            # Its replies are bounded by the unsent-bytes hold and the in-flight limit.
            fut = loop.create_task(self._call_async(op, req))
            fut.add_done_callback(lambda f: self._finished(f, rid, op.name, False))
        self.pending.add(fut)

    async def _call_after(self, wait: Awaitable[None], op: Operation, req: Request) -> Reply:
        await wait
        server = self.server
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(server._executor, server.call_sync, op, req)

    async def _call_async(self, op: Operation, req: Request) -> Reply:
        out = await op.handler(req.args, bytes(req.payload))
        return out if isinstance(out, Reply) else Reply(out)

    def _finished(self, fut: asyncio.Future[Any], rid: int, op_name: str, counted: bool) -> None:
        self.pending.discard(fut)
        if counted:
            self.executing -= 1
        if self.load_name is not None:
            self.server.load.give_back("requests", self.load_name)
        if self.closed or fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            self._send_error(rid, self.server.error_for(op_name, exc))
        else:
            reply: Reply = fut.result()
            self._send_reply(rid, reply.result, reply.payload)
        if self.failing is not None:
            if not self.pending:  # the last request taken is answered: now say why
                self._hang_up(self.failing)
            return
        if self.held:
            self.release()

    # output ---------------------------------------------------------------------------

    def _send_reply(self, rid: int, result: Any, payload: Payload) -> None:
        if self.closed:
            return
        try:
            buffers = self.conn.send_response(rid, result, payload, join_below=SMALL_REPLY_BYTES)
        except ShuttleError as exc:  # e.g. a reply over the client's payload limit
            self._send_error(rid, exc)
            return
        self._write(buffers)

    def _send_error(self, rid: int, exc: ShuttleError) -> None:
        counters = self.server.counters
        counters.errors += 1
        counters.errors_by_code[exc.code] += 1
        if not self.closed:
            self._write(self.conn.send(ErrorResponse.from_exception(rid, exc)))

    def _write(self, buffers: list[Any]) -> None:
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
        self._send_bytes(data)

    def _send_bytes(self, data: Any) -> None:
        """Write ``data`` (encrypted first on a TLS connection)."""
        transport = self.transport
        assert transport is not None
        tls = self.tls
        transport.write(data if tls is None else tls.encrypt(data))

    def _raw_write(self, data: bytes) -> None:
        """Write bytes as they are (TLS handshake records)."""
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def _fatal(self, exc: RemoteProtocolError) -> None:
        """The client broke the protocol (or its stream is corrupt): read nothing more of
        it, answer every request it sent before (they were taken, and may have run),
        then tell it why (rid 0) and hang up."""
        server = self.server
        server.counters.protocol_errors += 1
        if not self.encrypted and not self.authenticated and looks_like_tls(self._first_bytes):
            log.warning(
                "protocol error from %s: it speaks TLS, and this node serves without TLS "
                "(start it with --tls, or connect without TLS)",
                self.peer,
            )
        else:
            log.warning("protocol error from %s: %s", self.peer, exc)
        if self.pending and not self.closed and self.failing is None:
            self.failing = exc
            server.counters.drained_before_close += 1
            if self.transport is not None:
                self.transport.pause_reading()
            return
        self._hang_up(exc)

    def _hang_up(self, exc: RemoteProtocolError) -> None:
        """Send the connection's ERROR (rid 0) saying why, and close."""
        limits = self.server.limits
        frame = encode_frame(
            FrameKind.ERROR,
            [0, exc.code, str(exc)],
            header_bytes_max=limits.header_bytes_max,
            payload_bytes_max=limits.payload_bytes_max,
        )
        if self.transport is not None and not self.closed:
            self._send_bytes(b"".join(frame))
        self._close()

    def revoke(self, error: ShuttleError) -> None:
        """The principal it authenticated as is gone: say why (rid 0) and close. Replies
        of requests still running are dropped (their clients see the error)."""
        if self.closed or self.transport is None:
            return
        log.warning("closing %s: %s", self.peer, error)
        with contextlib.suppress(ShuttleError):
            self._write(self.conn.send(ErrorResponse.from_exception(0, error)))
        self._close()

    def goodbye(self, reason: str) -> None:
        """Say GOODBYE and close: only when every request taken has been answered
        (clients may then send the unanswered ones again, safely)."""
        if self.closed or self.transport is None:
            return
        if self.encrypted and (self.tls is None or not self.tls.established):
            self.abort()  # still in its TLS handshake: no frame could reach it
            return
        with contextlib.suppress(ShuttleError):
            self._write(self.conn.send(Goodbye(reason)))
        self._close()

    def _close(self) -> None:
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
