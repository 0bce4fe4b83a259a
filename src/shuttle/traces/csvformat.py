"""The canonical CSV form as a registered reader (format name ``csv``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from shuttle.traces import io
from shuttle.traces.formats import TraceReader, register
from shuttle.traces.record import CSV_COLUMNS, TraceRecord

_HEADER = ",".join(CSV_COLUMNS).encode()


@register
class CanonicalCsvReader(TraceReader):
    """``time,client,op,file,offset,size`` with a header; times already relative."""

    name = "csv"
    description = "Shuttle's canonical CSV (time,client,op,file,offset,size)"
    rebase = False

    @classmethod
    def sniff(cls, head: bytes) -> bool:
        return head.startswith(_HEADER)

    def records(self, path: str | Path) -> Iterator[TraceRecord]:
        for line, record in enumerate(io.read_csv(path), start=2):
            self.position = f"line {line}"
            yield record
