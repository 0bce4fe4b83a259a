"""ABACUS 6.5 on the live system: adapting to contention over shared data, the
directory object.

Four clients each insert 200 files: into one shared directory (high contention), or
each into a directory of its own (low contention). Each client has its own run-time
and its own directory object, placed statically at the client, adaptive (starting at
the client), or statically at the directory's node. At the client, the optimistic
protocol over the node's isolation object makes conflicting inserts retry over the
network; at the node, the clients' objects take turns locally. The experiment reports
the time until all four are done, the retries per configuration (the paper's Table 1)
and, for the adaptive run, each client's cumulative inserts and retries over time
(Figure 11). Every run uses a fresh volume, so it starts from a cold cache.
"""

from __future__ import annotations

import functools
import secrets
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from shuttle.bench.abacus import PLACEMENTS, Bench, Progress, bench_node, migrations_of, summary
from shuttle.bench.session import run_clients
from shuttle.net.profiles import parse_link_profile
from shuttle.runtime.config import RuntimeConfig

CLIENTS = 4
FILES = 200
CONTENTION = ("high", "low")


@dataclass
class DirectorySettings:
    """Everything ``shuttle bench abacus directory`` takes as a flag."""

    links: tuple[str, ...] = ("lan", "san")
    runs: int = 3
    window_s: float = 0.25
    threshold: float = 0.3
    clients: int = CLIENTS
    files: int = FILES
    contention: tuple[str, ...] = CONTENTION
    client_cpu: int | None = None
    node_cpu: int | None = None


@dataclass
class ClientResult:
    elapsed_s: float
    retries: int
    conflicts: int
    where: str
    #: [[seconds since the start, inserts, retries], ...]
    timeline: list[list[float]] = field(default_factory=list)
    migrations: list[dict[str, Any]] = field(default_factory=list)


def run_inserts(
    bench: Bench,
    config: RuntimeConfig,
    placement: str,
    contention: str,
    settings: DirectorySettings,
) -> list[ClientResult]:
    """All clients at once, each through its own run-time and directory object."""
    volume = f"bench-{secrets.token_hex(6)}"  # a fresh namespace: a cold cache
    with bench.runtime(config) as rt:  # the directories, made before the clock starts
        setup = _directory(rt, volume, "static", None)
        if contention == "high":
            setup.mkdir("/shared")
        else:
            for i in range(settings.clients):
                setup.mkdir(f"/c{i}")
        rt.destroy(setup)
    out: list[ClientResult | None] = [None] * settings.clients
    errors: list[BaseException] = []
    barrier = threading.Barrier(settings.clients)
    t0 = time.time()

    def client(i: int) -> None:
        try:
            with bench.runtime(config) as rt:
                d = _directory(
                    rt,
                    volume,
                    "auto" if placement == "adaptive" else "static",
                    bench.node_id if placement == "server" else None,
                )
                parent = "/shared" if contention == "high" else f"/c{i}"
                barrier.wait()
                start = time.monotonic()
                wall0 = time.time()
                with rt.console("dir"):
                    for j in range(settings.files):
                        d.create(f"{parent}/c{i}-f{j:04d}", {"type": "file", "key": f"k{i}.{j}"})
                elapsed = time.monotonic() - start
                stats = d.stats()
                where = "client" if rt.where(d) == rt.id else "server"
                moves = migrations_of(rt, d, wall0)
                rt.destroy(d)
            out[i] = ClientResult(
                elapsed,
                int(stats["retries"]),
                int(stats["conflicts"]),
                where,
                [[round(t - t0, 3), n, r] for t, n, r in stats["timeline"]],
                moves,
            )
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    run_clients([functools.partial(client, i) for i in range(settings.clients)], barrier)
    if errors:
        raise errors[0]
    results = [r for r in out if r is not None]
    _check_listing(bench, config, volume, contention, settings)
    return results


def _directory(rt: Any, volume: str, placement: str, at: str | None) -> Any:
    nodes = [n.node_id for n in rt.nodes]
    return rt.create(
        "directory",
        at=at,
        placement=placement,
        volume=volume,
        isolations={n: rt.service(n, "isolation") for n in nodes},
    )


def _check_listing(
    bench: Bench, config: RuntimeConfig, volume: str, contention: str, settings: DirectorySettings
) -> None:
    """Every insert is there once: the benchmark measures a correct run only."""
    with bench.runtime(config) as rt:
        d = _directory(rt, volume, "static", None)
        parents = (
            ["/shared"] if contention == "high" else [f"/c{i}" for i in range(settings.clients)]
        )
        names = [name for p in parents for name, _ in d.listdir(p)]
        rt.destroy(d)
    expected = settings.clients * settings.files
    if len(names) != expected or len(set(names)) != expected:
        raise AssertionError(
            f"directory benchmark: {len(names)} entries ({len(set(names))} distinct) "
            f"after {expected} inserts"
        )


def run_directory_benchmark(settings: DirectorySettings, progress: Progress) -> dict[str, Any]:
    """Figure 10 and Table 1: each link and contention level, three placements."""
    config = RuntimeConfig(window_s=settings.window_s, threshold_fraction=settings.threshold)
    node_args = ["--window", str(settings.window_s), "--threshold", str(settings.threshold)]
    report: dict[str, Any] = {
        "experiment": "abacus-6.5-directory",
        "settings": asdict(settings),
        "cases": [],
    }
    for link_name in settings.links:
        link = parse_link_profile(link_name)
        with bench_node(
            link,
            size_bytes=0,
            node_args=node_args,
            client_cpu=settings.client_cpu,
            node_cpu=settings.node_cpu,
        ) as bench:
            for contention in settings.contention:
                runs: dict[str, list[list[ClientResult]]] = {p: [] for p in PLACEMENTS}
                for i in range(settings.runs):
                    for placement in PLACEMENTS:
                        progress(
                            f"{link_name} {contention} contention run {i + 1}/{settings.runs}: "
                            f"{placement}"
                        )
                        runs[placement].append(
                            run_inserts(bench, config, placement, contention, settings)
                        )
                report["cases"].append(_case(link_name, contention, runs))
    return report


def _case(link: str, contention: str, runs: dict[str, list[list[ClientResult]]]) -> dict[str, Any]:
    times = {p: [max(c.elapsed_s for c in run) for run in runs[p]] for p in PLACEMENTS}
    means = {p: statistics.fmean(times[p]) for p in PLACEMENTS}
    best = min(means["client"], means["server"])
    retries = {
        p: round(statistics.fmean(sum(c.retries for c in run) for run in runs[p]), 2)
        for p in PLACEMENTS
    }
    first = runs["adaptive"][0] if runs["adaptive"] else []
    return {
        "link": link,
        "contention": contention,
        "label": f"{contention} contention\n{link}",
        "placements": {p: summary(times[p]) for p in PLACEMENTS},
        "retries": retries,
        "adaptive_over_best_static": round(means["adaptive"] / best, 4),
        "better_static": "client" if means["client"] <= means["server"] else "server",
        "adaptive_where": [[c.where for c in run] for run in runs["adaptive"]],
        "adaptive_migrations": [[c.migrations for c in run] for run in runs["adaptive"]],
        "adaptive_timeline": [c.timeline for c in first],
        "target_met": means["adaptive"] <= 1.10 * best,
    }
