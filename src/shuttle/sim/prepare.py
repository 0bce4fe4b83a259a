"""Cutting a background trace into measured intervals, in two passes over it.

A generated background is hours long at about a thousand requests a second -- tens
of millions of records -- so it is never held whole. It is read twice, in pieces of
columns (a :data:`ChunkSource`):

1. count the requests in every aligned window of length T and choose the K busiest
   that have a full warm-up W before them (section 4.1);
2. read the span those intervals need once, and hand each piece to every interval
   it concerns: its warm-up part to that interval's :class:`~shuttle.sim.workload.WarmUp`
   (which keeps only the last access of each block), its timed part (from
   ``start - warmup_timed_s`` to ``end + overrun_s_max``) as columns.

Each interval then gets dense file ids of its own, so block keys are small ints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from shuttle.errors import ConfigError
from shuttle.sim.blocks import BLOCK_BITS
from shuttle.sim.config import ExperimentConfig
from shuttle.sim.workload import (
    I64,
    Columns,
    Interval,
    WarmPiece,
    WarmState,
    WarmUp,
    choose_windows,
    window_counts,
)

#: ``chunks(start_s, end_s)``: the records with ``start_s <= time < end_s`` as column
#: pieces in time order. File ids may be any int64. Trace time starts at 0.
ChunkSource = Callable[[float, float], Iterator[Columns]]

#: ``progress(records, phase)`` after each piece.
Progress = Callable[[int, str], None]


@dataclass(frozen=True, slots=True)
class IntervalData:
    """One measured interval: its background records and its caches after the warm-up."""

    interval: Interval
    #: Records from ``start - warmup_timed_s`` to ``end + overrun_s_max``.
    background: Columns
    warm: WarmState


def columns_source(columns: Columns) -> ChunkSource:
    """A trace already in memory as a chunk source (one piece per request)."""

    def chunks(start_s: float, end_s: float) -> Iterator[Columns]:
        yield columns.window(start_s, end_s)

    return chunks


def prepare_intervals(
    chunks: ChunkSource,
    experiment: ExperimentConfig,
    block_size_bytes: int,
    progress: Progress | None = None,
) -> tuple[list[IntervalData], int]:
    """Both passes: choose the intervals, then warm each one's caches.

    Returns the intervals and the number of records in the whole trace.
    """
    intervals, records = plan_intervals(chunks, experiment, progress)
    return collect_intervals(chunks, intervals, experiment, block_size_bytes, progress), records


def plan_intervals(
    chunks: ChunkSource, experiment: ExperimentConfig, progress: Progress | None = None
) -> tuple[list[Interval], int]:
    """Pass 1: the K busiest intervals of the whole trace, and its number of records."""
    counts = np.zeros(0, dtype=np.int64)
    last_s = 0.0
    records = 0
    for piece in chunks(0.0, math.inf):
        if not len(piece):
            continue
        these = window_counts(piece.time_s, 0.0, experiment.interval_s)
        if len(these) > len(counts):
            counts = np.concatenate([counts, np.zeros(len(these) - len(counts), np.int64)])
        counts[: len(these)] += these
        last_s = float(piece.time_s[-1])
        records += len(piece)
        if progress is not None:
            progress(records, "counting requests per interval")
    if records == 0:
        raise ConfigError("the background trace is empty; nothing to measure")
    chosen = choose_windows(
        counts, 0.0, last_s, experiment.interval_s, experiment.intervals, experiment.warmup_s
    )
    return chosen, records


def collect_intervals(
    chunks: ChunkSource,
    intervals: list[Interval],
    experiment: ExperimentConfig,
    block_size_bytes: int,
    progress: Progress | None = None,
) -> list[IntervalData]:
    """Pass 2: each interval's warmed caches and timed records, from one read of the span."""
    warm_from = [max(0.0, i.start_s - experiment.warmup_s) for i in intervals]
    timed_from = [i.start_s - experiment.warmup_timed_s for i in intervals]
    timed_to = [i.end_s + experiment.overrun_s_max for i in intervals]
    warmups = [WarmUp(block_size_bytes) for _ in intervals]
    timed: list[list[Columns]] = [[] for _ in intervals]
    records = 0
    for piece in chunks(min(warm_from), max(timed_to)):
        records += len(piece)
        # Most pieces lie wholly inside several intervals' warm-ups: reduce them once.
        whole: WarmPiece | None = None
        for k in range(len(intervals)):
            warm_part = piece.window(warm_from[k], timed_from[k])
            if len(warm_part) == len(piece) and len(piece):
                if whole is None:
                    whole = WarmPiece.of(piece, block_size_bytes)
                warmups[k].add_piece(whole)
            elif len(warm_part):
                warmups[k].add(warm_part)
            timed_part = piece.window(timed_from[k], timed_to[k])
            if len(timed_part):
                timed[k].append(timed_part.copy())
        if progress is not None:
            progress(records, "warming the caches")
    return [
        _finish(interval, warmup, timed[k], block_size_bytes)
        for k, (interval, warmup) in enumerate(zip(intervals, warmups, strict=True))
    ]


def _finish(
    interval: Interval, warmup: WarmUp, pieces: list[Columns], block_size_bytes: int
) -> IntervalData:
    files, blocks, metadata = warmup.finish()
    background = Columns.concat(pieces)
    every_file = np.concatenate([files, metadata, background.file])
    unique, dense = np.unique(every_file, return_inverse=True)
    dense = dense.astype(np.int64)
    n_blocks, n_meta = len(files), len(metadata)
    _check_block_numbers(blocks, background, block_size_bytes)
    warm = WarmState(
        blocks_lru_first=(dense[:n_blocks] << BLOCK_BITS) + blocks,
        metadata_files=dense[n_blocks : n_blocks + n_meta],
        records=warmup.records,
    )
    background = background.with_files(dense[n_blocks + n_meta :], len(unique))
    return IntervalData(interval, background, warm)


def _check_block_numbers(blocks: I64, background: Columns, block_size_bytes: int) -> None:
    highest = int(blocks.max()) if len(blocks) else 0
    if len(background):
        first, count = background.block_range(block_size_bytes)
        highest = max(highest, int((first + count).max()))
    if highest >= 1 << BLOCK_BITS:
        raise ConfigError(
            f"a file reaches block {highest}, past the simulator's limit of {1 << BLOCK_BITS} "
            "blocks per file; use a larger server.block_size_bytes"
        )
