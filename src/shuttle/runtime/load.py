"""Node load ``L``: the average number of runnable threads on the node's CPUs.

ABACUS added a load average decaying over H to ``/proc/loadavg``; we read what Linux
already keeps. Over an interval ``dt`` on the ``n`` CPUs this process may use:

* our own threads' time running and time waiting in the run queue, exact, from
  ``/proc/self/task/*/schedstat`` (per-thread scheduler accounting);
* the CPUs' busy time, from ``/proc/stat``; what we did not use of it, other
  processes did.

Other processes' time *waiting* is not visible to us, but our own waits tell how
many compete: under fair sharing a thread of ours that was runnable with ``m``
competitors ran ``1/(m+1)`` of that time, so ``m = our wait / our run`` (bounded by
what the others actually ran, ``their run / our run``, so that our threads waiting
for each other are not taken for competitors). While we were runnable, ``m`` others
were too; the rest of their running happened while we were not.

``L = (our runnable · (1 + m) + max(0, their run - m · our run)) / (dt · n)``.

A busy thread of ours alone gives 1; beside one CPU-bound competitor 2, beside two 3;
an idle node with a competitor gives 1; an idle node about 0. Threads waiting for
Python's GIL sleep, so they count as neither.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Jiffies per second of /proc/stat's counters.
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One interval's reading."""

    interval_s: float
    load: float
    own_run_s: float
    own_wait_s: float
    others_run_s: float
    cpus: int


def _own_threads() -> dict[int, tuple[int, int]]:
    """Per thread of this process: (ns on CPU, ns waiting to run)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                run, wait, _ = f.read().split()
        except (OSError, ValueError):
            continue  # the thread ended, or no schedstat on this kernel
        out[int(tid)] = (int(run), int(wait))
    return out


def _cpu_busy_jiffies(cpus: set[int]) -> int:
    """Busy jiffies (everything but idle and iowait) summed over ``cpus``."""
    total = 0
    try:
        with open("/proc/stat", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for line in lines:
        if not line.startswith(b"cpu") or line.startswith(b"cpu "):
            continue
        fields = line.split()
        try:
            cpu = int(fields[0][3:])
        except ValueError:
            continue
        if cpu in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(x) for x in fields[1:])
            steal = rest[0] if rest else 0
            total += user + nice + system + irq + softirq + steal
    return total


def estimate_load(
    own_run: float, own_wait: float, others_run: float, dt: float, cpus: int
) -> float:
    """``L`` from our threads' run and wait times and the others' run time (module
    docstring); all in seconds over ``dt``."""
    if dt <= 0:
        return 0.0
    competitors = min(own_wait, others_run) / own_run if own_run > 0 else 0.0
    runnable = own_run + own_wait
    alone = max(0.0, others_run - competitors * own_run)
    return (runnable * (1 + competitors) + alone) / (dt * max(1, cpus))


def available_cpu_s(sample: LoadSample) -> float:
    """CPU seconds the process could have had over ``sample``'s interval: what its
    CPUs left after the other processes ran, or, if more, its fair share beside the
    competitors it waited behind (``cpus / (1 + m)``, as in :func:`estimate_load`:
    others fill a CPU we leave idle, and would yield a share of it if we wanted it)."""
    span = sample.interval_s * sample.cpus
    left = span - sample.others_run_s
    competitors = (
        min(sample.own_wait_s, sample.others_run_s) / sample.own_run_s
        if sample.own_run_s > 0
        else 0.0
    )
    return max(0.0, left, span / (1 + competitors))


class LoadSampler:
    """Reads ``L`` over the interval since the previous :meth:`sample`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last_t = clock()
        self._cpus = self._affinity()
        self._threads = _own_threads()
        self._busy = _cpu_busy_jiffies(self._cpus)
        self.last: LoadSample = LoadSample(0.0, 0.0, 0.0, 0.0, 0.0, len(self._cpus))

    @staticmethod
    def _affinity() -> set[int]:
        try:
            return set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return {0}

    def sample(self) -> LoadSample:
        """The load since the previous call (the node may be re-pinned meanwhile)."""
        now = self._clock()
        dt = now - self._last_t
        cpus = self._affinity()
        threads = _own_threads()
        busy = _cpu_busy_jiffies(cpus)
        if dt <= 0:
            return self.last
        run_ns = wait_ns = 0
        for tid, (run, wait) in threads.items():
            run0, wait0 = self._threads.get(tid, (0, 0))
            run_ns += max(0, run - run0)
            wait_ns += max(0, wait - wait0)
        own_run = run_ns / 1e9
        own_wait = wait_ns / 1e9
        # Re-pinned meanwhile: the counters are over another set; count only our own.
        busy_s = max(0, busy - self._busy) / _CLK_TCK if cpus == self._cpus else own_run
        others_run = max(0.0, busy_s - own_run)
        n = max(1, len(cpus))
        load = estimate_load(own_run, own_wait, others_run, dt, n)
        self._last_t, self._cpus, self._threads, self._busy = now, cpus, threads, busy
        self.last = LoadSample(dt, load, own_run, own_wait, others_run, n)
        return self.last
