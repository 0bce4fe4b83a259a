"""The run-time inside a storage node: wiring of the binding manager, the monitor,
the resource manager and the node's anchored storage object.

The node's process calls :meth:`NodeRuntime.start` once it listens (so the run-time
knows its address), and :meth:`NodeRuntime.close` on shutdown (shipped objects'
worker processes end with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shuttle.errors import ShuttleError
from shuttle.net.principal_limits import PrincipalLoad
from shuttle.net.principals import PrincipalBook, PrincipalTable
from shuttle.net.registry import OperationRegistry
from shuttle.net.tls import ClientTls
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import Digest, build_digest
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import Peers
from shuttle.runtime.planner import ResourceManager
from shuttle.runtime.service import register_runtime_ops
from shuttle.runtime.ticker import Ticker

log = logging.getLogger("shuttle.runtime")

#: Threads for the run-time's own steps (migrations, creations, destroys): a few,
#: apart from the threads that run object methods.
CONTROL_THREADS = 4


class NodeRuntime:
    """Mobile objects on one storage node."""

    def __init__(
        self,
        node_id: str,
        registry: OperationRegistry,
        storage: MobileObject,
        *,
        services: Mapping[str, MobileObject] | None = None,
        config: RuntimeConfig | None = None,
        key: bytes | None = None,
        speed: float = 1.0,
        sandbox_limits: Any = None,
        principals: PrincipalBook | None = None,
        tls: ClientTls | None = None,
        load: PrincipalLoad | None = None,
    ) -> None:
        self.config = config or RuntimeConfig()
        # Calls acting for a principal authenticate as it (runtime/authority.py).
        self.peers = Peers(
            key=key,
            client_name=f"shuttle-node-runtime {node_id}",
            derive=principals.key_of if principals is not None else None,
            tls=tls,
        )
        if principals is not None:
            principals.listeners.append(self._principals_changed)
        self.monitor = ResourceMonitor(self.config.window_s)
        self.executor = ThreadPoolExecutor(
            self.config.executor_threads, thread_name_prefix="shuttle-obj"
        )
        self.control = ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="shuttle-rt")
        self.bm = BindingManager(
            node_id,
            config=self.config,
            peers=self.peers,
            monitor=self.monitor,
            executor=self.executor,
            control=self.control,
            speed=speed,
            accepts_shipped=key is not None,
            sandbox_limits=sandbox_limits,
            is_node=True,
            principals=principals,
            durable_dir=self.config.durable_dir,
            load=load,
        )
        self.ticker = Ticker(self.monitor, self.config.window_s)
        self.manager = ResourceManager(
            node_id,
            self.config,
            peers=self.peers,
            locations=self.bm.table,
            local_digest=self.local_digest,
            memory_capacity_bytes=self.config.object_memory_bytes,
        )
        self.storage_rid = ObjectId.storage(node_id)
        self.bm.host_anchored(self.storage_rid, storage)
        # The file system's node services (isolation, atomicity): anchored beside
        # the storage object, under fixed ids every client can name.
        for name, obj in (services or {}).items():
            self.bm.host_anchored(ObjectId.service(node_id, name), obj)
        register_runtime_ops(registry, self.bm, manager=self.manager)
        self._task: asyncio.Task[None] | None = None
        self.started = time.monotonic()

    def _principals_changed(self, table: PrincipalTable) -> None:
        """Connections to other run-times acting for a removed principal are closed
        (the nodes at their other ends close them too; this frees ours at once)."""
        acting_for = {h.principal for _, h in self.bm.table.hosted_items() if h.principal}
        for name in acting_for - set(table.names()):
            loop = self.bm.loop
            if loop is not None:
                loop.call_soon_threadsafe(self.peers.drop_principal, name)

    def local_digest(self) -> Digest:
        return build_digest(self.bm, self.monitor.window(), self.ticker.load, cpu=self.ticker.cpu)

    def stats(self) -> dict[str, Any]:
        """The ``runtime`` section of ``node.stats``."""
        return {
            "hosted": len(self.bm.table.hosted_ids()),
            "load": round(self.ticker.load, 4),
            "speed": self.bm.speed,
            "evaluations": self.manager.evaluations,
            "migrations": sum(1 for e in self.bm.history.events() if e.ok),
            "shipped_code": self.bm.accepts_shipped,
        }

    def start(self, address: str) -> None:
        """The node listens at ``address``: start the periodic work."""
        loop = asyncio.get_running_loop()
        self.bm.attach_loop(loop, address)
        self.bm.durability.start()
        self._task = loop.create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.ticker.interval_s)
            self.ticker.tick()
            for rid, app in self.expired_leases():
                log.warning(
                    "dropping %s: its application %s has not been heard from for %.0f s",
                    rid,
                    app,
                    self.config.lease_s,
                )
                try:
                    await loop.run_in_executor(self.control, self._drop, rid)
                except ShuttleError as exc:  # busy or moving: next tick
                    log.info("dropping %s later: %s", rid, exc)

    def expired_leases(self) -> list[tuple[ObjectId, str]]:
        """Objects whose application's run-time has gone silent: not heard from (a
        digest every H to the nodes its objects run on and to its durable objects'
        homes) for ``lease_s``, with that application. A durable object is its home's
        to judge (the home hears the application; the node it runs on may not): the
        home drops it wherever it runs, and its copy there stops at its next renewal."""
        now = time.monotonic()
        out = []
        for rid, hosted in self.bm.table.hosted_items():
            if hosted.app == self.bm.id or hosted.gate.closed or self.bm.table.is_migrating(rid):
                continue
            if hosted.durable:
                continue  # below, at its home
            heard = max(self.manager.heard.get(hosted.app, 0.0), hosted.arrived_at)
            if now - heard > self.config.lease_s:
                out.append((rid, hosted.app))
        for rid, entry in self.bm.table.homed_items():
            app = self.bm.durability.app_of(rid)
            if not entry.durable or not app or app == self.bm.id:
                continue
            if self.bm.table.is_migrating(rid):
                continue
            heard = max(self.manager.heard.get(app, 0.0), self.started, entry.since)
            if now - heard > self.config.lease_s:
                out.append((rid, app))
        return out

    def _drop(self, rid: ObjectId) -> None:
        """An object of a silent application ends (hosted here, or a durable one homed
        here: forgotten, so its copy elsewhere hears "stale" and stops)."""
        if self.bm.table.hosted(rid) is not None:
            self.bm.destroy_hosted(rid)
        if rid.home == self.bm.id:
            self.bm.table.forgotten(rid)
            self.bm.durability.forget(rid)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self.bm.tasks):
            task.cancel()
        await asyncio.gather(*self.bm.tasks, return_exceptions=True)
        loop = asyncio.get_running_loop()
        for rid in self.bm.table.hosted_ids():
            if not rid.is_anchored:
                await loop.run_in_executor(self.control, self.bm.release, rid)
        await self.peers.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.control.shutdown(wait=False, cancel_futures=True)
