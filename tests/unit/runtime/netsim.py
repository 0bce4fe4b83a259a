"""Run-times in one process, joined by an in-memory network that loses what a test
says: the migration protocol end to end (real binding managers, their real
``object.*`` handlers) without sockets, with a lost request, a lost reply or a
cut-off run-time exactly where a test wants it.

Every message goes through :meth:`Net.deliver`: arguments and payloads cross as
msgpack would carry them, a typed error comes back as the same class, and
:attr:`Net.rule` (``(source, target, op) -> "ok" | "drop" | "lose_reply"``) decides
its fate: ``drop``, the request never arrives; ``lose_reply``, it runs and its
answer is lost (the caller cannot tell the two apart: an unreachable peer). A
run-time in :attr:`Net.down` cannot be connected to (:class:`NotSent`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgpack

from shuttle.errors import ShuttleError, UnreachableError
from shuttle.net.registry import OperationRegistry, Reply
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import NotSent, Peers
from shuttle.runtime.service import register_runtime_ops
from shuttle.wire import Response

Rule = Callable[[str, str, str], str]


class Net:
    """Run-times by id, and the rule every message between them passes."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.pool = pool
        self.runtimes: dict[str, BindingManager] = {}
        self.registries: dict[str, OperationRegistry] = {}
        self.down: set[str] = set()
        self.rule: Rule = lambda source, target, op: "ok"
        #: (source, target, op, fate) of every message, in order.
        self.log: list[tuple[str, str, str, str]] = []

    def add(
        self,
        runtime_id: str,
        *,
        durable_dir: Path | None = None,
        config: RuntimeConfig | None = None,
    ) -> BindingManager:
        """A run-time on this network (a node's if ``durable_dir``: it can be a home)."""
        bm = BindingManager(
            runtime_id,
            config=config or RuntimeConfig(),
            peers=NetPeers(self, runtime_id),
            monitor=ResourceMonitor(1.0),
            executor=self.pool,
            is_node=durable_dir is not None,
            durable_dir=durable_dir,
        )
        registry = OperationRegistry()
        register_runtime_ops(registry, bm)
        bm.attach_loop(asyncio.get_running_loop(), f"127.0.0.{len(self.runtimes) + 1}:1")
        self.runtimes[runtime_id] = bm
        self.registries[runtime_id] = registry
        for other in self.runtimes.values():
            other.peers.learn(runtime_id, bm.address)
            bm.peers.learn(other.id, other.address)
        return bm

    async def deliver(
        self, source: str, target: str, op: str, args: dict[str, Any], payload: Any
    ) -> Response:
        fate = (
            "down" if target in self.down or source in self.down else self.rule(source, target, op)
        )
        self.log.append((source, target, op, fate))
        if fate == "down":
            raise NotSent(f"{target} cannot be reached")
        if fate == "drop":
            raise UnreachableError(f"the request to {target} was lost")
        args = msgpack.unpackb(msgpack.packb(args, use_bin_type=True), raw=False)
        handler = self.registries[target].get(op).handler
        try:
            result = await handler(args, bytes(payload))  # type: ignore[misc]
        except ShuttleError as exc:
            if fate == "lose_reply":
                raise UnreachableError(f"the answer of {target} to {op} was lost") from exc
            raise type(exc)(str(exc)) from None
        if fate == "lose_reply":
            raise UnreachableError(f"the answer of {target} to {op} was lost")
        if isinstance(result, Reply):
            return Response(1, result.result, result.payload)
        return Response(1, msgpack.unpackb(msgpack.packb(result, use_bin_type=True), raw=False))


class NetPeers(Peers):
    """What a run-time on a :class:`Net` calls the others through."""

    def __init__(self, net: Net, me: str) -> None:
        super().__init__()
        self.net = net
        self.me = me

    async def call(
        self, runtime_id: str, op: str, args: dict[str, Any], payload: Any = b""
    ) -> Response:
        return await self.net.deliver(self.me, runtime_id, op, args, payload)

    async def call_or_not_sent(
        self, runtime_id: str, op: str, args: dict[str, Any], payload: Any = b""
    ) -> Response:
        return await self.net.deliver(self.me, runtime_id, op, args, payload)

    async def control(
        self,
        runtime_id: str,
        op: str,
        args: dict[str, Any],
        payload: Any = b"",
        *,
        timeout_s: float | None = None,
    ) -> Response:
        return await self.net.deliver(self.me, runtime_id, op, args, payload)
