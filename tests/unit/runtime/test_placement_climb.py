"""The admission edge climbed on the measured objective (docs/runtime.md, "The
admission edge"; ``shuttle serve --cpu-climb``): with many clients, the share of its
CPU a node lets arrivals fill rises from the budget a step at a time while the
clients' aggregate calls a second do not fall by more than their noise; a step after
which they fell is taken back with the stacks it let in, and the node holds. On a
fake clock: one sample a window, none while an arrival is on its way."""

from __future__ import annotations

from typing import Any

import pytest

from shuttle.errors import ConfigError
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.placement import NodeView, PlacementConfig, choose
from shuttle.runtime.placement_climb import (
    CLIMB_HOLD_WINDOWS,
    CLIMB_SEND_BACK_WINDOWS,
    CLIMB_TRIAL_WINDOWS_MAX,
    AdmissionClimb,
)
from shuttle.testing import FakeClock
from tests.unit.runtime.test_placement_many import NODE_SPEED, mix
from tests.unit.runtime.test_placement_many_saturation import arrivals, backs
from tests.unit.runtime.test_planner import resource_manager
from tests.unit.runtime.test_planner_rounds import digest


def feed(
    climb: AdmissionClimb, clock: FakeClock, rates: list[float], clients: list[str] | None = None
) -> float:
    """One settled sample a window (over ``clients``, the same each time)."""
    share = climb.share
    for r in rates:
        share = climb.observe(clock.now(), r, True, clients or ())
        clock.jump(1.0)
    return share


def climb_at() -> AdmissionClimb:
    """The defaults' range: from the budget, 0.7, to the share that sends back, 0.9."""
    return AdmissionClimb(0.7, 0.9, 1.0)


def test_the_edge_rises_while_the_rate_does_not_fall_and_stops_at_the_ceiling() -> None:
    clock = FakeClock(0.0)
    climb = climb_at()
    assert climb.share == 0.7 and climb.state == "reference"
    # Three windows make the reference; then a step up is tried.
    assert feed(climb, clock, [200, 204, 198]) == pytest.approx(0.8)
    assert climb.state == "trial"
    climb.arrived(["app1/console-cheap", "app2/console-cheap"])
    # An arrival on its way: its cost is not in the rate yet, no sample.
    climb.observe(clock.now(), 150.0, settled=False)
    clock.jump(1.0)
    # It rose: kept, and the next step tried, up to the share that sends stacks back.
    assert feed(climb, clock, [214, 216, 212]) == pytest.approx(0.9)
    assert climb.last.startswith("kept 0.80: 214.0 ± 1.2 calls/s against 200.7")
    climb.arrived(["app3/console-cheap"])
    assert feed(climb, clock, [213, 215, 211]) == pytest.approx(0.9)
    assert climb.state == "hold" and climb.last.endswith("at the ceiling 0.90")
    assert climb.send_back(clock.now()) == {}


def test_a_step_after_which_the_rate_fell_is_taken_back_with_its_stacks() -> None:
    clock = FakeClock(0.0)
    climb = climb_at()
    feed(climb, clock, [230, 232, 228])
    climb.arrived(["app1/console-cheap", "app2/console-cheap"])
    assert feed(climb, clock, [190, 186, 194]) == pytest.approx(0.7)
    assert climb.state == "hold" and climb.last.startswith("fell: 190.0 ± 2.3 calls/s")
    back = climb.send_back(clock.now())
    assert sorted(back) == ["app1/console-cheap", "app2/console-cheap"]
    assert "lowered the clients' calls a second" in back["app1/console-cheap"]
    # One of them left; the other is asked until the send-back's windows are over.
    climb.left(["app1/console-cheap"])
    assert list(climb.send_back(clock.now())) == ["app2/console-cheap"]
    clock.jump(CLIMB_SEND_BACK_WINDOWS * 1.0)
    assert climb.send_back(clock.now()) == {}
    # It holds, then measures a new reference and tries again.
    assert CLIMB_HOLD_WINDOWS > CLIMB_SEND_BACK_WINDOWS + 1
    feed(climb, clock, [180.0])
    assert climb.state == "hold"
    assert feed(climb, clock, [180, 180, 181, 182, 181]) == pytest.approx(0.8)
    assert climb.state == "trial"


def test_a_fall_within_the_noise_does_not_take_a_step_back() -> None:
    # Per-second rates near the node's saturation vary by 15-30 %: a mean 10 calls a
    # second lower, with standard errors of 11.5 each (16 for the difference), is
    # kept; the same fall measured steady is not.
    clock = FakeClock(0.0)
    climb = climb_at()
    feed(climb, clock, [200, 240, 220])
    climb.arrived(["app1/console-cheap"])
    assert feed(climb, clock, [190, 230, 210]) == pytest.approx(0.9)
    clock = FakeClock(0.0)
    climb = climb_at()
    feed(climb, clock, [219, 220, 221])
    climb.arrived(["app1/console-cheap"])
    assert feed(climb, clock, [209, 210, 211]) == pytest.approx(0.7)


def test_a_step_that_let_nothing_in_learns_nothing_and_is_taken_back() -> None:
    clock = FakeClock(0.0)
    climb = climb_at()
    feed(climb, clock, [200, 200, 200])
    assert climb.share == pytest.approx(0.8)
    # The rate it sees meanwhile is not the step's: nothing came.
    feed(climb, clock, [300.0] * (CLIMB_TRIAL_WINDOWS_MAX - 1))
    assert climb.share == pytest.approx(0.8) and climb.state == "trial"
    feed(climb, clock, [300.0])
    assert climb.share == pytest.approx(0.7) and climb.state == "hold"
    assert climb.last.startswith("no arrival at 0.80: the edge did not bind")


def test_samples_are_one_a_window_and_none_while_an_arrival_is_on_its_way() -> None:
    clock = FakeClock(0.0)
    climb = climb_at()
    for _ in range(15):  # evaluations every 0.1 s: the first of each window counts
        climb.observe(clock.now(), 200.0, settled=True)
        clock.jump(0.1)
    assert climb.state == "reference"  # two samples in one second of evaluations
    # An unsettled evaluation discards what the measure had gathered.
    climb.observe(clock.now(), 200.0, settled=False)
    clock.jump(1.0)
    feed(climb, clock, [200, 200])
    assert climb.state == "reference"
    feed(climb, clock, [200])
    assert climb.state == "trial"


def test_a_rate_over_other_clients_is_no_reference() -> None:
    # In the mix benchmark every pass brings new clients while the last pass's
    # digests go stale: a sum over both read as a rise of 3x.
    clock = FakeClock(0.0)
    climb = climb_at()
    old = [f"app{i}" for i in range(8)]
    for r in (200, 200, 200):
        climb.observe(clock.now(), r, True, old)
        clock.jump(1.0)
    assert climb.state == "trial" and climb.share == pytest.approx(0.8)
    climb.arrived(["app1/console-cheap"])
    # One client more: the trial is not judged, nor kept; a new reference.
    one_more = [*old, "app8"]
    assert climb.observe(clock.now(), 200.0, True, one_more) == pytest.approx(0.7)
    assert climb.state == "reference" and climb.last.startswith("the clients changed (11%)")
    clock.jump(1.0)
    for r in (205, 205):
        climb.observe(clock.now(), r, True, one_more)
        clock.jump(1.0)
    assert climb.last.startswith("reference 203.3")  # over the nine clients
    assert climb.share == pytest.approx(0.8)
    # Two steps kept: at the ceiling. Most of the stacks new: from the floor again.
    climb.arrived(["app2/console-cheap"])
    feed(climb, clock, [205, 206, 204], one_more)
    climb.arrived(["app3/console-cheap"])
    assert feed(climb, clock, [205, 206, 204], one_more) == pytest.approx(0.9)
    new = [f"new{i}" for i in range(8)]
    assert climb.observe(clock.now(), 100.0, True, new) == pytest.approx(0.7)
    assert climb.last.startswith("the clients changed (100%)")


def test_the_climb_s_range_is_checked() -> None:
    with pytest.raises(ConfigError, match="from the CPU budget to the share that sends"):
        AdmissionClimb(0.95, 0.9, 1.0)
    with pytest.raises(ConfigError, match="at least two samples"):
        AdmissionClimb(0.7, 0.9, 1.0, samples_per_measure=1)


def test_choose_sends_back_what_the_climb_asks_with_many_clients_only() -> None:
    # Eight cheap filters at a node under its budget: nothing would move; the climb's
    # send-back moves the two it names, whatever they save.
    stacks, nodes = mix(8, node=NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.5), at_node=("cheap",))
    asked = {
        "app1/console-cheap": "the admission edge's last step lowered it",
        "app9/console-cheap": "not a stack here: ignored",
    }
    plan = choose(stacks, nodes, PlacementConfig(), send_back=asked)
    assert backs(plan.moves) == ["app1/console-cheap"]
    assert next(m.reason for m in plan.moves if m.stack_id == "app1/console-cheap") == (
        "the admission edge's last step lowered it"
    )
    assert arrivals(plan.moves) == []
    # A pinned stack (its residence after a move) stays.
    plan = choose(stacks, nodes, PlacementConfig(), send_back=asked, pinned={"app1/filter-cheap"})
    assert backs(plan.moves) == []
    # Below aggregate_clients_min clients the paper's rule decides, as before.
    stacks, nodes = mix(3, node=NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.5), at_node=("cheap",))
    assert backs(choose(stacks, nodes, PlacementConfig(), send_back=asked).moves) == []


def evaluate_rounds(rm: Any, clock: FakeClock, clients: int, rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of digests from ``clients`` clients, each calling from one of
    two consoles in turn (as a mix client whose window held one kind of call): the
    stacks the node sees change every round, the clients do not."""
    for r in range(rounds):
        for i in range(clients):
            d = digest(f"app{i}")
            console = f"app{i}/console-{r % 2}"
            d["edges"][0]["caller"], d["consoles"] = console, [console]
            rm.receive(d)
        clock.jump(1.0)
    return rm.log_since(0, limit=len(rm.records))


def test_the_node_climbs_with_many_clients_and_decides_as_before_with_few() -> None:
    clock = FakeClock(100.0)
    # Not adaptive: nothing moves, so every evaluation is settled (the climb is
    # consulted all the same).
    rm = resource_manager(RuntimeConfig(cpu_climb=True, adaptive=False), clock)
    records = evaluate_rounds(rm, clock, 6, 4)
    climbs = [r["climb"] for r in records if "climb" in r]
    assert climbs and climbs[0]["share"] == 0.7 and climbs[0]["settled"]
    # Six clients' consoles, 5 calls each in their half-second span: 60 calls a second.
    assert climbs[0]["rate"] == pytest.approx(60.0)
    assert rm.climb is not None and rm.climb.share == pytest.approx(0.8)
    assert climbs[-1]["last"].startswith("reference 60.0 ± 0.0 calls/s; trying 0.80")
    # Off by default; and with fewer clients than aggregate_clients_min, not consulted.
    plain = resource_manager(RuntimeConfig(), FakeClock(100.0))
    assert plain.climb is None
    few_clock = FakeClock(100.0)
    few = resource_manager(RuntimeConfig(cpu_climb=True, adaptive=False), few_clock)
    assert all("climb" not in r for r in evaluate_rounds(few, few_clock, 2, 4))
    assert few.climb is not None and few.climb.share == 0.7 and few.climb.state == "reference"
