"""Trace records, readers (strace, nfsdump, block traces) and recorders."""

from shuttle.traces.record import CSV_COLUMNS, Op, TraceRecord

__all__ = ["CSV_COLUMNS", "Op", "TraceRecord"]
