"""The block cache over fixed-size blocks of objects, write-through, evicting by CLOCK
(second chance): one policy that the storage node (:mod:`shuttle.store`) and the
client (:mod:`shuttle.client.cache`) both use. It sits below both packages, so neither
imports the other for it.

Reads go through :meth:`BlockCache.read` with a *fetch* function ``(start, end) -> bytes``
(the fsspec shape): the node's reads the object from disk, the client's asks the node.
Runs of missing blocks are fetched with one call each. Writes go to the backing store
first and then update the cache (:meth:`~BlockCache.write`, :meth:`~BlockCache.truncate`,
:meth:`~BlockCache.invalidate`), so the cache never holds bytes the store does not.

Why CLOCK and not LRU: a hit is the node's commonest operation (every warm page it
serves), and an LRU must move the block to the young end on every one, under the
cache's mutex, because the I/O pool's threads insert and evict meanwhile. CLOCK only
sets the block's reference bit on a hit, which needs no lock; eviction, under the
mutex, goes round the blocks oldest first, clears the bits it finds set and evicts the
first block whose bit is clear (a block enters with its bit clear, as in
:class:`shuttle.sim.policies.Clock`, the simulator's policy the tests compare it with).
It keeps what was used since the hand last passed, as an LRU keeps what was used
lately, at a cost of one store per hit (benchmarks/README.md, "Tail latency under many
clients": the mutex and the LRU's move were 1.6 k of the 12.4 k instructions of the
node's warm read).

Concurrency contract: the cache is thread-safe on its own, but a read of a key must
not overlap a write of the same key, or a read could put pre-write bytes back after
the write updated the cache. The object store guarantees this with its per-key
reader/writer lock; the client forgets a key after changing it. Everything that
inserts, evicts, patches or drops blocks, and every read that fetches, holds the
cache's mutex; a read that finds all its blocks (:meth:`BlockCache.read_hit`) takes
none. That is safe because each step it takes is one operation on a built-in object,
atomic under the GIL: the lookups of the key's map of blocks and of the block in it (a
block is published there complete, after its bytes and bit are set, and removed whole;
a map dropped meanwhile only makes the lookup miss), a read of the block's bytes (an
immutable ``bytes`` object, replaced whole by a patch, never changed in place) and the
store of its bit. A block evicted after the lookup still holds the
object's bytes at the version its key's lock (or, on the node's lock-free read, its
generation check) vouches for. The hit's two counters are added to without the mutex:
compiled (the mypyc group, :mod:`shuttle.compiled`) each addition runs without giving
up the GIL, so none is lost; the pure Python build may lose one when two threads hit at
the same instant (counters are statistics there; the tests that assert on exact counts
read from one thread). A free-threaded Python would need atomics for all of this.

What a hit can return, read a second time against fills, evictions, patches and
invalidations in the I/O pool's threads (tests/unit/store/test_cache_clock.py; ``make
sanitize`` runs them with the compiled build under AddressSanitizer): never another
key's bytes, as a key's blocks live in that key's own map and a ``_Block`` stays the
block of one key and index for its life (an insert makes a new one; nothing moves or
reuses one); never a torn block, as a patch replaces the bytes whole; an evicted,
invalidated or patched-over block's bytes only until the caller's version check, which
is why every caller without the key's lock reads a generation or epoch before and after
and declines when it moved (:class:`~shuttle.store.fastread.CachedReads`, the RADOS
store's ``read_cached``). A map dropped when its key's last block goes is empty by
then, so a hit that still holds it misses.

Counters (:class:`CacheStats`) are the observable API: tests, the node's stats
operation and the benchmarks read them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Final, final

from mypy_extensions import trait

from shuttle.errors import InvalidArgumentError

#: 64 KiB blocks: one block is one typical content-defined chunk, a 4 KiB page read
#: costs one 64 KiB pread on a miss (a few microseconds from the page cache), and a
#: 128 MiB cache is 2,048 entries, so the clock's bookkeeping stays small.
DEFAULT_BLOCK_SIZE_BYTES = 64 * 1024
#: 128 MiB by default; the node's configuration sets it (``0`` disables the cache).
DEFAULT_CAPACITY_BYTES = 128 * 1024 * 1024
#: Smallest block: below 512 bytes the per-entry overhead exceeds the data.
BLOCK_SIZE_BYTES_MIN = 512

Fetch = Callable[[int, int], bytes]


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A snapshot of the cache's counters. ``hits``/``misses`` count blocks."""

    hits: int
    misses: int
    bytes_from_cache: int
    bytes_from_disk: int
    evictions: int
    invalidations: int
    blocks_cached: int
    bytes_cached: int
    capacity_bytes: int
    block_size_bytes: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


#: :meth:`SpanReader.lane_span`'s "no span": the read goes the usual way. A span the
#: lane answers holds at least one byte, so its ``stop`` is never 0.
NO_SPAN: Final[tuple[bytes, int, int]] = (b"", 0, 0)


@trait
class SpanReader:
    """A read that a node's read lane calls natively: ``lane_span(key, offset, length,
    expected_version)`` → ``(buffer, start, stop)``, the read's bytes being
    ``buffer[start:stop]`` (usually a whole cached block, from :meth:`BlockCache.span_hit`),
    or :data:`NO_SPAN` when it cannot answer from memory (the caller goes the usual way).

    Why a trait here: the node's protocol (``net``) may not import the store, and a call
    through a Python callable costs the compiled lane a bound method's argument parsing
    and the span's tuple and ints boxed (0.3 k of a warm read's 9.2 k instructions,
    benchmarks/README.md "Tail latency"). Compiled with the mypyc group, a call of
    ``lane_span`` is a native call and its span comes back as a C struct. It sits with
    the block cache because a span is the cache's: ``net`` and ``store`` both sit above
    it. Implementations never raise on a request they cannot answer: they decline."""

    def lane_span(
        self, key: str, offset: int, length: int, expected_version: int | None
    ) -> tuple[bytes, int, int]:
        raise NotImplementedError


@final
class BytesSpans(SpanReader):
    """The :class:`SpanReader` of a read that answers bytes or None (a ``--workers``
    worker's, any store's without a span reader of its own): the span of all the bytes
    it answers; None, or no bytes, is :data:`NO_SPAN`."""

    def __init__(self, read: Callable[[str, int, int, int | None], bytes | None]) -> None:
        self.read = read

    def lane_span(
        self, key: str, offset: int, length: int, expected_version: int | None
    ) -> tuple[bytes, int, int]:
        data = self.read(key, offset, length, expected_version)
        if not data:
            return NO_SPAN
        return data, 0, len(data)


@final
class _Block:
    """A cached block: its bytes (immutable; a patch replaces them whole) and its
    reference bit (set by every hit, cleared by the eviction hand as it passes)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.used = False


class BlockCache:
    """A fully associative cache of ``block_size_bytes`` blocks, ``capacity_bytes``
    total, evicting by CLOCK (see the module).

    Block ``i`` of an object holds bytes ``[i*B, min((i+1)*B, size))``; only the last
    block of an object is shorter than ``B``.
    """

    def __init__(
        self,
        capacity_bytes: int = DEFAULT_CAPACITY_BYTES,
        block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES,
    ) -> None:
        if capacity_bytes < 0:
            raise InvalidArgumentError(f'"capacity_bytes" must be >= 0, got {capacity_bytes}')
        if block_size_bytes < BLOCK_SIZE_BYTES_MIN:
            raise InvalidArgumentError(
                f'"block_size_bytes" must be >= {BLOCK_SIZE_BYTES_MIN}, got {block_size_bytes}'
            )
        self.capacity_bytes = capacity_bytes
        self.block_size_bytes = block_size_bytes
        #: Held by everything but a read that hits (see the module).
        self._lock = threading.Lock()
        #: The cached blocks by key, then by index, looked up without the mutex by hits;
        #: only mutex holders change them. Plain dicts (compiled, a lookup is a C call),
        #: and two levels rather than one keyed by ``(key, index)``: a hit then builds,
        #: hashes and frees no tuple (0.4 k of its 1.9 k instructions, callgrind).
        self._index: dict[str, dict[int, _Block]] = {}
        #: The same blocks in the order the eviction hand meets them, oldest first
        #: (a block the hand passes with its bit set goes to the end); mutex only.
        self._clock: OrderedDict[tuple[str, int], _Block] = OrderedDict()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._bytes_from_cache = 0
        self._bytes_from_disk = 0
        self._evictions = 0
        self._invalidations = 0

    # --- reads ----------------------------------------------------------------------

    def read(self, key: str, offset: int, length: int, size: int, fetch: Fetch) -> bytes:
        """Bytes ``[offset, offset+length)`` of ``key`` (clipped to ``size``).

        ``fetch(start, end)`` must return the object's bytes in ``[start, end)``; it is
        called once per run of consecutive missing blocks, without the cache's lock held.
        Errors from ``fetch`` propagate; blocks fetched before the error stay cached.
        """
        end = min(offset + length, size)
        if offset >= end:
            return b""
        bsz = self.block_size_bytes
        first, last = offset // bsz, (end - 1) // bsz
        found: dict[int, bytes] = {}
        with self._lock:
            blocks = self._index.get(key)
            for idx in range(first, last + 1):
                entry = None if blocks is None else blocks.get(idx)
                if entry is not None:
                    entry.used = True
                    found[idx] = entry.data
            self._hits += len(found)
            self._misses += last - first + 1 - len(found)
            if len(found) == last - first + 1:  # all hits: the common, fast case
                self._bytes_from_cache += end - offset
                return self._assemble(found, first, last, offset, end)
        hit_idxs = list(found)
        idx = first
        while idx <= last:
            if idx in found:
                idx += 1
                continue
            run_end = idx
            while run_end + 1 <= last and run_end + 1 not in found:
                run_end += 1
            start, stop = idx * bsz, min((run_end + 1) * bsz, size)
            data = fetch(start, stop)
            if len(data) != stop - start:
                raise OSError(
                    f"short read of {key!r}: wanted {stop - start} bytes at {start}, "
                    f"got {len(data)}; the file changed behind the store"
                )
            with self._lock:
                self._bytes_from_disk += len(data)
                for j in range(idx, run_end + 1):
                    # A run of one block is kept as fetched (if immutable): compiled,
                    # even a slice of the whole copies it (64 KiB, about 4 µs a miss).
                    whole = run_end == idx and type(data) is bytes
                    blk = data if whole else data[(j - idx) * bsz : (j - idx + 1) * bsz]
                    found[j] = blk
                    self._insert(key, j, blk)
            idx = run_end + 1
        from_cache = sum(min(end, (j + 1) * bsz) - max(offset, j * bsz) for j in hit_idxs)
        with self._lock:
            self._bytes_from_cache += from_cache
        return self._assemble(found, first, last, offset, end)

    def read_hit(self, key: str, offset: int, end: int) -> bytes | None:
        """Bytes ``[offset, end)`` of ``key`` if all their blocks are cached, else None.

        The fast path of :meth:`read` for a small read that hits (counted as a hit per
        block); it never fetches and takes no lock (the module says why that is safe),
        so an event loop may call it. A None counts nothing, and the caller then goes
        the long way. ``end`` must already be clipped to the object's size.

        A read of more than one block is not atomic against a :meth:`write` in another
        thread (old block *i* beside new block *i+1* can be returned): a caller must
        check a version or generation of the key around it, as the store's loop-side
        read (its stripe's generation) and the RADOS store (its epoch) do.
        """
        span = self.span_hit(key, offset, end)
        if span[2] == 0:
            return None
        return span[0][span[1] : span[2]]

    def span_hit(self, key: str, offset: int, end: int) -> tuple[bytes, int, int]:
        """:meth:`read_hit` without its copy: ``(buffer, start, stop)`` with the bytes
        ``buffer[start:stop]``, where ``buffer`` is the cached block itself for a range
        within one block (immutable: a patch replaces a block, never changes it), or
        the range joined from its blocks for a range over several; :data:`NO_SPAN`
        (``stop`` 0: a span has at least one byte) where :meth:`read_hit` answers None,
        with the same counts and the same caller's duty (a version or generation
        checked around it). A node's read lane hands the span to the reply's packer,
        which copies the range straight into the frame: one copy of the page instead of
        two (a slice, then the frame). Not None but a sentinel, so that compiled the
        span is a C struct from here to the packer, its ints never boxed on the way."""
        if offset >= end:
            return NO_SPAN
        bsz = self.block_size_bytes
        idx = offset // bsz
        base = idx * bsz
        if end - base > bsz:
            joined = self._read_hits(key, offset, end)
            return NO_SPAN if joined is None else (joined, 0, len(joined))
        blocks = self._index.get(key)
        if blocks is None:
            return NO_SPAN
        entry = blocks.get(idx)
        if entry is None:
            return NO_SPAN
        blk = entry.data  # one look: a patch may replace it after this
        if len(blk) < end - base:
            return NO_SPAN
        entry.used = True
        self._hits += 1
        self._bytes_from_cache += end - offset
        return blk, offset - base, end - base

    def fill(self, key: str, offset: int, end: int, block: bytes) -> bytes:
        """Bytes ``[offset, end)`` of ``key`` out of ``block``, the whole block that holds
        them (block ``offset // B``: ``B`` bytes, or fewer if it is the object's last),
        just read by the caller after :meth:`read_hit` missed; the block is cached.

        :meth:`read` of a range within one block, with its fetch already done: the same
        fill rule (the whole block is kept), the same counters (a miss, the block's
        bytes from disk) and the same eviction; if another reader cached the block
        meanwhile, that copy is used and counted as a hit, as :meth:`read` would. One
        turn of the cache's mutex instead of :meth:`read`'s three, no fetch function:
        a node's block-cache miss on its event loop calls it
        (:mod:`shuttle.store.missread`). ``end`` must be clipped to the object's size
        and within the block; the caller holds the key's lock shared, as for
        :meth:`read`."""
        bsz = self.block_size_bytes
        idx = offset // bsz
        base = idx * bsz
        if end - base > len(block) or end <= offset:
            raise ValueError(
                f"fill of {key!r}: [{offset}, {end}) is not within the {len(block)}-byte "
                f"block at {base}; pass the whole block that holds the range"
            )
        lock = self._lock
        lock.acquire()
        blocks = self._index.get(key)
        entry = None if blocks is None else blocks.get(idx)
        if entry is not None and len(entry.data) == len(block):
            entry.used = True
            self._hits += 1
            self._bytes_from_cache += end - offset
            block = entry.data
        else:
            self._misses += 1
            self._bytes_from_disk += len(block)
            self._insert(key, idx, block)
        lock.release()
        return block[offset - base : end - base]

    def _read_hits(self, key: str, offset: int, end: int) -> bytes | None:
        """:meth:`read_hit` of a range over several blocks (no lock either)."""
        bsz = self.block_size_bytes
        first, last = offset // bsz, (end - 1) // bsz
        blocks = self._index.get(key)
        if blocks is None:
            return None
        entries: list[_Block] = []
        found: dict[int, bytes] = {}
        for idx in range(first, last + 1):
            entry = blocks.get(idx)
            if entry is None:
                return None
            blk = entry.data
            if (idx < last and len(blk) < bsz) or (idx == last and len(blk) < end - idx * bsz):
                return None
            entries.append(entry)
            found[idx] = blk
        for entry in entries:
            entry.used = True
        self._hits += len(found)
        self._bytes_from_cache += end - offset
        return self._assemble(found, first, last, offset, end)

    def _assemble(
        self, found: dict[int, bytes], first: int, last: int, offset: int, end: int
    ) -> bytes:
        bsz = self.block_size_bytes
        if first == last:
            base = first * bsz
            return found[first][offset - base : end - base]
        parts = []
        for j in range(first, last + 1):
            base = j * bsz
            lo = max(offset, base) - base
            hi = min(end, base + bsz) - base
            parts.append(found[j][lo:hi])
        return b"".join(parts)

    # --- writes (write-through: the caller has already written the disk) -----------

    def write(
        self, key: str, offset: int, data: bytes | bytearray | memoryview, old_size: int
    ) -> None:
        """Bring cached blocks of ``key`` up to date after ``data`` was written at ``offset``.

        Full cached blocks that the write overlaps are patched (their bytes replaced
        whole; they keep their place and bit); a cached short (last) block that changes
        is dropped. Blocks are never added here (no write-allocate): a large upload
        would otherwise flush the whole cache.
        """
        if not data:
            return
        bsz = self.block_size_bytes
        end = offset + len(data)
        with self._lock:
            blocks = self._index.get(key)
            if not blocks:
                return
            touched = [i for i in blocks if i * bsz < end and (i + 1) * bsz > offset]
            if end > old_size and old_size % bsz:
                touched.append(old_size // bsz)  # the old short last block grows
            for i in set(touched):
                entry = blocks.get(i)
                if entry is None:
                    continue
                blk = entry.data
                if len(blk) < bsz:
                    self._drop(key, i)
                    self._invalidations += 1
                    continue
                base = i * bsz
                lo, hi = max(offset, base), min(end, base + bsz)
                entry.data = b"".join(
                    (blk[: lo - base], bytes(data[lo - offset : hi - offset]), blk[hi - base :])
                )

    def truncate(self, key: str, old_size: int, new_size: int) -> None:
        """Drop the blocks of ``key`` that a resize from ``old_size`` to ``new_size`` changes."""
        keep_below = min(old_size, new_size) // self.block_size_bytes
        with self._lock:
            blocks = self._index.get(key)
            if not blocks:
                return
            for i in [i for i in blocks if i >= keep_below]:
                self._drop(key, i)
                self._invalidations += 1

    def invalidate(self, key: str) -> None:
        """Forget every block of ``key`` (after a put, a remove, or any wholesale change)."""
        with self._lock:
            blocks = self._index.get(key)
            if not blocks:
                return
            for i in list(blocks):
                self._drop(key, i)
                self._invalidations += 1

    def clear(self) -> None:
        """Forget everything (a cold-cache benchmark run). Counters are kept."""
        with self._lock:
            self._index.clear()
            self._clock.clear()
            self._bytes = 0

    def reset_counters(self) -> None:
        with self._lock:
            self._hits = self._misses = self._evictions = self._invalidations = 0
            self._bytes_from_cache = self._bytes_from_disk = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                hits=self._hits,
                misses=self._misses,
                bytes_from_cache=self._bytes_from_cache,
                bytes_from_disk=self._bytes_from_disk,
                evictions=self._evictions,
                invalidations=self._invalidations,
                blocks_cached=len(self._clock),
                bytes_cached=self._bytes,
                capacity_bytes=self.capacity_bytes,
                block_size_bytes=self.block_size_bytes,
            )

    def blocks(self) -> list[tuple[str, int, bool]]:
        """The cached blocks as ``(key, index, reference bit)``, in the order the
        eviction hand will meet them (the next victim candidate first): what the tests
        compare with a reference model of CLOCK, and a look for debugging."""
        with self._lock:
            return [(key, idx, entry.used) for (key, idx), entry in self._clock.items()]

    # --- internals (caller holds self._lock) -----------------------------------------

    def _insert(self, key: str, idx: int, blk: bytes) -> None:
        if len(blk) > self.capacity_bytes:
            return
        blocks = self._index.get(key)
        if blocks is not None and idx in blocks:  # another reader cached it meanwhile
            self._drop(key, idx)
        # Room first, then the new block: it goes in behind every block the hand
        # passed, so it is the last the hand meets (CLOCK's ring, where the new block
        # takes the victim's slot and the hand moves on).
        clock = self._clock
        while self._bytes + len(blk) > self.capacity_bytes:
            victim = next(iter(clock))
            entry = clock[victim]
            if entry.used:  # its second chance
                entry.used = False
                clock.move_to_end(victim)
                continue
            self._drop(victim[0], victim[1])
            self._evictions += 1
        entry = _Block(blk)
        clock[(key, idx)] = entry
        blocks = self._index.get(key)
        if blocks is None:
            blocks = self._index[key] = {}
        blocks[idx] = entry  # published complete: readers look here
        self._bytes += len(blk)

    def _drop(self, key: str, idx: int) -> None:
        blocks = self._index.get(key)
        entry = None if blocks is None else blocks.pop(idx, None)
        if entry is None:
            return
        del self._clock[(key, idx)]
        self._bytes -= len(entry.data)
        if blocks is not None and not blocks:
            del self._index[key]
