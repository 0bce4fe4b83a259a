"""A small read answered from the block cache without the key's lock, compiled.

:meth:`ObjectStore.read_cached <shuttle.store.objects.ObjectStore.read_cached>` says
why reading without the lock is safe (the key lock's generation as a sequence lock);
this module is that code alone, so that it can be compiled with the mypyc group
(:mod:`shuttle.compiled`) while the store around it stays interpreted. A node's read
lane calls :meth:`CachedReads.read` directly: a warm read then runs no interpreted
frame on the node. It reads the attribute table's two maps by reference (the table
never rebinds them, only changes their contents) and the store's ``_closed`` flag.
"""

from __future__ import annotations

from typing import Any

from shuttle.blockcache import BlockCache
from shuttle.store.attrs import StoredAttrs
from shuttle.store.locks import KeyLocks
from shuttle.store.stats import StoreCounters


class CachedReads:
    """The lock-free cache-hit read of one store, for reads of up to ``max_bytes``."""

    def __init__(
        self,
        store: Any,
        locks: KeyLocks,
        dirty: dict[str, Any],
        clean: dict[str, Any],
        cache: BlockCache,
        counters: StoreCounters,
        max_bytes: int,
    ) -> None:
        self.store = store  # for its ``_closed`` flag
        self.locks = locks
        self.dirty = dirty
        self.clean = clean
        self.cache = cache
        self.counters = counters
        self.max_bytes = max_bytes

    def read(
        self, key: str, offset: int, length: int, expected_version: int | None
    ) -> bytes | None:
        """Bytes ``[offset, offset+length)`` of ``key`` if every block is cached and no
        change overlapped the look, else None (the caller goes the long way)."""
        if not (0 < length <= self.max_bytes and offset >= 0):
            return None
        lock = self.locks.lock_for(key)
        generation = lock.generation
        if generation & 1:
            return None
        found = self.dirty.get(key)
        if found is None:
            found = self.clean.get(key)
        if type(found) is not StoredAttrs:
            return None
        rec: StoredAttrs = found
        if expected_version is not None and expected_version != rec.version:
            return None
        end = min(rec.size, offset + length)
        if offset >= end:
            return None
        data = self.cache.read_hit(key, offset, end)
        # Closed last, just before the generation's second look: a store closed at any
        # point of the lookup answers nothing (and a test can land a change here).
        if data is None or self.store._closed or lock.generation != generation:
            return None
        self.counters.read_done(len(data))
        return data

    def limited(self, max_bytes: int) -> CachedReads:
        """The same reads, for at most ``max_bytes`` (a node's inline limit)."""
        return CachedReads(
            self.store,
            self.locks,
            self.dirty,
            self.clean,
            self.cache,
            self.counters,
            min(self.max_bytes, max_bytes),
        )
