"""ABACUS 6.7, adapting to competition over resources, on the live system.

Two filters read a 32 MB object over the LAN from one client: filter 1 passes 60 %
of what it reads (selectivity 40 %), filter 2 passes 30 % (selectivity 70 %). The
node lends memory for one filter only (``--object-memory``), so they compete for its
single slot. Filter 1 starts alone; filter 2 starts ``delay_s`` later. Both share the
client's link to the node, as two applications on one LAN client do.

Three ways, as everywhere: both static at the client; static "server" (first come,
first served: filter 1 takes the slot and keeps it, filter 2 stays at the client);
adaptive (both start at the client). The paper's Figure 12 plots cumulative blocks
searched by each filter over time with the migrations; the run's time is until both
are done.
"""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from shuttle.bench.abacus import (
    CPU_RATIO_LOW,
    FILTER_MEMORY_BYTES,
    PLACEMENTS,
    Bench,
    FilterRun,
    Progress,
    bench_node,
    cpu_s_per_mb,
    run_filter,
    summary,
)
from shuttle.bench.session import run_clients
from shuttle.net.profiles import parse_link_profile
from shuttle.runtime.config import RuntimeConfig

PAPER = (
    "Filter 1 (less selective) starts first and is soon migrated to the server; "
    "shortly after filter 2 (more selective) starts, ABACUS moves filter 2 to the "
    "server and sends filter 1 back to its client. The filter at the server runs "
    "faster; filter 2 gains more from it. Migrations come after a noticeable delay "
    "because ABACUS's clients did not push their statistics."
)


@dataclass
class CompetitionSettings:
    size_bytes: int = 32 << 20
    link: str = "lan"
    runs: int = 3
    window_s: float = 1.0
    threshold: float = 0.3
    block_bytes: int = 64 << 10
    #: Selectivities (1 - pass fraction) of filter 1 and filter 2.
    selectivity_1: float = 0.4
    selectivity_2: float = 0.7
    cpu_ratio: float = CPU_RATIO_LOW
    #: Seconds after filter 1 that filter 2 starts.
    delay_s: float = 6.0
    client_cpu: int | None = None
    node_cpu: int | None = None


def _one(
    bench: Bench, settings: CompetitionSettings, placement: str, per_mb: float
) -> dict[str, Any]:
    """One run: both filters, placed as ``placement``; returns their traces."""
    config = RuntimeConfig(window_s=settings.window_s, threshold_fraction=settings.threshold)
    placements = {
        "client": ("client", "client"),
        "server": ("server", "client"),  # the slot goes to whoever comes first
        "adaptive": ("adaptive", "adaptive"),
    }[placement]
    results: dict[int, FilterRun] = {}
    errors: list[BaseException] = []
    with bench.runtime(config) as rt:
        t0, wall0 = time.monotonic(), time.time()

        def go(i: int, where: str, selectivity: float, delay: float) -> None:
            try:
                if delay:
                    time.sleep(delay)  # the second application starts later
                results[i] = run_filter(
                    rt,
                    bench,
                    where,
                    pass_fraction=1 - selectivity,
                    cpu_per_mb=per_mb,
                    block_bytes=settings.block_bytes,
                    name=f"filter{i}",
                    t0=t0,
                    wall0=wall0,
                )
            except BaseException as exc:
                errors.append(exc)

        run_clients(
            [
                functools.partial(go, 1, placements[0], settings.selectivity_1, 0.0),
                functools.partial(go, 2, placements[1], settings.selectivity_2, settings.delay_s),
            ]
        )
        elapsed = time.monotonic() - t0
    if errors:
        raise errors[0]
    return {
        "elapsed_s": elapsed,
        "filters": {
            str(i): {
                "elapsed_s": round(r.elapsed_s, 4),
                "blocks": r.blocks,
                "final": r.final,
                "migrations": r.migrations,
                "trace": r.trace,
            }
            for i, r in sorted(results.items())
        },
    }


def run_competition_benchmark(settings: CompetitionSettings, progress: Progress) -> dict[str, Any]:
    link = parse_link_profile(settings.link)
    per_mb = cpu_s_per_mb(settings.cpu_ratio, link)
    # Room for one filter: more than one filter's memory, less than two.
    room = FILTER_MEMORY_BYTES + FILTER_MEMORY_BYTES // 2
    node_args = [
        "--window",
        str(settings.window_s),
        "--threshold",
        str(settings.threshold),
        "--object-memory",
        str(room),
    ]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PLACEMENTS}
    with bench_node(
        link,
        size_bytes=settings.size_bytes,
        node_args=node_args,
        client_cpu=settings.client_cpu,
        node_cpu=settings.node_cpu,
    ) as bench:
        for i in range(settings.runs):
            for placement in PLACEMENTS:
                progress(f"run {i + 1}/{settings.runs}: {placement}")
                runs[placement].append(_one(bench, settings, placement, per_mb))
    means = {p: statistics.fmean(r["elapsed_s"] for r in runs[p]) for p in PLACEMENTS}
    adaptive_final = [
        {f: run["filters"][f]["final"] for f in run["filters"]} for run in runs["adaptive"]
    ]
    return {
        "experiment": "abacus-6.7-competition",
        "settings": asdict(settings),
        "cpu_s_per_mb": round(per_mb, 5),
        "object_memory_bytes": room,
        "paper": PAPER,
        "placements": {p: summary([r["elapsed_s"] for r in runs[p]]) for p in PLACEMENTS},
        "adaptive_final": adaptive_final,
        "more_selective_ends_at_server": all(f["2"].startswith("server") for f in adaptive_final),
        "adaptive_beats_both_static": means["adaptive"] < min(means["client"], means["server"]),
        "runs": runs,
    }
