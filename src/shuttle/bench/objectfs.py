"""ABACUS's file-system experiments on the live system: 6.4 (data access patterns,
the cache object) and 6.6 (application phases), over the object-based file system
(:mod:`shuttle.objects.fs`).

A *table* file of 192 KB in 8 KB blocks takes 128-byte records: *insert* writes
1,500 records at random slots, *scan* reads 1,500 records at random slots. The
file's stack is ``file`` (static at the client: the application's interface) over
``cache`` over the node's ``isolation`` object; the cache object is placed three
ways, as the paper's bars: statically at the client, adaptive (starting at the
client), statically at the node. Before timing, the table is read once so the
cache is warm (the paper ran each experiment once to warm it).

**Scale.** Today's CPUs make each insert some 5-10× shorter than on the paper's
300 MHz machines while the emulated links keep the paper's speeds, so a phase lasts
a few seconds instead of tens. The run-time's window ``H`` is scaled with it
(default 0.25 s, the paper's 1 s divided by the speed-up of a phase), so that a
phase is as many windows long as in the paper: adaptation that takes a few windows
costs the same share of a run.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from shuttle.bench.abacus import PLACEMENTS, Bench, Progress, bench_node, migrations_of, summary
from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.errors import ConfigError
from shuttle.net.profiles import parse_link_profile
from shuttle.runtime.client import Runtime
from shuttle.runtime.config import RuntimeConfig

#: The table file of ABACUS 6.4.
TABLE_KEY = "bench/objectfs/table"
TABLE_BYTES = 192 << 10
RECORD_BYTES = 128
RECORDS = 1500
CACHE_BLOCK_BYTES = 8192
#: The window H for these experiments (module docstring: scaled with the phases).
WINDOW_S_DEFAULT = 0.25
PHASES = ("insert", "scan")


@dataclass
class TableSettings:
    """Everything ``shuttle bench abacus cache|phases`` takes as a flag."""

    links: tuple[str, ...] = ("lan", "san")
    runs: int = 3
    window_s: float = WINDOW_S_DEFAULT
    threshold: float = 0.3
    records: int = RECORDS
    record_bytes: int = RECORD_BYTES
    table_bytes: int = TABLE_BYTES
    block_bytes: int = CACHE_BLOCK_BYTES
    #: The phases of one run (6.4 runs each alone; 6.6 runs insert, scan, insert, scan).
    phases: tuple[str, ...] = ("insert",)
    seed: int = 1
    client_cpu: int | None = None
    node_cpu: int | None = None

    def __post_init__(self) -> None:
        bad = [p for p in self.phases if p not in PHASES]
        if bad or not self.phases:
            raise ConfigError(f"phases are {' and '.join(PHASES)}, got {', '.join(self.phases)}")
        if self.table_bytes < self.record_bytes or self.table_bytes % self.record_bytes:
            raise ConfigError(
                f"the table ({self.table_bytes} B) must hold a whole number of "
                f"{self.record_bytes}-byte records"
            )


@dataclass
class PhaseRun:
    """One run of a sequence of phases."""

    #: Seconds each phase took.
    phase_s: list[float]
    #: Where the cache was at the end of each phase.
    where: list[str]
    migrations: list[dict[str, Any]] = field(default_factory=list)
    #: (seconds since start, operations done) every 50 operations.
    trace: list[tuple[float, int]] = field(default_factory=list)

    @property
    def elapsed_s(self) -> float:
        return sum(self.phase_s)


def make_table(bench: Bench, settings: TableSettings) -> None:
    addresses = [NodeAddress(n.node_id, n.host, n.port) for n in bench.nodes]
    with Client(addresses, key=bench.key) as c:
        c.put(TABLE_KEY, bytes(settings.table_bytes))


def run_table(
    rt: Runtime, bench: Bench, placement: str, settings: TableSettings, rng: random.Random
) -> PhaseRun:
    """The phases of ``settings`` with the cache placed as ``placement``."""
    node = bench.node_id
    cache = rt.create(
        "cache",
        at=node if placement == "server" else None,
        placement="auto" if placement == "adaptive" else "static",
        isolation=rt.service(node, "isolation"),
        key=TABLE_KEY,
        block_bytes=settings.block_bytes,
    )
    file = rt.create("file", placement="static", backing=cache, key=TABLE_KEY)
    slots = settings.table_bytes // settings.record_bytes
    run = PhaseRun([], [])
    with rt.console("table"):
        file.read(0, settings.table_bytes)  # warm the cache
        start = time.monotonic()
        wall0 = time.time()
        done = 0
        for phase in settings.phases:
            t = time.monotonic()
            for _ in range(settings.records):
                offset = rng.randrange(slots) * settings.record_bytes
                if phase == "insert":
                    file.write(offset, rng.randbytes(settings.record_bytes))
                else:
                    file.read(offset, settings.record_bytes)
                done += 1
                if done % 50 == 0:
                    run.trace.append((round(time.monotonic() - start, 4), done))
            run.phase_s.append(time.monotonic() - t)
            run.where.append(_side(rt, cache))
    run.migrations = migrations_of(rt, cache, wall0)
    rt.destroy(file)
    rt.destroy(cache)
    return run


def _side(rt: Runtime, ref: Any) -> str:
    return "client" if rt.where(ref) == rt.id else "server"


def run_table_benchmark(
    settings: TableSettings, progress: Progress, experiment: str
) -> dict[str, Any]:
    """Each link, each placement, ``runs`` times (interleaved)."""
    config = RuntimeConfig(window_s=settings.window_s, threshold_fraction=settings.threshold)
    node_args = ["--window", str(settings.window_s), "--threshold", str(settings.threshold)]
    report: dict[str, Any] = {
        "experiment": experiment,
        "settings": asdict(settings),
        "links": [],
    }
    rng = random.Random(settings.seed)
    for link_name in settings.links:
        link = parse_link_profile(link_name)
        with bench_node(
            link,
            size_bytes=0,
            node_args=node_args,
            client_cpu=settings.client_cpu,
            node_cpu=settings.node_cpu,
        ) as bench:
            make_table(bench, settings)
            runs: dict[str, list[PhaseRun]] = {p: [] for p in PLACEMENTS}
            for i in range(settings.runs):
                for placement in PLACEMENTS:
                    progress(f"{link_name} run {i + 1}/{settings.runs}: {placement}")
                    with bench.runtime(config) as rt:
                        runs[placement].append(run_table(rt, bench, placement, settings, rng))
        report["links"].append(_link_report(link_name, link, runs, settings))
    return report


def _link_report(
    name: str, link: Any, runs: dict[str, list[PhaseRun]], settings: TableSettings
) -> dict[str, Any]:
    phases = list(settings.phases)
    per_phase = {
        p: [summary([r.phase_s[i] for r in runs[p]]) for i in range(len(phases))]
        for p in PLACEMENTS
    }
    totals = {p: statistics.fmean(r.elapsed_s for r in runs[p]) for p in PLACEMENTS}
    # The per-phase optimum: the better static placement for each phase (Table 2).
    optimal = sum(
        min(per_phase["client"][i]["mean_s"], per_phase["server"][i]["mean_s"])
        for i in range(len(phases))
    )
    best_static = min(totals["client"], totals["server"])
    return {
        "link": name,
        "bandwidth_bits_per_s": link.bandwidth_bits_per_s,
        "latency_s": link.latency_s,
        "phases": phases,
        "placements": {p: summary([r.elapsed_s for r in runs[p]]) for p in PLACEMENTS},
        "per_phase": per_phase,
        "optimal_s": round(optimal, 4),
        "adaptive_over_best_static": round(totals["adaptive"] / best_static, 4),
        "adaptive_over_optimal": round(totals["adaptive"] / optimal, 4),
        "better_static": "client" if totals["client"] <= totals["server"] else "server",
        "adaptive_where": [r.where for r in runs["adaptive"]],
        "adaptive_migrations": [r.migrations for r in runs["adaptive"]],
        "adaptive_trace": runs["adaptive"][0].trace if runs["adaptive"] else [],
    }


def phase_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Per link: is adaptive within 1.3× of the per-phase optimum and faster than both
    static placements (the issue's targets for 6.6)?"""
    out = []
    for link in report["links"]:
        means = {p: link["placements"][p]["mean_s"] for p in PLACEMENTS}
        out.append(
            {
                "link": link["link"],
                "within_1_3_of_optimal": link["adaptive_over_optimal"] <= 1.3,
                "faster_than_both_static": means["adaptive"]
                < min(means["client"], means["server"]),
            }
        )
    return out


def single_phase_settings(phase: str, base: TableSettings) -> TableSettings:
    return TableSettings(**{**asdict(base), "phases": (phase,)})


def run_cache_benchmark(settings: TableSettings, progress: Progress) -> dict[str, Any]:
    """Figure 8: insert and scan, each alone, on each link."""
    report: dict[str, Any] = {"experiment": "abacus-6.4-cache", "workloads": []}
    for phase in PHASES:
        one = single_phase_settings(phase, settings)

        def say(message: str, phase: str = phase) -> None:
            progress(f"{phase}: {message}")

        sub = run_table_benchmark(one, say, phase)
        report["workloads"].append({"workload": phase, "links": sub["links"]})
        report["settings"] = {k: v for k, v in sub["settings"].items() if k != "phases"}
    return report
