"""Store-level counters: operations by kind, bytes moved, journal and recovery activity.

The node's stats operation returns :meth:`StoreCounters.snapshot` (plain ints, ready for
a msgpack header); benchmarks and tests read the same numbers.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StoreCounters:
    """Thread-safe counters. ``ops`` counts calls by operation name (``read``, ``write``,
    ``put``, ...), including calls that failed; ``errors`` counts those by error code."""

    ops: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    bytes_written: int = 0
    bytes_rechunked: int = 0
    chunks_reused: int = 0
    hashes_deferred_computed: int = 0
    checkpoints: int = 0
    recovered_records: int = 0
    adopted_objects: int = 0
    #: Objects re-chunked because their record predates the chunking in use.
    objects_rechunked: int = 0
    #: ``read`` calls answered by :meth:`read_done` (the cache-hit path): a plain int,
    #: which the compiled build adds to natively, where a ``Counter`` item costs about
    #: 1,500 instructions per read; :meth:`snapshot` reports them under ``ops``.
    reads_done: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def op(self, name: str) -> None:
        with self._lock:
            self.ops[name] += 1

    def error(self, code: str) -> None:
        with self._lock:
            self.errors[code] += 1

    def read_done(self, nbytes: int) -> None:
        """One ``read`` that returned ``nbytes``: ``op`` and ``add`` without the lock
        (the store's loop-side reads call it for every page they serve). Compiled (the
        mypyc group), each addition is a native one that never gives up the GIL, so no
        count is lost against the locked updates; the pure Python build may lose one
        when two threads count at the same instant, as the block cache's hit counters
        may (:mod:`shuttle.blockcache`): these are statistics."""
        self.reads_done += 1
        self.bytes_read += nbytes

    def add(self, **amounts: int) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            ops = dict(self.ops)
            if self.reads_done:
                ops["read"] = ops.get("read", 0) + self.reads_done
            return {
                "ops": ops,
                "errors": dict(self.errors),
                "bytes_read": self.bytes_read,
                "bytes_written": self.bytes_written,
                "bytes_rechunked": self.bytes_rechunked,
                "chunks_reused": self.chunks_reused,
                "hashes_deferred_computed": self.hashes_deferred_computed,
                "checkpoints": self.checkpoints,
                "recovered_records": self.recovered_records,
                "adopted_objects": self.adopted_objects,
                "objects_rechunked": self.objects_rechunked,
            }
