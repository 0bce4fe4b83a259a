"""A node that missed a change of principals catches up from its peers on its own.

``shuttle cluster user add/remove/caps`` gives the new table to every node it reaches
(:mod:`shuttle.cluster.principals`). A node it could not reach (down, or cut off from
the administrator's machine) would keep its older table, and with it a removed
principal's key, until someone ran ``shuttle cluster user sync``. Instead, a node
started with ``--cluster-file FILE`` (``shuttle cluster up`` gives its own) *pulls*:

* **before it listens**, it asks every other node of the file for its table
  (``principals.get``, as the cluster key's holder, over TLS checked against the CA
  when the cluster has TLS) and takes the newest if it is newer than its own: a node
  coming back after it missed a change serves nobody with the old table;
* **every** :data:`PEERS_CHECK_S` (``--principals-check``) it asks again: a node that
  stayed up but was cut off catches up within one interval of being reachable again.

Which table wins is what the CLI decides (:func:`~shuttle.cluster.principals.newest`):
the highest epoch; two different tables at that epoch are a conflict an administrator
resolves (``shuttle cluster user sync --from NODE``), so the node keeps its own and
says so in its log. The table is stored like one the CLI gives (a compare-and-set on
the epoch the node had), and installing it closes the connections of principals it
removed. Peers are trusted as the CLI is: each is asked with the cluster key (which
every node holds, and from which every principal's key derives), and its proof is
checked in the handshake, so only a holder of the cluster key can hand a node a table.

The cluster file is read at each round (peers restart on other ports; ``cluster up``
writes it while it starts the nodes): one that cannot be read is a round with no peers,
logged, never a stopped node.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from shuttle.cluster.clusterfile import ClusterFile, NodeEntry
from shuttle.errors import ConfigError, ShuttleError, VersionMismatchError
from shuttle.net.blocking import BlockingConnection
from shuttle.net.principals import PrincipalTable
from shuttle.net.tls import ClientTls
from shuttle.node.principal_store import PrincipalStore

log = logging.getLogger("shuttle.node")

#: How often a node asks its peers for a newer principal table. A removed principal
#: is refused by a node that missed the removal within this long of the node being
#: reachable again (plus one round, :data:`PEER_TIMEOUT_S` at most); a round costs
#: each peer one small request, so ten seconds cost a cluster nothing measurable while
#: keeping a stale node's window well under what re-issuing a key takes a person.
PEERS_CHECK_S: Final = 10.0
#: Seconds to connect to a peer and have its answer. A table is a few KB; two seconds
#: is a hundred round trips on the slowest link profile. Peers are asked at once, so a
#: round (and a node's start) waits at most this long for peers that are down.
PEER_TIMEOUT_S: Final = 2.0
#: Peers asked at once in a round (more wait for a thread).
PEER_THREADS: Final = 8


@dataclass(frozen=True)
class PeerTable:
    """What one peer answered: its table, or why it could not."""

    node: str
    table: PrincipalTable | None
    error: str = ""


def newer_table(current: PrincipalTable, answers: list[PeerTable]) -> PrincipalTable | None:
    """The table to adopt: the peers' newest, if its epoch is above ``current``'s and
    no two peers hold different tables at that epoch (a conflict is logged and nothing
    is adopted). None: nothing newer, or a conflict."""
    known = [a for a in answers if a.table is not None]
    if not known:
        return None
    top = max(a.table.epoch for a in known if a.table is not None)
    if top <= current.epoch:
        return None
    at_top = {a.table.digest(): a for a in known if a.table is not None and a.table.epoch == top}
    if len(at_top) > 1:
        log.warning(
            "principals: nodes %s hold different tables at epoch %d; keeping this node's "
            "(epoch %d) until an administrator runs `shuttle cluster user sync --from NODE`",
            ", ".join(sorted(a.node for a in at_top.values())),
            top,
            current.epoch,
        )
        return None
    return next(iter(at_top.values())).table


class PeerCatchUp:
    """Pulls newer principal tables from the other nodes of ``cluster_file``.

    ``node_id``: this node's name in the file (it does not ask itself); ``key``: the
    cluster key; ``tls``: how to dial peers (None: plain). Counters in :meth:`stats`.
    """

    def __init__(
        self,
        store: PrincipalStore,
        cluster_file: Path,
        node_id: str,
        key: bytes,
        tls: ClientTls | None,
        *,
        interval_s: float = PEERS_CHECK_S,
    ) -> None:
        if interval_s <= 0:
            raise ConfigError(f"--principals-check must be positive seconds, got {interval_s:g}")
        self.store = store
        self.cluster_file = cluster_file
        self.node_id = node_id
        self.key = key
        self.tls = tls
        self.interval_s = interval_s
        self.rounds = 0
        self.adopted = 0
        self.last_errors: dict[str, str] = {}

    def stats(self) -> dict[str, Any]:
        return {
            "epoch": self.store.book.table.epoch,
            "peer_rounds": self.rounds,
            "peer_adopted": self.adopted,
            "peer_errors": dict(self.last_errors),
            "peer_check_s": self.interval_s,
        }

    def peers(self) -> list[NodeEntry]:
        """The other nodes of the cluster file (none if it cannot be read now)."""
        try:
            cluster = ClusterFile.load(self.cluster_file)
        except ConfigError as exc:
            log.info("principals: no peers to ask this round: %s", exc)
            return []
        return [e for e in cluster.nodes if e.id != self.node_id and e.port]

    def _ask(self, entry: NodeEntry) -> PeerTable:
        try:
            with BlockingConnection(
                entry.host,
                entry.port,
                client_name=f"shuttle-node-{self.node_id}-principals",
                connect_timeout_s=PEER_TIMEOUT_S,
                request_timeout_s=PEER_TIMEOUT_S,
                key=self.key,
                tls=self.tls,
            ) as conn:
                result = conn.call("principals.get").result
            table = PrincipalTable.from_wire(result.get("table"), f"node {entry.id}")
        except (ShuttleError, OSError) as exc:  # down, cut off, or refusing: next round
            return PeerTable(entry.id, None, f"{type(exc).__name__}: {exc}"[:300])
        return PeerTable(entry.id, table)

    def round(self) -> PrincipalTable | None:
        """Ask every peer once (blocking; peers at once) and store a newer table if one
        is found; returns it, to install in the book on the event loop (None: nothing
        to change)."""
        self.rounds += 1
        peers = self.peers()
        if not peers:
            return None
        with ThreadPoolExecutor(min(PEER_THREADS, len(peers))) as pool:
            answers = list(pool.map(self._ask, peers))
        self.last_errors = {a.node: a.error for a in answers if a.table is None}
        current = self.store.book.table
        newer = newer_table(current, answers)
        if newer is None:
            return None
        try:
            stored = self.store.put(newer, current.epoch)
        except VersionMismatchError:
            return None  # changed meanwhile (an administrator at work): next round
        self.adopted += 1
        log.warning(
            "principals: epoch %d from the other nodes (this node had epoch %d: it missed "
            "a change while it was down or cut off)",
            stored.epoch,
            current.epoch,
        )
        return stored

    async def catch_up(self) -> None:
        """One round, off the event loop, and the result installed (connections of
        removed principals are closed)."""
        loop = asyncio.get_running_loop()
        try:
            table = await loop.run_in_executor(None, self.round)
        except ShuttleError as exc:  # the node's own store failed: keep what we have
            log.warning("principals: could not store the peers' newer table: %s", exc)
            return
        if table is not None and table.digest() != self.store.book.table.digest():
            self.store.book.replace(table)

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.catch_up()
            except Exception:  # one bad round must not end the rounds
                log.exception("principals: a round of asking peers failed")
