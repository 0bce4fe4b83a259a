"""The nodes' CPU over a mix pass: in all (:func:`node_cpu_s`, from /proc) and in each
second of it (:class:`CpuTimeline`, a thread that reads it at each second's end), the
figures a pass's throughput is read against."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from shuttle.bench.abacus import Bench
from shuttle.bench.stream import process_cpu_s


def node_cpu_s(bench: Bench) -> float:
    return sum(process_cpu_s(e.pid) for e in bench.cluster.nodes if e.pid is not None)


class CpuTimeline:
    """The nodes' CPU busy in each second of a pass, read from /proc by a thread that
    wakes at each second's end (the pass's clock: ``started`` gives its start).
    ``probe``, if given, is called once by that thread as the pass's first second ends
    (the clients' run-times and the node's threads are up by then); its result is
    :attr:`probed`."""

    def __init__(self, bench: Bench, seconds: int, probe: Callable[[], Any] | None = None) -> None:
        self._bench = bench
        self._seconds = seconds
        self._busy: list[float] = []
        self._thread: threading.Thread | None = None
        self._probe = probe
        self.probed: Any = None
        #: The pass's start (``time.monotonic()``), once it has started.
        self.t0: float | None = None

    def started(self, t0: float) -> None:
        self.t0 = t0
        self._thread = threading.Thread(target=self._run, args=(t0,), daemon=True)
        self._thread.start()

    def _run(self, t0: float) -> None:
        last = node_cpu_s(self._bench)
        for i in range(1, self._seconds + 1):
            time.sleep(max(0.0, t0 + i - time.monotonic()))  # to the second's end
            now = node_cpu_s(self._bench)
            self._busy.append(now - last)  # CPU seconds in a one-second interval
            last = now
            if i == 1 and self._probe is not None:
                self.probed = self._probe()

    def result(self) -> list[float]:
        """The series (the pass is over: the thread has at most one second to go)."""
        if self._thread is not None:
            self._thread.join()
        return list(self._busy)
