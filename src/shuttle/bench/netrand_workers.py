"""``shuttle bench netrand --workers 1,2``: what more processes per node give.

One node per count in ``--workers`` (``shuttle serve --workers N``: N processes on
one port, docs/architecture.md "Workers"), each holding the same file. ``--clients``
client processes per node (forked once, each with its own connections, so the
kernel spreads them over the node's processes) read random 4 KiB pages of the
file's first half, all warm (a first pass, untimed, reads them in). The clients
are pinned to one CPU (``--cpu``, default the highest allowed); the nodes are not,
so a node with more processes may use the other CPUs.

Passes are interleaved: in every round each node gets one pass of ``--pages`` pages
per client, in an order that alternates between rounds, so drift on a shared
machine falls on every count alike; the report gives each count's pages/s per round,
their median, and the ratio to the first count *within each round* (median, min,
max: the noise). Each pass also records where the CPU went (the profile that says
why a count gives what it gives): CPU seconds of the node's processes and of the
clients over the pass's wall time (cores used), and how busy each CPU of the
machine was (everyone's load, the other users' included).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuttle.bench.netrand_summary import summarize
from shuttle.bench.nodes import bench_client
from shuttle.bench.placement import default_cpu, pinned
from shuttle.client.client import Client
from shuttle.errors import ConfigError

#: How long a pass may take before the benchmark gives up on its clients.
PASS_TIMEOUT_S = 600.0
KEY = "bench/netrand-workers.dat"


def parse_workers(value: str) -> tuple[int, ...]:
    """``"1,2"`` → ``(1, 2)``: the process counts to compare, the first the anchor."""
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise ConfigError(
                f"--workers takes process counts like 1,2; {part!r} is not a number"
            ) from None
        if not 1 <= n <= 64:
            raise ConfigError(f"--workers: {n} is out of range; use 1 to 64")
        out.append(n)
    if len(out) < 2 or len(set(out)) != len(out):
        raise ConfigError(
            "--workers compares nodes: give two or more different counts, the anchor first "
            "(e.g. --workers 1,2)"
        )
    return tuple(out)


@dataclass(frozen=True)
class WorkersConfig:
    workers: tuple[int, ...]
    clients: int = 8
    pages: int = 400
    rounds: int = 10
    file_bytes: int = 64 << 20
    page_bytes: int = 4096
    seed: int = 1
    cpu: int | None = None
    #: The nodes' CPU speed factor (0.25: each request costs four times the CPU, a
    #: node slower than its clients: the case where more node processes can pay).
    cpu_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.clients < 1 or self.pages < 1 or self.rounds < 1:
            raise ConfigError("--clients, --pages and --rounds must be positive")
        if self.file_bytes < 2 * self.page_bytes:
            raise ConfigError(f"--file-bytes must be at least two pages ({2 * self.page_bytes})")


def cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has run so far (all its threads; 0 if gone), from the
    scheduler's nanosecond count (``/proc/PID/task/*/schedstat``): a pass is a second
    or two, in which the 10 ms ticks of ``/proc/PID/stat`` would be too coarse."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total / 1e9


def cpu_busy() -> dict[int, tuple[int, int]]:
    """Per CPU: (busy ticks, all ticks) since boot, from /proc/stat."""
    out: dict[int, tuple[int, int]] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu":
            continue
        ticks = [int(x) for x in rest.split()]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
        out[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return out


def _client(
    client: Client,
    pages: list[list[int]],
    page_bytes: int,
    barrier: Any,
    results: multiprocessing.connection.Connection,
) -> None:
    """One forked client: a pass of ``pages[r]`` in round r, between barriers."""
    client.after_fork_in_child()
    out: list[tuple[list[int], float, float]] = []
    try:
        clock = time.perf_counter_ns
        for plan in pages:
            barrier.wait(PASS_TIMEOUT_S)
            lat: list[int] = []
            start = time.time()
            for page in plan:
                t = clock()
                data = client.read(KEY, page * page_bytes, page_bytes)
                lat.append(clock() - t)
                if len(data) != page_bytes:
                    raise AssertionError(f"page {page}: got {len(data)} bytes")
            out.append((lat, start, time.time()))
            barrier.wait(PASS_TIMEOUT_S)
        client.close()
        results.send(out)
    except BaseException as exc:  # the parent reports it
        results.send({"error": f"{type(exc).__name__}: {exc}"})
        barrier.abort()
    finally:
        results.close()


@dataclass
class _Fleet:
    """One node's clients: forked once, driven pass by pass."""

    count: int
    node_pids: list[int]
    barrier: Any
    procs: list[Any]
    pipes: list[multiprocessing.connection.Connection]


def _node_pids(client: Client) -> list[int]:
    """Every process of the client's node (its ``node.stats``), or [] for one process."""
    workers = client.node_stats(client.nodes[0]).get("workers")
    return [int(p) for p in workers["pids"]] if workers else []


def run(config: WorkersConfig, progress: Any = lambda _: None) -> dict[str, Any]:
    """Run the comparison; returns the report (see the module docstring)."""
    ctx = multiprocessing.get_context("fork")
    half = max(1, (config.file_bytes // config.page_bytes) // 2)
    with contextlib.ExitStack() as stack:
        clients: dict[int, Client] = {}
        pids: dict[int, list[int]] = {}
        for count in config.workers:
            node_pids: list[int] = []
            client, scratch = stack.enter_context(
                bench_client(
                    None,
                    cache_bytes=0,
                    cpu_factor=config.cpu_factor,
                    node_args=["--workers", str(count)],
                    node_pids=node_pids,
                )
            )
            path = scratch / "netrand.dat"
            if not path.exists():
                with open(path, "wb") as f:
                    f.write(os.urandom(config.file_bytes))
            progress(
                f"putting {config.file_bytes >> 20} MiB into the node with {count} process(es)"
            )
            client.put(KEY, path)
            clients[count] = client
            found = _node_pids(client)
            pids[count] = found if found else node_pids
        cpu = config.cpu if config.cpu is not None else default_cpu()
        plans = {
            i: [
                [
                    random.Random(config.seed * 7919 + i * 131 + r).randrange(half)
                    for _ in range(config.pages)
                ]
                for r in range(config.rounds)
            ]
            for i in range(config.clients)
        }
        fleets: dict[int, _Fleet] = {}
        with pinned(cpu):
            for count, client in clients.items():
                progress(f"warming the node with {count} process(es)")
                for page in range(half):
                    client.read(KEY, page * config.page_bytes, config.page_bytes)
                barrier = ctx.Barrier(config.clients + 1)
                procs, pipes = [], []
                for i in range(config.clients):
                    receive, send = ctx.Pipe(duplex=False)
                    proc = ctx.Process(
                        target=_client,
                        args=(client, plans[i], config.page_bytes, barrier, send),
                        daemon=True,
                    )
                    proc.start()
                    send.close()
                    procs.append(proc)
                    pipes.append(receive)
                fleets[count] = _Fleet(count, pids[count], barrier, procs, pipes)
            stack.callback(_stop_fleets, list(fleets.values()))
            profiles: dict[int, list[dict[str, Any]]] = {c: [] for c in config.workers}
            order = list(config.workers)
            for rnd in range(config.rounds):
                progress(f"round {rnd + 1}/{config.rounds}")
                for count in order if rnd % 2 == 0 else reversed(order):
                    profiles[count].append(_pass(fleets[count]))
            outputs = {c: _collect(f) for c, f in fleets.items()}
    return _report(config, cpu, outputs, profiles)


def _plan(config: WorkersConfig, client: int, half: int) -> list[list[int]]:
    """Client ``client``'s pages, round by round (the same for every node)."""
    rng = random.Random(config.seed * 1000 + client)
    return [[rng.randrange(half) for _ in range(config.pages)] for _ in range(config.rounds)]


def _pass(fleet: _Fleet) -> dict[str, Any]:
    """One pass of a fleet's clients, with where the CPU went meanwhile."""
    client_pids = [p.pid for p in fleet.procs]
    node0 = [cpu_seconds(p) for p in fleet.node_pids]
    clients0 = sum(cpu_seconds(p) for p in client_pids)
    busy0 = cpu_busy()
    t0 = time.perf_counter()
    fleet.barrier.wait(PASS_TIMEOUT_S)  # go
    fleet.barrier.wait(PASS_TIMEOUT_S)  # all done
    wall = time.perf_counter() - t0
    busy1 = cpu_busy()
    node_s = [cpu_seconds(p) - before for p, before in zip(fleet.node_pids, node0, strict=True)]
    client_s = sum(cpu_seconds(p) for p in client_pids) - clients0
    return {
        "wall_s": wall,
        "node_cores": sum(node_s) / wall,
        # Per process of the node (the primary first): how the load was shared.
        "node_cores_by_process": [round(s / wall, 3) for s in node_s],
        "client_cores": client_s / wall,
        "node_cpu_s": sum(node_s),
        "client_cpu_s": client_s,
        "cpu_busy": {
            str(c): round((busy1[c][0] - busy0[c][0]) / max(1, busy1[c][1] - busy0[c][1]), 3)
            for c in busy1
            if c in busy0
        },
    }


def _collect(fleet: _Fleet) -> list[Any]:
    outs = [p.recv() if p.poll(PASS_TIMEOUT_S) else {"error": "no answer"} for p in fleet.pipes]
    for proc in fleet.procs:
        proc.join(PASS_TIMEOUT_S)
    errors = [o["error"] for o in outs if isinstance(o, dict)]
    if errors:
        raise RuntimeError(f"{len(errors)} benchmark clients failed; first: {errors[0]}")
    return outs


def _stop_fleets(fleets: list[_Fleet]) -> None:
    for fleet in fleets:
        with contextlib.suppress(Exception):
            fleet.barrier.abort()
        for proc in fleet.procs:
            if proc.is_alive():
                proc.kill()


def _report(
    config: WorkersConfig,
    cpu: int,
    outputs: dict[int, list[Any]],
    profiles: dict[int, list[dict[str, Any]]],
) -> dict[str, Any]:
    by_count: dict[str, Any] = {}
    rates: dict[int, list[float]] = {}
    for count, outs in outputs.items():
        passes = []
        for rnd in range(config.rounds):
            got = [o[rnd] for o in outs]
            passes.append(
                summarize(
                    [x for lat, _, _ in got for x in lat],
                    [s for _, s, _ in got],
                    [e for _, _, e in got],
                )
            )
        rates[count] = [p["pages_per_s"] for p in passes]
        prof = profiles[count]
        for one, summary in zip(prof, passes, strict=True):
            # CPU per page: what decides throughput once the CPUs are the limit, and
            # steadier than pages/s when others load the machine.
            one["node_cpu_us_per_page"] = one["node_cpu_s"] * 1e6 / summary["requests"]
            one["client_cpu_us_per_page"] = one["client_cpu_s"] * 1e6 / summary["requests"]
        by_count[str(count)] = {
            "pages_per_s": rates[count],
            "pages_per_s_median": statistics.median(rates[count]),
            "p50_us_median": statistics.median(p["p50_us"] for p in passes),
            "p99_us_median": statistics.median(p["p99_us"] for p in passes),
            "node_cores_median": statistics.median(p["node_cores"] for p in prof),
            "client_cores_median": statistics.median(p["client_cores"] for p in prof),
            "node_cpu_us_per_page_median": statistics.median(
                p["node_cpu_us_per_page"] for p in prof
            ),
            "client_cpu_us_per_page_median": statistics.median(
                p["client_cpu_us_per_page"] for p in prof
            ),
            "cpu_busy_median": statistics.median(
                statistics.fmean(p["cpu_busy"].values()) for p in prof
            ),
            "profile": prof,
        }
    anchor = config.workers[0]
    ratios: dict[str, Any] = {}
    for count in config.workers[1:]:
        per_round = [b / a for a, b in zip(rates[anchor], rates[count], strict=True)]
        ratios[f"{count}_over_{anchor}"] = {
            "per_round": per_round,
            "median": statistics.median(per_round),
            "min": min(per_round),
            "max": max(per_round),
        }
    return {
        "config": {
            "workers": list(config.workers),
            "clients": config.clients,
            "pages": config.pages,
            "rounds": config.rounds,
            "file_bytes": config.file_bytes,
            "seed": config.seed,
            "cpu_factor": config.cpu_factor,
        },
        "placement": {"clients_cpu": cpu, "nodes": "unpinned", "cpus": os.cpu_count()},
        "by_workers": by_count,
        "ratios": ratios,
    }
