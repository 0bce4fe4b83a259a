"""Traces as the simulator reads them: columns, request kinds, blocks, and intervals.

A trace of :class:`~shuttle.traces.record.TraceRecord` is turned once into numpy
columns (:class:`Columns`); every run then slices and converts the part it needs.
File names are interned to small integers; a block is named by one integer,
``file << 32 | block number``, so the caches hash plain ints.

The mobile application and the background share no files (the paper's assumption),
so the mobile trace's file ids live in their own range (:data:`MOBILE_FILE_BASE`).

Interval selection (section 4.1): the trace is cut into aligned windows of length T;
the K windows with the most requests that have a full warm-up W before them are
measured. The warm-up is replayed through the caches alone (:class:`WarmUp`): LRU
contents depend only on the order of accesses, so one pass gives the contents of a
cache of every size at once (the LRU stack property) -- the C most recently used
blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from shuttle.errors import ConfigError
from shuttle.sim.blocks import BLOCK_BITS, block_span
from shuttle.sim.blocks import block_accesses as split_blocks
from shuttle.traces.record import Op, TraceRecord

# Request kinds as the server sees them, cheapest first. The order matters: kinds
# below BLOCK_READ are metadata requests.
META_READ = 0
META_WRITE = 1
BLOCK_READ = 2
BLOCK_WRITE = 3
#: A mobile object's own boundary (a trace of one object, ``shuttle trace
#: record-object``): the console's call to the object and the object's answer. They
#: never reach the server's CPU or caches; only the mobile application replays them
#: (:mod:`shuttle.sim.mobile`), and a background may not hold them.
CALL = 4
RETURN = 5
KIND_NAMES = (
    "metadata read",
    "metadata write",
    "block read",
    "block write",
    "console call",
    "object return",
)

#: Mobile-application file ids start here, far above any background file id.
MOBILE_FILE_BASE = 1 << 28

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]


def kind_of(op: Op) -> int:
    """The server request kind of a trace operation."""
    if op.is_console:
        return CALL if op is Op.CALL else RETURN
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

    @classmethod
    def concat(cls, pieces: list[Columns]) -> Columns:
        """The pieces one after another (their file ids must share one numbering)."""
        if not pieces:
            return cls.from_records([])
        if len(pieces) == 1:
            return pieces[0]
        return cls(
            time_s=np.concatenate([p.time_s for p in pieces]),
            client=np.concatenate([p.client for p in pieces]),
            kind=np.concatenate([p.kind for p in pieces]),
            file=np.concatenate([p.file for p in pieces]),
            offset=np.concatenate([p.offset for p in pieces]),
            size=np.concatenate([p.size for p in pieces]),
            file_count=max(p.file_count for p in pieces),
        )

    def copy(self) -> Columns:
        """A copy that does not keep a larger parent array alive."""
        return Columns(
            self.time_s.copy(),
            self.client.copy(),
            self.kind.copy(),
            self.file.copy(),
            self.offset.copy(),
            self.size.copy(),
            self.file_count,
        )

    def with_files(self, file: I64, file_count: int) -> Columns:
        """The same records with their files renumbered."""
        return Columns(
            self.time_s, self.client, self.kind, file, self.offset, self.size, file_count
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
        return block_span(self.offset, self.size, block_size_bytes)


# --- the measured intervals ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interval:
    """One measured interval: its start, end, and how many requests it holds."""

    index: int
    start_s: float
    end_s: float
    requests: int


def window_counts(time_s: F64, origin_s: float, interval_s: float) -> I64:
    """Requests per aligned window ``[origin + k T, origin + (k+1) T)`` (k = 0, 1, ...)."""
    if len(time_s) == 0:
        return np.zeros(0, dtype=np.int64)
    bins = ((time_s - origin_s) // interval_s).astype(np.int64)
    counts: I64 = np.bincount(bins).astype(np.int64)
    return counts


def choose_windows(
    counts: I64,
    origin_s: float,
    span_s: float,
    interval_s: float,
    count: int,
    warmup_s: float,
) -> list[Interval]:
    """The ``count`` windows with the most requests among those that qualify.

    A window qualifies if it lies wholly inside the trace's ``span_s`` and has a full
    ``warmup_s`` of trace before it. Ties go to the earlier window; the result is in
    time order. Raises :class:`~shuttle.errors.ConfigError` if too few qualify.
    """
    windows = min(int(span_s // interval_s), len(counts))
    first = int(np.ceil(warmup_s / interval_s - 1e-9))
    if windows - first < count:
        raise ConfigError(
            f"the background trace spans {span_s:.0f} s: too short for {count} intervals of "
            f"{interval_s:g} s after a {warmup_s:g} s warm-up (needs at least "
            f"{warmup_s + count * interval_s:.0f} s); generate a longer trace or lower "
            "experiment.intervals / experiment.warmup_s"
        )
    eligible = np.arange(first, windows)
    # Stable sort on -count keeps earlier windows first among equals.
    order = eligible[np.argsort(-counts[eligible], kind="stable")][:count]
    return [
        Interval(
            index=i,
            start_s=origin_s + w * interval_s,
            end_s=origin_s + (w + 1) * interval_s,
            requests=int(counts[w]),
        )
        for i, w in enumerate(sorted(int(w) for w in order))
    ]


def busiest_intervals(
    time_s: F64, interval_s: float, count: int, warmup_s: float
) -> list[Interval]:
    """The ``count`` windows of ``interval_s`` with the most requests (section 4.1).

    Windows are aligned to the trace's first record; see :func:`choose_windows`.
    """
    if len(time_s) == 0:
        raise ConfigError("the background trace is empty; nothing to measure")
    origin = float(time_s[0])
    span = float(time_s[-1]) - origin
    counts = window_counts(time_s, origin, interval_s)
    return choose_windows(counts, origin, span, interval_s, count, warmup_s)


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
    files, blocks = block_accesses(columns, block_size_bytes)
    return ((files + file_base) << BLOCK_BITS) + blocks


def block_accesses(columns: Columns, block_size_bytes: int) -> tuple[I64, I64]:
    """(file, block number) of every block access, in order (multi-block requests expanded)."""
    is_block = (columns.kind == BLOCK_READ) | (columns.kind == BLOCK_WRITE)
    _, files, blocks = split_blocks(
        columns.file[is_block], columns.offset[is_block], columns.size[is_block], block_size_bytes
    )
    return files, blocks


@dataclass(frozen=True, slots=True)
class WarmPiece:
    """A piece of trace reduced to what a warm-up needs: its distinct blocks with the
    position of their last access in the piece, and its distinct metadata files."""

    files: I64
    blocks: I64
    last: I64
    accesses: int
    metadata: I64
    records: int

    @classmethod
    def of(cls, columns: Columns, block_size_bytes: int) -> WarmPiece:
        files, blocks = block_accesses(columns, block_size_bytes)
        accesses = len(files)
        files, blocks, last = _last_per_block(files, blocks, np.arange(accesses, dtype=np.int64))
        metadata = np.unique(columns.file[columns.kind < BLOCK_READ])
        return cls(files, blocks, last, accesses, metadata, len(columns))


class WarmUp:
    """Replays trace pieces through an LRU block cache and an infinite metadata cache.

    Only the order of accesses matters to LRU contents, so instead of a cache this
    keeps, per block, the sequence number of its last access; :meth:`finish` sorts by
    it (the LRU stack). Each piece is reduced to its distinct blocks as it comes, so
    hours of trace fit in little memory. Writes allocate (write-through with
    allocation): every block access moves its block to the most recently used end.
    File ids may be any int64 (they are not packed into keys here).
    """

    def __init__(self, block_size_bytes: int) -> None:
        self.block_size_bytes = block_size_bytes
        self.records = 0
        self._accesses = 0
        self._files: list[I64] = []
        self._blocks: list[I64] = []
        self._last: list[I64] = []
        self._metadata: list[I64] = []

    def add(self, columns: Columns) -> None:
        """Replay the next piece of the trace (pieces must come in time order)."""
        self.add_piece(WarmPiece.of(columns, self.block_size_bytes))

    def add_piece(self, piece: WarmPiece) -> None:
        """Replay a piece already reduced (several warm-ups can share one reduction)."""
        self.records += piece.records
        self._files.append(piece.files)
        self._blocks.append(piece.blocks)
        self._last.append(piece.last + self._accesses)
        self._accesses += piece.accesses
        self._metadata.append(piece.metadata)

    def finish(self) -> tuple[I64, I64, I64]:
        """(files, blocks) from least to most recently used, and the metadata files."""
        empty = np.empty(0, dtype=np.int64)
        files, blocks, last = _last_per_block(
            np.concatenate(self._files or [empty]),
            np.concatenate(self._blocks or [empty]),
            np.concatenate(self._last or [empty]),
        )
        order = np.argsort(last, kind="stable")
        metadata = np.unique(np.concatenate(self._metadata or [empty]))
        return files[order], blocks[order], metadata


def _last_per_block(files: I64, blocks: I64, sequence: I64) -> tuple[I64, I64, I64]:
    """Keep one entry per (file, block): the one with the highest sequence number."""
    if len(files) == 0:
        return files, blocks, sequence
    order = np.lexsort((sequence, blocks, files))
    files, blocks, sequence = files[order], blocks[order], sequence[order]
    last = np.ones(len(files), dtype=bool)
    last[:-1] = (files[1:] != files[:-1]) | (blocks[1:] != blocks[:-1])
    return files[last], blocks[last], sequence[last]


def warm_cache_contents(columns: Columns, block_size_bytes: int) -> WarmState:
    """Replay ``columns`` (interned file ids) through the caches: the state afterwards."""
    warm = WarmUp(block_size_bytes)
    warm.add(columns)
    files, blocks, metadata = warm.finish()
    return WarmState(
        blocks_lru_first=(files << BLOCK_BITS) + blocks,
        metadata_files=metadata,
        records=warm.records,
    )
