"""CPU speed factor: the CPU a section costs scales with 1/factor (generous bounds:
the machine is shared and CPU clocks tick in scheduler quanta)."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest

from shuttle.errors import ConfigError
from shuttle.net.cpu import CpuSpeed, burn_cpu, parse_speed_factor

DATA = b"shuttle" * 150_000  # ~1 MB: sha256 of it takes a few ms


def _work() -> None:
    for _ in range(4):
        hashlib.sha256(DATA).digest()


def _cpu_of(fn: object) -> float:
    assert callable(fn)
    start = time.thread_time()
    fn()
    return time.thread_time() - start


@pytest.mark.parametrize(("factor", "low", "high"), [(0.5, 1.6, 2.6), (0.25, 3.2, 5.2)])
def test_a_slower_node_spends_proportionally_more_cpu(
    factor: float, low: float, high: float
) -> None:
    speed = CpuSpeed(factor)
    base = min(_cpu_of(_work) for _ in range(3))

    def scaled() -> None:
        with speed.section():
            _work()

    slow = min(_cpu_of(scaled) for _ in range(3))
    assert low <= slow / base <= high, (base, slow)
    assert speed.counters.sections == 3
    assert speed.counters.burned_s == pytest.approx(
        speed.counters.work_s * (1 / factor - 1), rel=0.2
    )


def test_full_speed_and_faster_burn_nothing() -> None:
    for factor in (1.0, 2.0):
        speed = CpuSpeed(factor)
        with speed.section():
            _work()
        assert speed.counters.burned_s == 0.0
        assert speed.counters.work_s > 0.0


def test_sections_nest_without_scaling_twice() -> None:
    speed = CpuSpeed(0.5)

    @speed.scaled
    def inner() -> int:
        _work()
        return 7

    with speed.section():
        assert inner() == 7
    assert speed.counters.sections == 1
    assert speed.counters.burned_s == pytest.approx(speed.counters.work_s, rel=0.2)


def test_the_burn_happens_even_when_the_work_fails() -> None:
    speed = CpuSpeed(0.5)
    with pytest.raises(ZeroDivisionError), speed.section():
        _work()
        _ = 1 / 0
    assert speed.counters.burned_s > 0.0


def test_burning_is_real_cpu_on_the_calling_thread_only() -> None:
    other_cpu: list[float] = []

    def idle_thread() -> None:
        start = time.thread_time()
        time.sleep(0.05)
        other_cpu.append(time.thread_time() - start)

    t = threading.Thread(target=idle_thread)
    t.start()
    burned = burn_cpu(0.03)
    t.join()
    assert 0.03 <= burned < 0.06
    assert other_cpu[0] < 0.01


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "out of range"),
        (-1, "out of range"),
        ("fast", "'fast' is not a number"),
        (True, "expected a number"),
        (float("nan"), "out of range"),
    ],
)
def test_bad_factors_are_config_errors(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_speed_factor(value)
    assert parse_speed_factor("0.5") == 0.5
