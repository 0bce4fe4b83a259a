"""Which node holds a key: rendezvous (highest random weight) hashing over the
cluster's node addresses (the hash itself is :mod:`shuttle.rendezvous`, which the
object file system uses too).

Every client computes the same answer from the cluster's node ids alone, with no
directory to consult; adding or removing a node moves only the keys that node wins
or held (about 1/N of them), which a later rebalancing issue can rely on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shuttle.client.model import NodeAddress
from shuttle.errors import ConfigError, InvalidArgumentError
from shuttle.rendezvous import weight


def node_for_key(nodes: Sequence[NodeAddress], key: str) -> NodeAddress:
    """The node that holds ``key`` (the same on every client for the same node ids)."""
    if not nodes:
        raise ConfigError("no storage nodes configured; start some with `shuttle cluster up`")
    if len(nodes) == 1:
        return nodes[0]
    return max(nodes, key=lambda node: weight(node.node_id, key))


def nodes_in_order(nodes: Sequence[NodeAddress], key: str) -> list[NodeAddress]:
    """Every node, in the order of preference for ``key``: :func:`node_for_key` first,
    then the node that would hold it were that one gone, and so on. A gateway cluster
    (nodes over one shared store) fails over in this order, so every client moves a
    dead node's keys to the same next node."""
    if not nodes:
        raise ConfigError("no storage nodes configured; start some with `shuttle cluster up`")
    return sorted(nodes, key=lambda node: weight(node.node_id, key), reverse=True)


def positions_by_node(
    keys: Sequence[str], node_for: Callable[[str], NodeAddress]
) -> dict[str, list[int]]:
    """The positions in ``keys`` of the keys each node holds (``node_for``: the
    client's own choice, which a gateway client makes by locality), by node id: what a
    many-key call sends to each node, one round trip per node."""
    out: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        out.setdefault(node_for(key).node_id, []).append(i)
    return out


def node_named(nodes: Sequence[NodeAddress], node_id: str) -> NodeAddress:
    """The node of ``nodes`` called ``node_id`` (or addressed ``host:port``)."""
    for node in nodes:
        if node_id in (node.node_id, node.address):
            return node
    known = ", ".join(n.node_id for n in nodes)
    raise InvalidArgumentError(f"no node {node_id!r} in this cluster; its nodes: {known}")
