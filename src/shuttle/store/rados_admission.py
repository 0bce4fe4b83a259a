"""Which misses of a RADOS gateway's block cache are worth caching (and reading whole).

A miss of the node's block cache used to read the whole blocks around the range asked
for and put them into the cache (LRU then; CLOCK now, an approximation of LRU), betting
that the page, or the rest of its block, is read again before the block is evicted.
When the working set is much larger than the cache, the bet loses: the block is evicted
unused, and it evicted a block that might have been read again. Replayed by
benchmarks/rados_reuse.py, every one of the 3,514 timed misses of ``shuttle bench ceph
netrand --file-bytes 8388608 --node-cache-bytes 1048576`` re-read a block the cache had
evicted, 90 % of them one evicted without a single hit. With blocks larger than a page
(``--cache-block-bytes``; the node's default block is a 4 KiB page), such a miss also
reads more from RADOS than the client asked for (a 64 KiB read takes 1.5× a 4 KiB one
on the local Ceph: benchmarks/README.md, "Warm reads on a RADOS gateway").

The test here is 2Q's ghost queue (Johnson and Shasha, VLDB 1994: "A1out") used for
admission: the gateway remembers the blocks of its last misses, as many as its cache
holds blocks (the cache's *reach*). A miss reads and caches the whole blocks when

* the cache has room for them (nothing is evicted for them: a cache that is filling,
  or one larger than the working set, fills as before), or
* one of them missed before within the reach: it is being read again soon enough that,
  cached, it would have stayed until then (an LRU cache of that many blocks would have
  kept it, had nothing else been read in between).

Otherwise it reads only the bytes asked for and caches nothing: a block admitted then
would be evicted before its next use, and would evict one that might not be. With
reads spread evenly over a working set W times the cache, about 1/W of the misses
find their block in the ghost queue, which is the share an LRU cache would have hit
(the node's CLOCK cache about the same).

Pure bookkeeping, no I/O; thread-safe (one short lock). Counters (``stats()``):
``whole_reads`` (misses read and cached whole), ``partial_reads`` (misses read as
asked, not cached), ``ghost_hits`` (misses of a block missed before within the reach).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

#: The ghost queue remembers at most this many blocks, whatever the cache's size: a
#: key and an int per entry (about 150 bytes), so 64 Ki entries cost about 10 MiB;
#: a cache of more blocks (4 GiB of 64 KiB blocks) is one a working set rarely
#: exceeds by much, and a reach that is too short only reads more misses partially.
GHOST_BLOCKS_MAX = 65536


class MissAdmission:
    """Decides, for each miss, whole blocks into the cache or only the bytes asked for."""

    def __init__(self, capacity_blocks: int) -> None:
        #: How many missed blocks are remembered: as many as the cache holds.
        self.reach_blocks = max(0, min(capacity_blocks, GHOST_BLOCKS_MAX))
        self._ghost: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._lock = threading.Lock()
        self.whole_reads = 0
        self.partial_reads = 0
        self.ghost_hits = 0

    def whole(self, key: str, first: int, last: int, room: bool) -> bool:
        """A miss of blocks ``first``..``last`` of ``key``: True to read them whole and
        cache them, False to read only the bytes asked for (see the module). ``room``:
        the cache has room for them without evicting anything. Remembers the miss."""
        ghost = self._ghost
        with self._lock:
            seen = False
            for idx in range(first, last + 1):
                block = (key, idx)
                if block in ghost:
                    seen = True
                    ghost.move_to_end(block)
                else:
                    ghost[block] = None
            while len(ghost) > self.reach_blocks:
                ghost.popitem(last=False)
            if seen:
                self.ghost_hits += 1
            if room or seen:
                self.whole_reads += 1
                return True
            self.partial_reads += 1
            return False

    def would_keep(self, key: str, first: int, last: int, room: bool) -> bool:
        """Whether :meth:`whole` would read blocks ``first``..``last`` of ``key`` whole
        now, without remembering anything (a client's ``direct`` read asks first)."""
        if room:
            return True
        ghost = self._ghost
        with self._lock:
            return any((key, idx) in ghost for idx in range(first, last + 1))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "whole_reads": self.whole_reads,
                "partial_reads": self.partial_reads,
                "ghost_hits": self.ghost_hits,
            }
