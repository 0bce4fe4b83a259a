"""Lookaside stores: on a cache miss, take an object's chunks from local directories
that hold them (a USB stick, an older copy of a data set, a previous release of a
source tree), verified against the node's hashes, and only the rest from the node.
See docs/lookaside.md.

Layout:

* ``index``   the SQLite index of one store: chunk hash → file, offset, length
* ``stores``  a store (a directory and its index) and the set a user has added
* ``reader``  the miss path: stores first, the node for the rest; verification,
  counters, and the rule that skips the stores when the link is faster
* ``cli``     ``shuttle lookaside add|index|ls|rm``

Use: ``Client(nodes, lookaside=[LookasideStore.open(dir)])`` (or ``StoreSet()`` for the
user's added stores); ``client.counters()["lookaside"]`` says what it did.
"""

from shuttle.client.lookaside.index import IndexReport, IndexSummary, Location, LookasideIndex
from shuttle.client.lookaside.reader import LookasideCounters, LookasideReader
from shuttle.client.lookaside.stores import (
    LOOKASIDE_ENV,
    LookasideStore,
    StoreSet,
    default_home,
    stores_from_env,
)

__all__ = [
    "LOOKASIDE_ENV",
    "IndexReport",
    "IndexSummary",
    "Location",
    "LookasideCounters",
    "LookasideIndex",
    "LookasideReader",
    "LookasideStore",
    "StoreSet",
    "default_home",
    "stores_from_env",
]
