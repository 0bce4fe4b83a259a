"""Which gateway node sits beside a key's data: the client's cache of each key's
primary-OSD host, and of each node's host, learned in the background.

A gateway node on a RADOS store answers ``rados.locate`` (keys → the CRUSH host of
each key's primary OSD, plus its own host; shuttle.store.rados_locality).
:class:`GatewayClient <shuttle.client.gateways.GatewayClient>` puts the nodes on a
key's primary host first, and falls back to rendezvous order while it does not know.

Nothing here is on a request's path: :meth:`Locality.host_of` is a dict lookup, and a
key it does not know is queued for a background thread, which locates queued keys in
batches (one round trip per :data:`LOCATE_BATCH` keys) on any live node. So the first
request for a key goes to its rendezvous node, and the later ones to the node beside
its data. Answers expire after :data:`LOCATION_TTL_S` (an OSD that died moves its
primaries; until then a request only goes to a node that is not beside the data,
which still serves it), and the cache holds at most :data:`LOCATIONS_MAX` keys.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from shuttle.client.model import NodeAddress
from shuttle.errors import ShuttleError, UnknownOperationError

log = logging.getLogger("shuttle.client.locality")

#: Keys whose primary host the client remembers (least recently used go first); a
#: key and a host name take ~150 bytes, so about 10 MB at most.
LOCATIONS_MAX = 65536

#: Seconds an answer is used: a primary moves when an OSD dies or returns.
LOCATION_TTL_S = 30.0

#: Keys located per round trip (the node takes up to 4,096).
LOCATE_BATCH = 1024

#: Keys waiting to be located; more are dropped (and asked again on a later request).
PENDING_MAX = 8 * LOCATE_BATCH

#: Seconds a node's host is trusted before it is asked again (a node restarted on
#: another machine behind the same address is noticed within this long).
NODE_HOST_TTL_S = 300.0
#: How long :meth:`Locality.close` waits for the thread (it may be in a lookup).
CLOSE_WAIT_S = 10.0

#: ``call(node, op, args) -> result`` (the client's own request path).
Call = Callable[[NodeAddress, str, dict[str, Any]], Any]


class Locality:
    """Primary-OSD hosts of keys and hosts of nodes, filled by a background thread
    (started on first need, stopped by :meth:`close`). Thread-safe."""

    def __init__(
        self,
        nodes: Sequence[NodeAddress],
        call: Call,
        order: Callable[[str], list[NodeAddress]],
        *,
        capacity: int = LOCATIONS_MAX,
        ttl_s: float = LOCATION_TTL_S,
    ) -> None:
        self.nodes = list(nodes)
        self._call = call
        self._order = order
        self.capacity = capacity
        self.ttl_s = ttl_s
        self._lock = threading.Condition()
        self._keys: OrderedDict[str, tuple[str | None, float]] = OrderedDict()
        self._node_hosts: dict[str, tuple[str, float]] = {}
        self._pending: dict[str, None] = {}
        self._thread: threading.Thread | None = None
        self._inflight = False
        self._closed = False
        #: False once a node said it cannot locate (not a RADOS store): stop asking.
        self.enabled = True
        #: Round trips made to locate keys, and keys located (for tests and stats).
        self.round_trips = 0
        self.located = 0

    # --- lookups (no I/O) ---------------------------------------------------------------

    def host_of(self, key: str) -> str | None:
        """The host of ``key``'s primary OSD if known and fresh; else None, and the key
        is queued to be located in the background."""
        now = time.monotonic()
        with self._lock:
            hit = self._keys.get(key)
            if hit is not None and hit[1] > now:
                self._keys.move_to_end(key)
                return hit[0]
            if self.enabled and not self._closed and len(self._pending) < PENDING_MAX:
                self._pending[key] = None
                self._start()
                self._lock.notify()
            return None

    def node_host(self, node: NodeAddress) -> str | None:
        with self._lock:
            hit = self._node_hosts.get(node.node_id)
            return hit[0] if hit is not None else None

    def prefer(self, key: str, order: list[NodeAddress]) -> list[NodeAddress]:
        """``order`` with the nodes on ``key``'s primary host first (stable)."""
        host = self.host_of(key)
        if host is None:
            return order
        near = [n for n in order if self.node_host(n) == host]
        if not near:
            return order
        return near + [n for n in order if self.node_host(n) != host]

    def forget_node(self, node: NodeAddress) -> None:
        """``node`` died: learn its host again when it is back (it may have moved)."""
        with self._lock:
            self._node_hosts.pop(node.node_id, None)

    # --- the background thread --------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="shuttle-locality", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                # A thread that close() gave up waiting for is no longer self._thread: it
                # ends when its lookup returns, though the Locality may be open again.
                self._lock.wait_for(
                    lambda: self._closed or self._thread is not me or bool(self._pending)
                )
                if self._closed or self._thread is not me:
                    return
                batch = list(self._pending)[:LOCATE_BATCH]
                for key in batch:
                    del self._pending[key]
                self._inflight = True
            try:
                self._locate(batch)
            except UnknownOperationError:
                self.enabled = False  # a node without a RADOS store: stop asking
            except ShuttleError as exc:
                log.debug("locating %d keys failed: %s", len(batch), exc)
            finally:
                with self._lock:
                    self._inflight = False
                    self._lock.notify_all()

    def _learn_node_hosts(self) -> None:
        now = time.monotonic()
        for node in self.nodes:
            with self._lock:
                hit = self._node_hosts.get(node.node_id)
            if hit is not None and hit[1] > now:
                continue
            try:
                result = self._call(node, "rados.locate", {"keys": []})
            except ShuttleError:
                continue  # dead or unreachable: asked again next batch
            self.round_trips += 1
            with self._lock:
                self._node_hosts[node.node_id] = (str(result["host"]), now + NODE_HOST_TTL_S)

    def _locate(self, keys: list[str]) -> None:
        self._learn_node_hosts()
        # Any live node answers for every key: ask the first key's preferred node.
        last: ShuttleError | None = None
        for node in self._order(keys[0]):
            try:
                result = self._call(node, "rados.locate", {"keys": keys})
                break
            except UnknownOperationError:
                raise
            except ShuttleError as exc:
                last = exc
        else:
            assert last is not None
            raise last
        self.round_trips += 1
        expires = time.monotonic() + self.ttl_s
        with self._lock:
            self._node_hosts.setdefault(
                node.node_id, (str(result["host"]), time.monotonic() + NODE_HOST_TTL_S)
            )
            for key, host in zip(keys, result["hosts"], strict=True):
                self._keys[key] = (host, expires)
                self._keys.move_to_end(key)
            while len(self._keys) > self.capacity:
                self._keys.popitem(last=False)
            self.located += len(keys)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no key waits to be located (tests); False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._pending and not self._inflight, timeout_s)

    def close(self) -> None:
        """Stop the background thread (a later lookup starts it again)."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            self._lock.notify_all()
        if thread is not None:
            thread.join(CLOSE_WAIT_S)
        with self._lock:  # a client used again after close starts a new thread
            self._closed = False
            self._pending.clear()
