"""The load estimate of the background's busiest intervals, on a short trace."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shuttle.sim.calibration import IntervalLoad, background_load
from shuttle.sim.config import ServerConfig
from shuttle.traces.background import BackgroundConfig

#: 20 minutes at the daily peak: a 7-minute warm-up, then the busiest 3 minutes.
PEAK = replace(BackgroundConfig(), duration_s=1200.0, start_time_of_day_s=13.7 * 3600)


@pytest.fixture(scope="module")
def default_load() -> IntervalLoad:
    (load,) = background_load(PEAK, 0, ServerConfig(), intervals=1, warmup_s=420.0)
    return load


def test_busy_interval_loads_the_cpu_in_the_paper_regime(default_load: IntervalLoad) -> None:
    load = default_load
    assert load.metadata_fraction == pytest.approx(0.87, abs=0.02)
    assert 0.35 < load.cpu_utilisation < 0.65  # busy, not saturated at speed 1.0
    assert load.cpu_utilisation_half_speed == pytest.approx(2 * load.cpu_utilisation)
    assert load.cpu_utilisation_half_speed > 0.8  # the mobile application tips it over
    assert load.disk_utilisation < 0.9  # the disk keeps up at the default cache
    assert 0.5 < load.block_hit_ratio < 1.0
    assert load.metadata_hit_ratio > 0.9  # the paper: above 90%


def test_a_smaller_cache_hits_less_and_loads_the_disk_more(default_load: IntervalLoad) -> None:
    (small,) = background_load(PEAK, 0, ServerConfig(cache_blocks=256), intervals=1, warmup_s=420.0)
    assert small.block_hit_ratio < default_load.block_hit_ratio - 0.1
    assert small.disk_utilisation > default_load.disk_utilisation
