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
without one accepts any HELLO. A HELLO that names a principal is checked against
that principal's key (derived from the cluster key, :mod:`shuttle.net.principals`),
and every request of its connection against the principal's capabilities (the
operation's guard) before it runs; when the principal is removed, its connections
are closed. With TLS (``tls``, :class:`~shuttle.net.tls.ServerTls`) the TLS handshake comes first,
and the proof also answers the TLS channel. Until a connection's handshake is done it
has :attr:`ServerLimits.handshake_timeout_s` to finish it, and only a few connections
may be at that stage at once (:func:`~shuttle.net.admission.unauthenticated_max`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from shuttle.errors import (
    AuthenticationError,
    ConfigError,
    NodeBusyError,
    ServerError,
    ShuttleError,
    StorageIOError,
)
from shuttle.net import auth
from shuttle.net.admission import (
    ServerLimits,
    effective_connections_max,
    raise_descriptor_limit,
    unauthenticated_max,
)
from shuttle.net.node_closing import check_timeouts, goodbye, revoke
from shuttle.net.node_protocol import NodeProtocol
from shuttle.net.principal_limits import PrincipalLimits, PrincipalLoad
from shuttle.net.principals import Principal, PrincipalBook, PrincipalTable, anyone
from shuttle.net.registry import Operation, OperationRegistry, Reply
from shuttle.net.server_stats import ServerCounters
from shuttle.net.tls import ServerTls
from shuttle.wire import (
    Limits,
    Request,
)

log = logging.getLogger("shuttle.node")

#: Threads for blocking handlers (fsync-bound writes, cold reads). Disk work gains
#: little from more on one device; a few keep a slow fsync from stalling other reads.
EXECUTOR_THREADS = 4

#: How long a graceful shutdown waits for requests already running.
SHUTDOWN_GRACE_S = 10.0

#: Errors of a process out of descriptors: a transient shortage, not a disk fault.
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


CpuAccount = Callable[[], AbstractContextManager[Any]]


class RpcServer:
    """Serves ``registry`` on a TCP port.

    ``cpu_account`` wraps every handler call (e.g. the node's CPU speed factor,
    which burns extra CPU after the work to emulate a slower machine). With ``key``
    (the cluster key) every client must prove it holds the same key in the
    handshake; without it any client is served. ``admission`` bounds what clients
    can make the node hold (see :mod:`shuttle.net.admission`).

    ``principals`` (a node with a cluster key): the principals that may connect besides
    the cluster key's holders, each checked against its caps. ``principal``: the
    principal ``key`` belongs to, when it is not the cluster key (a client's run-time,
    which serves its own principal only). With ``tls`` every connection is TLS, with
    that certificate.
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
        principals: PrincipalBook | None = None,
        principal: str | None = None,
        tls: ServerTls | None = None,
        principal_limits: PrincipalLimits | None = None,
    ) -> None:
        if key is not None and len(key) != auth.KEY_BYTES:
            raise ConfigError(f"a cluster key is {auth.KEY_BYTES} bytes, got {len(key)}")
        if principals is not None and (key is None or principal is not None):
            raise ConfigError("only a node with the cluster key serves principals")
        #: The principals that may connect (None: only holders of ``key``).
        self.principals = principals
        #: Whose ``key`` is (None: the cluster key).
        self.principal = principal
        if principals is not None:
            principals.listeners.append(self._principals_changed)
        self.registry = registry
        self.node_id = node_id
        self.limits = limits or Limits()
        #: The cluster key clients must prove they hold, or None (any client is served).
        self.key = key
        #: The certificate every connection's TLS presents, or None (plain TCP).
        self.tls = tls
        self.counters = ServerCounters()
        #: Which worker process of its node this server is (0: the primary, or the
        #: node's only process; ``shuttle serve --workers``).
        self.worker_index = 0
        self.cpu_account = cpu_account
        #: The account to enter around protocol work, or None when it would do nothing
        #: (a full-speed node): two clock reads and a generator per request saved.
        self._account: CpuAccount | None = None if cpu_account is nullcontext else cpu_account
        self._executor = ThreadPoolExecutor(executor_threads, thread_name_prefix="shuttle-io")
        self._server: asyncio.Server | None = None
        #: Further listeners (:meth:`listen_private`).
        self._private: list[asyncio.Server] = []
        self._protocols: set[NodeProtocol] = set()
        self.admission = admission or ServerLimits()
        #: The connection cap in force (fitted to the descriptor limit at start).
        self.connections_max = self.admission.connections_max
        #: How many connections may be in their handshake at once (fitted at start).
        self.unauthenticated_max = unauthenticated_max(self.admission, self.connections_max)
        #: What each principal holds of the node (connections, requests, objects),
        #: against its share (net/principal_limits.py).
        self.load = PrincipalLoad(
            principal_limits or PrincipalLimits(), node_id, self.connections_max
        )
        #: Connections still in their handshake, oldest first (a dict keeps order).
        self._unauthenticated: dict[NodeProtocol, None] = {}
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
        out["server"]["unauthenticated"] = len(self._unauthenticated)
        out["server"]["unauthenticated_max"] = self.unauthenticated_max
        out["server"]["tls"] = self.tls is not None
        out["server"]["principals"] = self.load.stats()
        for name, source in self._stats_sources.items():
            out[name] = source()
        return out

    def _register_system_ops(self) -> None:
        reg = self.registry

        def ping(args: dict[str, Any], payload: bytes) -> Reply:
            """Answer at once, echoing the payload (liveness and round-trip probe); a
            worker process of a node says which (``worker``: its index)."""
            out: dict[str, Any] = {"node": self.node_id, "time": time.time()}
            if self.worker_index:
                out["worker"] = self.worker_index
            return Reply(out, payload)

        def node_ops(args: dict[str, Any], payload: bytes) -> Any:
            """The operations this node serves, with their modes and descriptions."""
            return [{"name": op.name, "mode": op.mode.value, "doc": op.doc} for op in reg]

        def node_stats(args: dict[str, Any], payload: bytes) -> Any:
            """Counters of the server and of every registered component."""
            return self.stats()

        reg.add("ping", ping, guard=anyone)
        reg.add("node.ops", node_ops, guard=anyone)
        reg.add("node.stats", node_stats)  # a cluster operation: admins only

    # --- principals ------------------------------------------------------------------

    def credentials_for(self, hello: Any) -> tuple[bytes | None, Principal | None]:
        """The key a HELLO's proof must be made with, and the principal its connection
        acts as (None: unrestricted). :class:`AuthenticationError` when the HELLO names
        a principal this server does not know."""
        name = auth.hello_principal(hello)
        if name == self.principal or self.key is None:
            # The key's own holder (the cluster key's, or a run-time's principal), or a
            # node without a key, which serves anyone.
            return self.key, None
        book = self.principals
        if name is None or book is None:
            whose = "the cluster key" if name is None else f"principal {name!r}"
            serves = (
                f"principal {self.principal!r} only"
                if self.principal is not None
                else "the cluster key only (it has no principals)"
            )
            raise AuthenticationError(
                f"{self.node_id} serves {serves}; this client offered {whose}"
            )
        principal = book.get(name)
        if principal is None:
            raise AuthenticationError(
                f"node {self.node_id} knows no principal {name!r}: it was removed, or "
                "never added (an admin lists them: shuttle cluster user list)"
            )
        return book.key_for(principal), principal

    def _principals_changed(self, table: PrincipalTable) -> None:
        """A new principal table: connections of removed (or re-keyed) principals are
        closed; the others act with their new caps from their next request."""
        for proto in list(self._protocols):
            old = proto.principal
            if old is None:
                continue
            new = table.get(old.name)
            if new is None or new.salt != old.salt:
                self.counters.auth_failures += 1
                revoke(
                    proto,
                    AuthenticationError(
                        f"principal {old.name!r} was removed from the cluster: node "
                        f"{self.node_id} closed this connection"
                    ),
                )
            else:
                proto.principal = new

    # --- lifecycle -----------------------------------------------------------------

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> tuple[str, int]:
        """Listen on ``host:port`` (port 0 picks a free one); returns the bound address.
        ``reuse_port``: with ``SO_REUSEPORT``, so the processes of one node with
        ``--workers`` share the port (the kernel spreads connections among them)."""
        loop = asyncio.get_running_loop()
        soft, _hard = raise_descriptor_limit()
        self.connections_max = effective_connections_max(self.admission.connections_max, soft)
        self.unauthenticated_max = unauthenticated_max(self.admission, self.connections_max)
        self.load.fit(self.connections_max)
        self._server = await loop.create_server(
            lambda: NodeProtocol(self),
            host,
            port,
            reuse_address=True,
            reuse_port=reuse_port or None,
            backlog=512,
        )
        sock = self._server.sockets[0]
        bound = sock.getsockname()
        log.info("node %s listening on %s:%d", self.node_id, bound[0], bound[1])
        self._sweeper = loop.create_task(self._sweep_forever())
        return bound[0], bound[1]

    async def listen_private(self) -> tuple[str, int]:
        """Listen on a second, kernel-chosen port on 127.0.0.1 as well (a node's workers
        reach their primary there: on the shared port the kernel could hand them to any
        process of the node). Same protocol, key and TLS; returns its address."""
        loop = asyncio.get_running_loop()
        private = await loop.create_server(lambda: NodeProtocol(self), "127.0.0.1", 0)
        self._private.append(private)
        bound = private.sockets[0].getsockname()
        return bound[0], bound[1]

    def close_connection(self, number: int, reason: str) -> bool:
        """Close connection ``number`` (saying ``reason`` if nothing is in flight);
        False when there is none."""
        for proto in list(self._protocols):
            if proto.number == number:
                if proto.pending:
                    proto.abort()
                else:
                    goodbye(proto, reason)
                return True
        return False

    def next_connection_number(self) -> int:
        self._connection_numbers += 1
        return self._connection_numbers

    # --- connections before authentication ---------------------------------------------

    def admit(self, proto: NodeProtocol) -> None:
        """A connection was accepted: it is in its handshake until :meth:`authenticated`.
        Over :attr:`unauthenticated_max` of those, the one that has waited longest is
        closed, so connections that never finish cannot keep a newer one out."""
        waiting = self._unauthenticated
        waiting[proto] = None
        while len(waiting) > self.unauthenticated_max:
            oldest = next(iter(waiting))
            if oldest is proto:
                break
            del waiting[oldest]
            oldest.evict(self.unauthenticated_max)

    def authenticated(self, proto: NodeProtocol) -> None:
        """``proto`` finished its handshake (or is gone): it no longer counts as waiting."""
        self._unauthenticated.pop(proto, None)

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
                check_timeouts(proto, now, limits)
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
        for private in self._private:
            private.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + grace_s
        while any(p.pending for p in self._protocols) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for proto in list(self._protocols):
            if proto.pending:  # GOODBYE promises every request taken was answered
                proto.abort()
            else:
                goodbye(proto, "node is shutting down")
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
