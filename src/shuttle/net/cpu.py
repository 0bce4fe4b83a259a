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

With ``SHUTTLE_CPU_TRACE=FILE`` in a node's environment every burn appends a line to
``FILE``: when it started (``CLOCK_MONOTONIC``, comparable across processes), the
process and thread, the CPU seconds asked, burned and the burn's wall time (a wall
over its CPU is the burn waiting for a core); and so does every garbage collection
(its generation, wall and CPU: a collection inside a section is work the section
measured, so it is multiplied too). :func:`read_cpu_trace` reads it back;
``benchmarks/slow_node_spread.py`` sets it beside live runs (benchmarks/README.md,
"The simulator against the live system").
"""

from __future__ import annotations

import functools
import gc
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from shuttle.errors import ConfigError

log = logging.getLogger(__name__)

#: Slowest node we emulate: 100 times slower burns 99 s per second of work, beyond
#: which an experiment would not finish.
SPEED_FACTOR_MIN = 0.01
#: Fastest factor accepted (it only informs the placement model; nothing is burned).
SPEED_FACTOR_MAX = 100.0
#: Busy-loop iterations between two reads of the thread CPU clock: about 10 µs of
#: work on this machine, so a burn overshoots its target by no more than that while
#: the clock reads (a system call each) stay a few percent of the loop.
BURN_SPIN_ITERATIONS = 150

#: The environment variable naming the burn trace's file (unset: no trace, and a burn
#: reads no clock beyond its own).
CPU_TRACE_ENV = "SHUTTLE_CPU_TRACE"

P = ParamSpec("P")
R = TypeVar("R")


class _Trace:
    """The trace's file, opened on the first line written (a process that never burns
    nor collects makes none). Each line is written by one ``write`` to a file opened
    for appending, so lines of several threads and processes do not interleave."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.fd: int | None = None
        self._opening = threading.Lock()
        #: The collection in progress: its start on the monotonic and thread clocks
        #: (collections hold the GIL: one at a time in a process).
        self._gc_start: tuple[float, float] | None = None

    def write(self, kind: str, start: float, a: float, b: float, c: float) -> None:
        if self.fd is None:
            with self._opening:
                if self.path is None:
                    return
                if self.fd is None:
                    try:
                        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                    except OSError as exc:  # a jailed worker sees no such directory
                        log.warning("no CPU trace: cannot open %s (%s)", self.path, exc.strerror)
                        self.path = None
                        return
        assert self.fd is not None
        line = (
            f"{kind} {start:.6f} {os.getpid()} {threading.get_native_id()} "
            f"{a:.9f} {b:.9f} {c:.9f}\n"
        )
        os.write(self.fd, line.encode())

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        """``gc.callbacks``: a collection's generation, wall and thread CPU. Its CPU is
        inside whatever section it interrupted, so the emulation multiplies it too."""
        if phase == "start":
            self._gc_start = (time.monotonic(), time.thread_time())
        elif self._gc_start is not None:
            wall0, cpu0 = self._gc_start
            self._gc_start = None
            generation = float(info.get("generation", -1))
            self.write("gc", wall0, generation, time.monotonic() - wall0, time.thread_time() - cpu0)


_trace = _Trace(os.environ.get(CPU_TRACE_ENV) or None)
if _trace.path is not None:
    gc.callbacks.append(_trace.on_gc)


def burn_cpu(cpu_s: float) -> float:
    """Busy-loop on this thread until it has used ``cpu_s`` more seconds of CPU.

    Returns the CPU seconds actually burned (slightly more than asked)."""
    if cpu_s <= 0:
        return 0.0
    traced = _trace.path is not None
    start = time.thread_time()
    wall0 = time.monotonic() if traced else 0.0
    end = start + cpu_s
    x = 0
    while time.thread_time() < end:
        for i in range(BURN_SPIN_ITERATIONS):
            x ^= i
    burned = time.thread_time() - start
    if traced:
        _trace.write("burn", wall0, cpu_s, burned, time.monotonic() - wall0)
    return burned


@dataclass(frozen=True)
class Burn:
    """A burn in the trace: when it started (``CLOCK_MONOTONIC`` seconds), the process
    and thread, the CPU seconds asked and burned, and its wall seconds."""

    start: float
    pid: int
    thread: int
    asked_s: float
    burned_s: float
    wall_s: float


@dataclass(frozen=True)
class Collection:
    """A garbage collection in the trace: when it started, the process and thread, the
    generation collected, its wall and its thread CPU seconds."""

    start: float
    pid: int
    thread: int
    generation: int
    wall_s: float
    cpu_s: float


def read_cpu_trace(path: str | os.PathLike[str]) -> tuple[list[Burn], list[Collection]]:
    """The burns and the collections a ``SHUTTLE_CPU_TRACE`` file holds, each in the
    order written (a line cut short by a process killed mid-write is left out)."""
    burns: list[Burn] = []
    collections: list[Collection] = []
    with open(path, encoding="ascii") as f:
        for line in f:
            parts = line.split()
            if len(parts) != 7 or not line.endswith("\n"):
                continue
            start, pid, thread = float(parts[1]), int(parts[2]), int(parts[3])
            a, b, c = float(parts[4]), float(parts[5]), float(parts[6])
            if parts[0] == "burn":
                burns.append(Burn(start, pid, thread, a, b, c))
            elif parts[0] == "gc":
                collections.append(Collection(start, pid, thread, int(a), b, c))
    return burns, collections


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
