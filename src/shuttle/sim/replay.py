"""Cache replay: run a block or file trace through a cache policy alone.

Every read or write request is split into the blocks it covers (``offset //
block_size`` to ``(offset + size - 1) // block_size``; a zero-byte request still
touches its block), each block is one access, and a write is an access that leaves
the block cached (write-through with allocation, as in the paper's server). Metadata
requests do not touch the block cache and are only counted. A block is named by
one integer, :func:`shuttle.sim.blocks.block_key` (files interned in order of
appearance), so policies hash plain ints.

Policies form a registry (:mod:`shuttle.sim.policies`: ``lru``, ``fifo``, ``clock``)
with one shared test suite; replay uses their tight :meth:`CachePolicy.replay`
loop.

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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shuttle.errors import ConfigError
from shuttle.sim.blocks import block_accesses, block_keys

# Re-exported: the policies lived here before they had a module of their own.
from shuttle.sim.policies import FIFO, LRU, POLICIES, CachePolicy, Clock, make_policy, register
from shuttle.traces.record import Op, TraceRecord

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


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


def split_accesses(records: Iterable[TraceRecord], block_size_bytes: int) -> BlockAccesses:
    """Split every read and write of ``records`` into the blocks it covers
    (:func:`shuttle.sim.blocks.block_accesses`); metadata requests are only counted."""
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
    read_a = np.asarray(is_read, dtype=np.bool_)
    request, file, block = block_accesses(
        np.asarray(file_ids, dtype=np.int64),
        np.asarray(offsets, dtype=np.int64),
        np.asarray(sizes, dtype=np.int64),
        block_size_bytes,
    )
    n_reads = int(read_a.sum())
    return BlockAccesses(
        keys=block_keys(file, block),
        reads=read_a[request],
        requests=len(read_a),
        read_requests=n_reads,
        write_requests=len(read_a) - n_reads,
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
        split_accesses(records, block_size_bytes), policy, size_blocks, block_size_bytes
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


__all__ = [
    "FIFO",
    "LIBCACHESIM_POLICIES",
    "LRU",
    "POLICIES",
    "BlockAccesses",
    "CachePolicy",
    "Clock",
    "LibCacheSimResult",
    "ReplayResult",
    "compare_sizes",
    "libcachesim_replay",
    "make_policy",
    "register",
    "replay",
    "replay_accesses",
    "split_accesses",
    "write_oracle_general",
]
