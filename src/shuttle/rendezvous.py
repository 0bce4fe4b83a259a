"""Rendezvous (highest random weight) hashing: which nodes a key prefers, in order.

Every client, run-time and object computes the same answer from the node ids alone,
with no directory to consult; adding or removing a node moves only the keys that node
wins or held (about 1/N of them). Two packages need it, so it lives below both: the
client routes keys to nodes with it (``client/routing.py``), and the object file
system picks a RAID 5 file's columns with it (``objects/fs/volume.py``).

The weight is the first 8 bytes of blake3 over ``node id NUL key``. It decides where
data lives, so it is part of the storage format: changing it moves every key
(docs/storage-format.md, "Placement of keys").
"""

from __future__ import annotations

from collections.abc import Iterable

import blake3

#: Bytes of the hash compared. 64 bits: two nodes tie for a key with probability
#: 2^-64, and the ordering stays the same on every machine (bytes, not floats).
WEIGHT_BYTES = 8


def weight(node_id: str, key: str) -> bytes:
    """Node ``node_id``'s weight for ``key``: the node with the highest wins it."""
    return blake3.blake3(f"{node_id}\x00{key}".encode()).digest(length=WEIGHT_BYTES)


def ranked(node_ids: Iterable[str], key: str) -> list[str]:
    """Every node id, most preferred for ``key`` first: the winner, then the node that
    would win were it gone, and so on."""
    return sorted(node_ids, key=lambda node: weight(node, key), reverse=True)


def winner(node_ids: Iterable[str], key: str) -> str:
    """The node id that wins ``key`` (``ranked(...)[0]``, without the sort).
    Raises ValueError if there are no nodes: callers say what to do about that."""
    return max(node_ids, key=lambda node: weight(node, key))
