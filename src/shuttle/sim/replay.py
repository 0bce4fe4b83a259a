"""Cache replay: run a block or file trace through a cache policy alone.

Every read or write request is split into the blocks it covers (``offset //
block_size`` to ``(offset + size - 1) // block_size``; a zero-byte request still
touches its block), each block is one access, and a write is an access that leaves
the block cached (write-through with allocation, as in the paper's server). Metadata
requests do not touch the block cache and are only counted. A block is named by
one integer, ``file_id << 40 | block`` (files interned in order of appearance), so
policies hash plain ints.

Policies form a registry (:data:`POLICIES`: ``lru``, ``fifo``, ``clock``) with one
shared test suite and hypothesis tests against simple reference models. Each has a
per-access :meth:`CachePolicy.access` (for tests and small uses) and a tight
:meth:`CachePolicy.replay` loop over all accesses (what the command and the
benchmark use); both must give the same hits.

How this compares with libCacheSim (``docs/traces.md`` has the detail): libCacheSim
reads a vSCSI record as *one* request for object ``lbn`` of ``len`` bytes and caches
whole objects against a byte capacity; it does not split requests into blocks.
Shuttle's replay splits. To compare like with like, the tests hand libCacheSim the
very block accesses Shuttle replays (object id = block key, size 1, capacity =
blocks) and require identical hit counts.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from shuttle.errors import ConfigError
from shuttle.traces.record import Op, TraceRecord

#: Bits of a block key that hold the block number (files up to 2**40 blocks).
BLOCK_KEY_BITS = 40

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


class CachePolicy(ABC):
    """A cache of ``capacity_blocks`` blocks keyed by int. Subclasses set ``name``."""

    name: ClassVar[str]
    description: ClassVar[str]

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 1:
            raise ConfigError(f'"size" must be at least 1 block, got {capacity_blocks}')
        self.capacity_blocks = capacity_blocks

    @abstractmethod
    def access(self, key: int) -> bool:
        """Access one block; True on a hit. A miss inserts it (evicting if full)."""

    @abstractmethod
    def replay(self, keys: Sequence[int], reads: Sequence[bool]) -> tuple[int, int]:
        """Access every key in order; return (hits, hits among accesses that are reads)."""

    @abstractmethod
    def contents(self) -> list[int]:
        """The cached blocks, in the policy's eviction order (next victim first)."""

    def __len__(self) -> int:
        return len(self.contents())


POLICIES: dict[str, type[CachePolicy]] = {}


def register(cls: type[CachePolicy]) -> type[CachePolicy]:
    """Class decorator: make a policy available by its ``name``."""
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, capacity_blocks: int) -> CachePolicy:
    """A fresh policy; :class:`ConfigError` lists the known names."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ConfigError(
            f"unknown cache policy {name!r}; expected one of {', '.join(sorted(POLICIES))}"
        ) from None
    return cls(capacity_blocks)


@register
class LRU(CachePolicy):
    """Least recently used: a hit moves the block to the most recently used end."""

    name = "lru"
    description = "least recently used"

    def __init__(self, capacity_blocks: int) -> None:
        super().__init__(capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def access(self, key: int) -> bool:
        blocks = self._blocks
        if key in blocks:
            blocks.move_to_end(key)
            return True
        blocks[key] = None
        if len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        return False

    def replay(self, keys: Sequence[int], reads: Sequence[bool]) -> tuple[int, int]:
        # The loop is the whole cost of a replay: bound methods in locals, a counter
        # instead of len() (about 4 M accesses/s here; see benchmarks/README.md).
        blocks = self._blocks
        touch = blocks.move_to_end
        evict = blocks.popitem
        room = self.capacity_blocks - len(blocks)
        hits = read_hits = 0
        for key, read in zip(keys, reads, strict=True):
            if key in blocks:
                touch(key)
                hits += 1
                if read:
                    read_hits += 1
            else:
                blocks[key] = None
                if room > 0:
                    room -= 1
                else:
                    evict(False)
        return hits, read_hits

    def contents(self) -> list[int]:
        return list(self._blocks)


@register
class FIFO(CachePolicy):
    """First in, first out: hits do not change the eviction order."""

    name = "fifo"
    description = "first in, first out"

    def __init__(self, capacity_blocks: int) -> None:
        super().__init__(capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def access(self, key: int) -> bool:
        blocks = self._blocks
        if key in blocks:
            return True
        blocks[key] = None
        if len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
        return False

    def replay(self, keys: Sequence[int], reads: Sequence[bool]) -> tuple[int, int]:
        blocks = self._blocks
        evict = blocks.popitem
        room = self.capacity_blocks - len(blocks)
        hits = read_hits = 0
        for key, read in zip(keys, reads, strict=True):
            if key in blocks:
                hits += 1
                if read:
                    read_hits += 1
            else:
                blocks[key] = None
                if room > 0:
                    room -= 1
                else:
                    evict(False)
        return hits, read_hits

    def contents(self) -> list[int]:
        return list(self._blocks)


@register
class Clock(CachePolicy):
    """CLOCK (second chance): a hit sets the block's reference bit; the hand clears
    set bits as it passes and evicts the first block whose bit is clear. A block
    enters with its bit clear (libCacheSim's ``Clock`` with its defaults)."""

    name = "clock"
    description = "CLOCK / second chance, one reference bit"

    def __init__(self, capacity_blocks: int) -> None:
        super().__init__(capacity_blocks)
        self._slot: dict[int, int] = {}
        self._keys: list[int] = []
        self._ref = bytearray(capacity_blocks)
        self._hand = 0

    def access(self, key: int) -> bool:
        hits, _ = self.replay((key,), (False,))
        return hits == 1

    def replay(self, keys: Sequence[int], reads: Sequence[bool]) -> tuple[int, int]:
        slot, ring, ref = self._slot, self._keys, self._ref
        cap = self.capacity_blocks
        hand = self._hand
        hits = read_hits = 0
        for key, read in zip(keys, reads, strict=True):
            at = slot.get(key)
            if at is not None:
                ref[at] = 1
                hits += 1
                if read:
                    read_hits += 1
            elif len(ring) < cap:
                slot[key] = len(ring)
                ring.append(key)
            else:
                while ref[hand]:
                    ref[hand] = 0
                    hand = hand + 1 if hand + 1 < cap else 0
                del slot[ring[hand]]
                ring[hand] = key
                slot[key] = hand
                hand = hand + 1 if hand + 1 < cap else 0
        self._hand = hand
        return hits, read_hits

    def contents(self) -> list[int]:
        ring = self._keys
        if len(ring) < self.capacity_blocks:
            return list(ring)
        return ring[self._hand :] + ring[: self._hand]


# --- from records to block accesses --------------------------------------------------


@dataclass(frozen=True)
class BlockAccesses:
    """A trace's block accesses in order: keys, whether each is a read, and counts."""

    keys: I64
    reads: B
    requests: int
    read_requests: int
    write_requests: int
    metadata_requests: int
    files: int


def block_accesses(records: Iterable[TraceRecord], block_size_bytes: int) -> BlockAccesses:
    """Split every read and write of ``records`` into the blocks it covers."""
    if block_size_bytes < 1:
        raise ConfigError(f'"block_size" must be at least 1 byte, got {block_size_bytes}')
    files: dict[str, int] = {}
    file_ids: list[int] = []
    offsets: list[int] = []
    sizes: list[int] = []
    is_read: list[bool] = []
    metadata = 0
    read_op, write_op = Op.READ, Op.WRITE
    for r in records:
        op = r.op
        if op is read_op or op is write_op:
            fid = files.get(r.file)
            if fid is None:
                fid = files[r.file] = len(files)
            file_ids.append(fid)
            offsets.append(r.offset)
            sizes.append(r.size)
            is_read.append(op is read_op)
        else:
            metadata += 1
    fid_a = np.asarray(file_ids, dtype=np.int64)
    off_a = np.asarray(offsets, dtype=np.int64)
    size_a = np.asarray(sizes, dtype=np.int64)
    read_a = np.asarray(is_read, dtype=np.bool_)
    first = off_a // block_size_bytes
    count = (off_a + np.maximum(size_a, 1) - 1) // block_size_bytes - first + 1
    if len(first) and int(first.max() + count.max()) >= 1 << BLOCK_KEY_BITS:
        raise ConfigError(
            f"a request reaches block 2**{BLOCK_KEY_BITS} or beyond; use a larger block size"
        )
    base = (fid_a << BLOCK_KEY_BITS) + first
    total = int(count.sum())
    if total == len(base):
        keys = base
    else:  # expand multi-block requests: base, base + 1, ... within each request
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        keys = np.repeat(base, count) + within
    n_reads = int(read_a.sum())
    return BlockAccesses(
        keys=keys,
        reads=np.repeat(read_a, count),
        requests=len(base),
        read_requests=n_reads,
        write_requests=len(base) - n_reads,
        metadata_requests=metadata,
        files=len(files),
    )


@dataclass(frozen=True)
class ReplayResult:
    """Counters of one replay. Ratios are hits / accesses (0 when there are none)."""

    policy: str
    size_blocks: int
    block_size_bytes: int
    requests: int
    metadata_requests: int
    accesses: int
    hits: int
    read_accesses: int
    read_hits: int
    write_accesses: int
    write_hits: int
    elapsed_s: float

    @property
    def misses(self) -> int:
        return self.accesses - self.hits

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.accesses if self.accesses else 0.0

    @property
    def read_hit_ratio(self) -> float:
        return self.read_hits / self.read_accesses if self.read_accesses else 0.0

    @property
    def accesses_per_s(self) -> float:
        """Block accesses replayed per second of the policy loop."""
        return self.accesses / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "size_blocks": self.size_blocks,
            "block_size_bytes": self.block_size_bytes,
            "requests": self.requests,
            "metadata_requests": self.metadata_requests,
            "accesses": self.accesses,
            "hits": self.hits,
            "misses": self.misses,
            "hit_ratio": self.hit_ratio,
            "read_accesses": self.read_accesses,
            "read_hits": self.read_hits,
            "read_hit_ratio": self.read_hit_ratio,
            "write_accesses": self.write_accesses,
            "write_hits": self.write_hits,
            "elapsed_s": self.elapsed_s,
            "accesses_per_s": self.accesses_per_s,
        }


def replay_accesses(
    accesses: BlockAccesses, policy: str, size_blocks: int, block_size_bytes: int
) -> ReplayResult:
    """Replay already split accesses through a fresh ``policy`` cache."""
    cache = make_policy(policy, size_blocks)
    keys = accesses.keys.tolist()
    reads = accesses.reads.tolist()
    start = time.perf_counter()
    hits, read_hits = cache.replay(keys, reads)
    elapsed = time.perf_counter() - start
    n_reads = int(accesses.reads.sum())
    return ReplayResult(
        policy=policy,
        size_blocks=size_blocks,
        block_size_bytes=block_size_bytes,
        requests=accesses.requests,
        metadata_requests=accesses.metadata_requests,
        accesses=len(keys),
        hits=hits,
        read_accesses=n_reads,
        read_hits=read_hits,
        write_accesses=len(keys) - n_reads,
        write_hits=hits - read_hits,
        elapsed_s=elapsed,
    )


def replay(
    records: Iterable[TraceRecord], policy: str, size_blocks: int, block_size_bytes: int
) -> ReplayResult:
    """Split ``records`` into block accesses and replay them through ``policy``."""
    make_policy(policy, size_blocks)  # fail fast on a bad name or size
    return replay_accesses(
        block_accesses(records, block_size_bytes), policy, size_blocks, block_size_bytes
    )


# --- libCacheSim on the same accesses -------------------------------------------------

#: libCacheSim's binary "oracleGeneral" request layout: time, object id, size, next
#: access (unused here, -1).
ORACLE_GENERAL = np.dtype([("time", "<u4"), ("obj_id", "<u8"), ("size", "<u4"), ("next", "<i8")])
#: libCacheSim class for each of our policies (same eviction rules, checked by tests).
LIBCACHESIM_POLICIES = {"lru": "LRU", "fifo": "FIFO", "clock": "Clock"}


@dataclass(frozen=True)
class LibCacheSimResult:
    """libCacheSim's misses on the same block accesses, and its speed."""

    policy: str
    size_blocks: int
    accesses: int
    misses: int
    miss_ratio: float
    elapsed_s: float

    @property
    def hit_ratio(self) -> float:
        return 1.0 - self.miss_ratio

    @property
    def accesses_per_s(self) -> float:
        return self.accesses / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "size_blocks": self.size_blocks,
            "accesses": self.accesses,
            "misses": self.misses,
            "miss_ratio": self.miss_ratio,
            "hit_ratio": self.hit_ratio,
            "elapsed_s": self.elapsed_s,
            "accesses_per_s": self.accesses_per_s,
        }


def write_oracle_general(accesses: BlockAccesses, path: str) -> None:
    """Write the block accesses as a libCacheSim oracleGeneral trace (size 1 each)."""
    rows = np.zeros(len(accesses.keys), ORACLE_GENERAL)
    rows["obj_id"] = accesses.keys
    rows["size"] = 1
    rows["next"] = -1
    rows.tofile(path)


def libcachesim_replay(
    trace_path: str, accesses: int, policy: str, size_blocks: int
) -> LibCacheSimResult:
    """Run libCacheSim's own reader and cache over an oracleGeneral trace of blocks.

    Each block access is an object of size 1 and the cache holds ``size_blocks``
    bytes, i.e. that many blocks: exactly the cache :func:`replay_accesses` models.
    Raises :class:`ConfigError` if libcachesim (a dev dependency) is not installed.
    """
    try:
        import libcachesim as lcs
    except ImportError as exc:
        raise ConfigError(
            "the libCacheSim comparison needs the libcachesim package (a dev dependency: "
            "scripts/setup.sh --dev)"
        ) from exc
    if policy not in LIBCACHESIM_POLICIES:
        raise ConfigError(
            f"no libCacheSim counterpart for {policy!r}; one of {', '.join(LIBCACHESIM_POLICIES)}"
        )
    reader = lcs.TraceReader(trace_path, lcs.TraceType.ORACLE_GENERAL_TRACE)
    # A hash table sized to the cache (libCacheSim grows it if needed): the default
    # 2**24 buckets cost 128 MB to clear and thrash the CPU caches at small sizes.
    hashpower = min(max(math.ceil(math.log2(size_blocks + 1)) + 1, 12), 24)
    cache = getattr(lcs, LIBCACHESIM_POLICIES[policy])(size_blocks, hashpower=hashpower)
    start = time.perf_counter()
    miss_ratio, _byte_miss_ratio = cache.process_trace(reader)
    elapsed = time.perf_counter() - start
    return LibCacheSimResult(
        policy=policy,
        size_blocks=size_blocks,
        accesses=accesses,
        misses=round(miss_ratio * accesses),
        miss_ratio=miss_ratio,
        elapsed_s=elapsed,
    )


def compare_sizes(
    accesses: BlockAccesses,
    policy: str,
    sizes: Sequence[int],
    block_size_bytes: int,
    *,
    libcachesim: bool = False,
    repeat: int = 1,
) -> list[dict[str, Any]]:
    """Replay ``accesses`` at every size (best time of ``repeat``), optionally beside
    libCacheSim on the same accesses. One JSON-ready row per size."""
    import os
    import tempfile

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="shuttle-replay-") as tmp:
        trace_path = os.path.join(tmp, "blocks.oracleGeneral")
        if libcachesim:
            write_oracle_general(accesses, trace_path)
        for size in sizes:
            ours = min(
                (replay_accesses(accesses, policy, size, block_size_bytes) for _ in range(repeat)),
                key=lambda r: r.elapsed_s,
            )
            row: dict[str, Any] = {"shuttle": ours.to_dict()}
            if libcachesim:
                theirs = min(
                    (
                        libcachesim_replay(trace_path, len(accesses.keys), policy, size)
                        for _ in range(repeat)
                    ),
                    key=lambda r: r.elapsed_s,
                )
                row["libcachesim"] = theirs.to_dict()
                row["same_hits"] = theirs.misses == ours.misses
                row["ratio_vs_libcachesim"] = (
                    ours.accesses_per_s / theirs.accesses_per_s if theirs.accesses_per_s else 0.0
                )
            rows.append(row)
    return rows
