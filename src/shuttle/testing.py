"""Test doubles that ship with Shuttle, so users can test their code against it too.

* :class:`FakeClock`: a :class:`~shuttle.net.clock.Clock` whose time moves only when
  the test says so; sleepers wake in deadline order. Link shaping and timers take a
  clock argument, so their exact instants can be checked without wall time.
* :func:`memory_stream_pair`: two connected asyncio ``(StreamReader, StreamWriter)``
  pairs over an in-memory transport, for testing protocol code without a socket.
* :class:`MemoryNode`: a storage node in this process (the node's own storage
  operations over an :class:`~shuttle.store.ObjectStore` in a directory) that the
  synchronous :class:`~shuttle.client.Client` reaches without a socket
  (:meth:`MemoryNode.client`), for unit tests of the client's cache, routing and
  file objects. It counts the operations it serves.

These stand in for time and sockets only in unit tests; integration tests use real
processes and real sockets on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack

from shuttle.client.client import Client
from shuttle.errors import InvalidArgumentError, ShuttleError
from shuttle.net.addresses import NodeAddress
from shuttle.net.blocking import Call
from shuttle.net.blocking_stream import ConnectionCounters
from shuttle.net.registry import OperationRegistry, Reply
from shuttle.node.handlers import register_storage_ops
from shuttle.store import ObjectStore
from shuttle.wire import ErrorResponse, Response
from shuttle.wire.events import Payload

#: Event-loop passes :meth:`FakeClock.advance_to` grants after each wake-up so that
#: woken tasks can run their chain of callbacks (a wake-up, a write delivered with
#: ``call_soon``, a reader resumed, ...) before time moves on. Chains in Shuttle's
#: shaping are at most about five passes long; 32 leaves a wide margin.
SETTLE_PASSES = 32


class FakeClock:
    """A clock that stands still until the test moves it.

    * :meth:`jump` / :meth:`jump_to` set the time at once and wake every sleeper whose
      deadline has passed, in deadline order (ties: the order they went to sleep).
      They are plain functions: the woken tasks run when the test next yields.
    * :meth:`advance` / :meth:`advance_to` move time step by step through each
      sleeper's deadline, letting the woken tasks run (see :data:`SETTLE_PASSES`)
      before the next step, so a task that sleeps again sees the right ``now()``.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._sequence = itertools.count()

    def now(self) -> float:
        """The fake time in seconds."""
        return self._now_s

    async def sleep_until(self, deadline_s: float) -> None:
        """Wait until the test moves time to ``deadline_s`` or beyond."""
        if deadline_s <= self._now_s:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline_s, next(self._sequence), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many tasks are waiting on this clock (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        """The earliest deadline anyone waits for, or ``None``."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)

    def _wake_due(self) -> int:
        woken = 0
        while self._sleepers and self._sleepers[0][0] <= self._now_s:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
                woken += 1
        return woken

    def jump_to(self, t_s: float) -> None:
        """Set the time to ``t_s`` (never backwards) and wake the sleepers due by then."""
        if t_s < self._now_s:
            raise InvalidArgumentError(
                f"FakeClock cannot go backwards: now {self._now_s}, asked {t_s}"
            )
        self._now_s = t_s
        self._wake_due()

    def jump(self, dt_s: float) -> None:
        """:meth:`jump_to` ``now() + dt_s``."""
        self.jump_to(self._now_s + dt_s)

    async def settle(self) -> None:
        """Let ready tasks run (:data:`SETTLE_PASSES` event-loop passes) without moving
        time."""
        for _ in range(SETTLE_PASSES):
            await asyncio.sleep(0)

    async def advance_to(self, t_s: float) -> None:
        """Move time to ``t_s`` through every deadline on the way, in order, letting the
        woken tasks run at each one."""
        if t_s < self._now_s:
            raise InvalidArgumentError(
                f"FakeClock cannot go backwards: now {self._now_s}, asked {t_s}"
            )
        await self.settle()
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > t_s:
                break
            self._now_s = max(self._now_s, deadline)
            self._wake_due()
            await self.settle()
        self._now_s = t_s
        await self.settle()

    async def advance(self, dt_s: float) -> None:
        """:meth:`advance_to` ``now() + dt_s``."""
        await self.advance_to(self._now_s + dt_s)


class MemoryTransport(asyncio.Transport):
    """One end of an in-memory byte pipe; bytes written here are delivered, in order,
    to the peer end's protocol on a later event-loop pass (as a socket would).

    No flow control: writes never pause. :meth:`close` sends end-of-stream to the
    peer; :meth:`abort` makes the peer see ``ConnectionResetError``.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        super().__init__(extra={"peername": f"memory:{name}", "sockname": f"memory:{name}"})
        self._loop = loop
        self._protocol: asyncio.BaseProtocol | None = None
        self.peer: MemoryTransport | None = None
        self._closing = False
        self._reading = True
        self.bytes_written = 0

    # asyncio.BaseTransport
    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._shut(None)

    def abort(self) -> None:
        self._shut(ConnectionResetError("memory transport aborted by the peer"))

    def _shut(self, error: Exception | None) -> None:
        if self._closing:
            return
        self._closing = True
        if self.peer is not None:
            self._loop.call_soon(self.peer._peer_shut, error)
        if self._protocol is not None:
            self._loop.call_soon(self._protocol.connection_lost, None)

    def _peer_shut(self, error: Exception | None) -> None:
        protocol = self._protocol
        if self._closing or not isinstance(protocol, asyncio.Protocol):
            return
        if error is None:
            protocol.eof_received()
        else:
            self._closing = True
            protocol.connection_lost(error)

    # asyncio.ReadTransport
    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        self._reading = False

    def resume_reading(self) -> None:
        self._reading = True

    # asyncio.WriteTransport
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self.bytes_written += len(data)
        if self.peer is not None:
            self._loop.call_soon(self.peer._receive, bytes(data))

    def _receive(self, data: bytes) -> None:
        protocol = self._protocol
        if not self._closing and isinstance(protocol, asyncio.Protocol):
            protocol.data_received(data)

    def write_eof(self) -> None:
        if self.peer is not None:
            self._loop.call_soon(self.peer._peer_shut, None)

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


StreamPair = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _stream_end(
    loop: asyncio.AbstractEventLoop, transport: MemoryTransport, limit: int
) -> StreamPair:
    reader = asyncio.StreamReader(limit=limit)
    protocol = asyncio.StreamReaderProtocol(reader)
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    return reader, writer


async def memory_stream_pair(limit: int = 2**16) -> tuple[StreamPair, StreamPair]:
    """Two connected ``(reader, writer)`` pairs: what one writer writes, the other
    reader reads. ``limit`` is the readers' ``StreamReader`` line limit."""
    loop = asyncio.get_running_loop()
    a, b = MemoryTransport(loop, "a"), MemoryTransport(loop, "b")
    a.peer, b.peer = b, a
    return _stream_end(loop, a, limit), _stream_end(loop, b, limit)


class MemoryNode:
    """A storage node without a process or a socket: the operations a real node
    registers (:func:`shuttle.node.handlers.register_storage_ops`) over an object
    store in ``data_dir``, called in this thread.

    What a client sees is what a node would send: results pass through msgpack, and
    errors through their wire code (:class:`~shuttle.wire.ErrorResponse`), so the
    client raises the same typed errors. ``served`` counts requests by operation.
    """

    def __init__(self, data_dir: Path, node_id: str = "memory") -> None:
        self.node_id = node_id
        self.store = ObjectStore(data_dir)
        self.registry = OperationRegistry()
        register_storage_ops(self.registry, self.store)
        self.address = NodeAddress(node_id, "memory", 0)
        self.served: Counter[str] = Counter()

    def handle(self, op: str, args: dict[str, Any], payload: Payload) -> Response:
        """Serve one request as the node would: a :class:`Response`, or the typed error."""
        self.served[op] += 1
        try:
            out = self.registry.get(op).handler(args, bytes(payload))
        except ShuttleError as exc:
            raise ErrorResponse.from_exception(0, exc).to_exception() from None
        reply = out if isinstance(out, Reply) else Reply(out)
        result = msgpack.unpackb(msgpack.packb(reply.result, use_bin_type=True), raw=False)
        return Response(0, result, bytes(reply.payload))

    def connect(self) -> MemoryConnection:
        return MemoryConnection(self)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> MemoryNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def client(nodes: Sequence[MemoryNode], **options: Any) -> Client:
        """A :class:`Client` of ``nodes`` (``options`` as for the client)."""
        by_id = {node.node_id: node for node in nodes}
        return Client(
            [node.address for node in nodes],
            dial=lambda address: by_id[address.node_id].connect(),
            **options,
        )


class MemoryConnection:
    """A client's connection to a :class:`MemoryNode` (the client's ``NodeConnection``)."""

    def __init__(self, node: MemoryNode) -> None:
        self.node = node
        self.counters = ConnectionCounters(connects=1)
        self.closed = False

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = True,
    ) -> Response:
        self.closed = False  # like a socket connection, reopened on use
        counters = self.counters
        counters.requests += 1
        counters.round_trips += 1
        counters.bytes_sent += len(payload)
        counters.by_op[op] = counters.by_op.get(op, 0) + 1
        try:
            response = self.node.handle(op, dict(args or {}), payload)
        except ShuttleError:
            counters.errors += 1
            raise
        counters.bytes_received += len(response.payload)
        return response

    def call_many(
        self, calls: Iterable[Call], *, window: int = 16, idempotent: bool = True
    ) -> Iterator[Response]:
        for call in calls:
            yield self.call(call.op, call.args, call.payload, idempotent=idempotent)

    def close(self) -> None:
        self.closed = True
