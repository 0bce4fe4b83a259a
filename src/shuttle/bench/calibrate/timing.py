"""Clocks and timed calls: the node's CPU clock read from this machine, and a call
made back to back as a program makes them, each call's wall time kept."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shuttle.errors import ConfigError

#: Repetitions of each timed call (after WARMUP_CALLS untimed): enough that the
#: node's CPU clock, read once before and once after, averages out.
CALLS = 200
WARMUP_CALLS = 10


def node_cpu_clock(entry_pid: int | None, node: str) -> Callable[[], float]:
    """The node process's CPU clock (seconds, all its threads).

    Raises :class:`ConfigError` when the node does not run on this machine (the
    cluster file records no pid, or the process is gone)."""
    if entry_pid is None:
        raise ConfigError(
            f"node {node} has no process id in the cluster file: calibration reads the "
            "node's CPU clock, so the node must run on this machine (start it with "
            "`shuttle cluster up`)"
        )
    clock_id = ((~entry_pid) << 3) | 2  # CPUCLOCK_SCHED of the whole process

    def read() -> float:
        try:
            return time.clock_gettime(clock_id)
        except OSError as exc:
            raise ConfigError(
                f"cannot read the CPU clock of node {node} (pid {entry_pid}): {exc}; "
                "is it running on this machine?"
            ) from None

    read()
    return read


@dataclass(frozen=True)
class Timed:
    """Per call: wall seconds (median and mean), node CPU, client CPU; and each call's
    start and wall time, warm-up calls first (``warmup`` of them)."""

    wall_s: float
    wall_mean_s: float
    node_cpu_s: float
    client_cpu_s: float
    calls: int
    starts: tuple[float, ...] = ()
    walls: tuple[float, ...] = ()
    warmup: int = 0

    def to_json(self) -> dict[str, float]:
        return {
            "wall_s": self.wall_s,
            "wall_mean_s": self.wall_mean_s,
            "node_cpu_s": self.node_cpu_s,
            "client_cpu_s": self.client_cpu_s,
            "calls": self.calls,
        }


#: Timed calls are made in this many batches; a CPU figure is the smallest batch's
#: per call, so a burst of the node's own background work (its planner's tick, a
#: digest) in one batch does not count as the calls' cost.
BATCHES = 3


def timed_calls(
    call: Callable[[], Any],
    node_cpu: Callable[[], float],
    *,
    calls: int = CALLS,
    budget_s: float | None = None,
) -> Timed:
    """Time ``call`` ``calls`` times, back to back as a program makes them, after a
    few untimed (their times are kept too: a link's bucket remembers them)."""
    starts: list[float] = []
    walls: list[float] = []

    def one() -> None:
        t = time.perf_counter()
        call()
        starts.append(t)
        walls.append(time.perf_counter() - t)

    for _ in range(WARMUP_CALLS):
        one()
    node_per_call: list[float] = []
    client_per_call: list[float] = []
    started = time.perf_counter()
    per_batch = max(1, calls // BATCHES)
    done = 0
    while done < calls:
        n0, c0 = node_cpu(), time.process_time()
        batch = 0
        while batch < per_batch and done < calls:
            one()
            batch += 1
            done += 1
            if budget_s is not None and time.perf_counter() - started > budget_s and done >= 5:
                calls = done
        node_per_call.append((node_cpu() - n0) / batch)
        client_per_call.append((time.process_time() - c0) / batch)
    timed = walls[WARMUP_CALLS:]
    return Timed(
        statistics.median(timed),
        statistics.fmean(timed),
        min(node_per_call),
        min(client_per_call),
        len(timed),
        tuple(starts),
        tuple(walls),
        WARMUP_CALLS,
    )
