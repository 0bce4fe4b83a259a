"""A client of a gateway cluster: several nodes over one shared store (a Ceph RADOS
pool, ``shuttle serve --store rados:POOL``), any of which serves any key.

A key goes first to a node on the CRUSH host of its primary OSD, beside its data
(:mod:`shuttle.client.locality` learns where keys live in the background, from the
nodes' ``rados.locate``); while that is not known, or no node runs on that host, to
its rendezvous node (:func:`~shuttle.client.routing.node_for_key`), so each node's
block cache holds its share of the keys. When the chosen node cannot be
reached, :class:`GatewayClient` marks it dead for :data:`DEAD_NODE_S` and sends the
request to the next node in the key's order (:func:`~shuttle.client.routing.nodes_in_order`):
nothing is lost, since the data is in the shared store, not on the node. A stream
that a node's death cuts short resumes at the byte it reached, on the next node, and
against the same version (it fails with VersionMismatchError if the object changed,
as any stream does).

What is retried: every request routed by key, and listings. A request that may have
been applied before the node died is sent again; for puts, writes and truncates that
is harmless (they set the same bytes again, under a new version); a remove retried
after it was applied answers NotFoundError; a conditional change retried after it was
applied answers VersionMismatchError. An upload cut short starts again on the next
node when the source can be read again (bytes or a path); a one-shot iterable cannot,
and the error is raised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from shuttle.client import calls
from shuttle.client.calls import Op
from shuttle.client.client import Client, Progress, Source
from shuttle.client.locality import Locality
from shuttle.client.model import NodeAddress, ObjectInfo
from shuttle.client.routing import nodes_in_order
from shuttle.errors import UnreachableError
from shuttle.wire import Response

T = TypeVar("T")

#: How long a node that could not be reached is skipped before it is tried again (a
#: restarted node is back in use after this long; 5 s is a few request timeouts of a
#: node that answers, far below how long a dead node stays dead).
DEAD_NODE_S = 5.0


def _no_progress(_: int) -> None:
    pass


class GatewayClient(Client):
    """A :class:`~shuttle.client.client.Client` whose requests fail over between the
    nodes of a gateway cluster (see the module docstring)."""

    def __init__(
        self, nodes: Sequence[NodeAddress], *, locality: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(nodes, **kwargs)
        self._dead: dict[str, float] = {}
        self._dead_lock = threading.Lock()
        #: Requests sent again to another node after one could not be reached.
        self.failovers = 0
        #: Where keys' primary OSDs are (None: ``locality=False``, rendezvous only).
        self.locality = (
            Locality(
                self.nodes,
                lambda node, op, args: self.call(node, op, args).result,
                lambda key: self._order(key, keyed=False),
            )
            if locality and len(self.nodes) > 1
            else None
        )

    def mark_dead(self, node: NodeAddress) -> None:
        """Skip ``node`` for :data:`DEAD_NODE_S` (it could not be reached)."""
        with self._dead_lock:
            self._dead[node.node_id] = time.monotonic() + DEAD_NODE_S
        if self.locality is not None:
            self.locality.forget_node(node)

    def _alive(self, node: NodeAddress) -> bool:
        with self._dead_lock:
            until = self._dead.get(node.node_id)
            if until is None:
                return True
            if until <= time.monotonic():
                del self._dead[node.node_id]
                return True
            return False

    def _order(self, key: str, *, keyed: bool = True) -> list[NodeAddress]:
        """The nodes to try for ``key``: live ones in the key's order (those beside its
        primary OSD first, if ``keyed`` and known), then dead ones."""
        order = nodes_in_order(self.nodes, key)
        if keyed and self.locality is not None:
            order = self.locality.prefer(key, order)
        return [n for n in order if self._alive(n)] + [n for n in order if not self._alive(n)]

    def node_for(self, key: str) -> NodeAddress:
        return self._order(key)[0]

    def _send(self, op: Op, node: NodeAddress | None = None) -> Response:
        key = op.args.get("key")
        order = self._order(key) if isinstance(key, str) else self._order(op.op, keyed=False)
        return self._failover(order, node, lambda target: Client._send(self, op, target))

    def _read_piece(
        self, key: str, offset: int, length: int, node: NodeAddress | None = None
    ) -> bytes:
        # (Client.read has already read a key remembered for direct reads from RADOS,
        # before any node is ranked.)
        return self._failover(
            self._order(key),
            node,
            lambda target: Client._read_piece(self, key, offset, length, target),
        )

    def _failover(
        self, order: list[NodeAddress], node: NodeAddress | None, call: Callable[[NodeAddress], T]
    ) -> T:
        """``call(target)`` on each node of ``order`` (``node`` first, if alive) until
        one answers; an unreachable node is marked dead."""
        if node is not None and self._alive(node):
            order = [node, *(n for n in order if n.node_id != node.node_id)]
        last: UnreachableError | None = None
        for target in order:
            try:
                return call(target)
            except UnreachableError as exc:
                self.mark_dead(target)
                self.failovers += 1
                last = exc
        assert last is not None, "a client has at least one node"
        raise last

    def close(self) -> None:
        if self.locality is not None:
            self.locality.close()
        super().close()

    def _list(self, prefix: str, delimiter: str | None) -> tuple[list[str], list[str]]:
        """One node lists the whole pool (asking every node would list it N times); a
        listing cut short by a node's death resumes on the next node."""
        keys: list[str] = []
        prefixes: list[str] = []
        start_after: str | None = None
        while True:
            page = calls.page(self._send(calls.list_page(prefix, delimiter, start_after)))
            keys += page.keys
            prefixes += page.prefixes
            start_after = page.next
            if start_after is None:
                return keys, prefixes

    def iter_read(
        self,
        key: str,
        offset: int = 0,
        length: int | None = None,
        *,
        progress: Progress = _no_progress,
        info: ObjectInfo | None = None,
    ) -> Iterator[bytes | bytearray]:
        info = info or self.stat(key)
        end = info.size if length is None else min(info.size, offset + length)
        at = offset
        for _attempt in range(len(self.nodes)):
            node = self.node_for(key)
            try:
                for piece in super().iter_read(key, at, end - at, progress=progress, info=info):
                    at += len(piece)
                    yield piece
                return
            except UnreachableError:
                self.mark_dead(node)
                self.failovers += 1
        yield from super().iter_read(key, at, end - at, progress=progress, info=info)

    def put(
        self,
        key: str,
        source: Source,
        *,
        expected_version: int | None = None,
        progress: Progress = _no_progress,
        mtime_ns: int | None = None,
    ) -> ObjectInfo:
        again = isinstance(source, bytes | bytearray | memoryview | str | Path)

        def put() -> ObjectInfo:
            return super(GatewayClient, self).put(
                key, source, expected_version=expected_version, progress=progress, mtime_ns=mtime_ns
            )

        for _attempt in range(len(self.nodes) - 1 if again else 0):
            node = self.node_for(key)
            try:
                return put()
            except UnreachableError:
                self.mark_dead(node)
                self.failovers += 1
        return put()
