"""Reading an object range from lookaside stores and the node: the client's miss path.

On a miss for ``[start, stop)`` of one version of an object the reader

1. takes the object's chunk list from its attributes (the stat the open made anyway;
   paged from the node, pinned to the version, for objects of more than 8,192 chunks);
2. looks every chunk overlapping the range up in its stores' indexes, in the order
   the stores were added, reads each one found and verifies it against the node's
   blake3 hash. A mismatch is a miss: it is logged, counted, and the stale file's
   entries are dropped. A store that cannot be read (a USB stick pulled out
   mid-read) is a miss too;
3. fetches what no store supplied from the node in one pipelined batch
   (``call_many``), every request pinned to the version, so a change on the node
   fails the read (``VersionMismatchError``) instead of mixing versions.

Verified chunks are kept in a small LRU by hash (content-addressed, so valid for any
key and version): a chunk that spans two cache blocks is read and hashed once.

**When to skip the stores.** Lookaside pays only if taking bytes from a store costs
less time than taking them over the link. The reader measures both as it goes: the
store's *effective* rate (bytes it supplied / time spent looking up, reading and
verifying, so failed lookasides count against it) and the link's rate (bytes / time of
its own node fetches). It uses the stores unless both are known and the link is
faster; while skipping it still uses them every :data:`PROBE_EVERY`-th read, so the
store's rate stays current. Time saved is estimated per read as bytes from stores /
link rate − time spent on the stores (negative when a lookaside cost time).
"""

from __future__ import annotations

import bisect
import logging
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from shuttle.cdc import chunk_hash
from shuttle.client.lookaside.stores import LookasideStore
from shuttle.client.model import Chunk, ObjectInfo
from shuttle.net.blocking import Call

if TYPE_CHECKING:
    from shuttle.client.client import Client

log = logging.getLogger(__name__)

#: Verified chunks kept by hash: 8 MiB is 32 of the largest chunks (256 KiB), enough
#: for the chunks around any read a page cache or FUSE read-ahead makes.
VERIFIED_CACHE_BYTES = 8 << 20
#: Chunk lists kept by (key, version): a paged list costs round trips to rebuild.
CHUNK_LISTS_KEPT = 64
#: Whole-object reads go in windows this large, each one store pass and one node
#: batch: an object up to 64 MiB is one batch, a larger one holds 64 MiB at a time.
WINDOW_BYTES = 64 << 20
#: While the link is measured faster than the stores, every PROBE_EVERY-th read uses
#: the stores anyway, so a store that got faster (its pages now cached) is noticed.
PROBE_EVERY = 32
#: Each new rate sample weighs this much against the history (the history decays by
#: 1 − RATE_DECAY per sample): about the last ten reads count.
RATE_DECAY = 0.1
#: The stores' rate counts as measured only after this many reads consulted them: one
#: miss (a file changed since the store's release, often the first one read, such as a
#: package's ``__init__.py`` with its version) is a rate of zero, and would otherwise
#: send the next PROBE_EVERY − 1 reads to the link (a 100 Kbit/s build lost 8 s so).
STORE_SAMPLES_MIN = 8

Clock = Callable[[], float]
Progress = Callable[[int], None]


def _no_progress(_: int) -> None:
    pass


class Rate:
    """A throughput measured from (bytes, seconds) samples, recent ones weighing most."""

    def __init__(self) -> None:
        self.bytes = 0.0
        self.seconds = 0.0
        #: Samples added so far.
        self.samples = 0

    def add(self, nbytes: int, seconds: float) -> None:
        keep = 1.0 - RATE_DECAY
        self.bytes = self.bytes * keep + nbytes
        self.seconds = self.seconds * keep + max(seconds, 0.0)
        self.samples += 1

    @property
    def bytes_per_s(self) -> float | None:
        """None until measured."""
        if self.seconds <= 0.0:
            return None
        return self.bytes / self.seconds


@dataclass(slots=True)
class LookasideCounters:
    """What the reader did (``client.counters()["lookaside"]``)."""

    reads: int = 0
    #: Reads that did not consult the stores (the link was measured faster).
    reads_skipped: int = 0
    #: Reads that consulted the stores only to re-measure them.
    probes: int = 0
    #: Chunks that overlap a read and came from a store, counted per read (a chunk
    #: across two cache blocks counts in both); bytes of the read they supplied.
    chunks_from_stores: int = 0
    bytes_from_stores: int = 0
    #: The same for what came from the node.
    chunks_from_node: int = 0
    bytes_from_node: int = 0
    #: Pipelined batches of requests sent to the node: one per read that needed it.
    node_batches: int = 0
    #: Chunks a store had whose bytes did not match the node's hash.
    verify_failures: int = 0
    #: Chunks a store indexed but could not supply (gone, unreadable, changed).
    store_misses: int = 0
    store_seconds: float = 0.0
    node_seconds: float = 0.0
    #: Estimated: bytes from stores at the measured link rate, less the store time.
    time_saved_s: float = 0.0


class LookasideReader:
    """Reads ranges of ``client``'s objects from ``stores`` first, the node for the rest.

    Thread-safe. ``clock`` times the store and node work (``time.perf_counter``).
    """

    def __init__(
        self,
        client: Client,
        stores: Sequence[LookasideStore],
        *,
        clock: Clock = time.perf_counter,
        verified_cache_bytes: int = VERIFIED_CACHE_BYTES,
    ) -> None:
        self.client = client
        self.stores = list(stores)
        self.clock = clock
        self.counters = LookasideCounters()
        self.store_rate = Rate()
        self.link_rate = Rate()
        self._lock = threading.Lock()
        self._since_probe = 0
        self._verified: OrderedDict[bytes, bytes] = OrderedDict()
        self._verified_bytes = 0
        self._verified_max = verified_cache_bytes
        self._lists: OrderedDict[tuple[str, int], tuple[list[Chunk], list[int]]] = OrderedDict()

    # --- the miss path -------------------------------------------------------------------

    def fetch(self, info: ObjectInfo, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the version ``info`` of an object (``stop`` clipped
        to its size): the client cache's fetch function.

        Raises what the node's read raises (``VersionMismatchError`` if the object
        changed since ``info``); store failures never raise, they are misses."""
        stop = min(stop, info.size)
        if start >= stop:
            return b""
        if not self._use_stores():
            return self._node_only(info, start, stop)
        chunks, offsets = self._chunk_list(info)
        first = max(bisect.bisect_right(offsets, start) - 1, 0)
        last = bisect.bisect_left(offsets, stop)
        span = chunks[first:last]
        t0 = self.clock()
        have = self._from_stores(span)
        store_s = self.clock() - t0
        # What the stores gave, clipped to the range; the node fills the gaps.
        pieces: list[tuple[int, int, bytes]] = []
        for c in span:
            data = have.get(c.hash)
            if data is None:
                continue
            lo, hi = max(c.offset, start), min(c.offset + c.length, stop)
            if lo < hi:
                pieces.append((lo, hi, data[lo - c.offset : hi - c.offset]))
        # Bytes of the range the stores gave (a chunk spanning two cache blocks counts
        # its part in each read), for the counters and the store's measured rate.
        store_bytes = sum(hi - lo for lo, hi, _ in pieces)
        gaps = _gaps(pieces, start, stop)
        node_chunks = sum(1 for c in span if c.hash not in have)
        fetched = self._from_node(info, gaps, node_chunks) if gaps else []
        with self._lock:
            n = self.counters
            n.reads += 1
            n.chunks_from_stores += len(span) - node_chunks
            n.bytes_from_stores += store_bytes
            n.store_seconds += store_s
            self.store_rate.add(store_bytes, store_s)
            link = self.link_rate.bytes_per_s
            if link:
                n.time_saved_s += store_bytes / link - store_s
        pieces += [(lo, hi, data) for (lo, hi), data in zip(gaps, fetched, strict=True)]
        pieces.sort(key=lambda p: p[0])
        out = b"".join(p[2] for p in pieces)
        if len(out) != stop - start:  # the pieces tile the range: a bug if not
            raise AssertionError(f"lookaside assembled {len(out)} bytes of {stop - start}")
        return out

    def iter_range(
        self, info: ObjectInfo, start: int, stop: int, *, progress: Progress = _no_progress
    ) -> Iterator[bytes]:
        """Bytes ``[start, stop)`` of the version ``info``, in windows of
        :data:`WINDOW_BYTES` (each one store pass and one node batch)."""
        stop = min(stop, info.size)
        for lo in range(start, stop, WINDOW_BYTES):
            data = self.fetch(info, lo, min(lo + WINDOW_BYTES, stop))
            progress(len(data))
            yield data

    # --- stores --------------------------------------------------------------------------

    def _use_stores(self) -> bool:
        """The skip rule: stores unless both rates are known (the stores' after
        :data:`STORE_SAMPLES_MIN` reads) and the link is faster."""
        if not self.stores:
            return False
        with self._lock:
            store, link = self.store_rate.bytes_per_s, self.link_rate.bytes_per_s
            if self.store_rate.samples < STORE_SAMPLES_MIN:
                store = None
            if store is None or link is None or store > link:
                self._since_probe = 0
                return True
            self._since_probe += 1
            if self._since_probe >= PROBE_EVERY:
                self._since_probe = 0
                self.counters.probes += 1
                return True
            self.counters.reads_skipped += 1
            return False

    def _from_stores(self, span: Sequence[Chunk]) -> dict[bytes, bytes]:
        """Verified bytes of as many chunks of ``span`` as the stores hold, by hash."""
        have: dict[bytes, bytes] = {}
        with self._lock:
            for c in span:
                data = self._verified.get(c.hash)
                if data is not None:
                    self._verified.move_to_end(c.hash)
                    have[c.hash] = data
        wanted = {c.hash: c for c in span if c.hash not in have}
        for store in self.stores:
            if not wanted:
                break
            try:
                found = store.lookup(list(wanted))
            except sqlite3.Error as exc:  # a broken index is a miss, not a failed read
                log.warning("lookaside %s: index lookup failed: %s", store.root, exc)
                continue
            for h, loc in found.items():
                chunk = wanted[h]
                if loc.length != chunk.length:
                    continue  # a hash collision of different lengths: impossible, but cheap
                data = store.read(loc)
                if data is None:
                    with self._lock:
                        self.counters.store_misses += 1
                    continue
                if chunk_hash(data) != h:
                    log.warning(
                        "lookaside %s: %s at %d does not match its hash; dropped until re-indexed",
                        store.root,
                        loc.path,
                        loc.offset,
                    )
                    with self._lock:
                        self.counters.verify_failures += 1
                    store.drop(loc)
                    continue
                have[h] = data
                del wanted[h]
                self._remember(h, data)
        return have

    def _remember(self, h: bytes, data: bytes) -> None:
        if len(data) > self._verified_max:
            return
        with self._lock:
            if h in self._verified:
                return
            self._verified[h] = data
            self._verified_bytes += len(data)
            while self._verified_bytes > self._verified_max:
                _, old = self._verified.popitem(last=False)
                self._verified_bytes -= len(old)

    # --- the node ------------------------------------------------------------------------

    def _chunk_list(self, info: ObjectInfo) -> tuple[list[Chunk], list[int]]:
        """The whole chunk list of version ``info`` and its offsets (for bisection)."""
        ident = (info.key, info.version)
        with self._lock:
            kept = self._lists.get(ident)
            if kept is not None:
                self._lists.move_to_end(ident)
                return kept
        chunks = list(info.chunks)
        if not info.chunks_complete or (info.size and not chunks):
            chunks = self._page_chunks(info, chunks)
        entry = (chunks, [c.offset for c in chunks])
        with self._lock:
            self._lists[ident] = entry
            while len(self._lists) > CHUNK_LISTS_KEPT:
                self._lists.popitem(last=False)
        return entry

    def _page_chunks(self, info: ObjectInfo, have: list[Chunk]) -> list[Chunk]:
        out = list(have)
        node = self.client.node_for(info.key)
        start: int | None = len(out)
        while start is not None:
            args = {"key": info.key, "start": start, "expected_version": info.version}
            page = self.client.call(node, "chunks", args).result
            out += [Chunk(o, n, h) for o, n, h in page["chunks"]]
            start = page["next"]
        return out

    def _node_only(self, info: ObjectInfo, start: int, stop: int) -> bytes:
        data = self._from_node(info, [(start, stop)], 0)[0]
        with self._lock:
            self.counters.reads += 1
        return data

    def _from_node(
        self, info: ObjectInfo, ranges: Sequence[tuple[int, int]], chunks: int
    ) -> list[bytes]:
        """The bytes of each of ``ranges`` of version ``info``, all in one pipelined
        batch of requests of at most the client's piece size."""
        piece = self.client.piece_bytes
        calls: list[Call] = []
        owners: list[int] = []
        for i, (lo, hi) in enumerate(ranges):
            for a in range(lo, hi, piece):
                args = {
                    "key": info.key,
                    "offset": a,
                    "length": min(piece, hi - a),
                    "expected_version": info.version,
                }
                calls.append(Call("read", args))
                owners.append(i)
        parts: list[list[bytes]] = [[] for _ in ranges]
        conn = self.client.connection(self.client.node_for(info.key))
        t0 = self.clock()
        for owner, res in zip(
            owners, conn.call_many(calls, window=self.client.window), strict=True
        ):
            parts[owner].append(bytes(res.payload))
        elapsed = self.clock() - t0
        out = [b"".join(p) for p in parts]
        nbytes = sum(len(b) for b in out)
        with self._lock:
            n = self.counters
            n.chunks_from_node += chunks
            n.bytes_from_node += nbytes
            n.node_batches += 1
            n.node_seconds += elapsed
            self.link_rate.add(nbytes, elapsed)
        return out

    # --- counters ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = asdict(self.counters)
            out["store_rate_bytes_per_s"] = self.store_rate.bytes_per_s
            out["link_rate_bytes_per_s"] = self.link_rate.bytes_per_s
        out["stores"] = [str(s.root) for s in self.stores]
        return out


def _gaps(pieces: list[tuple[int, int, bytes]], start: int, stop: int) -> list[tuple[int, int]]:
    """The parts of ``[start, stop)`` that ``pieces`` (sorted, disjoint) do not cover."""
    gaps = []
    pos = start
    for lo, hi, _ in pieces:
        if lo > pos:
            gaps.append((pos, lo))
        pos = max(pos, hi)
    if pos < stop:
        gaps.append((pos, stop))
    return gaps
