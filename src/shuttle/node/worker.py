"""A worker process of a node started with ``--workers N`` (docs/architecture.md,
"Workers").

The primary (``shuttle serve``) owns the store and everything a node keeps in memory;
it starts N-1 of these with ``python -m shuttle.node.worker``, giving each the
node's configuration, the address of a private listener of its own, and the shared
change generations (a descriptor, :mod:`shuttle.store.generations`). A worker listens
on the node's port beside the primary (``SO_REUSEPORT``: the kernel hands each new
connection to one of them), authenticates its clients with the node's key, its
principals (the primary's table, which a change installs in every worker before it
is answered: :func:`follow_principals`) and TLS, and then, per request:

* a small ``read`` it can check (:mod:`shuttle.node.worker_reads`) is answered here,
  on the read lane, without the primary, and so is a ``stat`` of an object whose
  attributes it knows as they are now;
* every other request, and a read it cannot check, is sent to the primary on a
  connection of the primary's that belongs to this client connection alone, opened
  with its first such request, as the client's principal. So the primary checks
  the principal's caps as for its own clients, and everything a connection owns there
  (callback sessions and their long polls, upload sessions, the run-time's calls) is
  owned, kept and released exactly as if the client had connected to the primary:
  when the client hangs up, its upstream connection is closed; when the primary
  closes an upstream connection, the worker closes its client's.

A worker dies with its primary (``PR_SET_PDEATHSIG``), and it holds the data
directory's lock descriptor too, so a new primary cannot open the directory while a
worker of the old one could still answer reads from it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import sys
from typing import Any

import uvloop

from shuttle.blockcache import BytesSpans
from shuttle.errors import ConfigError, ShuttleError, UnreachableError
from shuttle.net.aio import AsyncConnection
from shuttle.net.auth import load_key_file
from shuttle.net.cpu import CpuSpeed
from shuttle.net.memory import tune_allocator
from shuttle.net.principals import Principal, PrincipalBook, PrincipalTable, anyone, reads
from shuttle.net.registry import (
    CONNECTION_ARG,
    PRINCIPAL_ARG,
    Mode,
    OperationRegistry,
    Reply,
    principal_of,
)
from shuttle.net.server import RpcServer
from shuttle.net.tls import ClientTls, ServerTls
from shuttle.node.config import NodeConfig
from shuttle.node.handlers import STAT_CHUNKS_MAX
from shuttle.node.worker_reads import WorkerReads
from shuttle.store.generations import ChangeGenerations

log = logging.getLogger("shuttle.node")

#: What a worker says on its standard output once it listens (its primary waits for it).
READY_LINE = "ready"
#: Operations every server answers itself (``RpcServer``'s system operations).
SYSTEM_OPS = frozenset({"ping", "node.ops", "node.stats"})
#: Operations a worker answers itself when it can (:mod:`shuttle.node.worker_reads`),
#: else sends to the primary.
ANSWERED_HERE = frozenset({"read", "stat"})
#: The primary's operations for its workers only (not served to clients by a worker).
WORKER_OPS_PREFIX = "worker."
#: How long a request sent on to the primary may take. The client's own timeout is
#: what bounds a call; this only frees the worker's task if the primary never answers
#: (a shipped object's call may run for minutes, up to the sandbox's wall limit).
UPSTREAM_REQUEST_TIMEOUT_S = 3600.0
#: How long a worker's long poll for the principal table is held at the primary
#: (``shuttle.node.worker_pool.PRINCIPALS_WAIT_S_MAX`` caps it).
PRINCIPALS_WAIT_S = 20.0
#: Threads of a worker's pool: it runs no handler there, only the disconnect hooks.
WORKER_EXECUTOR_THREADS = 1
#: ``prctl`` option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent (the primary) dies, however it dies: a
    worker must never answer reads from files a later primary changes."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # it died before the call: nobody would signal us
        os._exit(1)


class Upstreams:
    """Each client connection's own connection to the primary (see the module)."""

    def __init__(
        self,
        server: RpcServer,
        host: str,
        port: int,
        key: bytes | None,
        tls: ClientTls | None,
        book: PrincipalBook | None,
    ) -> None:
        self.server = server
        self.book = book
        self.host, self.port = host, port
        self.key = key
        self.tls = tls
        self._by_connection: dict[int, AsyncConnection] = {}
        #: Requests sent on to the primary.
        self.forwarded = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: Client connections whose upstream is watched (see :meth:`_watch`).
        self._watched: set[int] = set()

    def connection(self, principal: Principal | None = None) -> AsyncConnection:
        """A new connection to the primary (not opened yet), as ``principal`` (None:
        with the cluster key)."""
        key = self.key
        if principal is not None:
            assert self.book is not None  # a worker without a key has no principals
            key = self.book.key_for(principal)
        return AsyncConnection(
            self.host,
            self.port,
            key=key,
            principal=None if principal is None else principal.name,
            tls=self.tls,
            verify=False,  # the primary's private listener: its key proof is checked
            client_name="shuttle-worker",
            request_timeout_s=UPSTREAM_REQUEST_TIMEOUT_S,
        )

    async def forward(self, name: str, args: dict[str, Any], payload: bytes) -> Reply:
        """Send request ``name`` to the primary on this client connection's upstream."""
        number = args.pop(CONNECTION_ARG)
        principal = principal_of(args)
        args.pop(PRINCIPAL_ARG, None)
        up = self._by_connection.get(number)
        if up is None:
            # As the client's principal: the primary checks its caps and acts as it,
            # exactly as for a client of its own.
            up = self._by_connection[number] = self.connection(principal)
        elif up.counters.connects and not up.connected:
            # The primary closed this connection's upstream: what the client had
            # there (its callback session, its uploads) is gone, so its connection
            # goes too, as it would have had it connected to the primary.
            self._lost(number)
        self.forwarded += 1
        try:
            response = await up.call(name, args, payload)
        except UnreachableError:
            self._lost(number)
            raise
        if number not in self._watched and self._by_connection.get(number) is up:
            self._watched.add(number)
            self._keep(self._loop.create_task(self._watch(number, up)))
        return Reply(response.result, response.payload)

    async def _watch(self, number: int, up: AsyncConnection) -> None:
        """When the primary ends client ``number``'s upstream connection (it idled, or
        its principal was removed), the worker ends the client's: with a GOODBYE when
        nothing is in flight, which tells the client that no request of its was lost,
        as the primary's own goodbye would have."""
        try:
            await up.wait_lost()
        finally:
            self._watched.discard(number)
        if self._by_connection.get(number) is up:
            del self._by_connection[number]
            self.server.close_connection(
                number, "the node's primary process closed this connection's session"
            )

    def _lost(self, number: int) -> None:
        self.server.close_connection(number, "the node's primary process closed the connection")
        raise UnreachableError(
            "the node's primary process closed this connection's session; reconnect"
        )

    def owned(self, number: int) -> int:
        """1 while ``number`` has an upstream: the primary decides when that one idles."""
        return 1 if number in self._by_connection else 0

    def disconnected(self, number: int) -> None:
        """Client connection ``number`` closed (in a pool thread): close its upstream."""
        up = self._by_connection.pop(number, None)
        if up is not None:
            self._loop.call_soon_threadsafe(self._close_soon, up)

    def _close_soon(self, up: AsyncConnection) -> None:
        self._keep(self._loop.create_task(up.close()))

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(self._tasks.discard)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def close(self) -> None:
        ups, self._by_connection = self._by_connection, {}
        for up in ups.values():
            await up.close()
        for task in list(self._tasks):
            task.cancel()


def register_worker_ops(
    registry: OperationRegistry,
    ops: list[dict[str, Any]],
    upstreams: Upstreams,
    worker_reads: WorkerReads,
) -> None:
    """Every operation the primary serves (``ops``, its ``node.ops``), sent on to it,
    but ``read`` and ``stat``, answered here when they can be (see the module)."""
    for op in ops:
        name = op["name"]
        if name in SYSTEM_OPS or name in ANSWERED_HERE or name.startswith(WORKER_OPS_PREFIX):
            continue

        def forward(args: dict[str, Any], payload: bytes, _name: str = name) -> Any:
            return upstreams.forward(_name, args, payload)

        # No guard here: the request goes on as the client's principal, and the primary
        # checks it as it checks its own clients'.
        registry.add(
            name,
            forward,
            Mode.ASYNC,
            op.get("doc", ""),
            per_connection=True,
            guard=anyone,
            wants_principal=True,
        )

    lane = worker_reads.read

    def read_here(args: dict[str, Any], payload: bytes) -> Reply | None:
        key, offset, length = args.get("key"), args.get("offset", 0), args.get("length")
        version = args.get("expected_version")
        if (
            type(key) is str
            and type(offset) is int
            and type(length) is int
            and (version is None or type(version) is int)
        ):
            data = lane(key, offset, length, version)
            if data is not None:
                return Reply(None, data)
        return None

    def read(args: dict[str, Any], payload: bytes) -> Any:
        """Bytes [offset, offset+length) of an object: here when this worker can check
        them, else from the primary."""
        return upstreams.forward("read", args, payload)

    registry.add(
        "read",
        read,
        Mode.ASYNC,
        inline_try=read_here,
        read_lane=BytesSpans(lane),
        per_connection=True,
        guard=reads(),  # checked here: this process may answer it
        wants_principal=True,
    )

    stat_here_call = worker_reads.stat

    def stat_here(args: dict[str, Any], payload: bytes) -> Reply | None:
        key, version = args.get("key"), args.get("expected_version")
        chunks_max = args.get("chunks_max", STAT_CHUNKS_MAX)
        if (
            type(key) is str
            and type(chunks_max) is int
            and chunks_max >= 0
            and (version is None or type(version) is int)
        ):
            attrs = stat_here_call(key, min(chunks_max, STAT_CHUNKS_MAX), version)
            if attrs is not None:
                return Reply(attrs)
        return None  # the primary answers (or says what is wrong)

    def stat(args: dict[str, Any], payload: bytes) -> Any:
        """Attributes of one object: here when this worker knows them as they are now,
        else from the primary."""
        return upstreams.forward("stat", args, payload)

    registry.add(
        "stat",
        stat,
        Mode.ASYNC,
        inline_try=stat_here,
        per_connection=True,
        guard=reads("key", "stat"),  # checked here: this process may answer it
        wants_principal=True,
    )
    registry.on_disconnect(upstreams.disconnected, owned=upstreams.owned)


async def serve_worker(
    config: NodeConfig, index: int, node_id: str, primary: tuple[str, int], generations_fd: int
) -> None:
    """Serve as worker ``index`` of the node until SIGTERM or SIGINT."""
    key = load_key_file(config.key_file) if config.key_file is not None else None
    server_tls: ServerTls | None = None
    peer_tls: ClientTls | None = None
    if config.tls_enabled:
        assert config.tls_cert is not None and config.tls_key is not None
        server_tls = ServerTls(config.tls_cert, config.tls_key)
        peer_tls = ClientTls(config.ca_file)
    generations = ChangeGenerations(generations_fd, writer=False)
    registry = OperationRegistry()
    # With a key, the node's principals: the primary's table, kept current by
    # follow_principals (a node without a key has none).
    book = PrincipalBook(key) if key is not None else None
    # The node's CPU speed factor holds in every process of it (docs/conditions.md).
    cpu = CpuSpeed(config.cpu_factor)
    server = RpcServer(
        registry,
        node_id,
        executor_threads=WORKER_EXECUTOR_THREADS,
        cpu_account=cpu.section if cpu.burn_ratio else contextlib.nullcontext,
        key=key,
        admission=config.worker_admission(),
        principals=book,
        tls=server_tls,
    )
    server.worker_index = index
    upstreams = Upstreams(server, primary[0], primary[1], key, peer_tls, book)
    upstreams.bind(asyncio.get_running_loop())
    control = upstreams.connection()  # the worker's own: learning, the list of operations

    async def stat(key_: str, chunks_max: int) -> dict[str, Any]:
        response = await control.call(
            "stat", {"key": key_, "chunks_max": chunks_max}, idempotent=True
        )
        result: dict[str, Any] = response.result
        return result

    worker_reads = WorkerReads(str(config.data_dir), generations, stat)
    try:
        ops = (await control.call("node.ops", idempotent=True)).result
        register_worker_ops(registry, ops, upstreams, worker_reads)
        server.add_stats_source(
            "worker",
            lambda: {
                "index": index,
                "pid": os.getpid(),
                "forwarded": upstreams.forwarded,
                "reads": worker_reads.stats(),
            },
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        follower: asyncio.Task[None] | None = None
        if book is not None:
            # Before any client is served.
            await install_principals(control, index, book, first=True)
            follower = loop.create_task(follow_principals(control, index, book, stop))
        # The node's port: the primary's (with --listen HOST:0 the kernel chose it, and
        # the primary passed it on in the configuration).
        await server.start(config.host, config.port, reuse_port=True)
        print(READY_LINE, flush=True)
        await stop.wait()
        if follower is not None:
            follower.cancel()
    finally:
        await server.close()
        await upstreams.close()
        await control.close()
        worker_reads.close()
        generations.close()


async def install_principals(
    control: AsyncConnection, index: int, book: PrincipalBook, *, first: bool = False
) -> None:
    """Ask the primary for its principal table (``worker.principals``: at once when it
    differs from the one installed, else after a while) and install it. Installing it
    closes the connections of principals it no longer has; the next ask tells the
    primary it is installed (docs/architecture.md, "Workers")."""
    # The first time, "": nothing installed yet, so the primary answers at once.
    digest = "" if first else book.table.digest()
    response = await control.call(
        "worker.principals", {"index": index, "digest": digest, "timeout_s": PRINCIPALS_WAIT_S}
    )
    table = PrincipalTable.from_wire(response.result["table"], "the primary's principals")
    if first or table.digest() != book.table.digest():
        book.replace(table)
        log.info("principals: epoch %d from the primary", table.epoch)


async def follow_principals(
    control: AsyncConnection, index: int, book: PrincipalBook, stop: asyncio.Event
) -> None:
    """Keep ``book`` the primary's, for as long as the worker runs. A worker that loses
    its primary can no longer learn a removal in time: it stops (its clients reconnect,
    to the others)."""
    try:
        while True:
            await install_principals(control, index, book)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.error("worker %d lost the primary's principal table (%s): stopping", index, exc)
        stop.set()


def main(argv: list[str] | None = None) -> None:
    """``python -m shuttle.node.worker``: started by a primary, never by hand."""
    parser = argparse.ArgumentParser(
        prog="shuttle.node.worker",
        description="A worker process of a Shuttle node (started by `shuttle serve "
        "--workers N`; not a command to run by hand).",
    )
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--primary", required=True, help="HOST:PORT of the primary's listener")
    parser.add_argument("--generations-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--config", required=True, help="the node's configuration, JSON")
    ns = parser.parse_args(argv)
    _die_with_parent(ns.parent)
    try:
        config = NodeConfig.from_wire(json.loads(ns.config))
    except (ConfigError, ValueError) as exc:
        print(f"worker: bad configuration from the primary: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    tune_allocator()
    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s node[{config.name}] worker {ns.index} %(message)s",
        stream=sys.stderr,
    )
    host, _, port = ns.primary.rpartition(":")
    try:
        uvloop.run(serve_worker(config, ns.index, ns.node_id, (host, int(port)), ns.generations_fd))
    except ShuttleError as exc:
        log.error("worker %d stopped: %s", ns.index, exc)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
