"""An application's run-time: where its console lives and where its objects start.

:class:`Runtime` is what a program (or ``shuttle grep``) uses to build object stacks
over a cluster and call them. It runs a small event loop on a thread of its own,
with a listening port (so nodes can move objects back to it, and anyone holding a
reference can ask it, their home, where they are) and the periodic digests that
tell the nodes what its objects cost::

    with Runtime.connect("/tmp/shuttle/cluster.toml", link="lan") as rt:
        node = rt.node_for("logs/a.txt")
        grep = rt.create("grep", pattern="ERROR", storage=rt.storage(node),
                         keys=["logs/a.txt"])
        with rt.console("grep"):
            done = False
            while not done:
                done, matches = grep.next()

Objects start here (``at=None``) or on a node (``at="n1"``); with ``placement="auto"``
(the default) the nodes' resource managers may move them while the program runs,
and ``placement="static"`` keeps them where they started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import uvloop

from shuttle.client.model import NodeAddress
from shuttle.client.routing import node_for_key
from shuttle.errors import ConfigError, InvalidArgumentError, ObjectBusyError, ShuttleError
from shuttle.net import certs
from shuttle.net.registry import OperationRegistry
from shuttle.net.server import RpcServer
from shuttle.net.tls import ClientTls, ServerTls
from shuttle.runtime import migration, values
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.client_digests import Digests
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import CONSOLE_PREFIX
from shuttle.runtime.hosting import POLICIES
from shuttle.runtime.ids import APPLICATION_PREFIX, ObjectId
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.moves import MigrationEvent
from shuttle.runtime.peers import Peers
from shuttle.runtime.refs import Ref
from shuttle.runtime.service import register_runtime_ops
from shuttle.runtime.ticker import Ticker

log = logging.getLogger("shuttle.runtime")

#: Threads of a client run-time's executor: migrations' drain waits and checkpoints
#: (object methods run on the application's own threads here).
CLIENT_EXECUTOR_THREADS = 4
#: How long start-up may take (a listening socket on loopback: milliseconds).
START_TIMEOUT_S = 10.0
#: How long closing waits for migrations under way to finish or roll back.
CLOSE_SETTLE_S = 30.0
#: Attempts to destroy each of the application's objects on its node when closing.
CLOSE_DESTROY_ATTEMPTS = 3
#: Beyond two drain timeouts, how long ``destroy`` waits for a moving object to settle
#: (its checkpoint shipped and installed).
DESTROY_SETTLE_S = 10.0


class Runtime:
    """The run-time of one application, over the nodes ``nodes``."""

    def __init__(
        self,
        nodes: Sequence[NodeAddress],
        *,
        key: bytes | None = None,
        principal: str | None = None,
        config: RuntimeConfig | None = None,
        listen_host: str = "127.0.0.1",
        speed: float = 1.0,
        monitor: bool = True,
        tls: ClientTls | None = None,
    ) -> None:
        if not nodes:
            raise ConfigError("a run-time needs at least one storage node")
        self.config = config or RuntimeConfig()
        self.nodes = list(nodes)
        self.id = f"{APPLICATION_PREFIX}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"
        self.key = key
        #: Whose ``key`` is (None: the cluster key): every call of this run-time, and
        #: of the objects it hosts, acts for that principal (docs/security.md).
        self.principal = principal
        self.monitoring = monitor
        #: The cluster's TLS (None: plain): nodes are dialled with it, and this
        #: run-time's own port listens with TLS too (see :func:`_listener_tls`).
        self.tls = tls
        self.peers = Peers(
            key=key, principal=principal, client_name=f"shuttle-runtime {self.id}", tls=tls
        )
        for n in self.nodes:
            self.peers.learn(n.node_id, n.address, n.link)
        self.monitor = ResourceMonitor(self.config.window_s)
        self.executor = ThreadPoolExecutor(CLIENT_EXECUTOR_THREADS, thread_name_prefix="shuttle-rt")
        self.control = ThreadPoolExecutor(CLIENT_EXECUTOR_THREADS, thread_name_prefix="shuttle-rtc")
        self.bm = BindingManager(
            self.id,
            config=self.config,
            peers=self.peers,
            monitor=self.monitor,
            executor=self.executor,
            control=self.control,
            speed=speed,
        )
        self.ticker = Ticker(self.monitor, self.config.window_s)
        self.registry = OperationRegistry()
        register_runtime_ops(self.registry, self.bm)
        # Nodes call back (moving an object here, invoking one) as the principal the
        # objects act for: this run-time's own, the only one it knows the key of.
        self._server = RpcServer(
            self.registry,
            self.id,
            key=key,
            principal=principal,
            tls=_listener_tls(self.id, listen_host) if tls is not None else None,
        )
        self._listen_host = listen_host
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._migrations: set[asyncio.Task[Any]] = set()
        #: Durable objects this application made: their homes are nodes (rid.home).
        self._durable: set[ObjectId] = set()
        #: What this run-time tells the nodes each window; their decisions come back
        #: to :meth:`_act`.
        self._digests = Digests(
            self.id,
            lambda: self.nodes,
            self.bm,
            self.peers,
            self.monitor,
            self.ticker,
            self.config,
            self.executor,
            self._durable,
            self._act,
        )
        self._closed = False
        self._start()

    # --- construction ---------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        target: str | Path | None = None,
        *,
        node: str | None = None,
        cluster: str | Path | None = None,
        link: str | None = None,
        key_file: str | Path | None = None,
        **options: Any,
    ) -> Runtime:
        """A run-time over a cluster file (or ``$SHUTTLE_CLUSTER``) or one node, like
        :func:`shuttle.connect`; ``link`` overrides every node's link profile."""
        from shuttle.client.connect import connect

        client = connect(target, node=node, cluster=cluster, link=link, key_file=key_file)
        try:
            return cls(
                client.nodes, key=client.key, principal=client.principal, tls=client.tls, **options
            )
        finally:
            client.close()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=f"runtime {self.id}", daemon=True)
        self._thread.start()
        if not self._started.wait(START_TIMEOUT_S):
            raise ConfigError(f"the run-time did not start within {START_TIMEOUT_S:g} s")
        if self._start_error is not None:
            raise self._start_error

    def _main(self) -> None:
        loop = uvloop.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        try:
            host, port = await self._server.start(self._listen_host, 0)
        except BaseException as exc:
            self._start_error = ConfigError(
                f"the run-time cannot listen on {self._listen_host}: {exc}"
            )
            self._started.set()
            return
        assert self._loop is not None
        self.bm.attach_loop(self._loop, f"{host}:{port}")
        await self._learn_node_ids()
        self._stop = stop = asyncio.Event()
        self._task = self._loop.create_task(self._periodic())
        self._started.set()
        await stop.wait()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        for task in list(self._migrations):
            with contextlib.suppress(BaseException):
                await task
        await self.peers.close()
        await self._server.close(grace_s=1.0)

    async def _learn_node_ids(self) -> None:
        """Nodes named by address (``--node HOST:PORT``) are asked their own id: object
        ids carry it (``n1/storage``), so the run-time must use the node's name."""
        renamed = []
        for n in self.nodes:
            if n.node_id != n.address:
                renamed.append(n)
                continue
            try:
                reply = await self.peers.call(n.node_id, "ping", {})
                node_id = str(reply.result["node"])
            except (ShuttleError, OSError, KeyError, TypeError):
                renamed.append(n)  # unreachable now: keep the address as its name
                continue
            self.peers.learn(node_id, n.address, n.link)
            renamed.append(NodeAddress(node_id, n.host, n.port, n.link))
        self.nodes = renamed

    @property
    def address(self) -> str:
        return self.bm.address

    # --- the application's API ----------------------------------------------------------

    def node_for(self, key: str) -> str:
        """The node that holds ``key`` (rendezvous hashing, as every client computes)."""
        return node_for_key(self.nodes, key).node_id

    def storage(self, node_id: str) -> Ref:
        """A reference to node ``node_id``'s storage object."""
        address = self.peers.address_of(node_id)
        if address is None:
            known = ", ".join(n.node_id for n in self.nodes)
            raise InvalidArgumentError(f"no node {node_id!r} in this cluster; its nodes: {known}")
        return self.bm.ref(ObjectId.storage(node_id), address)

    def service(self, node_id: str, name: str) -> Ref:
        """A reference to node ``node_id``'s anchored object ``name`` (``storage``,
        ``isolation``, ``atomicity``)."""
        if self.peers.address_of(node_id) is None:
            known = ", ".join(n.node_id for n in self.nodes)
            raise InvalidArgumentError(f"no node {node_id!r} in this cluster; its nodes: {known}")
        return self.bm.ref(ObjectId.service(node_id, name), self.peers.address_of(node_id) or "")

    def create(
        self,
        kind: str | type[MobileObject],
        *,
        at: str | None = None,
        placement: str = "auto",
        durable: bool | None = None,
        home: str | None = None,
        **params: Any,
    ) -> Ref:
        """A new object of built-in type ``kind`` (a name) or of a class of yours
        (shipped by value to a node), made here or on node ``at``.

        ``placement``: ``auto`` (the run-time may move it) or ``static`` (it stays).
        ``durable`` (default: the class's ``durable``): its state is written to its
        home node's disk before each call that changed it is answered, and its home
        brings it back from there if the node it runs on dies (docs/runtime.md,
        "Durable objects"). Its home is node ``home``, or ``at``, or the cluster's
        node for its id; a durable object's home must be up for it to be made."""
        if placement not in POLICIES:
            raise InvalidArgumentError(f"placement must be one of {POLICIES}, not {placement!r}")
        cls, type_name = self.bm.hosting.resolve_type(kind)
        if durable is None:
            durable = bool(cls.durable)
        code: bytes | None = None
        if not type_name:
            from shuttle.runtime.sandbox import ship_class

            code = ship_class(cls)
            self.bm.hosting.shipped(cls, code)
        target = self.id if at in (None, "client", self.id) else at
        assert target is not None
        if target != self.id:
            self._known_node(target)
        if durable:
            home = home or (target if target != self.id else None)
            if home is None:
                home = self.node_for(f".shuttle/durable/{secrets.token_hex(8)}")
            self._known_node(home)
            rid = self.bm.new_id(home)
        else:
            rid = self.bm.new_id()
        home_address = self.peers.address_of(rid.home) or self.address
        if target == self.id:
            self.bm.host_new(
                rid,
                home_address,
                cls,
                type_name,
                code,
                params,
                placement,
                durable=durable,
                app=self.id,
            )
        else:
            if not durable:
                self.bm.table.created_at(rid, target, type_name or cls.__qualname__, False)
            try:
                self.bm.run(
                    self.peers.call(
                        target,
                        "object.create",
                        {
                            "rid": str(rid),
                            "home_address": home_address,
                            "type": type_name,
                            "policy": placement,
                            "params": values.pack(params),
                            "durable": durable,
                            "from": self.id,
                            "from_address": self.address,
                        },
                        code or b"",
                    )
                )
            except BaseException:
                self.bm.table.creation_failed(rid)
                raise
        if durable:
            self._durable.add(rid)
            self.bm.table.heard(rid, target)
        return self.bm.ref(rid, home_address)

    def _known_node(self, node_id: str) -> None:
        if self.peers.address_of(node_id) is None:
            known = ", ".join(n.node_id for n in self.nodes)
            raise InvalidArgumentError(f"no node {node_id!r} in this cluster; its nodes: {known}")

    @contextlib.contextmanager
    def console(self, name: str = "main") -> Iterator[Ref]:
        """Run the block as console ``name``: calls it makes outside any object are
        the console's, which is where the run-time's stacks begin."""
        rid = ObjectId(self.id, f"{CONSOLE_PREFIX}{name}")
        if self.bm.table.home_entry(rid) is None:
            self.bm.table.created_at(rid, self.id, "console", False)
        with self.monitor.console(str(rid)) if self.monitoring else contextlib.nullcontext():
            yield self.bm.ref(rid, self.address)

    def where(self, ref: Ref) -> str:
        """The run-time (node id, or this client's id) where ``ref``'s object runs."""
        hint = self.bm.location_hint(ref.rid)
        if hint is not None and (ref.rid.home == self.id or hint == self.id):
            return hint
        return self.bm.run(self.bm.locate(ref.rid))

    def migrate(self, ref: Ref, to: str) -> dict[str, Any]:
        """Move ``ref``'s object to ``to`` (a node id, or ``"client"`` for here)."""
        target = self.id if to == "client" else to
        where = self.where(ref)
        if where == self.id:
            event = self.bm.run(migration.migrate_out(self.bm, ref.rid, target, "requested"))
            return event.to_json()
        reply = self.bm.run(
            self.peers.call(
                where,
                "object.migrate",
                {
                    "rid": str(ref.rid),
                    "to": target,
                    "to_address": self.peers.address_of(target)
                    or (self.address if target == self.id else ""),
                    "reason": "requested",
                },
            )
        )
        return dict(reply.result)

    def destroy(self, ref: Ref) -> None:
        """End ``ref``'s object wherever it runs. An object that is moving (or whose
        calls are draining) is waited for, for up to two drain timeouts and
        :data:`DESTROY_SETTLE_S`: the run-time may move it at any moment, and its
        application should not have to retry."""
        deadline = time.monotonic() + 2 * self.bm.config.drain_timeout_s + DESTROY_SETTLE_S
        pause = 0.01
        while True:
            try:
                if self._destroy_once(ref):
                    return
                busy: ObjectBusyError | None = None
            except ObjectBusyError as exc:
                busy = exc
            if time.monotonic() >= deadline:
                raise busy or ObjectBusyError(
                    f"object {ref.rid} kept moving while being destroyed; try again"
                )
            time.sleep(pause)  # a migration settles in milliseconds to a drain timeout
            pause = min(2 * pause, 0.2)

    def _destroy_once(self, ref: Ref) -> bool:
        """One attempt: False if the object was not where we looked (it moved)."""
        rid = ref.rid
        if self.bm.table.hosted(rid) is not None:
            done = self.bm.destroy_hosted(rid)
        else:
            # A durable object's home ends it wherever it runs; others, where they are.
            where = rid.home if rid in self._durable else self.where(ref)
            reply = self.bm.run(self.peers.call(where, "object.destroy", {"rid": str(rid)}))
            done = bool((reply.result or {}).get("destroyed"))
        if done:
            self.bm.table.forgotten(rid)
            self._durable.discard(rid)
            return True
        self.bm.table.hint_failed(rid)
        return False

    @property
    def events(self) -> list[MigrationEvent]:
        """Migrations this run-time took part in (as source or target), oldest first."""
        return self.bm.history.events()

    # --- digests (sent by runtime/client_digests.py) and the nodes' decisions ----------

    async def _periodic(self) -> None:
        while True:
            await asyncio.sleep(self.ticker.interval_s)
            if not self.monitoring:
                continue
            try:
                self.ticker.tick()
                await self._digests.maybe_send()
            except ShuttleError as exc:
                log.info("digest not delivered: %s", exc)
            except Exception:  # a bug here must not stop the application
                log.exception("run-time periodic work failed")

    def _act(self, decision: dict[str, Any]) -> None:
        """Carry out a node's decision about an object hosted here."""
        rid = ObjectId.parse(str(decision.get("rid", "")))
        target = str(decision.get("to", ""))
        if (
            self._closed
            or self.bm.table.hosted(rid) is None
            or self.bm.table.is_migrating(rid)
            or not target
        ):
            return
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._migrate_quietly(rid, target, str(decision.get("reason", ""))))
        self._migrations.add(task)
        task.add_done_callback(self._migrations.discard)

    async def _migrate_quietly(self, rid: ObjectId, target: str, reason: str) -> None:
        try:
            await migration.migrate_out(self.bm, rid, target, reason)
        except ShuttleError as exc:
            log.info("migration of %s to %s did not happen: %s", rid, target, exc)

    # --- shutdown -------------------------------------------------------------------------

    def close(self) -> None:
        """Destroy this application's objects on the nodes, then stop the run-time."""
        if self._closed:
            return
        self._closed = True  # no more decisions are acted on
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):  # migrations under way end or roll back
                self.bm.run(self._settle(), timeout_s=CLOSE_SETTLE_S)
        nodes: set[str] = set()
        remote = [
            (rid, entry.location)
            for rid, entry in self.bm.table.homed_items()
            if entry.location not in (self.id, "") and not rid.local.startswith(CONSOLE_PREFIX)
        ]
        # A durable object is ended by its home, wherever it runs (unless it is here).
        remote += [(rid, rid.home) for rid in self._durable if self.bm.table.hosted(rid) is None]
        for rid, location in remote:
            nodes.add(location)
            for attempt in range(CLOSE_DESTROY_ATTEMPTS):
                try:
                    self.bm.run(
                        self.peers.call(location, "object.destroy", {"rid": str(rid)}),
                        timeout_s=5.0,
                    )
                    break
                except (ShuttleError, OSError, TimeoutError) as exc:
                    if attempt == CLOSE_DESTROY_ATTEMPTS - 1:
                        log.warning(
                            "could not destroy %s on %s (%s); its node drops it when the "
                            "lease runs out",
                            rid,
                            location,
                            exc,
                        )
                    else:
                        time.sleep(0.2)
        for node in nodes | {n.node_id for n in self.nodes}:
            with contextlib.suppress(ShuttleError, OSError, TimeoutError):
                self.bm.run(self.peers.call(node, "runtime.bye", {"runtime": self.id}), 2.0)
        for rid in self.bm.table.hosted_ids():
            with contextlib.suppress(ShuttleError):
                if rid in self._durable:
                    self.bm.destroy_hosted(rid)  # its home forgets it too
                else:
                    self.bm.release(rid, destroyed=not rid.is_anchored)
        loop = self._loop
        if loop is not None and not loop.is_closed() and self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10.0)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.control.shutdown(wait=False, cancel_futures=True)

    async def _settle(self) -> None:
        await asyncio.gather(*list(self.bm.tasks), *list(self._migrations), return_exceptions=True)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _listener_tls(runtime_id: str, host: str) -> ServerTls:
    """The TLS an application's run-time listens with in a TLS cluster: a throwaway
    self-signed certificate (the cluster's CA key is not the application's to use).
    Nodes that call it check its key proof, bound to the TLS channel, instead of the
    certificate (:mod:`shuttle.net.tls`). The files live only while they are loaded."""
    directory = Path(tempfile.mkdtemp(prefix="shuttle-runtime-tls-"))
    try:
        pair = certs.self_signed(directory, runtime_id, host)
        return ServerTls(pair.cert, pair.key)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
