"""A client of a :class:`MemoryNode` whose requests can be held at a gate, so that tests
order a speculation's branch against its check with events instead of sleeps."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from shuttle.client import Client
from shuttle.net.blocking import Call
from shuttle.net.blocking_stream import ConnectionCounters
from shuttle.testing import MemoryConnection, MemoryNode
from shuttle.wire import Response
from shuttle.wire.events import Payload

KEY = "spec/object"


class GatedConnection:
    """A :class:`MemoryConnection` that runs ``hooks[op]()`` before serving ``op``."""

    def __init__(self, inner: MemoryConnection, hooks: dict[str, Callable[[], None]]) -> None:
        self.inner = inner
        self.hooks = hooks
        self.counters: ConnectionCounters = inner.counters

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = True,
    ) -> Response:
        hook = self.hooks.get(op)
        if hook is not None:
            hook()
        return self.inner.call(op, args, payload, idempotent=idempotent)

    def call_many(
        self, calls: Iterable[Call], *, window: int = 16, idempotent: bool = True
    ) -> Iterator[Response]:
        for call in calls:
            yield self.call(call.op, call.args, call.payload, idempotent=idempotent)

    def close(self) -> None:
        self.inner.close()


def gated_client(node: MemoryNode, hooks: dict[str, Callable[[], None]]) -> Client:
    """A client of ``node`` (1 KiB cache blocks) whose requests pass ``hooks``."""
    return Client(
        [node.address],
        dial=lambda _: GatedConnection(node.connect(), hooks),
        cache_bytes=64 << 10,
        cache_block_bytes=1 << 10,
    )
