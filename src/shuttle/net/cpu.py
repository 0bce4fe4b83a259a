"""The CPU speed factor of a node: a slower node burns proportionally more CPU.

A node with speed factor ``f < 1`` must spend ``1/f`` times the CPU a full-speed node
spends on the same work. We get that honestly: measure the thread CPU time a piece of
work really took (:func:`time.thread_time`), then burn ``(1/f - 1)`` times that much
more in a busy loop on the same thread. The burn occupies a core like real work, so
other requests on that node (and other processes on the machine) feel the contention,
and the resource monitor's per-thread CPU clocks see the slower node's true cost.

``f >= 1`` burns nothing (a node cannot be made faster than the machine); the
factor is still recorded, because the placement model uses it as the node's relative
raw speed.

Wrap synchronous CPU work only: an ``async`` section that awaits would also measure
whatever else ran on the event loop's thread meanwhile.

    speed = CpuSpeed(0.5)
    with speed.section():
        digest = blake3(data).digest()     # then burns as much again

    @speed.scaled
    def checksum(data: bytes) -> bytes: ...
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from shuttle.errors import ConfigError

#: Slowest node we emulate: 100 times slower burns 99 s per second of work, beyond
#: which an experiment would not finish.
SPEED_FACTOR_MIN = 0.01
#: Fastest factor accepted (it only informs the placement model; nothing is burned).
SPEED_FACTOR_MAX = 100.0
#: Busy-loop iterations between two reads of the thread CPU clock: about 10 µs of
#: work on this machine, so a burn overshoots its target by no more than that while
#: the clock reads (a system call each) stay a few percent of the loop.
BURN_SPIN_ITERATIONS = 150

P = ParamSpec("P")
R = TypeVar("R")


def burn_cpu(cpu_s: float) -> float:
    """Busy-loop on this thread until it has used ``cpu_s`` more seconds of CPU.

    Returns the CPU seconds actually burned (slightly more than asked)."""
    if cpu_s <= 0:
        return 0.0
    start = time.thread_time()
    end = start + cpu_s
    x = 0
    while time.thread_time() < end:
        for i in range(BURN_SPIN_ITERATIONS):
            x ^= i
    return time.thread_time() - start


def parse_speed_factor(value: object, where: str = "cpu speed factor") -> float:
    """Validate a speed factor from a config file or flag; raises :class:`ConfigError`."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{where}: expected a number such as 0.5, not {value!r}")
    try:
        factor = float(value)
    except ValueError:
        raise ConfigError(f"{where}: {value!r} is not a number; write e.g. 0.5") from None
    if not (math.isfinite(factor) and SPEED_FACTOR_MIN <= factor <= SPEED_FACTOR_MAX):
        raise ConfigError(
            f"{where}: {factor!r} is out of range; it must be between {SPEED_FACTOR_MIN} "
            f"and {SPEED_FACTOR_MAX:g} (0.5 = a node half as fast, 1 = this machine)"
        )
    return factor


@dataclass
class CpuCounters:
    """CPU accounting of one node's scaled sections.

    * ``sections``: sections completed.
    * ``work_s``: CPU seconds the work itself used.
    * ``burned_s``: CPU seconds burned on top to emulate the slower node.
    """

    sections: int = 0
    work_s: float = 0.0
    burned_s: float = 0.0


class CpuSpeed:
    """A node's CPU speed factor and the means to apply it to pieces of work.

    Thread-safe. Sections nest: only the outermost one on a thread measures and
    burns, so work is never scaled twice.
    """

    def __init__(self, factor: float = 1.0) -> None:
        self.factor = parse_speed_factor(factor)
        #: Extra CPU per CPU second of work: ``1/f - 1``, or 0 for ``f >= 1``.
        self.burn_ratio = max(0.0, 1.0 / self.factor - 1.0)
        self.counters = CpuCounters()
        self._lock = threading.Lock()
        self._local = threading.local()

    @contextmanager
    def section(self) -> Iterator[None]:
        """Measure the thread CPU of the body, then burn ``burn_ratio`` times as much.

        The burn happens also when the body raises (the work was done all the same)."""
        depth: int = getattr(self._local, "depth", 0)
        if depth:
            self._local.depth = depth + 1
            try:
                yield
            finally:
                self._local.depth = depth
            return
        self._local.depth = 1
        start = time.thread_time()
        try:
            yield
        finally:
            work_s = time.thread_time() - start
            burned_s = burn_cpu(work_s * self.burn_ratio) if self.burn_ratio else 0.0
            self._local.depth = 0
            with self._lock:
                self.counters.sections += 1
                self.counters.work_s += work_s
                self.counters.burned_s += burned_s

    def scaled(self, fn: Callable[P, R]) -> Callable[P, R]:
        """Decorator: run ``fn`` inside :meth:`section`."""

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            with self.section():
                return fn(*args, **kwargs)

        return wrapper

    def __repr__(self) -> str:
        return f"CpuSpeed(factor={self.factor:g})"
