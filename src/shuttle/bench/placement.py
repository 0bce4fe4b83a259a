"""Where the processes of a latency benchmark run: one CPU for the client and servers.

A 4 KiB fetch over loopback is a ping-pong: the client sleeps in ``recv`` while the
server works, then the other way round. Whether the woken process runs on the CPU
that woke it or on another one is the scheduler's choice, it sticks to a process for
its whole life, and it decides the result: measured on this machine (a 2-vCPU
Firecracker VM), a wake-up on the other vCPU costs an inter-processor interrupt and
a VM exit, about 25 µs each way, against ~17 µs for a whole same-CPU round trip of a
minimal echo server. Left alone, the scheduler put Redis beside the client and a
Shuttle node on the other vCPU in some runs and the reverse in others, so the
Shuttle/Redis ratio swung between 0.3 and 4 for reasons that had nothing to do with
either server. Pinning the client and every server it compares to one CPU gives all
of them the same, repeatable placement; ``--no-pin`` leaves it to the scheduler.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from shuttle.errors import ConfigError


def default_cpu() -> int:
    """The CPU to pin to: the highest-numbered one this process may use."""
    return max(os.sched_getaffinity(0))


def threads_of(pid: int) -> list[int]:
    """Thread ids of process ``pid`` (just ``pid`` if /proc cannot tell)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def cpu_time_s(pid: int) -> float:
    """CPU time every thread of ``pid`` has run so far, in seconds (the scheduler's
    nanosecond count, ``/proc/PID/task/TID/schedstat``); threads that ended are not
    counted, so take differences over spans in which none does (a server's pool
    threads live as long as it)."""
    return sched_use(pid)[0]


def sched_use(pid: int | None = None) -> tuple[float, float, int]:
    """What the scheduler did for every thread of ``pid`` so far (None: this process's
    main thread): seconds on a CPU, seconds runnable but waiting for one (the run
    delay), and how many times it was put on a CPU (``/proc/PID/task/TID/schedstat``),
    summed over its threads; as in :func:`cpu_time_s`, take differences over spans in
    which no thread ends."""
    if pid is None:
        paths = ["/proc/self/schedstat"]
    else:
        paths = [f"/proc/{pid}/task/{tid}/schedstat" for tid in threads_of(pid)]
    ran = waited = slices = 0
    for path in paths:
        try:
            with open(path) as f:
                fields = f.read().split()
            ran += int(fields[0])
            waited += int(fields[1])
            slices += int(fields[2])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
    return ran / 1e9, waited / 1e9, slices


def pin_process(pid: int, cpu: int) -> None:
    """Run every thread of ``pid`` on ``cpu`` (threads it starts later inherit it)."""
    for tid in threads_of(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(tid, {cpu})


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[int | None]:
    """Run the calling thread on ``cpu`` (None: leave it) until the block ends, when its
    previous CPU set is restored. Yields ``cpu``; pin servers with :func:`pin_process`.

    Raises :class:`ConfigError` if this process may not use ``cpu``.
    """
    if cpu is None:
        yield None
        return
    before = os.sched_getaffinity(0)
    if cpu not in before:
        raise ConfigError(
            f"cannot pin to CPU {cpu}: this process may use CPUs {sorted(before)}; "
            "pick one of them, or pass --no-pin"
        )
    os.sched_setaffinity(0, {cpu})
    try:
        yield cpu
    finally:
        os.sched_setaffinity(0, before)


#: ``/proc/stat``'s per-CPU fields, in order (proc(5)), in clock ticks.
PROC_STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_ticks() -> dict[str, list[int]]:
    """Each CPU's time so far by ``/proc/stat``'s fields (:data:`PROC_STAT_FIELDS`), in
    clock ticks, by name (``cpu0``, ``cpu1``, ...); empty where there is no /proc."""
    out: dict[str, list[int]] = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, _, rest = line.partition(" ")
                if name.startswith("cpu") and name != "cpu":
                    values = [int(v) for v in rest.split()[: len(PROC_STAT_FIELDS)]]
                    out[name] = values + [0] * (len(PROC_STAT_FIELDS) - len(values))
    except (OSError, ValueError):
        return {}
    return out


def cpu_use(before: dict[str, list[int]], after: dict[str, list[int]]) -> dict[str, Any]:
    """What each CPU did between two :func:`cpu_ticks`, in seconds: ``busy`` (user and
    system, whoever ran), ``irq`` (hard and soft interrupts: much of loopback's
    network path), ``idle`` (idle or waiting for I/O) and ``steal`` (the hypervisor ran
    something else on it). The ticks are the kernel's (``SC_CLK_TCK``, usually 10 ms)."""
    tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
    out: dict[str, Any] = {}
    for name, now in after.items():
        then = before.get(name)
        if then is None:
            continue
        d = dict(
            zip(PROC_STAT_FIELDS, (b - a for a, b in zip(then, now, strict=True)), strict=True)
        )
        out[name] = {
            "busy_s": (d["user"] + d["nice"] + d["system"]) * tick_s,
            "irq_s": (d["irq"] + d["softirq"]) * tick_s,
            "idle_s": (d["idle"] + d["iowait"]) * tick_s,
            "steal_s": d["steal"] * tick_s,
        }
    return out
