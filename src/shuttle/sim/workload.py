"""Traces as the simulator reads them: columns, request kinds, blocks, and intervals.

A trace of :class:`~shuttle.traces.record.TraceRecord` is turned once into numpy
columns (:class:`Columns`); every run then slices and converts the part it needs.
File names are interned to small integers; a block is named by one integer,
``file << 32 | block number``, so the caches hash plain ints.

The mobile application and the background share no files (the paper's assumption),
so the mobile trace's file ids live in their own range (:data:`MOBILE_FILE_BASE`).

Interval selection (section 4.1): the trace is cut into aligned windows of length T;
the K windows with the most requests that have a full warm-up W before them are
measured. The warm-up is replayed through the caches alone
(:func:`warm_cache_contents`): LRU contents depend only on the order of accesses, so
one pass gives the contents of a cache of every size at once (the LRU stack
property) -- the C most recently used blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shuttle.errors import ConfigError
from shuttle.traces.record import Op, TraceRecord

# Request kinds as the server sees them, cheapest first. The order matters: kinds
# below BLOCK_READ are metadata requests.
META_READ = 0
META_WRITE = 1
BLOCK_READ = 2
BLOCK_WRITE = 3
KIND_NAMES = ("metadata read", "metadata write", "block read", "block write")

#: Blocks per file id: a block key is ``file << BLOCK_BITS | block``.
BLOCK_BITS = 32
#: Mobile-application file ids start here, far above any background file id.
MOBILE_FILE_BASE = 1 << 28

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]


def kind_of(op: Op) -> int:
    """The server request kind of a trace operation."""
    if op.is_block:
        return BLOCK_WRITE if op.is_write else BLOCK_READ
    return META_WRITE if op.is_write else META_READ


_KIND_BY_OP = {op: kind_of(op) for op in Op}


@dataclass(frozen=True, slots=True)
class Columns:
    """A trace in columns, in time order. ``file`` ids are interned (0, 1, 2, ...)."""

    time_s: F64
    client: I64
    kind: I8
    file: I64
    offset: I64
    size: I64
    file_count: int

    def __len__(self) -> int:
        return len(self.time_s)

    @classmethod
    def from_records(cls, records: Iterable[TraceRecord]) -> Columns:
        """Collect ``records`` (must be in time order) into columns.

        Raises :class:`~shuttle.errors.ConfigError` if the times go backwards.
        """
        times: list[float] = []
        clients: list[int] = []
        kinds: list[int] = []
        files: list[int] = []
        offsets: list[int] = []
        sizes: list[int] = []
        ids: dict[str, int] = {}
        kind_by_op = _KIND_BY_OP
        for record in records:
            times.append(record.time)
            clients.append(record.client)
            kinds.append(kind_by_op[record.op])
            file_id = ids.get(record.file)
            if file_id is None:
                file_id = ids[record.file] = len(ids)
            files.append(file_id)
            offsets.append(record.offset)
            sizes.append(record.size)
        time_s = np.asarray(times, dtype=np.float64)
        if len(time_s) > 1 and bool(np.any(np.diff(time_s) < 0)):
            at = int(np.argmax(np.diff(time_s) < 0)) + 1
            raise ConfigError(
                f"trace is not in time order: record {at} is at {times[at]} s after "
                f"{times[at - 1]} s; sort it by time first"
            )
        return cls(
            time_s=time_s,
            client=np.asarray(clients, dtype=np.int64),
            kind=np.asarray(kinds, dtype=np.int8),
            file=np.asarray(files, dtype=np.int64),
            offset=np.asarray(offsets, dtype=np.int64),
            size=np.asarray(sizes, dtype=np.int64),
            file_count=len(ids),
        )

    def window(self, start_s: float, end_s: float) -> Columns:
        """The records with ``start_s <= time < end_s`` (a view, no copy)."""
        lo, hi = np.searchsorted(self.time_s, [start_s, end_s], side="left")
        return Columns(
            self.time_s[lo:hi],
            self.client[lo:hi],
            self.kind[lo:hi],
            self.file[lo:hi],
            self.offset[lo:hi],
            self.size[lo:hi],
            self.file_count,
        )

    def block_range(self, block_size_bytes: int) -> tuple[I64, I64]:
        """First block and block count of every record (sizes rounded up, >= 1 block)."""
        first = self.offset // block_size_bytes
        last = (self.offset + np.maximum(self.size, 1) - 1) // block_size_bytes
        return first, last - first + 1


# --- the measured intervals ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interval:
    """One measured interval: its start, end, and how many requests it holds."""

    index: int
    start_s: float
    end_s: float
    requests: int


def busiest_intervals(
    time_s: F64, interval_s: float, count: int, warmup_s: float
) -> list[Interval]:
    """The ``count`` aligned windows of ``interval_s`` with the most requests.

    Windows are aligned to the trace's first record; only whole windows with a full
    ``warmup_s`` of trace before them qualify. Ties go to the earlier window. The
    result is in time order. Raises :class:`~shuttle.errors.ConfigError` if the
    trace is too short to hold ``count`` such windows.
    """
    if len(time_s) == 0:
        raise ConfigError("the background trace is empty; nothing to measure")
    origin = float(time_s[0])
    span = float(time_s[-1]) - origin
    windows = int(span // interval_s)
    first = int(np.ceil(warmup_s / interval_s - 1e-9))
    if windows - first < count:
        raise ConfigError(
            f"the background trace spans {span:.0f} s: too short for {count} intervals of "
            f"{interval_s:g} s after a {warmup_s:g} s warm-up (needs at least "
            f"{warmup_s + count * interval_s:.0f} s); generate a longer trace or lower "
            "experiment.intervals / experiment.warmup_s"
        )
    bins = ((time_s - origin) // interval_s).astype(np.int64)
    counts = np.bincount(bins, minlength=windows + 1)[:windows]
    eligible = np.arange(first, windows)
    # Stable sort on -count keeps earlier windows first among equals.
    order = eligible[np.argsort(-counts[eligible], kind="stable")][:count]
    chosen = sorted(int(w) for w in order)
    return [
        Interval(
            index=i,
            start_s=origin + w * interval_s,
            end_s=origin + (w + 1) * interval_s,
            requests=int(counts[w]),
        )
        for i, w in enumerate(chosen)
    ]


# --- the warm-up --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WarmState:
    """Cache contents after a warm-up: blocks from least to most recently used."""

    blocks_lru_first: I64
    metadata_files: I64
    records: int

    def blocks_for(self, capacity_blocks: int | None) -> list[int]:
        """Contents of an LRU cache of ``capacity_blocks`` (None: infinite), LRU first."""
        blocks = self.blocks_lru_first
        if capacity_blocks is not None and capacity_blocks < len(blocks):
            blocks = blocks[len(blocks) - capacity_blocks :]
        return blocks.tolist()  # type: ignore[no-any-return]


def block_keys(columns: Columns, block_size_bytes: int, file_base: int = 0) -> I64:
    """Every block access of the block requests in ``columns``, in order, as keys."""
    is_block = columns.kind >= BLOCK_READ
    first, count = columns.block_range(block_size_bytes)
    first, count = first[is_block], count[is_block]
    files = columns.file[is_block] + file_base
    base = (files << BLOCK_BITS) + first
    total = int(count.sum())
    if total == len(base):
        return base
    # Expand multi-block requests: base repeated, plus 0, 1, ... within each request.
    starts = np.repeat(base, count)
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    return starts + offsets


def warm_cache_contents(columns: Columns, block_size_bytes: int) -> WarmState:
    """Replay ``columns`` through an LRU block cache and an infinite metadata cache.

    Writes allocate (write-through with allocation), so every block access moves the
    block to the most recently used end. Returns the blocks ordered by their last
    access (the LRU stack) and the files the metadata cache holds.
    """
    keys = block_keys(columns, block_size_bytes)
    if len(keys):
        reversed_keys = keys[::-1]
        unique, first_in_reversed = np.unique(reversed_keys, return_index=True)
        last_access = len(keys) - 1 - first_in_reversed
        blocks = unique[np.argsort(last_access, kind="stable")]
    else:
        blocks = np.empty(0, dtype=np.int64)
    meta = columns.kind < BLOCK_READ
    files = np.unique(columns.file[meta])
    return WarmState(blocks_lru_first=blocks, metadata_files=files, records=len(columns))
