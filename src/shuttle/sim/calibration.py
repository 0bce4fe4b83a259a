"""How loaded a background workload keeps the simulated server (a back-of-envelope check).

For the measured intervals the simulator would pick (the busiest windows with a full
warm-up before them, :func:`shuttle.sim.workload.busiest_intervals`) this computes,
from the server's own cost parameters (:class:`shuttle.sim.config.ServerConfig`):

* CPU utilisation = Σ cycles of the interval's requests / (reference Hz × speed) /
  interval length, at full and at half server speed;
* disk utilisation = (metadata misses + metadata writes + block read misses + block
  writes, each one block) × the disk's time per block / interval length, using an
  LRU block cache of ``cache_blocks`` and an infinite metadata cache, both warmed
  by the warm-up before the interval;
* the block and metadata hit ratios.

It ignores queueing and the mobile application, so it says whether the paper's
regime is *reachable* (CPU busy but not saturated at speed 1.0, saturated at 0.5
once the mobile application adds its work; disk not saturated at the default cache)
— the simulator then measures it. ``shuttle trace calibrate-background`` prints it
(:mod:`shuttle.sim.calibrate_cli`). It lives in ``sim`` because it applies the
simulator's cost model; the trace package below it knows nothing of the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shuttle.sim.config import ServerConfig
from shuttle.sim.replay import LRU
from shuttle.sim.workload import busiest_intervals
from shuttle.traces.background import OPS, BackgroundConfig, generate_columns

_IS_META = np.array([op.is_metadata for op in OPS])
_IS_WRITE = np.array([op.is_write for op in OPS])


@dataclass(frozen=True)
class IntervalLoad:
    """Estimated load of one measured interval."""

    start_s: float
    requests: int
    rate_per_s: float
    metadata_fraction: float
    cpu_utilisation: float
    cpu_utilisation_half_speed: float
    disk_utilisation: float
    block_hit_ratio: float
    metadata_hit_ratio: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def background_load(
    config: BackgroundConfig,
    seed: int = 0,
    server: ServerConfig | None = None,
    intervals: int = 6,
    interval_s: float = 180.0,
    warmup_s: float = 3 * 3600.0,
) -> list[IntervalLoad]:
    """Estimate CPU and disk load of the ``intervals`` busiest intervals of the trace."""
    srv = server or ServerConfig()
    times = np.concatenate([c.time_s for c in generate_columns(config, seed)])
    chosen = busiest_intervals(times, interval_s, intervals, warmup_s)
    del times
    lo_s = min(i.start_s for i in chosen) - warmup_s
    hi_s = max(i.end_s for i in chosen)
    chunks = list(generate_columns(config, seed, lo_s, hi_s))
    t = np.concatenate([c.time_s for c in chunks])
    op = np.concatenate([c.op for c in chunks])
    file = np.concatenate([c.file for c in chunks])
    offset = np.concatenate([c.offset for c in chunks])
    del chunks
    meta = _IS_META[op]
    write = _IS_WRITE[op]
    cycles = np.where(
        meta,
        np.where(write, srv.metadata_write_cycles, srv.metadata_read_cycles),
        np.where(write, srv.block_write_cycles, srv.block_read_cycles),
    )
    block_key = (file << 32) + offset // srv.block_size_bytes
    disk_s_per_block = srv.disk_s(srv.block_size_bytes)
    out = []
    for interval in chosen:
        w0, a, b = np.searchsorted(
            t, [interval.start_s - warmup_s, interval.start_s, interval.end_s]
        )
        # Warm LRU contents: the cache_blocks most recently used blocks (stack property).
        warm_keys = block_key[w0:a][~meta[w0:a]]
        reversed_unique, first = np.unique(warm_keys[::-1], return_index=True)
        recency = np.argsort(first)[: srv.cache_blocks][::-1]  # LRU first
        cache = LRU(srv.cache_blocks)
        cache.replay(reversed_unique[recency].tolist(), [False] * len(recency))
        blocks = ~meta[a:b]
        keys = block_key[a:b][blocks].tolist()
        reads = (~write[a:b][blocks]).tolist()
        hits, read_hits = cache.replay(keys, reads)
        read_misses = sum(reads) - read_hits
        block_writes = len(keys) - sum(reads)
        # Metadata: an infinite cache warmed by the warm-up; a miss is a first touch.
        meta_files = file[a:b][meta[a:b]]
        seen = np.isin(meta_files, np.unique(file[w0:a][meta[w0:a]]))
        misses = len(np.unique(meta_files[~seen]))
        meta_writes = int((meta[a:b] & write[a:b]).sum()) if srv.metadata_write_through else 0
        disk_ops = misses + meta_writes + read_misses + block_writes
        n = int(b - a)
        cpu_s = float(cycles[a:b].sum()) / srv.cpu_reference_hz
        out.append(
            IntervalLoad(
                start_s=interval.start_s,
                requests=n,
                rate_per_s=n / interval_s,
                metadata_fraction=float(meta[a:b].mean()) if n else 0.0,
                cpu_utilisation=cpu_s / interval_s,
                cpu_utilisation_half_speed=cpu_s / 0.5 / interval_s,
                disk_utilisation=disk_ops * disk_s_per_block / interval_s,
                block_hit_ratio=hits / len(keys) if keys else 0.0,
                metadata_hit_ratio=1.0 - misses / len(meta_files) if len(meta_files) else 1.0,
            )
        )
    return out
