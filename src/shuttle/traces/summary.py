"""What a trace holds: counts, duration, operation mix and bytes (``shuttle trace info``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shuttle.traces.record import Op, TraceRecord


@dataclass
class TraceSummary:
    """Totals over one pass of a trace. ``ops`` counts records per operation."""

    records: int = 0
    first_s: float = 0.0
    last_s: float = 0.0
    clients: int = 0
    files: int = 0
    ops: Counter[Op] = field(default_factory=Counter)
    bytes_read: int = 0
    bytes_written: int = 0
    #: Records whose time is earlier than the record before them.
    out_of_order: int = 0

    @property
    def duration_s(self) -> float:
        """Time from the first record to the last."""
        return self.last_s - self.first_s

    @property
    def metadata_fraction(self) -> float:
        """Share of records that are metadata requests (the paper's 87% and 42%)."""
        if not self.records:
            return 0.0
        return sum(n for op, n in self.ops.items() if op.is_metadata) / self.records

    @property
    def rate_per_s(self) -> float:
        """Mean records per second over the trace's duration."""
        return self.records / self.duration_s if self.duration_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (operation names as keys, in :class:`Op` order)."""
        return {
            "records": self.records,
            "duration_s": self.duration_s,
            "first_s": self.first_s,
            "last_s": self.last_s,
            "rate_per_s": self.rate_per_s,
            "clients": self.clients,
            "files": self.files,
            "metadata_fraction": self.metadata_fraction,
            "ops": {op.value: self.ops[op] for op in Op if self.ops[op]},
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "out_of_order": self.out_of_order,
        }


def summarize(records: Iterable[TraceRecord]) -> TraceSummary:
    """One pass over ``records``; memory grows with distinct clients and files only."""
    s = TraceSummary()
    ops: Counter[Op] = Counter()
    clients: set[int] = set()
    files: set[str] = set()
    read = write = 0
    previous = -float("inf")
    first = last = 0.0
    n = 0
    disorder = 0
    for r in records:
        t = r.time
        if n == 0:
            first = last = t
        n += 1
        if t < previous:
            disorder += 1
        previous = t
        if t > last:
            last = t
        elif t < first:
            first = t
        ops[r.op] += 1
        clients.add(r.client)
        files.add(r.file)
        if r.op is Op.READ:
            read += r.size
        elif r.op is Op.WRITE:
            write += r.size
    s.records = n
    s.first_s = first
    s.last_s = last if n else 0.0
    s.clients = len(clients)
    s.files = len(files)
    s.ops = ops
    s.bytes_read = read
    s.bytes_written = write
    s.out_of_order = disorder
    return s
