"""The real clock: never wakes early, wakes close to the deadline, leaks no descriptor."""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import pytest

from shuttle.net.clock import REAL_CLOCK, MonotonicClock
from tests.unit.net._aio import async_test


@pytest.mark.parametrize("precise", [True, False])
@async_test
async def test_sleep_until_never_wakes_early(precise: bool) -> None:
    clock = MonotonicClock(precise=precise)
    for delay_s in (0.0001, 0.0005, 0.003):
        deadline = clock.now() + delay_s
        await clock.sleep_until(deadline)
        assert clock.now() >= deadline
    await clock.sleep_until(clock.now() - 1.0)  # past deadlines return at once


@pytest.mark.skipif(not MonotonicClock().precise, reason="timerfd needs Linux")
@async_test
async def test_precise_wake_ups_beat_the_selectors_millisecond() -> None:
    """asyncio.sleep(100 µs) sleeps about 1 ms; the timerfd clock wakes far closer.
    Medians, with bounds wide enough for a loaded machine."""
    late_s = []
    for _ in range(30):
        deadline = REAL_CLOCK.now() + 0.0001
        await REAL_CLOCK.sleep_until(deadline)
        late_s.append(REAL_CLOCK.now() - deadline)
    assert statistics.median(late_s) < 0.0005


@pytest.mark.skipif(not MonotonicClock().precise, reason="timerfd needs Linux")
@async_test
async def test_concurrent_sleepers_wake_in_order_and_the_timer_fd_goes_away() -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    order: list[int] = []

    async def sleeper(i: int, deadline: float) -> None:
        await REAL_CLOCK.sleep_until(deadline)
        order.append(i)

    # Every deadline lies 0.2 s ahead, so the cancel below comes before the earliest
    # one (the cancelled sleeper's) even on a loaded machine that pauses this test.
    base = time.monotonic() + 0.2
    tasks = [asyncio.create_task(sleeper(i, base + 0.002 * (5 - i))) for i in range(5)]
    cancelled = asyncio.create_task(sleeper(99, base + 0.001))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(*tasks)
    assert order == [4, 3, 2, 1, 0]
    await REAL_CLOCK.sleep_until(time.monotonic() + 0.001)
    assert len(os.listdir("/proc/self/fd")) == fds_before
