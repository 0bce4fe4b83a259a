"""``netrand --clients N --repeat R``: how far the same passes move from run to run.

Each run's headline figures side by side with their spread (:func:`rerun_spread`), and
where the warm ÷ Redis ratio's movement comes from (:func:`ratio_noise`): the slices'
own noise inside a run, or something that holds a whole run.
"""

from __future__ import annotations

import statistics
from typing import Any

from shuttle.bench.netrand_summary import spread

#: What :func:`rerun_spread` follows from run to run: each a path into a run's report.
RERUN_FIGURES: dict[str, tuple[str, ...]] = {
    "remote_warm_pages_per_s": ("remote_warm", "pages_per_s"),
    "redis_pages_per_s": ("redis", "pages_per_s"),
    "mixed_paged_pages_per_s": ("mixed_paged", "pages_per_s"),
    "remote_warm_p99_us": ("remote_warm", "p99_us"),
    "redis_p99_us": ("redis", "p99_us"),
    "remote_warm_over_redis_throughput": ("remote_warm_over_redis", "throughput"),
    "remote_warm_over_redis_pair_median": ("remote_warm_over_redis", "throughput_pair_median"),
    "remote_warm_over_redis_p99": ("remote_warm_over_redis", "p99"),
    "mixed_paged_over_warm": ("mixed_paged_over_warm",),
}


def rerun_spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The same passes run back to back (``--repeat``): each run's headline figures and,
    for each figure, its :func:`spread` over the runs (``range_pct``: how far a rerun
    moved it, in % of the median); with the runs' slices, ``noise``
    (:func:`ratio_noise`): whether the warm ÷ Redis ratio moved between runs by what
    its slices move within one, or by more."""
    figures: dict[str, list[float]] = {}
    for name, path in RERUN_FIGURES.items():
        values = []
        for run in runs:
            value: Any = run
            for part in path:
                value = value.get(part) if isinstance(value, dict) else None
            if isinstance(value, (int, float)):
                values.append(float(value))
        if len(values) == len(runs):
            figures[name] = values
    out: dict[str, Any] = {
        "runs": len(runs),
        "figures": figures,
        "spread": {name: spread(values) for name, values in figures.items()},
    }
    noise = ratio_noise(runs)
    if noise is not None:
        out["noise"] = noise
        # Every run's slice pairs, for a look of one's own (the first run's are also
        # its ``slices``).
        out["slices"] = [run["slices"] for run in runs]
    return out


def ratio_noise(runs: list[dict[str, Any]]) -> dict[str, float] | None:
    """Where the warm ÷ Redis throughput's rerun-to-rerun movement comes from, from
    each run's slice pairs (``slices``), in % of the mean ratio: ``within_run_pct``, the
    standard deviation of one slice pair's ratio about its run's mean (the machine
    moving under a run, at the scale of a slice); ``expected_between_pct``, what that
    alone makes of a run's figure, which pools its slices (``within / sqrt(slices)``);
    ``between_runs_pct``, the standard deviation of the runs' figures themselves. A
    between-runs figure well over the expected one says the runs differ by more than
    their slices do: something that holds for a whole run (its forked clients, where
    the scheduler put them, the machine's load over minutes), which longer passes would
    not average away; one near it says the passes are too short. None without at
    least two runs with two slice pairs each."""
    per_run = [
        [float(pair["throughput"]) for pair in run.get("slices", [])]
        for run in runs
        if len(run.get("slices", [])) >= 2
    ]
    if len(per_run) < 2 or len(per_run) != len(runs):
        return None
    means = [statistics.fmean(ratios) for ratios in per_run]
    grand = statistics.fmean(means)
    deviations = [r - mean for ratios, mean in zip(per_run, means, strict=True) for r in ratios]
    dof = sum(len(ratios) - 1 for ratios in per_run)
    within = (sum(d * d for d in deviations) / dof) ** 0.5
    slices = statistics.fmean(len(ratios) for ratios in per_run)
    figures = [float(run["remote_warm_over_redis"]["throughput"]) for run in runs]
    return {
        "within_run_pct": 100.0 * within / grand,
        "expected_between_pct": 100.0 * within / slices**0.5 / grand,
        "between_runs_pct": 100.0 * statistics.stdev(figures) / grand,
    }
