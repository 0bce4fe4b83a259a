"""The RADOS store's key index: listing by prefix that scales with the page, not the pool.

Listing a RADOS pool (``rados ls``) walks every object of every placement group, so
its cost grows with the pool, whatever the prefix. Instead each key has an entry in the
omap of one of :data:`INDEX_SHARDS` index objects (``.shuttle/index/NN``, chosen by a
hash of the key; omap keys are the object keys, values empty). An omap is a sorted
key-value table inside the OSD (RocksDB), so ``get_omap_vals(start_after,
filter_prefix, max)`` costs what it returns. A page merges the shards' sorted runs.
Sharding is what Ceph's RGW does for large bucket indexes: it spreads the index's
writes over several OSDs, and keeps each omap far below the size (~100k keys) where
deep scrubs of one object get slow. The shard count is part of the pool's format.

Index objects are named ``.shuttle/...``: no key may start with that component, so
they never clash with an object.

Keeping the index and the objects in step (they are different RADOS objects, and
RADOS has no transaction across objects): a creator adds the entry before it writes
the object and again after; a remover removes the object, then the entry, then looks
whether the object exists again (a creator raced it) and puts the entry back if so.
Whatever the interleaving, an object that exists is listed once its creator returns.
The price is that a gateway killed between the steps, or a create racing a remove,
can leave an entry whose object is gone: a listing may name a key that a stat then
reports missing, until the key is created or removed again (``remove`` of a missing
key drops its entry).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import blake3

from shuttle.errors import InvalidArgumentError
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing

#: Index objects. 8 spreads the index over 8 placement groups (several OSDs) and keeps
#: a shard under RGW's advised ~100k entries up to ~800k keys; a page costs one omap
#: read per shard.
INDEX_SHARDS = 8

#: Where the index objects live (an invalid key prefix: no object can clash).
INDEX_OBJECT_PREFIX = ".shuttle/index/"

#: Sorts after every key that continues a given prefix: a key component is at most 255
#: bytes, and no valid UTF-8 byte sequence of that length sorts after 64 copies of the
#: largest code point (F4 8F BF BF). Used to skip a "directory" when listing with "/".
_PAST_COMPONENT = "\U0010ffff" * 64


def shard_of(key: str) -> str:
    """The name of the index object that holds ``key``'s entry."""
    n = int.from_bytes(blake3.blake3(key.encode()).digest(length=4), "little") % INDEX_SHARDS
    return f"{INDEX_OBJECT_PREFIX}{n:02d}"


def shard_names() -> list[str]:
    return [f"{INDEX_OBJECT_PREFIX}{n:02d}" for n in range(INDEX_SHARDS)]


#: ``fetch(shard, start_after, prefix, max)``: up to ``max`` keys of ``shard``, sorted,
#: greater than ``start_after`` and starting with ``prefix``.
FetchKeys = Callable[[str, str, str, int], list[str]]


class _Run:
    """The sorted keys of one shard, fetched a batch at a time."""

    def __init__(self, fetch: FetchKeys, shard: str, prefix: str, after: str, batch: int) -> None:
        self.fetch = fetch
        self.shard = shard
        self.prefix = prefix
        self.batch = batch
        self.buf: list[str] = []
        self.pos = 0
        self.exhausted = False
        self.seek(after)

    def seek(self, after: str) -> None:
        self.buf = self.fetch(self.shard, after, self.prefix, self.batch)
        self.pos = 0
        self.exhausted = len(self.buf) < self.batch

    def head(self) -> str | None:
        if self.pos < len(self.buf):
            return self.buf[self.pos]
        if self.exhausted or not self.buf:
            return None
        self.seek(self.buf[-1])
        return self.head()


def list_index(
    fetch: FetchKeys,
    prefix: str,
    delimiter: str | None,
    start_after: str | None,
    limit: int,
) -> Listing:
    """A page of the keys (and, with ``delimiter="/"``, prefixes) under ``prefix``,
    merged from the index shards; the same page :func:`shuttle.store.listing.list_page`
    gives for the same keys (where their paths do not clash)."""
    if delimiter not in (None, "/"):
        raise InvalidArgumentError(
            f"delimiter {delimiter!r} is not supported; use '/' (directories) or none."
        )
    if not 1 <= limit <= LIST_PAGE_ENTRIES_MAX:
        raise InvalidArgumentError(f'"limit" must be in 1..{LIST_PAGE_ENTRIES_MAX}, got {limit}')
    after = start_after or ""
    if after.startswith(prefix) and delimiter and "/" in after[len(prefix) :]:
        # Resuming after a "directory" prefix: skip everything under it.
        cut = after.index("/", len(prefix)) + 1
        if after[:cut] == after:
            after = after + _PAST_COMPONENT
    runs = [_Run(fetch, s, prefix, after, limit + 1) for s in shard_names()]
    heap: list[tuple[str, int]] = []
    for i, run in enumerate(runs):
        h = run.head()
        if h is not None:
            heap.append((h, i))
    heapq.heapify(heap)
    keys: list[str] = []
    prefixes: list[str] = []
    last: str | None = None
    while heap:
        key, i = heapq.heappop(heap)
        run = runs[i]
        run.pos += 1
        entry, is_prefix = key, False
        if delimiter is not None:
            slash = key.find("/", len(prefix))
            if slash >= 0:
                entry, is_prefix = key[: slash + 1], True
        if entry != last:
            if len(keys) + len(prefixes) == limit:
                return Listing(keys, prefixes, last)
            (prefixes if is_prefix else keys).append(entry)
            last = entry
        if is_prefix:
            # Skip the rest of this "directory" in every shard.
            past = entry + _PAST_COMPONENT
            heap = []
            for j, other in enumerate(runs):
                h = other.head()
                if h is not None and h.startswith(entry):
                    other.seek(past)
                    h = other.head()
                if h is not None:
                    heap.append((h, j))
            heapq.heapify(heap)
            continue
        h = run.head()
        if h is not None:
            heapq.heappush(heap, (h, i))
    return Listing(keys, prefixes, None)


def omap_fetcher(ioctx_of: Callable[[], Any], rados: Any) -> FetchKeys:
    """A :data:`FetchKeys` over the index objects' omaps (a missing shard is empty)."""

    def fetch(shard: str, after: str, prefix: str, count: int) -> list[str]:
        ioctx = ioctx_of()
        with rados.ReadOpCtx() as op:
            it, _ret = ioctx.get_omap_vals(op, after, prefix, count)
            try:
                ioctx.operate_read_op(op, shard)
            except rados.ObjectNotFound:
                return []
            return [k for k, _v in it]

    return fetch
