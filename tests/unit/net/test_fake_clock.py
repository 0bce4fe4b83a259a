"""FakeClock: time moves only when told; sleepers wake in deadline order."""

from __future__ import annotations

import asyncio

import pytest

from shuttle.errors import InvalidArgumentError
from shuttle.net.clock import REAL_CLOCK, Clock
from shuttle.testing import FakeClock
from tests.unit.net._aio import async_test


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(FakeClock(), Clock)
    assert isinstance(REAL_CLOCK, Clock)


@async_test
async def test_sleepers_wake_in_deadline_order_then_sleep_order() -> None:
    clock = FakeClock()
    log: list[tuple[str, float]] = []

    async def sleeper(name: str, deadline: float) -> None:
        await clock.sleep_until(deadline)
        log.append((name, clock.now()))

    tasks = [
        asyncio.create_task(sleeper(n, d))
        for n, d in [("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0)]
    ]
    await clock.settle()
    assert clock.sleepers == 4
    await clock.advance_to(2.5)
    assert log == [("a", 1.0), ("b1", 2.0), ("b2", 2.0)]
    await clock.advance(10.0)
    assert log[-1] == ("c", 3.0)
    assert clock.now() == 12.5
    await asyncio.gather(*tasks)


@async_test
async def test_a_chain_of_sleeps_sees_each_deadline() -> None:
    clock = FakeClock()
    seen: list[float] = []

    async def ticker() -> None:
        for _ in range(5):
            await clock.sleep_until(clock.now() + 0.25)
            seen.append(clock.now())

    task = asyncio.create_task(ticker())
    await clock.advance(1.0)
    assert seen == [0.25, 0.5, 0.75, 1.0]
    await clock.advance(1.0)
    await task
    assert seen[-1] == 1.25


@async_test
async def test_jump_wakes_everyone_due_at_once_and_time_never_goes_back() -> None:
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep_until(1.0))
    await clock.settle()
    clock.jump(5.0)
    await task
    assert clock.now() == 5.0
    await clock.sleep_until(4.0)  # already past: returns at once
    with pytest.raises(InvalidArgumentError, match="cannot go backwards"):
        clock.jump_to(1.0)


@async_test
async def test_cancelled_sleepers_are_forgotten() -> None:
    clock = FakeClock()
    task = asyncio.create_task(clock.sleep_until(1.0))
    await clock.settle()
    task.cancel()
    await clock.settle()
    assert clock.sleepers == 0
    assert clock.next_deadline() is None
