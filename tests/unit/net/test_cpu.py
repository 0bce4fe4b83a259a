"""CPU speed factor: the CPU a section costs scales with 1/factor (generous bounds:
the machine is shared and CPU clocks tick in scheduler quanta)."""

from __future__ import annotations

import gc
import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shuttle.errors import ConfigError
from shuttle.net import cpu
from shuttle.net.cpu import (
    CPU_TRACE_ENV,
    CpuSpeed,
    burn_cpu,
    parse_speed_factor,
    read_cpu_trace,
)

DATA = b"shuttle" * 150_000  # ~1 MB: sha256 of it takes a few ms


def _work() -> None:
    for _ in range(4):
        hashlib.sha256(DATA).digest()


def _cpu_of(fn: object) -> float:
    assert callable(fn)
    start = time.thread_time()
    fn()
    return time.thread_time() - start


class FakeThreadClock:
    """Stands in for :mod:`time` in :mod:`shuttle.net.cpu`: thread CPU time that moves
    by ``tick_s`` per read (the burn loop's spin between reads) and by what
    :meth:`work` says, so the arithmetic can be checked exactly."""

    def __init__(self, tick_s: float = 1e-4) -> None:
        self.now_s = 0.0
        self.tick_s = tick_s

    def thread_time(self) -> float:
        self.now_s += self.tick_s
        return self.now_s

    def work(self, cpu_s: float) -> None:
        self.now_s += cpu_s


@pytest.mark.parametrize("factor", [0.5, 0.25, 0.1])
def test_a_section_burns_work_times_one_over_factor_minus_one(
    factor: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeThreadClock()
    monkeypatch.setattr(cpu, "time", clock)
    speed = CpuSpeed(factor)
    before = clock.now_s
    with speed.section():
        clock.work(0.010)
    work_s, burned_s = speed.counters.work_s, speed.counters.burned_s
    assert work_s == pytest.approx(0.010 + clock.tick_s)  # one clock read inside
    want_s = work_s * (1 / factor - 1)
    assert want_s <= burned_s <= want_s + 2 * clock.tick_s  # overshoot: one spin
    # The section cost work / factor of CPU in all, give or take the clock reads.
    assert clock.now_s - before == pytest.approx(work_s / factor, abs=5 * clock.tick_s)
    assert speed.counters.sections == 1


@pytest.mark.parametrize("factor", [0.5, 0.25])
def test_a_slower_node_spends_proportionally_more_cpu(factor: float) -> None:
    """The same on the real thread CPU clock. Both sides are this thread's CPU time, so
    a loaded machine (which delays us but does not charge us for others' work)
    cannot move them: the lower bound is exact, the upper one allows a few spins."""
    speed = CpuSpeed(factor)
    start = time.thread_time()
    with speed.section():
        _work()
    spent_s = time.thread_time() - start
    work_s = speed.counters.work_s
    assert work_s > 0
    assert work_s / factor <= spent_s <= work_s / factor + 0.005, (work_s, spent_s)


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


def test_the_trace_records_each_burn_and_each_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cpu.trace"
    trace = cpu._Trace(str(path))
    monkeypatch.setattr(cpu, "_trace", trace)
    before = time.monotonic()
    burned = burn_cpu(0.002)
    gc.callbacks.append(trace.on_gc)
    try:
        gc.collect(1)
    finally:
        gc.callbacks.remove(trace.on_gc)
    burns, collections = read_cpu_trace(path)
    (burn,) = burns
    assert before <= burn.start <= time.monotonic()
    assert (burn.pid, burn.thread) == (os.getpid(), threading.get_native_id())
    assert burn.asked_s == pytest.approx(0.002)
    assert burn.burned_s == pytest.approx(burned, abs=1e-9)
    assert burn.wall_s >= burn.burned_s - 1e-4  # a thread's CPU never outruns the wall
    assert [c.generation for c in collections] == [1]
    assert collections[0].cpu_s >= 0.0 and collections[0].wall_s >= 0.0


def test_without_the_variable_nothing_is_written_and_cut_lines_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpu, "_trace", cpu._Trace(None))
    burn_cpu(0.001)
    assert list(tmp_path.iterdir()) == []
    path = tmp_path / "cpu.trace"
    path.write_text("burn 1.0 2 3 0.1 0.1 0.2\ngc 1.5 2 3 2 0.01 0.01\nburn 2.0 2 3 0.1")
    burns, collections = read_cpu_trace(path)
    assert [b.start for b in burns] == [1.0] and [c.generation for c in collections] == [2]


def test_a_node_process_traces_when_the_variable_names_a_file(tmp_path: Path) -> None:
    path = tmp_path / "cpu.trace"
    code = (
        "import gc\nfrom shuttle.net.cpu import CpuSpeed\n"
        "with CpuSpeed(0.5).section(): sum(range(10**5))\ngc.collect()"
    )
    env = {**os.environ, CPU_TRACE_ENV: str(path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    burns, collections = read_cpu_trace(path)
    assert len(burns) == 1 and burns[0].asked_s > 0.0
    assert 2 in [c.generation for c in collections]  # the full collection asked for
