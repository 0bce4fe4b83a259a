"""The registry of trace readers, format detection, and time ordering.

Every reader turns one source format into :class:`~shuttle.traces.record.TraceRecord`
values. A reader yields records in source order with the source's own clock (epoch
seconds, seconds since midnight, microseconds since boot...); :func:`read_trace` then
puts them in time order and rebases the clock so the first record is at 0 s, which is
what the canonical form promises.

Time order: real traces are *nearly* ordered (strace prints a call when it finishes;
nfsdump sees packets from several interfaces), so records are passed through a
reorder buffer that holds :data:`REORDER_WINDOW_S` of trace time. A record older
than that is an error (its line is named) unless ``sort=True``, which sorts the whole
trace in memory.

Readers are registered by name (``csv``, ``strace``, ``nfsdump``, ``blockcsv``,
``vscsi``); :func:`detect_format` guesses the name from the first bytes of a file.
All readers share one test suite (``tests/unit/traces/test_formats.py``).
"""

from __future__ import annotations

import heapq
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar, TypeVar

from shuttle.errors import ConfigError, TraceFormatError, UsageError
from shuttle.traces.record import TraceRecord

#: How far back in trace time a record may arrive and still be put in order. One
#: second covers strace's calls that finish out of order (a file read that blocks
#: for long is rare) and the few milliseconds of nfsdump reordering Ellard et al.
#: report for their traces; anything older means the file is not a time-ordered
#: trace (for example pieces of several traces concatenated) and needs ``sort``.
REORDER_WINDOW_S = 1.0

#: Bytes of a file :func:`detect_format` looks at.
SNIFF_BYTES = 4096


class TraceReader(ABC):
    """One source format. Subclasses set ``name`` and ``description``.

    ``position`` names where the reader is in its input (``"line 12"``) so errors
    raised while consuming its records can point at the source. ``skipped`` counts
    input the reader passed over on purpose, by reason (``"zero-byte I/O"``), so
    ``shuttle trace info`` can show what was not converted.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    #: False for formats whose times are already relative (the canonical CSV).
    rebase: ClassVar[bool] = True

    def __init__(self) -> None:
        self.position = "start"
        self.skipped: Counter[str] = Counter()

    @classmethod
    @abstractmethod
    def sniff(cls, head: bytes) -> bool:
        """Whether the first bytes of a file look like this format."""

    @abstractmethod
    def records(self, path: str | Path) -> Iterator[TraceRecord]:
        """Yield records in source order, with times on the source's own clock.

        Raises :class:`~shuttle.errors.TraceFormatError` naming the line (or byte
        offset) of malformed input.
        """


READERS: dict[str, type[TraceReader]] = {}

R = TypeVar("R", bound=type[TraceReader])


def register(cls: R) -> R:
    """Class decorator: make a reader available by its ``name``."""
    if cls.name in READERS:
        raise ConfigError(f"trace format {cls.name!r} is registered twice")
    READERS[cls.name] = cls
    return cls


def _load_builtin_readers() -> None:
    # Imported for their @register side effect; kept here so the registry is full
    # whichever module a caller imports first.
    from shuttle.traces import block, csvformat, nfsdump, strace  # noqa: F401


def format_names() -> list[str]:
    """Names of every registered format, sorted."""
    _load_builtin_readers()
    return sorted(READERS)


def get_reader(name: str) -> TraceReader:
    """A fresh reader for format ``name``; :class:`UsageError` lists the valid names."""
    _load_builtin_readers()
    try:
        return READERS[name]()
    except KeyError:
        raise UsageError(
            f"unknown trace format {name!r}; expected one of {', '.join(sorted(READERS))}"
        ) from None


def detect_format(path: str | Path) -> str:
    """Guess the format of ``path`` from its first bytes (gzip is looked through).

    Raises :class:`TraceFormatError` if no registered format recognises it.
    """
    _load_builtin_readers()
    head = _head(Path(path))
    for name in sorted(READERS):
        if READERS[name].sniff(head):
            return name
    raise TraceFormatError(
        f"{path}: cannot tell the trace format from its first bytes; pass --format "
        f"(one of {', '.join(sorted(READERS))})"
    )


def _head(path: Path) -> bytes:
    import gzip

    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read(SNIFF_BYTES)
        with open(path, "rb") as f:
            return f.read(SNIFF_BYTES)
    except OSError as exc:
        raise UsageError(f"cannot read trace {str(path)!r}: {exc.strerror or exc}") from exc


def read_trace(
    path: str | Path,
    format: str = "auto",
    *,
    sort: bool = False,
    reorder_window_s: float = REORDER_WINDOW_S,
    reader: TraceReader | None = None,
) -> Iterator[TraceRecord]:
    """Yield the records of any supported trace, time-ordered, first record at 0 s.

    ``format`` is a registered name or ``"auto"``. Pass ``reader`` to keep a handle
    on the reader (its ``skipped`` counters). Raises :class:`TraceFormatError` for
    malformed input or a record more than ``reorder_window_s`` out of order (unless
    ``sort``).
    """
    if reader is None:
        reader = get_reader(detect_format(path) if format == "auto" else format)
    raw = reader.records(path)
    if sort:
        ordered: Iterator[TraceRecord] = iter(sorted(raw, key=_time_of))
    else:
        ordered = in_time_order(raw, reorder_window_s, where=lambda: f"{path}: {reader.position}")
    return rebased(ordered) if reader.rebase else ordered


def _time_of(record: TraceRecord) -> float:
    return record.time


def in_time_order(
    records: Iterator[TraceRecord],
    window_s: float = REORDER_WINDOW_S,
    where: Callable[[], str] = lambda: "trace",
) -> Iterator[TraceRecord]:
    """Put nearly ordered ``records`` in time order with a reorder buffer.

    Equal times keep their input order. Raises :class:`TraceFormatError` (naming
    ``where()``) if a record is more than ``window_s`` older than the newest one
    seen before it.
    """
    heap: list[tuple[float, int, TraceRecord]] = []
    newest_s = -math.inf
    for seq, record in enumerate(records):
        t = record.time
        if t > newest_s:
            newest_s = t
        elif t < newest_s - window_s:
            raise TraceFormatError(
                f"{where()}: a record at t={t:.6f} s comes after one at t={newest_s:.6f} s; "
                f"the trace is out of order by more than the {window_s} s reorder window. "
                "Sort it (--sort) to read it anyway."
            )
        heapq.heappush(heap, (t, seq, record))
        horizon = newest_s - window_s
        while heap[0][0] < horizon:
            yield heapq.heappop(heap)[2]
    while heap:
        yield heapq.heappop(heap)[2]


def rebased(records: Iterator[TraceRecord]) -> Iterator[TraceRecord]:
    """Shift times so the first record is at 0 s (the canonical clock)."""
    first = next(records, None)
    if first is None:
        return
    t0 = first.time
    if t0 == 0.0:  # already relative (the usual case): keep the times bit for bit
        yield first
        yield from records
        return
    record = TraceRecord
    # Rounded to the nanosecond: source clocks tick in microseconds at best, and the
    # subtraction would otherwise leave float noise in every time (5.8e-05 → 5.80001e-05).
    yield record(0.0, first.client, first.op, first.file, first.offset, first.size)
    for r in records:
        yield record(round(r.time - t0, 9), r.client, r.op, r.file, r.offset, r.size)
