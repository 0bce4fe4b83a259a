"""The asyncio server that runs an :class:`OperationRegistry` over the wire codec.

Only bytes move here; the protocol lives in :mod:`shuttle.wire` and the operations in
whatever registered them. Each connection answers every request exactly once, with a
:class:`Response` or a typed :class:`ErrorResponse`; a connection is dropped only when
its byte stream is corrupt (then the peer first gets an error frame saying why).
A client that disconnects mid-request costs nothing but the work already started:
late replies are discarded and the node keeps serving the others. What a connection
can make the node hold (memory for requests and replies, descriptors, time) is
bounded by :class:`~shuttle.net.admission.ServerLimits`: a client that does not
read its replies stops being served until it does, a frame that stalls and a
connection that idles are closed, and connections past the cap are refused as busy.

Every connection starts with the node's CHALLENGE (a fresh nonce). A node with a
cluster key accepts only a HELLO whose proof answers that nonce
(:mod:`shuttle.net.auth`), so no request reaches a handler unauthenticated; a node
without one accepts any HELLO.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from shuttle.errors import (
    AuthenticationError,
    ConfigError,
    NodeBusyError,
    RemoteProtocolError,
    ServerError,
    ShuttleError,
    StorageIOError,
)
from shuttle.net import auth
from shuttle.net.admission import (
    ServerLimits,
    effective_connections_max,
    raise_descriptor_limit,
)
from shuttle.net.registry import CONNECTION_ARG, Mode, Operation, OperationRegistry, Reply
from shuttle.wire import (
    NONCE_BYTES,
    Challenge,
    ConnectionClosed,
    ErrorResponse,
    Goodbye,
    Hello,
    Limits,
    Request,
    RequestRejected,
    Role,
    Welcome,
    choose_version,
)
from shuttle.wire.connection import Connection
from shuttle.wire.events import NEED_DATA, FrameKind, Payload
from shuttle.wire.frames import encode_frame

log = logging.getLogger("shuttle.node")

#: Threads for blocking handlers (fsync-bound writes, cold reads). Disk work gains
#: little from more on one device; a few keep a slow fsync from stalling other reads.
EXECUTOR_THREADS = 4

#: How long a graceful shutdown waits for requests already running.
SHUTDOWN_GRACE_S = 10.0

_INLINE = Mode.INLINE

#: How long a closing connection may take to send what is buffered for it before it
#: is dropped (a client that does not read would keep it forever).
CLOSE_GRACE_S = 10.0

#: Errors of a process out of descriptors: a transient shortage, not a disk fault.
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})

#: Replies with payloads below this are sent as one joined buffer.
SMALL_REPLY_BYTES = 64 << 10


@dataclass
class ServerCounters:
    """What the server has done since it started (the ``node.stats`` operation)."""

    started_at: float = field(default_factory=time.time)
    connections_total: int = 0
    connections_open: int = 0
    requests: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    protocol_errors: int = 0
    #: Handshakes refused for missing or wrong credentials (or a replayed HELLO).
    auth_failures: int = 0
    #: Connections refused because the node served its maximum (``busy``).
    connections_refused: int = 0
    #: Connections closed because a frame stalled, or because they idled.
    frame_timeouts: int = 0
    idle_closed: int = 0
    #: Times a connection's requests were held back until its client read replies.
    holds: int = 0
    #: Connections dropped because their client took none of their replies for long.
    send_timeouts: int = 0
    by_op: Counter[str] = field(default_factory=Counter)
    errors_by_code: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, Any]:
        return {
            "uptime_s": round(time.time() - self.started_at, 3),
            "connections_total": self.connections_total,
            "connections_open": self.connections_open,
            "requests": self.requests,
            "errors": self.errors,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "protocol_errors": self.protocol_errors,
            "auth_failures": self.auth_failures,
            "connections_refused": self.connections_refused,
            "frame_timeouts": self.frame_timeouts,
            "idle_closed": self.idle_closed,
            "holds": self.holds,
            "send_timeouts": self.send_timeouts,
            "by_op": dict(self.by_op),
            "errors_by_code": dict(self.errors_by_code),
        }


CpuAccount = Callable[[], AbstractContextManager[Any]]


class RpcServer:
    """Serves ``registry`` on a TCP port.

    ``cpu_account`` wraps every handler call (e.g. the node's CPU speed factor,
    which burns extra CPU after the work to emulate a slower machine). With ``key``
    (the cluster key) every client must prove it holds the same key in the
    handshake; without it any client is served. ``admission`` bounds what clients
    can make the node hold (see :mod:`shuttle.net.admission`).
    """

    def __init__(
        self,
        registry: OperationRegistry,
        node_id: str,
        *,
        limits: Limits | None = None,
        executor_threads: int = EXECUTOR_THREADS,
        cpu_account: CpuAccount = nullcontext,
        key: bytes | None = None,
        admission: ServerLimits | None = None,
    ) -> None:
        if key is not None and len(key) != auth.KEY_BYTES:
            raise ConfigError(f"a cluster key is {auth.KEY_BYTES} bytes, got {len(key)}")
        self.registry = registry
        self.node_id = node_id
        self.limits = limits or Limits()
        #: The cluster key clients must prove they hold, or None (any client is served).
        self.key = key
        self.counters = ServerCounters()
        self.cpu_account = cpu_account
        #: The account to enter around protocol work, or None when it would do nothing
        #: (a full-speed node): two clock reads and a generator per request saved.
        self._account: CpuAccount | None = None if cpu_account is nullcontext else cpu_account
        self._executor = ThreadPoolExecutor(executor_threads, thread_name_prefix="shuttle-io")
        self._server: asyncio.Server | None = None
        self._protocols: set[_NodeProtocol] = set()
        self.admission = admission or ServerLimits()
        #: The connection cap in force (fitted to the descriptor limit at start).
        self.connections_max = self.admission.connections_max
        #: True while all connections' unsent replies together are over the node's bound.
        self.unsent_over = False
        self.unsent_bytes = 0
        self._connection_numbers = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._stats_sources: dict[str, Callable[[], dict[str, Any]]] = {}
        self._register_system_ops()

    @property
    def requires_key(self) -> bool:
        """Whether clients must authenticate with the cluster key (the run-time refuses
        shipped code on a node where this is False)."""
        return self.key is not None

    # --- system operations ---------------------------------------------------------

    def add_stats_source(self, name: str, source: Callable[[], dict[str, Any]]) -> None:
        """Add a section to ``node.stats`` (the store, its cache, the CPU governor...)."""
        self._stats_sources[name] = source

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node_id, "server": self.counters.snapshot()}
        out["server"]["connections_max"] = self.connections_max
        out["server"]["connections_held"] = sum(1 for p in self._protocols if p.held)
        out["server"]["connections_mid_frame"] = sum(
            1 for p in self._protocols if p.conn.partial_frame
        )
        out["server"]["unsent_bytes"] = self.unsent_bytes
        for name, source in self._stats_sources.items():
            out[name] = source()
        return out

    def _register_system_ops(self) -> None:
        reg = self.registry

        def ping(args: dict[str, Any], payload: bytes) -> Reply:
            """Answer at once, echoing the payload (liveness and round-trip probe)."""
            return Reply({"node": self.node_id, "time": time.time()}, payload)

        def node_ops(args: dict[str, Any], payload: bytes) -> Any:
            """The operations this node serves, with their modes and descriptions."""
            return [{"name": op.name, "mode": op.mode.value, "doc": op.doc} for op in reg]

        def node_stats(args: dict[str, Any], payload: bytes) -> Any:
            """Counters of the server and of every registered component."""
            return self.stats()

        reg.add("ping", ping)
        reg.add("node.ops", node_ops)
        reg.add("node.stats", node_stats)

    # --- lifecycle -----------------------------------------------------------------

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0 picks a free one); returns the bound address."""
        loop = asyncio.get_running_loop()
        soft, _hard = raise_descriptor_limit()
        self.connections_max = effective_connections_max(self.admission.connections_max, soft)
        self._server = await loop.create_server(
            lambda: _NodeProtocol(self), host, port, reuse_address=True, backlog=512
        )
        sock = self._server.sockets[0]
        bound = sock.getsockname()
        log.info("node %s listening on %s:%d", self.node_id, bound[0], bound[1])
        self._sweeper = loop.create_task(self._sweep_forever())
        return bound[0], bound[1]

    def next_connection_number(self) -> int:
        self._connection_numbers += 1
        return self._connection_numbers

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.admission.sweep_interval_s)
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> None:
        """Housekeeping: cut stalled frames and idle connections, and hold or release
        connections as the node's unsent replies cross its bound."""
        limits = self.admission
        total = 0
        for proto in list(self._protocols):
            total += proto.unsent()
            try:
                proto.check_timeouts(now, limits)
            except Exception:  # one connection's trouble must not stop the sweeps
                log.exception("housekeeping of connection %s failed", proto.peer)
        self.unsent_bytes = total
        over = total > limits.node_unsent_max_bytes
        if over and not self.unsent_over:
            log.warning(
                "unsent replies total %d MiB, over the node's %d MiB: holding back the "
                "requests of connections whose clients are not reading",
                total >> 20,
                limits.node_unsent_max_bytes >> 20,
            )
        self.unsent_over = over
        for proto in list(self._protocols):
            if over and (proto.unsent() or proto.executing):
                proto.hold()
            elif proto.held:
                try:
                    proto.release()
                except Exception:
                    log.exception("releasing connection %s failed", proto.peer)

    async def close(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop accepting, let running requests finish (up to ``grace_s``), say goodbye."""
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + grace_s
        while any(p.pending for p in self._protocols) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for proto in list(self._protocols):
            if proto.pending:  # GOODBYE promises every request taken was answered
                proto.abort()
            else:
                proto.goodbye("node is shutting down")
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=1.0)
        self._executor.shutdown(wait=True, cancel_futures=False)
        log.info("node %s stopped", self.node_id)

    # --- calling handlers ----------------------------------------------------------

    def call_sync(self, op: Operation, req: Request) -> Reply:
        """Run a synchronous handler under the CPU account; errors become exceptions."""
        payload = req.payload
        if type(payload) is not bytes:
            payload = bytes(payload)
        account = self._account
        if account is None:
            out = op.handler(req.args, payload)
        else:
            with account():
                out = op.handler(req.args, payload)
        return out if type(out) is Reply else Reply(out)

    def error_for(self, op_name: str, exc: BaseException) -> ShuttleError:
        """The typed error a handler's exception becomes on the wire."""
        if isinstance(exc, ShuttleError):
            return exc
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS:
            return NodeBusyError(
                f"{op_name}: node {self.node_id} is out of file descriptors ({exc.strerror}); "
                "nothing was changed: retry shortly, and if it persists raise the node's "
                "'ulimit -n' or lower --connections-max"
            )
        if isinstance(exc, OSError):
            return StorageIOError(
                f"{op_name}: the node's disk failed ({exc.strerror or exc}); "
                "check the node's log and free space"
            )
        log.error("internal error in %s", op_name, exc_info=exc)
        return ServerError(
            f"{op_name}: internal error on node {self.node_id} ({type(exc).__name__}: {exc}); "
            "see the node's log"
        )


class _NodeProtocol(asyncio.Protocol):
    """One client connection: bytes → codec events → handlers → bytes."""

    def __init__(self, server: RpcServer) -> None:
        self.server = server
        self.conn = Connection(Role.SERVER, server.limits)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.pending: set[asyncio.Future[Any]] = set()
        self.closed = False
        #: This connection's challenge nonce: a HELLO's proof must answer it.
        self.nonce = b""
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
        self.writing_paused = False
        #: When its unsent replies last went over the high mark without draining since.
        self.writing_paused_since: float | None = None
        #: A connection over the node's cap is answered ``busy`` and closed.
        self.refused = False
        #: True once asyncio reported the connection gone (``closed`` is set earlier).
        self.lost = False
        #: Bytes received on it (the sweep watches a partial frame for progress).
        self.bytes_in = 0
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
        # The node speaks first: a fresh nonce per connection, so a HELLO captured on
        # another connection cannot answer this one.
        self.nonce = os.urandom(NONCE_BYTES)
        challenge = Challenge(self.nonce, server.requires_key, auth.SCHEME)
        self._write(self.conn.send(challenge))
        if counters.connections_open > server.connections_max:
            self._refuse_busy()

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
        self.writing_paused = True
        self.writing_paused_since = time.monotonic()
        self.hold()

    def resume_writing(self) -> None:
        self.writing_paused = False
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
            or self.writing_paused
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
        if self.closed or self.refused:
            return
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
        self.bytes_in += len(data)
        if self.refused:
            return
        account = server._account
        if account is None:
            self._receive(data)
        else:
            with account():  # protocol work is node CPU too
                self._receive(data)

    def _receive(self, data: bytes) -> None:
        """Act on a chunk of bytes from the client.

        The usual chunk is one whole request for an operation that runs inline (a
        cached read, a stat): it is taken without an event object and answered right
        here, which is _dispatch's inline branch written out (every call saved shows
        in a loopback round trip). Anything else goes through :meth:`_process`."""
        server = self.server
        conn = self.conn
        parts = None if self.held else conn.receive_request(data)
        if parts is None:
            self._process(data)
            return
        self.requests += 1
        rid, name, args, payload = parts
        op = server.registry.find(name)
        if (
            op is None
            or self.closed
            or (op.mode is not _INLINE and (op.inline_when is None or not op.inline_when(args)))
        ):
            self._dispatch(rid, name, args, payload)
            return
        counters = server.counters
        counters.requests += 1
        counters.by_op[name] += 1
        try:
            out = op.handler(args, payload)
            if type(out) is Reply:
                buffers = conn.send_response(rid, out.result, out.payload)
            else:
                buffers = conn.send_response(rid, out, b"")
        except Exception as exc:  # every failure is answered, typed
            self._send_error(rid, server.error_for(op.name, exc))
            return
        transport = self.transport
        if transport is not None:
            if len(buffers) == 1:
                counters.bytes_out += len(buffers[0])
                transport.write(buffers[0])
            else:
                counters.bytes_out += len(buffers[0]) + len(buffers[1])
                transport.writelines(buffers)

    def eof_received(self) -> bool | None:
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
            proof = auth.check_hello(hello, server.key, self.nonce, server.node_id)
        except (RemoteProtocolError, AuthenticationError) as exc:
            if isinstance(exc, AuthenticationError):
                server.counters.auth_failures += 1
            log.warning("refusing %s (client %r): %s", self.peer, hello.client_name[:80], exc)
            self._write(self.conn.send(ErrorResponse.from_exception(0, exc)))
            self._close()
            return
        welcome = Welcome(version, server.node_id, server.limits.to_wire(), proof)
        self._write(self.conn.send(welcome))

    def _dispatch(self, rid: int, name: str, args: dict[str, Any], payload: Payload) -> None:
        """Run request ``rid`` (operation ``name``) and answer it, now or when it is done."""
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
        if op.mode is _INLINE or (op.inline_when is not None and op.inline_when(args)):
            # On the event loop, inside data_received's CPU account: no second account,
            # no Future, no closure; the reply is encoded and written right here.
            try:
                out = op.handler(args, payload if type(payload) is bytes else bytes(payload))
            except Exception as exc:  # every failure is answered, typed
                self._send_error(rid, server.error_for(op.name, exc))
                return
            if type(out) is Reply:
                result, payload = out.result, out.payload
            else:
                result, payload = out, b""
            try:
                buffers = self.conn.send_response(
                    rid, result, payload, join_below=SMALL_REPLY_BYTES
                )
            except ShuttleError as exc:  # e.g. a reply over the client's payload limit
                self._send_error(rid, exc)
                return
            if len(buffers) == 1 and self.transport is not None:
                counters.bytes_out += len(buffers[0])
                self.transport.write(buffers[0])
            else:
                self._write(buffers)
            return
        if op.per_connection:
            args[CONNECTION_ARG] = self.number  # whatever the client put there
            self.owns_sessions = True
        req = Request(rid, name, args, payload)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any]
        if op.mode is Mode.THREAD:
            fut = loop.run_in_executor(server._executor, server.call_sync, op, req)
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

    async def _call_async(self, op: Operation, req: Request) -> Reply:
        out = await op.handler(req.args, bytes(req.payload))
        return out if isinstance(out, Reply) else Reply(out)

    def _finished(self, fut: asyncio.Future[Any], rid: int, op_name: str, counted: bool) -> None:
        self.pending.discard(fut)
        if counted:
            self.executing -= 1
        if self.closed or fut.cancelled():
            return
        exc = fut.exception()
        if exc is not None:
            self._send_error(rid, self.server.error_for(op_name, exc))
        else:
            reply: Reply = fut.result()
            self._send_reply(rid, reply.result, reply.payload)
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
            transport.writelines(buffers)
            return
        counters.bytes_out += len(data)
        transport.write(data)

    def _fatal(self, exc: RemoteProtocolError) -> None:
        """The stream is corrupt: tell the peer why (rid 0), then hang up."""
        self.server.counters.protocol_errors += 1
        log.warning("protocol error from %s: %s", self.peer, exc)
        limits = self.server.limits
        frame = encode_frame(
            FrameKind.ERROR,
            [0, exc.code, str(exc)],
            header_bytes_max=limits.header_bytes_max,
            payload_bytes_max=limits.payload_bytes_max,
        )
        if self.transport is not None and not self.closed:
            self.transport.writelines(frame)
        self._close()

    def goodbye(self, reason: str) -> None:
        """Say GOODBYE and close: only when every request taken has been answered
        (clients may then send the unanswered ones again, safely)."""
        if self.closed or self.transport is None:
            return
        with contextlib.suppress(ShuttleError):
            self._write(self.conn.send(Goodbye(reason)))
        self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()  # sends what is buffered first...
            if self.transport.get_write_buffer_size():
                # ...which a client that does not read never lets finish.
                asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.abort)

    def abort(self) -> None:
        """Drop the connection now, unsent bytes and all."""
        self.closed = True
        if self.transport is not None and not self.lost:
            self.transport.abort()
