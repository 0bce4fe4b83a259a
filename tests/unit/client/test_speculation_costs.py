"""``auto``'s decision: the paper's rule T_f < (1 - p)·T_c, on numbers fed in, and the
engine following it (a normal read when the rule says no, a branch when it says yes)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shuttle.client.speculation import Speculator
from shuttle.client.speculation_costs import (
    CostModel,
    Ewma,
    expected_normal_s,
    expected_speculative_s,
    should_speculate,
)
from shuttle.testing import MemoryNode

seconds = st.floats(min_value=1e-6, max_value=10.0)
probability = st.floats(min_value=0.0, max_value=1.0)


@given(tf=seconds, tc=seconds, tr=seconds, p=probability)
def test_the_rule_is_exactly_when_speculation_is_expected_faster(
    tf: float, tc: float, tr: float, p: float
) -> None:
    t1 = expected_normal_s(tc, tr, p)
    t2 = expected_speculative_s(tf, tc, tr, p)
    assume(abs(t1 - t2) > 1e-9 * max(t1, t2))  # not a tie up to rounding
    assert should_speculate(tf, tc, p) == (t2 < t1)


def test_the_papers_points() -> None:
    """Section 2.4 and 4.2: with p = 0 speculate iff T_f < T_c; p = 0.25 needs
    T_f < 0.75·T_c; p = 1 never."""
    assert should_speculate(0.9, 1.0, 0.0) and not should_speculate(1.1, 1.0, 0.0)
    assert should_speculate(0.7, 1.0, 0.25) and not should_speculate(0.8, 1.0, 0.25)
    assert not should_speculate(1e-9, 1.0, 1.0)


@given(
    tf_thread=seconds,
    tf_fork=seconds,
    tc=seconds,
    stale=st.lists(st.booleans(), min_size=1, max_size=50),
)
def test_choose_picks_the_cheaper_mechanism_only_when_the_rule_holds(
    tf_thread: float, tf_fork: float, tc: float, stale: list[bool]
) -> None:
    model = CostModel()
    for s in stale:
        model.check(tc, stale=s)
    model.branch("thread", tf_thread)
    model.branch("fork", tf_fork)
    p = model.p.value
    assert p is not None and 0.0 <= p <= 1.0
    best_tf, best = min((tf_thread, "thread"), (tf_fork, "fork"))
    expected = best if best_tf < (1 - p) * tc else "none"
    assert model.choose() == expected
    assert model.choose(["fork"]) == ("fork" if tf_fork < (1 - p) * tc else "none")


def test_choose_reads_normally_until_there_is_something_measured() -> None:
    model = CostModel()
    assert model.choose() == "none"  # no T_c yet
    model.check(0.01, stale=None)
    assert model.choose() == "none"  # no T_f yet
    assert model.unmeasured(["thread", "fork"]) == ["thread", "fork"]
    model.branch("thread", 0.001)
    assert model.choose() == "thread" and model.unmeasured(["thread", "fork"]) == ["fork"]


def test_measured_t2_overrules_the_models_pick_and_can_veto_speculation() -> None:
    """A thread branch that slows the check beside it (the interpreter lock) costs
    more than its T_f says: its measured T2 sends auto to fork, or to a normal read."""
    model = CostModel()
    model.check(0.030, stale=False)  # T_c = 30 ms, p = 0
    model.branch("thread", 0.0005)
    model.branch("fork", 0.005)
    assert model.choose() == "thread"  # by the model: T2 = T_f
    model.observe("thread", 0.016)  # measured: the check showed
    assert model.choose() == "fork"  # fork's modelled 5 ms beats thread's measured 16
    model.observe("fork", 0.009)
    assert model.choose() == "fork"  # measured, and still the smaller T2
    model.forget_observed()
    model.observe("thread", 0.035)
    model.observe("fork", 0.040)
    assert model.choose() == "none"  # both measured worse than T1 = 30 ms
    model.forget_observed()
    assert model.choose() == "thread"  # tried again under today's conditions


def test_ewma_takes_the_first_sample_then_moves_by_alpha() -> None:
    e = Ewma(0.5)
    e.add(4.0)
    e.add(2.0)
    assert e.value == 3.0 and e.samples == 2


@pytest.mark.parametrize(
    ("tf_s", "tc_s", "p", "decision"),
    [(0.001, 0.010, 0.0, "thread"), (0.020, 0.010, 0.0, "none"), (0.008, 0.010, 0.25, "none")],
)
def test_the_engine_follows_the_rule(
    node: MemoryNode, tf_s: float, tc_s: float, p: float, decision: str
) -> None:
    with MemoryNode.client([node]) as client:
        client.put("k", b"x" * 100)
        engine = Speculator(client, auto_mechanisms=["thread"], probe_every=10**9)
        engine.speculate("k", lambda data, _: data)  # caches a copy (no copy: a read)
        engine.costs = CostModel()
        engine.costs.check(tc_s, stale=None)
        engine.costs.p.value = p
        engine.costs.branch("thread", tf_s)
        ran_in: list[str] = []

        def work(data: bytes, checkpoint: Callable[[], None]) -> None:
            ran_in.append(threading.current_thread().name)

        engine.speculate("k", work)
        stats = engine.stats()
        if decision == "none":
            assert stats["auto_normal"] == 1 and stats["speculated"]["thread"] == 0
            assert ran_in == ["MainThread"]
        else:
            assert stats["auto_speculated"] == 1 and stats["speculated"]["thread"] == 1
            assert ran_in == ["shuttle-speculation"]
        assert stats["probes"] == 0
        engine.close()


def test_auto_measures_what_it_has_not_measured(node: MemoryNode) -> None:
    with MemoryNode.client([node]) as client:
        client.put("k", b"x" * 100)
        engine = Speculator(client, probe_every=10**9)
        engine.speculate("k", lambda data, _: data)
        engine.speculate("k", lambda data, _: data)
        estimates = engine.stats()["estimates"]
        assert estimates["tf_s"]["thread"] > 0 and estimates["tf_s"]["fork"] > 0
        assert estimates["tc_s"] > 0 and estimates["p"] == 0.0
        assert engine.stats()["probes"] == 2
        engine.close()
