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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shuttle.client.lookaside.index import IndexReport, IndexSummary, Location, LookasideIndex
    from shuttle.client.lookaside.reader import LookasideCounters, LookasideReader
    from shuttle.client.lookaside.stores import (
        LOOKASIDE_ENV,
        LookasideStore,
        StoreSet,
        default_home,
        stores_from_env,
    )

# Imported on first use, not with the package: ``shuttle lookaside --help`` imports
# this package's ``cli`` module and must not pay for the reader (test_cli_start.py).
_LAZY: dict[str, str] = {
    "IndexReport": "shuttle.client.lookaside.index",
    "IndexSummary": "shuttle.client.lookaside.index",
    "Location": "shuttle.client.lookaside.index",
    "LookasideIndex": "shuttle.client.lookaside.index",
    "LookasideCounters": "shuttle.client.lookaside.reader",
    "LookasideReader": "shuttle.client.lookaside.reader",
    "LOOKASIDE_ENV": "shuttle.client.lookaside.stores",
    "LookasideStore": "shuttle.client.lookaside.stores",
    "StoreSet": "shuttle.client.lookaside.stores",
    "default_home": "shuttle.client.lookaside.stores",
    "stores_from_env": "shuttle.client.lookaside.stores",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


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
