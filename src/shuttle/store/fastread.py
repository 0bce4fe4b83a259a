"""A small read answered from the block cache without the key's lock, compiled.

:meth:`ObjectStore.read_cached <shuttle.store.reads.ReadOps.read_cached>`'s
lookup, alone in a module so that it can be compiled with the mypyc group
(:mod:`shuttle.compiled`) while the store around it stays interpreted; why reading
without the lock is safe is argued in :meth:`CachedReads.lane_span`. A node's read
lane calls :meth:`CachedReads.lane_span` natively (a
:class:`~shuttle.blockcache.SpanReader`): a warm read then runs no interpreted frame
and makes no Python-level call on the node, and its page is copied once, from the
cached block into the reply's frame. What it looks at of the store (the attribute
table's two maps, the key locks, the block cache, the store's closed flag) is the
:class:`~shuttle.store.loopreads.StoreView` it shares with the miss read.
"""

from __future__ import annotations

from shuttle.blockcache import NO_SPAN, SpanReader
from shuttle.store.loopreads import LoopRead


class CachedReads(LoopRead, SpanReader):
    """The lock-free cache-hit read of one store, for reads of up to ``max_bytes``."""

    def read(
        self, key: str, offset: int, length: int, expected_version: int | None
    ) -> bytes | None:
        """Bytes ``[offset, offset+length)`` of ``key`` if every block is cached and no
        change overlapped the look, else None (the caller goes the long way)."""
        span = self.lane_span(key, offset, length, expected_version)
        if span[2] == 0:
            return None
        return span[0][span[1] : span[2]]

    def span(
        self, key: str, offset: int, length: int, expected_version: int | None
    ) -> tuple[bytes, int, int] | None:
        """:meth:`read` without its copy: ``(buffer, start, stop)``, the bytes being
        ``buffer[start:stop]`` (usually ``buffer`` is the cached block itself:
        :meth:`BlockCache.span_hit <shuttle.blockcache.BlockCache.span_hit>`), or None:
        :meth:`lane_span`, for Python callers."""
        span = self.lane_span(key, offset, length, expected_version)
        return None if span[2] == 0 else span

    def lane_span(
        self, key: str, offset: int, length: int, expected_version: int | None
    ) -> tuple[bytes, int, int]:
        """The span of the read's bytes, as :meth:`span` gives it, or
        :data:`~shuttle.blockcache.NO_SPAN` (a span answered holds at least one byte).
        A node's read lane calls this natively and packs the range straight into its
        reply. The generation check below covers the span as it covers the bytes: the
        block is an immutable ``bytes`` object, so what it holds when the check passes
        is what the reply sends."""
        # A small read whose blocks are all cached is answered without the key's lock.
        # Why that is safe: every change to a key's attributes or cached blocks is made
        # under the key's lock held exclusively (put, write, truncate, remove), and that
        # lock's ``generation`` is odd while such a change is under way and has grown
        # once it is done (a sequence lock). We read the generation, then the attributes
        # and the block, then the generation again: equal and even means no change
        # overlapped what we looked at, so attributes and block belong to one state of
        # the object. Everything else that touches them leaves that state as it was:
        # readers on the long way insert blocks under the shared lock (no change can
        # run), a stat fills in a hash under it, eviction and ``clear`` only drop
        # blocks, and a checkpoint moving a record between maps at worst makes us miss.
        # A block is an immutable ``bytes`` object, replaced whole and never patched in
        # place, so no read can see a torn block. Each step is atomic under the GIL (an
        # int attribute read, dict lookups, the block's bytes and its reference bit; the
        # cache's hit takes no mutex either, shuttle.blockcache says why), which the
        # argument relies on: a free-threaded Python would need the generation read with
        # acquire ordering. Keys are not validated here: only valid keys ever have
        # attributes, so a key that finds a record is valid, and any other goes the long
        # way and is checked. Anything unusual (a miss, an error to raise, a race) goes
        # the long way too.
        if not (0 < length <= self.max_bytes and offset >= 0):
            return NO_SPAN
        view = self.view
        lock = view.locks.lock_for(key)
        generation = lock.generation
        if generation & 1:
            return NO_SPAN
        rec = view.peek(key)
        if rec is None:
            return NO_SPAN
        if expected_version is not None and expected_version != rec.version:
            return NO_SPAN
        end = min(rec.size, offset + length)
        if offset >= end:
            return NO_SPAN
        span = view.cache.span_hit(key, offset, end)
        # Closed last, just before the generation's second look: a store closed at any
        # point of the lookup answers nothing. (The view's flag, a native field: the
        # store's own was a generic look-up on an interpreted object, 0.19 k a read.)
        if span[2] == 0 or view.closed or lock.generation != generation:
            return NO_SPAN
        view.counters.read_done(end - offset)
        return span
