"""The paper's two experiments: sweep the server cache size or the server CPU speed.

A sweep runs every (point, placement, interval) combination -- the mobile
application at the client and at the server, each of the K busiest intervals -- and
pools what the runs measured per (point, placement): the mobile application's run
time (mean over intervals), hit rates and mean response times pooled over all
requests, and the background's response time split into its parts (Figures 2-7).

Runs are independent, so they go to a pool of worker processes (fork: the workers
inherit the prepared traces instead of receiving copies). Results are put back in
task order, so the output does not depend on the number of workers or on which
finishes first: the same configuration and seed give byte-identical JSON.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shuttle.errors import ConfigError
from shuttle.sim.config import ExperimentConfig, ServerConfig, replace, to_dict
from shuttle.sim.metrics import TrafficStats
from shuttle.sim.mobile import PLACEMENTS
from shuttle.sim.prepare import (
    ChunkSource,
    IntervalData,
    Progress,
    columns_source,
    prepare_intervals,
)
from shuttle.sim.run import RunResult, RunTiming, simulate_interval
from shuttle.sim.workload import Columns

MB = 1 << 20

#: The cache-size sweep's default points (MB of server cache; inf: infinite cache).
#: 1 MB is 128 blocks, of which the mobile program takes 100 when at the server.
CACHE_SIZES_MB = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, math.inf)
#: The CPU-speed sweep's default points: server CPU speed over the clients'.
CPU_SPEEDS = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
#: The server cache of the CPU-speed sweep unless configured (the base config's).
DEFAULT_PLACEMENTS = ("client", "server")


@dataclass(frozen=True, slots=True)
class Sweep:
    """One experiment: which parameter varies, over which points, and where the app runs."""

    name: str
    x_label: str
    points: tuple[float, ...]
    placements: tuple[str, ...] = DEFAULT_PLACEMENTS

    def __post_init__(self) -> None:
        if self.name not in SWEEP_NAMES:
            raise ConfigError(f"unknown sweep {self.name!r}; expected one of {SWEEP_NAMES}")
        if not self.points:
            raise ConfigError("a sweep needs at least one point")
        for placement in self.placements:
            if placement not in PLACEMENTS:
                raise ConfigError(
                    f"unknown placement {placement!r}; expected some of {', '.join(PLACEMENTS)}"
                )

    def config_for(self, base: ServerConfig, x: float) -> ServerConfig:
        """The server configuration at point ``x``."""
        if self.name == "cache-size":
            if math.isinf(x):
                return replace(base, cache_infinite=True)
            blocks = round(x * MB / base.block_size_bytes)
            if blocks <= base.mobile_blocks:
                raise ConfigError(
                    f"a {x:g} MB cache ({blocks} blocks) cannot hold the mobile program's "
                    f"{base.mobile_blocks} blocks; use sizes above "
                    f"{base.mobile_blocks * base.block_size_bytes / MB:g} MB"
                )
            return replace(base, cache_blocks=blocks, cache_infinite=False)
        return replace(base, server_speed=x * base.client_speed)

    def label(self, x: float) -> str:
        if math.isinf(x):
            return "inf"
        return f"{x:g}"


SWEEP_NAMES = ("cache-size", "cpu-speed")


def cache_size_sweep(
    points_mb: Sequence[float] = CACHE_SIZES_MB, placements: Sequence[str] = DEFAULT_PLACEMENTS
) -> Sweep:
    return Sweep("cache-size", "server cache (MB)", tuple(points_mb), tuple(placements))


def cpu_speed_sweep(
    speeds: Sequence[float] = CPU_SPEEDS, placements: Sequence[str] = DEFAULT_PLACEMENTS
) -> Sweep:
    return Sweep(
        "cpu-speed", "server CPU speed / client CPU speed", tuple(speeds), tuple(placements)
    )


# --- preparing the traces -----------------------------------------------------------


@dataclass(slots=True)
class Prepared:
    """The measured intervals (each with its warmed caches) and the mobile trace."""

    intervals: list[IntervalData]
    mobile: Columns
    sources: dict[str, Any] = field(default_factory=dict)


def prepare(
    background: ChunkSource | Columns,
    mobile: Columns,
    experiment: ExperimentConfig,
    block_size_bytes: int,
    sources: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> Prepared:
    """Pick the busiest intervals and replay each one's warm-up through the caches."""
    chunks = columns_source(background) if isinstance(background, Columns) else background
    intervals, records = prepare_intervals(chunks, experiment, block_size_bytes, progress)
    described = dict(sources or {})
    background_source = dict(described.get("background", {}))
    background_source["records"] = records
    described["background"] = background_source
    return Prepared(intervals, mobile, described)


# --- running ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Task:
    point: int
    placement: str
    interval: int


# What the worker processes inherit (set before the pool forks).
_SHARED: dict[str, Any] = {}


def _run_task(task: Task) -> tuple[Task, RunResult, RunTiming]:
    prepared: Prepared = _SHARED["prepared"]
    configs: list[ServerConfig] = _SHARED["configs"]
    experiment: ExperimentConfig = _SHARED["experiment"]
    timing = RunTiming()
    data = prepared.intervals[task.interval]
    result = simulate_interval(
        configs[task.point],
        experiment,
        task.placement,
        data.interval,
        data.background,
        data.warm,
        prepared.mobile,
        timing,
    )
    return task, result, timing


@dataclass(slots=True)
class SweepPerf:
    """Wall-clock figures of a sweep (not part of the deterministic results)."""

    runs: int = 0
    jobs: int = 1
    wall_s: float = 0.0
    run_wall_s: float = 0.0
    run_cpu_s: float = 0.0
    records: int = 0
    events: int = 0

    @property
    def records_per_s(self) -> float:
        """Trace records simulated per CPU second of a worker (steady under load)."""
        return self.records / self.run_cpu_s if self.run_cpu_s else 0.0

    @property
    def events_per_s(self) -> float:
        """Kernel events per CPU second of a worker."""
        return self.events / self.run_cpu_s if self.run_cpu_s else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "jobs": self.jobs,
            "wall_s": self.wall_s,
            "run_wall_s": self.run_wall_s,
            "run_cpu_s": self.run_cpu_s,
            "records": self.records,
            "events": self.events,
            "records_per_s": self.records_per_s,
            "events_per_s": self.events_per_s,
        }


def default_jobs() -> int:
    """One worker per CPU this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def run_sweep(
    sweep: Sweep,
    base: ServerConfig,
    experiment: ExperimentConfig,
    prepared: Prepared,
    jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, Any], SweepPerf]:
    """Run every task of ``sweep``; return the results document and the timing.

    ``progress(done, total)`` is called after each run.
    """
    if jobs < 1:
        raise ConfigError(f'"jobs" must be >= 1, got {jobs}')
    configs = [sweep.config_for(base, x) for x in sweep.points]
    tasks = [
        Task(p, placement, i)
        for p in range(len(configs))
        for placement in sweep.placements
        for i in range(len(prepared.intervals))
    ]
    _SHARED.update(prepared=prepared, configs=configs, experiment=experiment)
    perf = SweepPerf(runs=len(tasks), jobs=jobs)
    results: dict[Task, RunResult] = {}
    began = time.perf_counter()
    try:
        if jobs == 1:
            outputs: Any = map(_run_task, tasks)
            pool = None
        else:
            pool = multiprocessing.get_context("fork").Pool(jobs)
            outputs = pool.imap_unordered(_run_task, tasks)
        try:
            for task, result, timing in outputs:
                results[task] = result
                perf.run_wall_s += timing.wall_s
                perf.run_cpu_s += timing.cpu_s
                perf.records += timing.records
                perf.events += timing.events
                if progress is not None:
                    progress(len(results), len(tasks))
        finally:
            if pool is not None:
                pool.close()
                pool.join()
    finally:
        _SHARED.clear()
    perf.wall_s = time.perf_counter() - began
    document = _document(sweep, base, experiment, prepared, configs, tasks, results)
    return document, perf


# --- the results document -----------------------------------------------------------


def summarize(runs: Sequence[RunResult]) -> dict[str, Any]:
    """Pool the runs of one (point, placement) over the intervals."""
    background = TrafficStats()
    mobile = TrafficStats()
    for run in runs:
        background.add(run.background)
        mobile.add(run.mobile)
    run_times = [run.mobile_run.run_time_s for run in runs]
    client_accesses = sum(run.mobile_run.client_cache_accesses for run in runs)
    client_hits = sum(run.mobile_run.client_cache_hits for run in runs)
    n = len(runs)
    return {
        "mobile_run_time_s": sum(run_times) / n,
        "mobile_run_time_s_by_interval": run_times,
        "mobile_unfinished_runs": sum(
            1 for run in runs if run.placement != "none" and not run.mobile_run.finished
        ),
        "mobile_server_hit_rate": mobile.block_hit_rate,
        "mobile_client_cache_hit_rate": client_hits / client_accesses if client_accesses else 0.0,
        "mobile_mean_response_s": mobile.mean_response_s,
        "mobile_mean_block_response_s": mobile.mean_block_response_s,
        "background_hit_rate": background.block_hit_rate,
        "background_read_hit_rate": background.read_hit_rate,
        "background_metadata_hit_rate": background.metadata_hit_rate,
        "background_mean_response_s": background.mean_response_s,
        "background_mean_block_response_s": background.mean_block_response_s,
        "background_breakdown_s": background.breakdown_s(),
        "mobile_breakdown_s": mobile.breakdown_s(),
        "cpu_load": sum(run.load.cpu_utilisation for run in runs) / n,
        "disk_load": sum(run.load.disk_utilisation for run in runs) / n,
        "background": background.to_json(),
        "mobile": mobile.to_json(),
    }


def _document(
    sweep: Sweep,
    base: ServerConfig,
    experiment: ExperimentConfig,
    prepared: Prepared,
    configs: list[ServerConfig],
    tasks: list[Task],
    results: dict[Task, RunResult],
) -> dict[str, Any]:
    points = []
    for p, x in enumerate(sweep.points):
        by_placement = {}
        for placement in sweep.placements:
            runs = [results[t] for t in tasks if t.point == p and t.placement == placement]
            by_placement[placement] = summarize(runs)
        points.append(
            {
                "x": sweep.label(x),
                "cache_blocks": None if configs[p].cache_infinite else configs[p].cache_blocks,
                "server_speed": configs[p].server_speed,
                "placements": by_placement,
            }
        )
    document: dict[str, Any] = json_safe(
        {
            "sweep": sweep.name,
            "x_label": sweep.x_label,
            "placements": list(sweep.placements),
            "config": {
                "server": to_dict(base),
                "experiment": to_dict(experiment),
                **prepared.sources,
            },
            "intervals": [
                {
                    "index": d.interval.index,
                    "start_s": d.interval.start_s,
                    "end_s": d.interval.end_s,
                    "requests": d.interval.requests,
                    "warmup_records": d.warm.records,
                    "warm_blocks": len(d.warm.blocks_lru_first),
                    "warm_files": len(d.warm.metadata_files),
                }
                for d in prepared.intervals
            ],
            "points": points,
            "runs": [
                {"point": sweep.label(sweep.points[t.point]), **results[t].to_json()} for t in tasks
            ],
        }
    )
    return document


def json_safe(value: Any) -> Any:
    """Replace inf and NaN (not JSON) by the strings "inf", "-inf", "nan"."""
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if math.isnan(value):
            return "nan"
        return value
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
