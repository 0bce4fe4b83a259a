"""One interval run: warm-up, measured window, placements, determinism."""

from __future__ import annotations

import gc
import json

import pytest

from shuttle.sim.config import ExperimentConfig, ServerConfig
from shuttle.sim.run import RunResult, RunTiming, simulate_interval, warm_state_for
from shuttle.sim.workload import Columns, Interval, busiest_intervals

from .synthetic import background, search

BACKGROUND = Columns.from_records(background(duration_s=900.0, rate_per_s=150.0, seed=5))
MOBILE = Columns.from_records(search(files=40, blocks_per_file=6))
EXPERIMENT = ExperimentConfig(
    intervals=1, interval_s=60.0, warmup_s=600.0, warmup_timed_s=30.0, overrun_s_max=120.0
)
INTERVAL = busiest_intervals(BACKGROUND.time_s, 60.0, 1, 600.0)[0]


def run(
    placement: str, config: ServerConfig | None = None, interval: Interval = INTERVAL
) -> RunResult:
    config = config or ServerConfig(cache_blocks=400)
    warm = warm_state_for(BACKGROUND, interval, EXPERIMENT, config.block_size_bytes)
    return simulate_interval(config, EXPERIMENT, placement, interval, BACKGROUND, warm, MOBILE)


def test_background_requests_inside_the_interval_are_measured() -> None:
    result = run("none")
    inside = BACKGROUND.window(INTERVAL.start_s, INTERVAL.end_s)
    assert result.background.requests == len(inside)
    assert result.mobile.requests == 0
    assert not result.mobile_run.finished
    assert 0.0 < result.load.cpu_utilisation < 1.0


@pytest.mark.parametrize("placement", ["client", "server"])
def test_the_mobile_application_runs_to_completion(placement: str) -> None:
    result = run(placement)
    assert result.mobile_run.finished
    assert result.mobile_run.run_time_s > MOBILE.time_s[-1]
    server_reads = result.mobile.block_accesses
    assert server_reads == 40 * 6
    assert result.mobile.block_hit_rate == 0.0  # a single pass over its own files


def test_at_the_server_the_mobile_program_takes_cache_from_the_background() -> None:
    small = ServerConfig(cache_blocks=150)
    client = run("client", small).background
    server = run("server", small).background
    assert server.block_hit_rate < client.block_hit_rate


def test_a_slow_server_cpu_starves_the_mobile_program() -> None:
    """The background keeps this CPU 95% busy: the program gets 5% of it at the server."""
    slow = ServerConfig(cache_blocks=400, server_speed=0.06)
    at_client = run("client", slow)
    at_server = run("server", slow)
    assert at_client.load.cpu_utilisation > 0.9
    assert at_server.mobile_run.run_time_s > 2 * at_client.mobile_run.run_time_s


def test_the_same_seed_gives_byte_identical_results() -> None:
    first = json.dumps(run("server").to_json(), sort_keys=True)
    second = json.dumps(run("server").to_json(), sort_keys=True)
    assert first == second


def test_timing_is_reported_apart_from_the_result() -> None:
    config = ServerConfig(cache_blocks=400)
    warm = warm_state_for(BACKGROUND, INTERVAL, EXPERIMENT, config.block_size_bytes)
    timing = RunTiming()
    result = simulate_interval(
        config, EXPERIMENT, "client", INTERVAL, BACKGROUND, warm, MOBILE, timing
    )
    assert timing.records == result.records > 0
    assert timing.wall_s > 0.0
    assert "wall_s" not in json.dumps(result.to_json())


def test_a_fully_timed_warm_up_agrees_with_the_cache_only_warm_up() -> None:
    """Replaying the warm-up through the caches alone barely changes what is measured."""
    config = ServerConfig(cache_blocks=400)
    full = ExperimentConfig(
        intervals=1, interval_s=60.0, warmup_s=600.0, warmup_timed_s=600.0, overrun_s_max=120.0
    )
    quick = run("client", config).background
    warm = warm_state_for(BACKGROUND, INTERVAL, full, config.block_size_bytes)
    slow = simulate_interval(config, full, "client", INTERVAL, BACKGROUND, warm, MOBILE).background
    assert slow.requests == quick.requests
    assert slow.block_hit_rate == pytest.approx(quick.block_hit_rate, abs=0.01)
    assert slow.mean_response_s == pytest.approx(quick.mean_response_s, rel=0.05)


def test_a_finished_run_leaves_no_garbage_cycles_behind() -> None:
    """Workers run hundreds of intervals: each must be freed by reference counting."""
    gc.collect()
    gc.disable()
    try:
        run("server")
        unreachable = gc.collect()
    finally:
        gc.enable()
    assert unreachable < 50
