"""``bench netrand --workers``: the counts it takes and the ratios it reports."""

from __future__ import annotations

import os

import pytest

from shuttle.bench.netrand_workers import WorkersConfig, _report, cpu_seconds, parse_workers
from shuttle.errors import ConfigError


def test_the_counts_are_two_or_more_different_ones_the_anchor_first() -> None:
    assert parse_workers("1,2") == (1, 2)
    assert parse_workers(" 2, 1 ,4") == (2, 1, 4)
    for bad, why in (
        ("2", "two or more"),
        ("1,1", "two or more different"),
        ("1,x", "'x' is not a number"),
        ("0,1", "out of range"),
    ):
        with pytest.raises(ConfigError, match=why):
            parse_workers(bad)


def _pass(rate: float) -> tuple[list[int], float, float]:
    """One client's pass of 100 pages over 100/rate seconds."""
    return ([10_000] * 100, 0.0, 100 / rate)


def test_ratios_are_taken_within_each_round() -> None:
    config = WorkersConfig(workers=(1, 2), clients=1, pages=100, rounds=3)
    outputs = {1: [[_pass(100), _pass(200), _pass(50)]], 2: [[_pass(110), _pass(180), _pass(50)]]}
    profile = {
        "wall_s": 1.0,
        "node_cores": 0.5,
        "node_cores_by_process": [0.5],
        "client_cores": 0.4,
        "node_cpu_s": 0.5,
        "client_cpu_s": 0.4,
        "cpu_busy": {"0": 1.0, "1": 0.5},
    }
    profiles = {c: [dict(profile) for _ in range(3)] for c in (1, 2)}
    report = _report(config, 1, outputs, profiles)
    ratio = report["ratios"]["2_over_1"]
    assert ratio["per_round"] == pytest.approx([1.1, 0.9, 1.0])
    assert (ratio["median"], ratio["min"], ratio["max"]) == pytest.approx((1.0, 0.9, 1.1))
    assert report["by_workers"]["1"]["pages_per_s_median"] == pytest.approx(100)
    # 0.5 CPU seconds over 100 pages: 5,000 µs a page.
    assert report["by_workers"]["2"]["node_cpu_us_per_page_median"] == pytest.approx(5000)
    assert report["by_workers"]["2"]["cpu_busy_median"] == pytest.approx(0.75)


def test_cpu_seconds_counts_this_process_and_nothing_for_a_gone_one() -> None:
    assert cpu_seconds(os.getpid()) > 0
    assert cpu_seconds(2**22 + 12345) == 0.0
