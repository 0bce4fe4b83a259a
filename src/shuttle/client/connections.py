"""One client's connections to its nodes: what a connection must offer
(:class:`NodeConnection`), one per thread and node dialled on first use
(:class:`ThreadConnections`), all closed together, and their counters summed
(:func:`counter_totals`, which the asyncio client's connections report the same way).

A thread has its own connection to each node, so threads never wait for one another
on a socket; the set of every connection opened is kept to close and count them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from shuttle.client.model import NodeAddress
from shuttle.net.blocking import Call
from shuttle.net.blocking_stream import ConnectionCounters
from shuttle.wire import Response
from shuttle.wire.events import Payload

#: The counters a client sums over its connections (``Client.counters`` and
#: ``AsyncClient.counters`` report them under these names).
TOTALLED_COUNTERS = (
    "requests",
    "round_trips",
    "bytes_sent",
    "bytes_received",
    "connects",
    "errors",
)


class NodeConnection(Protocol):
    """What the client needs of one connection to a node: :class:`BlockingConnection`
    over a socket, or :class:`shuttle.testing.MemoryConnection` in tests."""

    counters: ConnectionCounters

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = True,
    ) -> Response: ...

    def call_many(
        self, calls: Iterable[Call], *, window: int = ..., idempotent: bool = True
    ) -> Iterator[Response]: ...

    def close(self) -> None: ...


#: Opens a connection to a node (called once per thread and node).
Dial = Callable[[NodeAddress], NodeConnection]


class _PerThread(threading.local):
    """One thread's connections to the nodes, by node id (built empty in each thread
    on first use, so the hot path reads a plain attribute, not ``getattr`` with a
    default)."""

    def __init__(self) -> None:
        self.conns: dict[str, NodeConnection] = {}


class ThreadConnections:
    """This process's connections to the nodes, one per thread and node, opened by
    ``dial`` on first use. ``mine`` is the calling thread's, by node id: the read
    path looks a connection up there directly."""

    def __init__(self, dial: Dial) -> None:
        #: Opens a new connection (that its caller owns) to a node.
        self.dial = dial
        self.mine = _PerThread()
        self._all: list[NodeConnection] = []
        self._lock = threading.Lock()

    def get(self, node: NodeAddress) -> NodeConnection:
        """This thread's connection to ``node`` (opened on first use)."""
        conns = self.mine.conns
        conn = conns.get(node.node_id)
        if conn is None:
            conn = self.dial(node)
            conns[node.node_id] = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def drop(self, node: NodeAddress) -> None:
        """Close this thread's connection to ``node`` (the next call dials a fresh one)."""
        conn = self.mine.conns.get(node.node_id)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every connection opened so far, in every thread (each thread dials
        again on its next call)."""
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self.mine = _PerThread()

    def forget_after_fork(self) -> None:
        """In a forked child: forget (without closing: they are the parent's) every
        connection, and the lock another thread of the parent may have held."""
        self._lock = threading.Lock()
        self.mine = _PerThread()
        self._all = []

    def totals(self) -> dict[str, int]:
        """:func:`counter_totals` over every connection opened so far."""
        with self._lock:
            conns = list(self._all)
        return counter_totals(conns)


class _Counted(Protocol):
    counters: ConnectionCounters


def counter_totals(conns: Iterable[_Counted]) -> dict[str, int]:
    """The :data:`TOTALLED_COUNTERS` of ``conns``, summed."""
    totals = dict.fromkeys(TOTALLED_COUNTERS, 0)
    for conn in conns:
        for name in totals:
            totals[name] += getattr(conn.counters, name)
    return totals
