"""Trace records, readers (strace, nfsdump, block traces), recorders and generators.

Layout:

* ``record``      the canonical record (:class:`TraceRecord`) and operations (:class:`Op`)
* ``io``          canonical CSV reading and writing (``.gz`` aware)
* ``formats``     the reader registry, format detection, time ordering (:func:`read_trace`)
* ``csvformat``   the canonical CSV as a registered reader
* ``strace``      ``strace -f -tt -T`` output → records (descriptor and offset tracking)
* ``strace_args`` a call's argument text split, and its string arguments decoded
* ``nfsdump``     nfsdump text (NFSv2/v3 calls) → records
* ``block``       CloudPhysics block traces: binary vSCSI and CSV
* ``summary``     counts, duration, op mix and bytes of a trace (``shuttle trace info``)
* ``pathfilter``  keep or drop a trace's records by the file they name (prefixes, lists)
* ``recorder``    run a real program under strace and convert its trace
* ``agrep``       the recorded mobile application (tre-agrep over the stdlib)
* ``background``  the synthetic background workload (``BackgroundConfig``, ``generate``)
* ``objtrace``    one object's run as a mobile trace: its reads, console calls, CPU
* ``cli``         ``shuttle trace ...``
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shuttle.traces.io import read_csv, write_csv
    from shuttle.traces.record import CSV_COLUMNS, Op, TraceRecord

# The names below are imported on first use, not with the package: the ``shuttle``
# command imports this package's ``cli`` module to build its help and must not pay
# for the rest (tests/unit/test_cli_start.py).
_LAZY: dict[str, str] = {
    "read_csv": "shuttle.traces.io",
    "write_csv": "shuttle.traces.io",
    "CSV_COLUMNS": "shuttle.traces.record",
    "Op": "shuttle.traces.record",
    "TraceRecord": "shuttle.traces.record",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["CSV_COLUMNS", "Op", "TraceRecord", "read_csv", "write_csv"]
