"""The cluster's space as the mount's ``statfs`` reports it: the disks under the
nodes, each file system once, or a large constant where no node reports a disk.
"""

from __future__ import annotations

from shuttle.client.client import Client

#: How long statfs answers from the nodes' last report: a node's stats are a few
#: hundred bytes of counters, and df or a file manager may ask many times a second.
STATFS_TTL_S = 2.0
#: What statfs reports when no node reports its disk (a RADOS store: the pool's
#: space is Ceph's to tell), so programs that check before writing go ahead; a
#: full node still says ENOSPC at close.
UNKNOWN_SPACE_BYTES = 1 << 46


def cluster_space(client: Client) -> tuple[int, int]:
    """``(total, free)`` bytes of the disks under the cluster's nodes, each disk once
    (nodes on one file system report the same ``fsid``, and would count it twice)."""
    disks: dict[tuple[str, int], tuple[int, int]] = {}
    for node in client.nodes:
        space = client.node_stats(node).get("store", {}).get("space", {})
        if "total_bytes" in space and "free_bytes" in space:
            disk = (node.host, int(space.get("fsid", node.port)))
            disks[disk] = (int(space["total_bytes"]), int(space["free_bytes"]))
    if not disks:
        return UNKNOWN_SPACE_BYTES, UNKNOWN_SPACE_BYTES
    return sum(t for t, _ in disks.values()), sum(f for _, f in disks.values())
