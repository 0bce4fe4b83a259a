"""The node-load estimate from scheduler accounting, on worked cases."""

from __future__ import annotations

import time

import pytest

from shuttle.runtime.load import LoadSampler, estimate_load


@pytest.mark.parametrize(
    ("own_run", "own_wait", "others_run", "cpus", "load"),
    [
        (1.0, 0.0, 0.0, 1, 1.0),  # a busy thread of ours, alone
        (0.5, 0.5, 0.5, 1, 2.0),  # beside one CPU-bound competitor: each runs half
        (1 / 3, 2 / 3, 2 / 3, 1, 3.0),  # beside two
        (0.25, 0.75, 0.75, 1, 4.0),  # beside three
        (0.0, 0.0, 1.0, 1, 1.0),  # idle, a competitor alone on the CPU
        (0.0, 0.0, 0.0, 1, 0.0),  # idle node
        (1.0, 1.0, 0.0, 1, 2.0),  # two of our threads, nobody else: not competitors
        (0.5, 0.5, 0.5, 2, 1.0),  # the same pair spread over two CPUs
        (0.5, 0.0, 0.3, 1, 0.8),  # both half busy, never at the same time
    ],
)
def test_estimate_load(
    own_run: float, own_wait: float, others_run: float, cpus: int, load: float
) -> None:
    assert estimate_load(own_run, own_wait, others_run, 1.0, cpus) == pytest.approx(load)


def test_the_sampler_reads_this_process() -> None:
    sampler = LoadSampler()
    # 50 ms of this thread's own CPU (by its precise clock): a running thread's
    # schedstat advances only at scheduler ticks and switches, so a fixed count of
    # iterations (5 ms on a fast machine) could read 0 on a loaded one.
    start = time.thread_time()
    x = 0
    while time.thread_time() - start < 0.05:
        for i in range(10_000):
            x ^= i
    sample = sampler.sample()
    assert sample.interval_s > 0 and sample.own_run_s > 0 and sample.load >= 0
