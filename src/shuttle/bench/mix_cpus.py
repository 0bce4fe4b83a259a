"""Where the mix benchmark's processes ran, checked rather than assumed.

The benchmark emulates the setup of Bhardwaj, Kulkarni and Stutsman (ATC 2020), one
storage server and client machines of their own, on one machine by giving the node one
CPU and the clients the other (:func:`shuttle.bench.abacus.bench_node` sets the
affinity of every thread of the node and of the benchmark process, whose forked clients
inherit it). This module reads back what the kernel actually allows each thread
(``/proc/PID/task/TID/status``, ``Cpus_allowed_list``) while a pass runs, and what each
CPU did over the pass (``/proc/stat``), so every pass's JSON says whether the partition
held: no thread of the node allowed on a client CPU, none of the clients' on the node's.

What the partition emulates and what it does not: the node cannot take CPU time from
the clients and they cannot take it from the node, as with separate machines; they
still share one kernel (the loopback's network work runs on whichever CPU sends or
receives), one memory bus and one last-level cache, and the clients share their one
CPU among themselves (64 client machines would have 64).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from shuttle.bench.placement import cpu_use
from shuttle.errors import ConfigError

#: A thread's allowed CPUs, by thread id, for one process.
Threads = Mapping[int, frozenset[int]]


def parse_cpu_list(text: str) -> frozenset[int]:
    """A kernel CPU list (``Cpus_allowed_list``, ``0-3,6``) as a set of CPU numbers;
    :class:`ConfigError` names what is not one."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ConfigError(
                f"{text!r} is not a CPU list: expected numbers and ranges such as 0-1,3"
            ) from None
        if first > last:
            raise ConfigError(f"{text!r} is not a CPU list: the range {part} runs backwards")
        out.update(range(first, last + 1))
    return frozenset(out)


def threads_allowed(pid: int) -> dict[int, frozenset[int]]:
    """Each thread of ``pid`` with the CPUs the kernel allows it (empty if ``pid`` is
    gone: a client that finished, a node that stopped)."""
    out: dict[int, frozenset[int]] = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Cpus_allowed_list:"):
                        out[tid] = parse_cpu_list(line.split(":", 1)[1])
                        break
        except OSError:
            continue  # a thread that just ended
    return out


def _cpu_text(cpus: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _side(processes: Mapping[int, Threads], own: frozenset[int] | None) -> dict[str, Any]:
    allowed: set[int] = set()
    outside = 0
    threads = 0
    for per_thread in processes.values():
        for cpus in per_thread.values():
            threads += 1
            allowed |= cpus
            if own is not None and not cpus <= own:
                outside += 1
    return {
        "cpus": None if own is None else _cpu_text(own),
        "processes": sum(1 for t in processes.values() if t),
        "threads": threads,
        "allowed": _cpu_text(allowed),
        "threads_outside": outside,
    }


def partition(
    node: Mapping[int, Threads],
    clients: Mapping[int, Threads],
    node_cpus: frozenset[int] | None,
    client_cpus: frozenset[int] | None,
) -> dict[str, Any]:
    """Whether the node's and the clients' threads kept to disjoint CPUs: ``held`` is
    true only if both sides were given CPUs, the two sets do not meet, every thread seen
    of each side is allowed only its own side's, and threads of both sides were seen
    (a check that saw nothing proves nothing). Pure: the threads come from
    :func:`threads_allowed`."""
    node_side = _side(node, node_cpus)
    client_side = _side(clients, client_cpus)
    pinned = node_cpus is not None and client_cpus is not None
    held = (
        pinned
        and not (node_cpus or frozenset()) & (client_cpus or frozenset())
        and node_side["threads"] > 0
        and client_side["threads"] > 0
        and node_side["threads_outside"] == 0
        and client_side["threads_outside"] == 0
    )
    return {
        "mode": "partitioned" if pinned else "shared",
        "held": bool(held),
        "node": node_side,
        "clients": client_side,
    }


def cpu_busy(
    before: dict[str, list[int]], after: dict[str, list[int]], wall_s: float
) -> dict[str, dict[str, float]]:
    """Each CPU's share of ``wall_s`` spent running anything (``busy``: user and
    system) and in interrupts (``irq``: much of loopback's network path), from two
    :func:`shuttle.bench.placement.cpu_ticks` (10 ms ticks: a pass of seconds reads to
    about a percent)."""
    if wall_s <= 0:
        return {}
    return {
        name: {
            "busy": round(use["busy_s"] / wall_s, 3),
            "irq": round(use["irq_s"] / wall_s, 3),
        }
        for name, use in sorted(cpu_use(before, after).items())
    }
