"""``shuttle bench abacus mix``: placement for aggregate throughput under many clients.

ABACUS 6.7 has two applications compete for one node. At scale the question is the
one Bhardwaj, Kulkarni and Stutsman ask ("Adaptive Placement for In-memory Storage
Functions", USENIX ATC 2020): many clients run a mix of *cheap* functions, which should
run at the node and save the transfer, and *CPU-heavy* ones, which should run at their
clients so that they do not saturate the node. That paper reports +85 % aggregate
throughput over running every function at the server and +10 % over running every
function at the clients.

Here ``clients`` client processes (forked, each with its own run-time, its own
emulated link to the nodes and its own listening port) each make two filters over an
object on its node: a cheap one (passes ``cheap_pass`` of each block, burns
``cheap_cpu_s_per_mb``) and a heavy one (passes ``heavy_pass``, burns
``heavy_cpu_s_per_mb``), each called from its own console (so each is a stack the
node's resource manager sees). In a pass every client calls them in a closed loop for
``duration_s``, picking the cheap one with probability ``cheap_share`` (seeded per
client and run, the same sequence in every placement). Four placements, interleaved
run by run (every other run in the reverse order): every filter static at its client,
every filter static at the node, the oracle split (every cheap filter static at the
node, every heavy one at its client; ``split=False`` leaves it out), and adaptive (both
start at the client; the run-time moves them); with ``partial``, partial splits too
(the first K clients' cheap filters at the node): the best split of a run is the
ceiling. A pass reports the calls completed from ``warmup_s`` to its end (steady
state, the figure the target is read from) and over the whole pass, per kind, and
where each filter ended.

**Two cores.** The node runs on one CPU and every client on the other
(:func:`shuttle.bench.abacus.choose_cpus`), so the clients together have one core and
the node one: they cannot take CPU time from each other, as on separate machines, and
every pass checks that this held and what each CPU did (:mod:`~shuttle.bench.mix_cpus`;
``pin=False``, ``--no-pin``, leaves both to the scheduler instead). A node whose CPU is
as fast as all its clients' together never saturates before they do, which is not the
case being asked about (many client machines, one storage server): the node runs with
``--cpu-factor`` (default 0.05: its objects burn twenty times the CPU for the same
work), so the clients together have twenty times its CPU. Links are per client (each
client's run-time shapes its own connections), as on a switched LAN where each machine
has its own port: the LAN profile's rate and latency with a deeper token bucket
(:data:`~shuttle.bench.mix_settings.LINK_DEFAULT`).

By concept: the settings and their checks in :mod:`~shuttle.bench.mix_settings`, the
client processes in :mod:`~shuttle.bench.mix_clients`, the nodes' CPU over a pass in
:mod:`~shuttle.bench.mix_timeline`, their decision logs read back in
:mod:`~shuttle.bench.mix_decisions`, the report and its JSON in
:mod:`~shuttle.bench.mix_report`; the passes themselves here.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from typing import Any

from shuttle.bench.abacus import Bench, Progress, bench_node
from shuttle.bench.mix_clients import ClientSetup, client_processes
from shuttle.bench.mix_cpus import cpu_busy, partition, threads_allowed
from shuttle.bench.mix_decisions import decisions, log_sizes
from shuttle.bench.mix_report import pass_report, run_report
from shuttle.bench.mix_settings import MixSettings
from shuttle.bench.mix_timeline import CpuTimeline, node_cpu_s
from shuttle.bench.node_profile import Recording, start_recording, write_summary
from shuttle.bench.placement import cpu_ticks
from shuttle.bench.stream import process_cpu_s
from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.errors import ConfigError
from shuttle.net.profiles import parse_link_profile

#: Prefix of the data objects' keys (one per node).
DATA_PREFIX = "bench/mix-"


def _data_keys(bench: Bench, settings: MixSettings) -> list[str]:
    """One data object per node (client ``i`` reads node ``i mod nodes``'s): keys tried
    in order until each node holds one (rendezvous hashing decides where a key lives)."""
    node_ids = [n.node_id for n in bench.nodes]
    chosen: dict[str, str] = {}
    data = os.urandom(settings.object_bytes)
    plain = [NodeAddress(n.node_id, n.host, n.port) for n in bench.nodes]
    with Client(plain, key=bench.key) as c:
        for i in range(64 * len(node_ids)):
            key = f"{DATA_PREFIX}{i}"
            holder = c.node_for(key).node_id
            if holder in chosen:
                continue
            c.put(key, data)
            chosen[holder] = key
            if len(chosen) == len(node_ids):
                break
    if len(chosen) < len(node_ids):
        raise ConfigError(f"could not place a data object on every one of {node_ids}")
    ordered = [chosen[n] for n in node_ids]
    return [ordered[i % len(ordered)] for i in range(settings.clients)]


def _clients_cpu_s(client_pids: list[int]) -> float:
    """CPU seconds the clients and this process (which runs on their CPU) have used:
    /proc/PID/stat, which keeps the time of threads that ended (each pass's run-times)."""
    total = 0.0
    for pid in (os.getpid(), *client_pids):
        with contextlib.suppress(OSError):
            total += process_cpu_s(pid)
    return total


def _partition_probe(bench: Bench, client_pids: list[int]) -> Callable[[], dict[str, Any]]:
    """What :func:`~shuttle.bench.mix_cpus.partition` says of this bench's processes
    when called: the nodes' threads, and the clients' with this process's (the
    benchmark process runs on the clients' CPU and forked them)."""
    node_cpus = None if bench.node_cpu is None else frozenset({bench.node_cpu})
    client_cpus = None if bench.client_cpu is None else frozenset({bench.client_cpu})

    def probe() -> dict[str, Any]:
        nodes = {e.pid: threads_allowed(e.pid) for e in bench.cluster.nodes if e.pid is not None}
        clients = {pid: threads_allowed(pid) for pid in (os.getpid(), *client_pids)}
        return partition(nodes, clients, node_cpus, client_cpus)

    return probe


def _start_profiles(
    bench: Bench, settings: MixSettings, placement: str, run: int
) -> list[Recording]:
    """py-spy on every node for an adaptive pass when ``--profile-node`` asks (on the
    clients' CPU: its own CPU is not the node's); none otherwise."""
    if settings.profile_dir is None or placement != "adaptive":
        return []
    return [
        start_recording(
            e.pid,
            settings.profile_dir,
            f"run{run + 1}-adaptive-node{i + 1}",
            rate=settings.profile_rate,
            cpu=bench.client_cpu,
            native=settings.profile_native,
            gil=settings.profile_gil,
        )
        for i, e in enumerate(bench.cluster.nodes)
        if e.pid is not None
    ]


#: What of a pass's node profile summary goes into the report.
PROFILE_BRIEF = (
    "trace",
    "chunks",
    "py_spy_cpu_s",
    "py_spy_failed",
    "py_spy_said",
    "sampled_cpu_s",
    "cpu_s",
)


def _profile_brief(summary: dict[str, Any]) -> dict[str, Any]:
    """A pass's node profile in the report: its file, py-spy's cost, where the sampled
    CPU went (the full summary, per second and top functions, is beside the trace)."""
    return {k: summary[k] for k in PROFILE_BRIEF if k in summary}


def run_mix_benchmark(settings: MixSettings, progress: Progress) -> dict[str, Any]:
    """The placements ``runs`` times each, interleaved; see the module docstring."""
    settings.check()
    link = parse_link_profile(settings.link)
    # Every stack here is decided only once its calls have returned (docs/runtime.md,
    # "Many clients": a heavy filter's half-finished window showed it free).
    node_args = ["--window", str(settings.window_s), "--threshold", str(settings.threshold)]
    node_args.append("--settle-calls")
    if settings.threshold_share:
        node_args.append("--threshold-share")
    if settings.arrivals_max is not None:
        node_args += ["--arrivals-max", str(settings.arrivals_max)]
    if settings.arrivals_max_saturated is not None:
        node_args += ["--arrivals-max-saturated", str(settings.arrivals_max_saturated)]
    if settings.cpu_budget is not None:
        node_args += ["--cpu-budget", str(settings.cpu_budget)]
    if settings.cpu_budget_saturated is not None:
        node_args += ["--cpu-budget-saturated", str(settings.cpu_budget_saturated)]
    if settings.cpu_climb:
        node_args.append("--cpu-climb")
    if not settings.raise_hold:
        node_args.append("--no-raise-hold")
    if not settings.rank_by_node_cpu:
        node_args.append("--no-rank-by-node-cpu")
    if not settings.shed_by_freed_cpu:
        node_args.append("--no-shed-by-freed-cpu")
    if not settings.log_as_text:
        node_args.append("--log-as-dicts")
    if settings.scheduled_gc_s is not None:
        node_args += ["--scheduled-gc", str(settings.scheduled_gc_s)]
    placements = settings.placements()
    passes: dict[str, list[dict[str, Any]]] = {p: [] for p in placements}
    with bench_node(
        link,
        size_bytes=settings.block_bytes,
        nodes=settings.nodes,
        cpu_factor=settings.node_cpu_factor,
        node_args=node_args,
        client_cpu=settings.client_cpu,
        node_cpu=settings.node_cpu,
        pin=settings.pin,
    ) as bench:
        progress(f"writing the data and starting {settings.clients} client processes")
        setup = ClientSetup(
            tuple(bench.nodes), bench.key, tuple(_data_keys(bench, settings)), settings
        )
        with client_processes(setup) as (run_pass, client_pids):
            probe = _partition_probe(bench, client_pids)
            for run in range(settings.runs):
                # Every other run in the reverse order: on a machine whose load drifts
                # (others' runs starting), the first placement of a run is not always
                # the one that ran on the quieter machine.
                for placement in placements if run % 2 == 0 else placements[::-1]:
                    progress(f"run {run + 1}/{settings.runs}: {placement}")
                    cpu0, wall0 = node_cpu_s(bench), time.monotonic()
                    ticks0, clients0 = cpu_ticks(), _clients_cpu_s(client_pids)
                    logged = log_sizes(bench)
                    seconds = int(settings.duration_s + 0.999)
                    per_second = CpuTimeline(bench, seconds, probe)
                    profiling = _start_profiles(bench, settings, placement, run)
                    try:
                        results, attempts = run_pass(placement, run, per_second.started)
                    except BaseException:
                        for r in profiling:  # no py-spy left sampling a node torn down
                            r.stop()
                        raise
                    cpu1, wall1 = node_cpu_s(bench), time.monotonic()
                    profiles = [write_summary(r, r.stop(), per_second.t0) for r in profiling]
                    ticks1, clients1 = cpu_ticks(), _clients_cpu_s(client_pids)
                    report = pass_report(
                        results, settings, cpu1 - cpu0, wall1 - wall0, per_second.result()
                    )
                    # Each CPU's use over the pass and whether the node and the clients
                    # kept to their own CPUs while it ran (read as its first second
                    # ended): the emulation of separate machines, checked per pass.
                    # (A CPU's busy share counts whatever ran on it, the others' too;
                    # the clients' own is beside the node's own, node_cpu_busy.)
                    report["cpu_busy"] = cpu_busy(ticks0, ticks1, wall1 - wall0)
                    report["clients_cpu_busy"] = round(
                        (clients1 - clients0) / max(wall1 - wall0, 1e-9), 3
                    )
                    report["partition"] = per_second.probed
                    # Setups that failed before this pass started (a starved node:
                    # mix_clients.SETUP_ATTEMPTS); their time is in the pass's wall time.
                    report["setup_attempts"] = attempts
                    # The machine's 1-minute load average as the pass ended: what else
                    # ran beside the benchmark (it is shared), to read the figures by.
                    report["machine_load_1min"] = round(os.getloadavg()[0], 2)
                    if placement == "adaptive":
                        keep = (
                            None
                            if settings.logs_dir is None
                            else settings.logs_dir / f"run{run + 1}-adaptive"
                        )
                        report["decisions"] = decisions(bench, logged, wall1 - wall0, keep)
                    if profiles:
                        report["node_profile"] = [_profile_brief(p) for p in profiles]
                    passes[placement].append(report)
        placement_cpus = {"client_cpu": bench.client_cpu, "node_cpu": bench.node_cpu}
    return run_report(settings, passes, placement_cpus)
