"""The periodic work every run-time does: a few times per observation window H it
snapshots the resource monitor and samples the node's load, and it answers the load
L averaged over the last window and the CPU the process used and could have had
(what a digest reports). The run-time's loop calls :meth:`Ticker.tick`.
"""

from __future__ import annotations

import time

from shuttle.runtime.digest import CpuUse
from shuttle.runtime.load import LoadSample, LoadSampler, available_cpu_s
from shuttle.runtime.monitor import ResourceMonitor


class Ticker:
    """The periodic work of a run-time: monitor snapshots and load samples, a few
    per window, and the average load over the last window (and the CPU its process
    used and could have had: :attr:`cpu`)."""

    def __init__(
        self, monitor: ResourceMonitor, window_s: float, ticks_per_window: int = 4
    ) -> None:
        self.monitor = monitor
        self.window_s = window_s
        self.interval_s = window_s / ticks_per_window
        self.sampler = LoadSampler()
        self._samples: list[tuple[float, LoadSample]] = []

    def tick(self) -> None:
        self.monitor.tick()
        sample = self.sampler.sample()
        now = time.monotonic()
        self._samples.append((now, sample))
        self._samples = [(t, x) for t, x in self._samples if t > now - self.window_s]

    @property
    def load(self) -> float:
        """L averaged over the last window."""
        if not self._samples:
            return 0.0
        return sum(x.load for _, x in self._samples) / len(self._samples)

    @property
    def cpu(self) -> CpuUse | None:
        """The CPU this process used over the last window and the CPU it could have
        had (None before the first sample)."""
        span = sum(x.interval_s for _, x in self._samples)
        if span <= 0:
            return None
        last = self._samples[-1][1]
        busy = sum(x.own_run_s + x.others_run_s for _, x in self._samples)
        return CpuUse(
            own_per_s=sum(x.own_run_s for _, x in self._samples) / span,
            available_per_s=sum(available_cpu_s(x) for _, x in self._samples) / span,
            cpus=last.cpus,
            # Over the CPUs it may run on (a sample's counters are in jiffies: a
            # little over 1 on a full CPU is rounding, not more than full).
            busy_share=min(1.0, busy / (span * last.cpus)),
        )
