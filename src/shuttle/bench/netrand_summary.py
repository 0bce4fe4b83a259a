"""What ``netrand --clients`` makes of its clients' samples: each pass's figures (its
slices pooled), each slice's, the slice pairs' ratios and their spread.

A client sends back, per pass it took part in, one sample per slice: its latencies
(ns), when it started and finished the slice (``time.time``) and the CPU seconds it
used (:func:`shuttle.bench.netrand_clients.run_clients`). A pass's throughput is its
requests over the sum of its slices' times, each from its first client's start to its
last client's finish; its percentiles are of all its requests.
"""

from __future__ import annotations

import statistics
from typing import Any

#: What the passes report: a mixed pass reports its warm and its cold readers apart,
#: and both together.
RESULTS = (
    "remote_cold",
    "remote_warm",
    "mixed_warm",
    "mixed_cold",
    "mixed",
    "mixed_paged_warm",
    "mixed_paged_cold",
    "mixed_paged",
    "redis",
)
#: The readers each compared with Redis (``NAME_over_redis``): every result but the
#: mixed passes' totals and Redis itself.
OVER_REDIS = tuple(name for name in RESULTS if name not in ("mixed", "mixed_paged", "redis"))


def _percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e3


def summarize(
    latencies_ns: list[int], started: list[float], finished: list[float]
) -> dict[str, Any]:
    """One pass of all clients: throughput over the pass and the latency percentiles."""
    return summarize_slices([(latencies_ns, started, finished)])


def summarize_slices(slices: list[tuple[list[int], list[float], list[float]]]) -> dict[str, Any]:
    """A pass made of slices (each: every client's latencies, starts and finishes):
    throughput over the slices' time (each from its first start to its last finish)
    and the latency percentiles of all their requests."""
    lat = sorted(x for latencies, _, _ in slices for x in latencies)
    if not lat:
        return {}
    elapsed_s = sum(max(finished) - min(started) for _, started, finished in slices)
    return {
        "requests": len(lat),
        "elapsed_s": elapsed_s,
        "pages_per_s": len(lat) / elapsed_s if elapsed_s > 0 else 0.0,
        "p50_us": _percentile(lat, 0.50),
        "p99_us": _percentile(lat, 0.99),
        "max_us": lat[-1] / 1e3,
    }


def spread(values: list[float]) -> dict[str, float]:
    """The median, lowest and highest of ``values``, and their range as a percentage
    of the median (how far one slice's figure may sit from another's)."""
    ordered = sorted(values)
    mid = statistics.median(ordered)
    return {
        "median": mid,
        "min": ordered[0],
        "max": ordered[-1],
        "range_pct": 100.0 * (ordered[-1] - ordered[0]) / mid if mid else 0.0,
    }


def summaries(report: dict[str, Any], outputs: list[dict[str, Any]]) -> None:
    """Every pass's figures (its slices pooled), each slice's, and the ratios."""
    slice_figures: dict[str, list[dict[str, Any]]] = {}
    for name in RESULTS:
        # A mixed pass as a whole: its warm and its cold readers' samples together.
        parts = (name + "_warm", name + "_cold") if name in ("mixed", "mixed_paged") else (name,)
        got = [o[part] for o in outputs for part in parts if part in o]
        if not got:
            continue
        slices = [
            (
                [x for runs in got for x in runs[i][0]],
                [runs[i][1] for runs in got],
                [runs[i][2] for runs in got],
            )
            for i in range(min(len(runs) for runs in got))
        ]
        report[name] = summarize_slices(slices)
        cpu_s = sum(run[3] for runs in got for run in runs)
        report[name]["client_cpu_us_per_req"] = cpu_s * 1e6 / report[name]["requests"]
        if len(slices) > 1:
            slice_figures[name] = [summarize_slices([one]) for one in slices]
    warm_slices = slice_figures.get("remote_warm")
    redis_slices = slice_figures.get("redis")
    paged_slices = slice_figures.get("mixed_paged")
    if warm_slices and redis_slices:
        # How much the machine moved under the run: each pair of slices' ratios.
        report["slices"] = [
            {
                "throughput": w["pages_per_s"] / r["pages_per_s"],
                "p99": w["p99_us"] / r["p99_us"],
                "requests": w["requests"] + r["requests"],
                # Which side moved when the ratio did.
                "warm_pages_per_s": w["pages_per_s"],
                "redis_pages_per_s": r["pages_per_s"],
                "warm_requests": w["requests"],
                "redis_requests": r["requests"],
            }
            for w, r in zip(warm_slices, redis_slices, strict=False)
        ]
    if warm_slices and paged_slices:
        # The miss path's target, slice by slice: mixed_paged ÷ the warm slice before it.
        report["mixed_paged_slices"] = [
            {
                "throughput": m["pages_per_s"] / w["pages_per_s"],
                "requests": m["requests"] + w["requests"],
            }
            for w, m in zip(warm_slices, paged_slices, strict=False)
        ]
    spreads: dict[str, dict[str, float]] = {
        name: spread([s["pages_per_s"] for s in figures]) for name, figures in slice_figures.items()
    }
    if "slices" in report:
        spreads["remote_warm_over_redis"] = spread([x["throughput"] for x in report["slices"]])
    if "mixed_paged_slices" in report:
        spreads["mixed_paged_over_warm"] = spread(
            [x["throughput"] for x in report["mixed_paged_slices"]]
        )
    if spreads:
        report["spread"] = spreads
    warm_s = report.get("remote_warm")
    for name in ("mixed", "mixed_paged"):
        mixed_s = report.get(name)
        if warm_s and mixed_s:  # the target: ≥ 0.8 at 8 and 64 clients
            report[f"{name}_over_warm"] = mixed_s["pages_per_s"] / warm_s["pages_per_s"]
    redis_s = report.get("redis")
    for name in OVER_REDIS:
        mine_s = report.get(name)
        if redis_s and mine_s:
            report[f"{name}_over_redis"] = {
                "p50": mine_s["p50_us"] / redis_s["p50_us"],
                "p99": mine_s["p99_us"] / redis_s["p99_us"],
                "throughput": mine_s["pages_per_s"] / redis_s["pages_per_s"],
            }
    paired = report.get("remote_warm_over_redis")
    if paired is not None and report.get("slices"):
        # The same ratio by a second estimator, beside the first (which stays the
        # headline): the median of the slice pairs' ratios. The pooled ratio is the
        # ratio of the two passes' sums, so one slow slice of either server moves it by
        # its share of the pass; the median ignores one such slice of four or more.
        paired["throughput_pair_median"] = statistics.median(
            x["throughput"] for x in report["slices"]
        )
