"""The event kernel: ordering, determinism, seeds, and M/M/1 against SimPy and theory."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from shuttle.errors import ConfigError
from shuttle.sim.kernel import PRIORITY_LATE, PRIORITY_URGENT, Kernel, derive_seed
from shuttle.sim.mm1 import bench, draw, mean_delay_theory_s, run_kernel, run_simpy


def test_events_run_in_time_order_and_equal_times_in_scheduling_order() -> None:
    kernel = Kernel()
    log: list[tuple[float, str]] = []

    def note(now: float, what: str) -> None:
        log.append((now, what))

    kernel.at(2.0, note, "late")
    kernel.at(1.0, note, "first at 1")
    kernel.at(1.0, note, "second at 1")
    kernel.at(0.5, note, "early")
    kernel.run()
    assert log == [(0.5, "early"), (1.0, "first at 1"), (1.0, "second at 1"), (2.0, "late")]
    assert kernel.now == 2.0
    assert kernel.events_processed == 4


def test_priority_orders_events_at_the_same_time() -> None:
    kernel = Kernel()
    log: list[str] = []
    kernel.at(1.0, lambda now, arg: log.append(arg), "normal")
    kernel.at(1.0, lambda now, arg: log.append(arg), "late", PRIORITY_LATE)
    kernel.at(1.0, lambda now, arg: log.append(arg), "urgent", PRIORITY_URGENT)
    kernel.run()
    assert log == ["urgent", "normal", "late"]


def test_a_handler_schedules_the_next_step_of_a_process() -> None:
    """A client thinks 1 s between three requests that each take 0.5 s."""
    kernel = Kernel()
    log: list[tuple[float, str]] = []

    def issue(now: float, n: int) -> None:
        log.append((now, f"issue {n}"))
        kernel.after(0.5, complete, n)

    def complete(now: float, n: int) -> None:
        log.append((now, f"done {n}"))
        if n < 3:
            kernel.after(1.0, issue, n + 1)

    kernel.at(0.0, issue, 1)
    kernel.run()
    assert log == [
        (0.0, "issue 1"),
        (0.5, "done 1"),
        (1.5, "issue 2"),
        (2.0, "done 2"),
        (3.0, "issue 3"),
        (3.5, "done 3"),
    ]


def test_run_until_stops_before_later_events_and_resumes() -> None:
    kernel = Kernel()
    seen: list[float] = []
    for t in (1.0, 2.0, 3.0):
        kernel.at(t, lambda now, arg: seen.append(now))
    kernel.run(until=2.0)
    assert seen == [1.0, 2.0]
    assert kernel.peek() == 3.0
    assert kernel.pending() == 1
    kernel.run()
    assert seen == [1.0, 2.0, 3.0]
    assert kernel.peek() == math.inf
    assert not kernel.step()


def test_after_names_the_bad_parameter() -> None:
    kernel = Kernel()
    with pytest.raises(ConfigError, match='"delay_s" must be >= 0'):
        kernel.after(-1.0, lambda now, arg: None)
    with pytest.raises(ConfigError, match='"priority"'):
        kernel.after(1.0, lambda now, arg: None, priority=99)


def test_random_streams_derive_from_one_seed_by_name() -> None:
    a, b = Kernel(seed=7), Kernel(seed=7)
    assert a.random("arrivals").random() == b.random("arrivals").random()
    assert a.random("arrivals").random() != a.random("service").random()
    assert Kernel(seed=8).random("arrivals").random() != a.random("arrivals").random()
    assert a.numpy_rng("x").integers(1 << 30) == b.numpy_rng("x").integers(1 << 30)
    assert derive_seed(7, "x") == derive_seed(7, "x") != derive_seed(7, "y")


def test_mm1_on_our_kernel_and_simpy_give_bit_identical_delays() -> None:
    draws = draw(20_000, 0.8, seed=3)
    ours, events, _ = run_kernel(draws)
    theirs, simpy_events, _ = run_simpy(draws)
    assert ours == theirs
    assert events == 40_000
    assert simpy_events > events  # SimPy needs more internal events for the same model


@pytest.mark.parametrize("utilisation", [0.3, 0.5, 0.8])
def test_mm1_mean_delay_matches_theory(utilisation: float) -> None:
    """Mean time in an M/M/1 system is 1/(mu - lambda); 200k customers get within 5%."""
    mean, _, _ = run_kernel(draw(200_000, utilisation, seed=11))
    assert mean == pytest.approx(mean_delay_theory_s(utilisation), rel=0.05)


def test_bench_reports_both_kernels() -> None:
    result = bench(events=4_000, seed=1)
    assert result.identical
    assert result.events == 4_000
    assert result.ratio_vs_simpy == pytest.approx(result.events_per_s / result.simpy_events_per_s)
    assert set(result.to_json()) >= {
        "events_per_s",
        "simpy_events_per_s",
        "ratio_vs_simpy",
        "mean_delay_s",
        "simpy_mean_delay_s",
    }


def test_draw_names_the_bad_parameter() -> None:
    with pytest.raises(ConfigError, match='"utilisation"'):
        draw(10, 1.2, 0)
    with pytest.raises(ConfigError, match='"customers"'):
        draw(0, 0.5, 0)


def test_a_stream_merges_with_the_heap_in_time_order() -> None:
    """A trace replayed at its times interleaves with the events the model schedules."""
    kernel = Kernel()
    log: list[tuple[float, str]] = []

    def arrive(now: float, name: str) -> None:
        log.append((now, name))
        if name == "arrival 0":
            kernel.at(now + 1.0, lambda t, _: log.append((t, "reply 0")))

    arrivals = [(1.0, "arrival 0"), (2.0, "arrival 1"), (2.0, "arrival 2"), (5.0, "arrival 3")]
    kernel.stream(arrivals, arrive)
    kernel.at(0.5, lambda t, _: log.append((t, "tick")))
    kernel.at(4.0, lambda t, _: log.append((t, "tick")))
    assert kernel.pending() == 3  # two on the heap, and the stream's next
    assert kernel.peek() == 0.5
    kernel.run()
    assert log == [
        (0.5, "tick"),
        (1.0, "arrival 0"),
        (2.0, "reply 0"),  # heap events go first at equal times
        (2.0, "arrival 1"),
        (2.0, "arrival 2"),
        (4.0, "tick"),
        (5.0, "arrival 3"),
    ]
    assert kernel.events_processed == 7
    assert kernel.pending() == 0


def test_a_stream_can_be_cut_short_and_run_until_a_time() -> None:
    kernel = Kernel()
    seen: list[int] = []

    def arrive(now: float, i: int) -> None:
        seen.append(i)
        if i == 3:
            kernel.end_stream()

    kernel.stream(((float(t), t) for t in range(10)), arrive)
    kernel.run(until=1.5)
    assert seen == [0, 1]
    assert kernel.peek() == 2.0
    assert kernel.step()
    assert seen == [0, 1, 2]
    kernel.run()
    assert seen == [0, 1, 2, 3]
    assert not kernel.step()
    kernel.stream([(1.0, 9)], arrive)  # a new stream may follow the ended one
    with pytest.raises(ConfigError, match="one stream at a time"):
        kernel.stream([(2.0, 10)], arrive)


def test_a_stream_is_read_lazily() -> None:
    """The source makes its events as the kernel reaches them (memory stays flat)."""
    kernel = Kernel()
    made: list[float] = []

    def source() -> Iterator[tuple[float, None]]:
        for t in range(1_000_000):
            made.append(float(t))
            yield float(t), None

    kernel.stream(source(), lambda now, _: None)
    kernel.run(until=10.0)
    assert len(made) == 12  # up to 10, plus the one read ahead
