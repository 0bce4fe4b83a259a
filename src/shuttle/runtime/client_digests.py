"""What an application's run-time tells the nodes each window (its digests) and when:
a console's first digest comes early (``first_digest_after_s`` into its burst of
activity), then one every ``digest_every_s`` while it is active, and one every
``digest_every_s`` while it is idle but objects of its own live on nodes (their lease),
to the nodes its stacks call and the nodes that host or are home to its objects.
Each node's reply carries its resource manager's decisions about objects hosted here,
handed to the run-time to carry out. Used by :class:`~shuttle.runtime.client.Runtime`;
the digest itself is built by :func:`~shuttle.runtime.digest.build_digest`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from shuttle.client.model import NodeAddress
from shuttle.runtime import values
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import CONSOLE_PREFIX, LinkDigest, build_digest
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import Peers
from shuttle.runtime.ticker import Ticker

log = logging.getLogger("shuttle.runtime")


class Digests:
    """One run-time's digests: the schedule (which consoles are active since when, and
    which have had their first digest) and the sending; ``act`` is called, on the
    run-time's loop, with each decision a node sends back."""

    def __init__(
        self,
        runtime_id: str,
        nodes: Callable[[], Sequence[NodeAddress]],
        bm: BindingManager,
        peers: Peers,
        monitor: ResourceMonitor,
        ticker: Ticker,
        config: RuntimeConfig,
        executor: Executor,
        durable: set[ObjectId],
        act: Callable[[dict[str, Any]], None],
    ) -> None:
        self._id = runtime_id
        #: The run-time's nodes (a function: it renames those given by address once it
        #: has asked them their ids).
        self._nodes = nodes
        self._bm = bm
        self._peers = peers
        self._monitor = monitor
        self._ticker = ticker
        self._config = config
        self._executor = executor
        #: The run-time's durable objects (its own set, shared): their homes hear from it.
        self._durable = durable
        self._act = act
        #: When each console's current burst of activity was first seen, and whether a
        #: digest has gone out since (a new stack's first digest comes early).
        self._active_since: dict[str, float] = {}
        self._reported: set[str] = set()
        self._last_digest = 0.0

    def _links(self) -> dict[str, LinkDigest]:
        """Each node's link as this run-time's digest declares it."""
        out = {}
        for n in self._nodes():
            link = n.link
            bw = None if link is None else link.bandwidth_bits_per_s
            out[n.node_id] = LinkDigest(
                link.name if link is not None else "loopback",
                None if bw is None else bw / 8,
                0.0 if link is None else link.latency_s,
            )
        return out

    async def maybe_send(self) -> None:
        """Send a digest of the window so far if one is due (see the module docstring),
        to the nodes it concerns."""
        window = self._monitor.window()
        now = time.monotonic()
        active = {caller for caller, _ in window.edges if caller.startswith(f"{self._id}/")}
        consoles = {c for c in active if ObjectId.parse(c).local.startswith(CONSOLE_PREFIX)}
        for c in list(self._active_since):
            if c not in consoles:
                del self._active_since[c]
                self._reported.discard(c)
        for c in consoles:
            self._active_since.setdefault(c, now)
        targets = {ObjectId.parse(callee).home for _, callee in window.edges}
        targets = {t for t in targets if t != self._id and self._peers.address_of(t) is not None}
        hosting = {
            e.location for _, e in self._bm.table.homed_items() if e.location not in (self._id, "")
        }
        # A durable object's home hears from its application too (or it forgets it).
        hosting |= {rid.home for rid in self._durable}
        hosting = {t for t in hosting if self._peers.address_of(t) is not None}
        targets |= hosting
        if not targets:
            return
        if not consoles:
            # Idle, but objects of ours live on nodes: a digest every H keeps their
            # lease (a node drops the objects of an application it no longer hears).
            if hosting and now - self._last_digest >= self._config.digest_every_s:
                self._last_digest = now
                await self._send(window, hosting)
            return
        first_due = any(
            c not in self._reported and now - t0 >= self._config.first_digest_after_s
            for c, t0 in self._active_since.items()
        )
        if not first_due and now - self._last_digest < self._config.digest_every_s:
            return
        self._last_digest = now
        self._reported.update(
            c
            for c, t0 in self._active_since.items()
            if now - t0 >= self._config.first_digest_after_s
        )
        await self._send(window, targets)

    async def _send(self, window: Any, targets: set[str]) -> None:
        loop = asyncio.get_running_loop()
        # With its CPU: whether the clients' CPUs are full is the node's to weigh
        # (docs/runtime.md, "The clients' saturation").
        digest = await loop.run_in_executor(
            self._executor,
            lambda: build_digest(
                self._bm, window, self._ticker.load, self._links(), cpu=self._ticker.cpu
            ),
        )
        packed = values.pack(digest.to_wire())
        replies = await asyncio.gather(
            *(self._peers.call(t, "runtime.digest", {}, packed) for t in sorted(targets)),
            return_exceptions=True,
        )
        for target, reply in zip(sorted(targets), replies, strict=True):
            if isinstance(reply, BaseException):
                log.info("digest to %s failed: %s", target, reply)
                continue
            for decision in (reply.result or {}).get("decisions", []):
                self._act(decision)
