"""The mix benchmark's report: each pass's figures summed over its clients (calls per
second in the steady state and over the whole pass, per-second timelines of calls,
filters at the node and the node's CPU), and the JSON of a whole run: the placements'
throughput with its spread, adaptive against the better static placement and the
oracle split, per run, and the ceiling of the splits. The benchmark itself is
:mod:`shuttle.bench.mix`."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from shuttle.bench.abacus import ci90
from shuttle.bench.mix_settings import KINDS, PARTIAL_PREFIX, MixSettings


def pass_report(
    results: Sequence[dict[str, Any]],
    settings: MixSettings,
    node_cpu_s: float,
    wall_s: float,
    node_cpu_timeline: Sequence[float] = (),
) -> dict[str, Any]:
    steady_s = settings.duration_s - settings.warmup_s
    steady = {k: sum(r["steady"][k] for r in results) for k in KINDS}
    total = {k: sum(r["total"][k] for r in results) for k in KINDS}
    seconds = len(results[0]["timeline"]["cheap"])
    timeline = [sum(r["timeline"][k][i] for r in results for k in KINDS) for i in range(seconds)]
    return {
        "calls_per_s": round(sum(steady.values()) / steady_s, 3),
        "calls_per_s_whole": round(sum(total.values()) / settings.duration_s, 3),
        "steady_calls": steady,
        "total_calls": total,
        "timeline_calls_per_s": timeline,
        # Per second of the pass, the filters at the node as it ended (per kind), and
        # the node's CPU busy over it: what the throughput was made with.
        "timeline_at_server": {
            k: [sum(r["placed"][k][i] for r in results) for i in range(seconds)] for k in KINDS
        },
        "timeline_node_cpu_busy": [round(x, 3) for x in node_cpu_timeline],
        "at_server": {k: sum(1 for r in results if r["where"][k] == "server") for k in KINDS},
        "moves": {k: sum(r["moves"][k] for r in results) for k in KINDS},
        "node_cpu_busy": round(node_cpu_s / wall_s, 3) if wall_s > 0 else None,
    }


def stats(samples: Sequence[float]) -> dict[str, Any]:
    return {
        "mean": round(statistics.fmean(samples), 3),
        "ci90": round(ci90(samples), 3),
        "runs": [round(x, 3) for x in samples],
    }


def run_report(
    settings: MixSettings, passes: dict[str, list[dict[str, Any]]], cpus: dict[str, Any]
) -> dict[str, Any]:
    placements = tuple(passes)
    rates = {p: [x["calls_per_s"] for x in passes[p]] for p in placements}
    means = {p: statistics.fmean(rates[p]) for p in placements}
    better = "client" if means["client"] >= means["server"] else "server"
    # Per run (the passes of a run are neighbours in time): adaptive over the better
    # static of that run, so drift between runs does not enter the ratio.
    per_run = [
        rates["adaptive"][i] / max(rates["client"][i], rates["server"][i], 1e-9)
        for i in range(settings.runs)
    ]
    last = passes["adaptive"][-1]
    n = settings.clients
    out: dict[str, Any] = {
        "experiment": "abacus-mix",
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()},
        "cpus": cpus,
        "paper": {
            "source": "Bhardwaj, Kulkarni, Stutsman, Adaptive Placement for In-memory "
            "Storage Functions, USENIX ATC 2020",
            "adaptive_over_server": 1.85,
            "adaptive_over_client": 1.10,
        },
        "throughput": {p: round(means[p], 3) for p in placements},
        "throughput_runs": {p: stats(rates[p]) for p in placements},
        "better_static": better,
        "adaptive_over_client": round(means["adaptive"] / max(means["client"], 1e-9), 3),
        "adaptive_over_server": round(means["adaptive"] / max(means["server"], 1e-9), 3),
        "adaptive_over_better_static": round(means["adaptive"] / max(means[better], 1e-9), 3),
        "adaptive_over_better_static_per_run": [round(x, 3) for x in per_run],
        "target_met": means["adaptive"] >= 1.10 * means[better],
        # Where each kind ended in the last adaptive pass: filters at the node, of n.
        "final_placement": {
            k: {"server": last["at_server"][k], "client": n - last["at_server"][k]} for k in KINDS
        },
        "passes": passes,
    }
    if "split" in passes:
        # The oracle: what the right placement gives here, per run against the better
        # static of the same run (the ceiling), and adaptive against it.
        out["split_over_better_static_per_run"] = [
            round(rates["split"][i] / max(rates["client"][i], rates["server"][i], 1e-9), 3)
            for i in range(settings.runs)
        ]
        out["split_over_better_static"] = round(means["split"] / max(means[better], 1e-9), 3)
        out["adaptive_over_split"] = round(means["adaptive"] / max(means["split"], 1e-9), 3)
        out["adaptive_over_split_per_run"] = [
            round(rates["adaptive"][i] / max(rates["split"][i], 1e-9), 3)
            for i in range(settings.runs)
        ]
    splits = [p for p in placements if p == "split" or p.startswith(PARTIAL_PREFIX)]
    if splits:
        out["ceiling"] = ceiling(rates, splits, settings.runs)
    out["spread"] = spread(out)
    return out


#: The per-run ratios :func:`spread` summarises: its key, and where the run's JSON
#: keeps the list.
RATIOS = (
    ("adaptive_over_better_static", ("adaptive_over_better_static_per_run",)),
    ("best_split_over_better_static", ("ceiling", "over_better_static_per_run")),
    ("adaptive_over_best_split", ("ceiling", "adaptive_over_ceiling_per_run")),
)


def spread(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each per-run ratio across the runs: mean, 90 % CI of the mean, min and max.
    Several interleaved runs per cell are what can tell two rules apart (two idle
    runs of one static placement differed by 1.33x, more than the budgets
    compared); the spread says how far apart two cells' ratios must be to mean it."""
    out: dict[str, dict[str, Any]] = {}
    for name, path in RATIOS:
        node: Any = report
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if not node:
            continue
        out[name] = {
            **stats(node),
            "min": round(min(node), 3),
            "max": round(max(node), 3),
        }
    return out


def ceiling(rates: dict[str, list[float]], splits: Sequence[str], runs: int) -> dict[str, Any]:
    """The best static split of each run (``split`` or a ``split-K``): the ceiling, per
    run against the better uniform placement of the same run, and adaptive against it.
    Per run, because the passes of a run are neighbours in time."""
    best = [max(splits, key=lambda p: rates[p][i]) for i in range(runs)]
    uniform = [max(rates["client"][i], rates["server"][i], 1e-9) for i in range(runs)]
    return {
        "placement_per_run": best,
        "calls_per_s_per_run": [round(rates[p][i], 3) for i, p in enumerate(best)],
        "over_better_static_per_run": [
            round(rates[p][i] / uniform[i], 3) for i, p in enumerate(best)
        ],
        "adaptive_over_ceiling_per_run": [
            round(rates["adaptive"][i] / max(rates[p][i], 1e-9), 3) for i, p in enumerate(best)
        ],
    }
