"""What the machine did under each slice of ``netrand --clients`` (its warm and Redis
slices), for telling what moved when a slice pair's ratio moves.

A slice pair's warm ÷ Redis ratio moves when either server's slice is slow. Each slice
then says why, in seconds over the slice: what each CPU did (``busy``, ``irq``,
``idle``, ``steal``: :func:`shuttle.bench.placement.cpu_use`), the CPU of the server
serving it (the node for a warm slice, Redis for a Redis one, when the benchmark
started them) and of all its clients, and ``others_s``: the busy time of the CPUs the
benchmark runs on (``benchmark_cpus``: its affinity, one CPU when pinned) less the
server's and the clients' (the benchmark's parent, other sessions, kernel threads; a
tick either way, as ``/proc/stat`` counts in ticks and the processes in nanoseconds).
Pinned, everything runs on one CPU: a slow slice with ``others_s`` up had company on
it, with ``idle`` up waited for something, with ``steal`` up lost the CPU to the
hypervisor, and with none of these but its server's CPU per request up did more work.

And from the scheduler (``/proc/PID/task/TID/schedstat``, :func:`shuttle.bench.
placement.sched_use`), for the server and for all the clients together: the seconds
they were runnable but waited for a CPU (``server_wait_s``, ``clients_wait_s``) and how
many times each was put on one, per request (``server_runs_per_req``,
``clients_runs_per_req``). A server that is put on the CPU once per request polls for
one request at a time and pays its wake-up each time; one put on it once per ten finds
ten waiting: the same work costs less CPU per request, so a slice whose CPU per request
moved says with these whether the batching moved.
"""

from __future__ import annotations

from typing import Any

#: The timed passes whose slices are paired (``slices``), and their key in a pair.
PAIRED = {"remote_warm": "warm", "redis": "redis"}


def attach(
    report: dict[str, Any],
    machine: dict[str, list[dict[str, Any]]],
    outputs: list[Any],
    benchmark_cpus: list[str],
) -> None:
    """Add to each slice pair of ``report["slices"]`` what the machine did under each of
    its two slices (``warm_machine``, ``redis_machine``). ``machine``: per pass name, per
    slice, ``cpus`` (:func:`~shuttle.bench.placement.cpu_use`) and ``server_cpu_s``
    (None when unknown), and ``server_wait_s`` and ``server_runs`` from the scheduler
    (None when unknown); ``outputs``: the clients' samples, whose fourth item per slice
    is the client's CPU seconds, and fifth and sixth (when there) its seconds waiting for
    a CPU and the times it was put on one; ``benchmark_cpus``: the CPUs (``cpu1``, ...) the
    servers and clients may run on, whose busy time ``others_s`` is taken from."""
    pairs = report.get("slices")
    if not pairs:
        return
    for name, side in PAIRED.items():
        slices = machine.get(name, [])
        for i, (pair, got) in enumerate(zip(pairs, slices, strict=False)):
            mine = [o[name][i] for o in outputs if len(o.get(name, ())) > i]
            clients_s = sum(sample[3] for sample in mine)
            cpus: dict[str, dict[str, float]] = got["cpus"]
            entry: dict[str, Any] = {
                "cpus": cpus,
                "benchmark_cpus": benchmark_cpus,
                "clients_cpu_s": clients_s,
                "server_cpu_s": got["server_cpu_s"],
            }
            requests = pair.get(f"{side}_requests")
            if got["server_cpu_s"] is not None:
                busy = sum(c["busy_s"] for name, c in cpus.items() if name in benchmark_cpus)
                entry["others_s"] = busy - clients_s - got["server_cpu_s"]
                if requests:
                    entry["server_cpu_us_per_req"] = got["server_cpu_s"] * 1e6 / requests
            if requests and got.get("server_runs") is not None:
                entry["server_wait_s"] = got["server_wait_s"]
                entry["server_runs_per_req"] = got["server_runs"] / requests
            if requests and mine and all(len(sample) >= 6 for sample in mine):
                entry["clients_wait_s"] = sum(sample[4] for sample in mine)
                entry["clients_runs_per_req"] = sum(sample[5] for sample in mine) / requests
            pair[f"{side}_machine"] = entry
