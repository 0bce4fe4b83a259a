"""The placement model against numbers worked by hand from ABACUS's equations 1-7.

Each test states the arithmetic in its comments; the numbers are small enough to
check on paper.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import ConfigError
from shuttle.runtime.placement import (
    QUIESCE_S_DEFAULT,
    EdgeView,
    NodeView,
    ObjectView,
    PlacementConfig,
    StackView,
    choose,
    feasible_splits,
    migration_cost_s,
    predict,
    predict_single,
    response_time_s,
    stall_s,
)

LAN = 1.25e6  # 10 Mbit/s in bytes per second
CONFIG = PlacementConfig(window_s=1.0, threshold_fraction=0.3)


def filter_stack(
    *,
    split: int = 1,
    filter_cpu_s: float = 0.2,
    storage_cpu_s: float = 0.05,
    up_bytes: float = 200_000,
    down_bytes: float = 1_000_000,
    calls: float = 10,
    memory: int = 0,
    stack_id: str = "s",
    client: str = "c",
    server: str = "n1",
    bandwidth: float | None = LAN,
    latency_s: float = 0.0005,
) -> StackView:
    """console -> filter -> storage: the filter reads ``down_bytes`` from storage and
    passes ``up_bytes`` up to the console in the window."""
    return StackView(
        stack_id,
        client,
        server,
        (
            ObjectView(f"{client}/console-{stack_id}", 0.0, migratable=False),
            ObjectView(f"{client}/filter-{stack_id}", filter_cpu_s, memory_bytes=memory),
            ObjectView(f"{server}/storage", storage_cpu_s, migratable=False),
        ),
        (EdgeView(up_bytes, calls), EdgeView(down_bytes, calls)),
        split,
        bandwidth,
        latency_s,
    )


def nodes(
    client_load: float = 0.5,
    server_load: float = 0.2,
    server_speed: float = 1.0,
    capacity: int | None = None,
) -> dict[str, NodeView]:
    return {
        "c": NodeView("c", 1.0, client_load),
        "n1": NodeView("n1", server_speed, server_load, capacity),
    }


def test_equation_4_splits_the_response_time_into_client_network_and_server() -> None:
    stack = filter_stack()
    ns = nodes()
    # C_1 = 1e6 B / 1.25e6 B/s + 2 × 0.5 ms × 10 calls = 0.8 + 0.01
    assert stall_s(stack, 1) == pytest.approx(0.81)
    # C_0 = 2e5 / 1.25e6 + 0.01 = 0.17
    assert stall_s(stack, 0) == pytest.approx(0.17)
    # T(1) = max(1, 0.5)·0.2/1 + 0.81 + max(1, 0.2)·0.05/1 = 1.06
    assert response_time_s(stack, 1, ns["c"], ns["n1"], 0.2) == pytest.approx(1.06)


def test_equations_5_and_6_idle_server_keeps_the_whole_cpu() -> None:
    # Moving the filter adds 0.2 / T(0) to the server's load 0.2: about 0.68 < 1, so
    # the effective load stays 1 and T(0) = 0.17 + 1·(0.2 + 0.05)/1 = 0.42.
    assert predict_single(filter_stack(), 0, nodes(), 1.0) == pytest.approx(0.42)


def test_equations_5_and_6_loaded_slow_server_solve_the_fixed_point() -> None:
    # Server at half speed with load 1.5: T = 0.17 + L·0.25/0.5 with
    # L = 1.5 + 0.2/(0.5·T), i.e. T = 0.92 + 0.2/T, so T² - 0.92·T - 0.2 = 0.
    expected = (0.92 + math.sqrt(0.92**2 + 0.8)) / 2
    got = predict_single(filter_stack(), 0, nodes(server_load=1.5, server_speed=0.5), 1.0)
    assert got == pytest.approx(expected, rel=1e-6)


def test_moving_objects_off_the_server_takes_their_load_away() -> None:
    # Filter now at the server (split 0), server load 1.6 measured, of which the
    # filter's 0.2 s of CPU in a 1 s window is 0.2. At the client: L_server = 1.4,
    # T(1) = 0.5→1 · 0.2 + 0.81 + 1.4 · 0.05 = 1.08.
    stack = filter_stack(split=0)
    assert predict_single(stack, 1, nodes(server_load=1.6), 1.0) == pytest.approx(1.08)


def test_migration_cost_is_quiesce_plus_checkpoint_over_the_link_plus_a_round_trip() -> None:
    stack = StackView(
        "s",
        "c",
        "n1",
        (
            ObjectView("c/console", migratable=False),
            ObjectView("c/f", 0.1, checkpoint_bytes=125_000, quiesce_s=0.02),
            ObjectView("n1/storage", migratable=False),
        ),
        (EdgeView(), EdgeView()),
        1,
        LAN,
        0.001,
    )
    # 0.02 + 125 000 / 1.25e6 + 2 × 0.001 = 0.122
    assert migration_cost_s(stack, 1, 0) == pytest.approx(0.122)


def test_a_selective_filter_moves_to_the_server() -> None:
    plan = choose([filter_stack()], nodes(), CONFIG)
    (move,) = plan.moves
    # benefit 1.06 - 0.42 = 0.64; cost = 0.01 quiesce + 0 B + 2 × 0.5 ms = 0.011
    assert move.to_server and move.execute
    assert move.benefit_s == pytest.approx(0.64)
    assert move.cost_s == pytest.approx(QUIESCE_S_DEFAULT + 0.001)
    assert move.rids == ("c/filter-s",)
    assert plan.best.placement["s"] == 0


def test_a_benefit_below_the_threshold_does_not_move() -> None:
    # The loaded slow server: benefit 1.16 - 1.1016 = 0.058 s < 0.3 s.
    plan = choose([filter_stack()], nodes(server_load=1.5, server_speed=0.5), CONFIG)
    # The greedy still prefers the server (a smaller T), but the move is not worth it.
    assert [(m.execute, m.to_server) for m in plan.moves] in ([], [(False, True)])
    assert not plan.executed


def test_a_filter_at_a_server_that_got_loaded_goes_back() -> None:
    # At the server (split 0) with a competitor: load 3.2 on a half-speed server.
    stack = filter_stack(split=0, up_bytes=900_000)
    plan = choose([stack], nodes(server_load=3.2, server_speed=0.5), CONFIG)
    (move,) = plan.executed
    assert not move.to_server
    assert move.net_s > CONFIG.threshold_s


def test_anchored_non_migratable_and_pinned_objects_stay() -> None:
    stack = filter_stack()
    assert list(feasible_splits(stack)) == [0, 1]
    assert list(feasible_splits(stack, pinned=["c/filter-s"])) == [1]
    assert not choose([stack], nodes(), CONFIG, pinned=["c/filter-s"]).moves


def test_competition_the_more_selective_filter_takes_the_only_slot() -> None:
    """Two filters, memory for one at the server (6.7): f1 (passes 60%) is there now,
    f2 (passes 30%) at the client. Link 1 MB/s, no latency, 0.1 s CPU each, 8 MB each,
    capacity 10 MB, server load 0.1 (f1's own).

    Baseline (both at the client): T = 0.1 + 1.0 = 1.1 each.
    f1 at the server alone: T = 0.6 + 0.1 = 0.7, benefit 0.4, score 0.4/0.1 = 4.
    f2 at the server alone: T = 0.3 + 0.1 = 0.4, benefit 0.7, score 7 -> first.
    f2 takes the slot; f1 no longer fits. Moves: f2 in (net 0.69 > 0.3); f1 out
    (its own net is negative, but 7 ≥ 1.25 × 4 and the room is needed)."""
    mb = 1_000_000

    def f(stack_id: str, split: int, up: float) -> StackView:
        return filter_stack(
            stack_id=stack_id,
            split=split,
            filter_cpu_s=0.1,
            storage_cpu_s=0.0,
            up_bytes=up,
            down_bytes=mb,
            calls=0,
            memory=8 * mb,
            bandwidth=1e6,
            latency_s=0.0,
        )

    stacks = [f("f1", 0, 0.6 * mb), f("f2", 1, 0.3 * mb)]
    ns = nodes(client_load=0.0, server_load=0.1, capacity=10 * mb)
    plan = choose(stacks, ns, CONFIG)
    scores = {(c.stack_id, c.split): c.score for c in plan.candidates}
    assert scores[("f1", 0)] == pytest.approx(4.0)
    assert scores[("f2", 0)] == pytest.approx(7.0)
    assert plan.best.placement == {"f1": 1, "f2": 0}
    assert [(m.stack_id, m.to_server, m.execute) for m in plan.moves] == [
        ("f1", False, True),  # evictions come first: they free the room
        ("f2", True, True),
    ]
    assert plan.moves[1].benefit_s == pytest.approx(0.7)
    assert "makes room" in plan.moves[0].reason


def test_competition_between_near_equals_does_not_churn() -> None:
    # f2 passes 52% instead of 30%: score (1 - 0.52)/0.1 = 4.8 < 1.25 × 4 = 5, so f1
    # keeps the slot, and f2's admission cannot go ahead without the room.
    mb = 1_000_000
    stacks = [
        filter_stack(
            stack_id="f1",
            split=0,
            filter_cpu_s=0.1,
            storage_cpu_s=0.0,
            up_bytes=0.6 * mb,
            down_bytes=mb,
            calls=0,
            memory=8 * mb,
            bandwidth=1e6,
            latency_s=0.0,
        ),
        filter_stack(
            stack_id="f2",
            split=1,
            filter_cpu_s=0.1,
            storage_cpu_s=0.0,
            up_bytes=0.52 * mb,
            down_bytes=mb,
            calls=0,
            memory=8 * mb,
            bandwidth=1e6,
            latency_s=0.0,
        ),
    ]
    ns = nodes(client_load=0.0, server_load=0.1, capacity=10 * mb)
    plan = choose(stacks, ns, CONFIG)
    assert not plan.executed


def test_equation_7_couples_stacks_through_the_server_load() -> None:
    # Two identical stacks moving to a server of speed 1 with measured load 0:
    # each adds 0.4/T; T = 0.17 + max(1, 0.8/T)·(0.4 + 0.0). With both at the
    # server, 0.8/T > 1 so T = 0.17 + 0.32/T: T² - 0.17T - 0.32 = 0.
    s1 = filter_stack(stack_id="a", filter_cpu_s=0.4, storage_cpu_s=0.0)
    s2 = filter_stack(stack_id="b", filter_cpu_s=0.4, storage_cpu_s=0.0)
    ns = nodes(client_load=0.0, server_load=0.0)
    both = predict([s1, s2], {"a": 0, "b": 0}, ns, 1.0)
    expected = (0.17 + math.sqrt(0.17**2 + 4 * 0.32)) / 2
    assert both.converged
    assert both.response_s["a"] == pytest.approx(expected, rel=1e-6)
    # One alone: 0.4/T < 1 at T = 0.57, so T = 0.17 + 0.4 = 0.57.
    alone = predict([s1, s2], {"a": 0}, ns, 1.0)
    assert alone.response_s["a"] == pytest.approx(0.57)


def test_plan_json_records_inputs_candidates_and_verdicts() -> None:
    record = choose([filter_stack()], nodes(), CONFIG).to_json()
    assert record["threshold_s"] == pytest.approx(0.3)
    assert record["current"]["splits"] == {"s": 1}
    assert record["moves"][0]["direction"] == "to_server"
    assert record["candidates"][0]["split"] == 0


def test_bad_config_says_which_knob() -> None:
    with pytest.raises(ConfigError, match="window H"):
        PlacementConfig(window_s=0)
    with pytest.raises(ConfigError, match="B_thresh"):
        PlacementConfig(threshold_fraction=-1)
    with pytest.raises(ConfigError, match="speed R"):
        NodeView("x", speed=0)


@settings(max_examples=200, deadline=None)
@given(
    cpu=st.floats(0, 2),
    storage_cpu=st.floats(0, 1),
    up=st.floats(0, 5e6),
    down=st.floats(0, 5e6),
    calls=st.integers(0, 200),
    client_load=st.floats(0, 4),
    server_load=st.floats(0, 4),
    speed=st.floats(0.1, 4),
    split=st.integers(0, 1),
)
def test_the_choice_never_executes_a_move_that_does_not_clear_the_threshold_alone(
    cpu: float,
    storage_cpu: float,
    up: float,
    down: float,
    calls: int,
    client_load: float,
    server_load: float,
    speed: float,
    split: int,
) -> None:
    """A single stack (no competition): whatever the measurements, a move is made only
    if it saves more than B_thresh, the predictions converge, and the best placement
    is never predicted worse than the current one."""
    stack = filter_stack(
        split=split,
        filter_cpu_s=cpu,
        storage_cpu_s=storage_cpu,
        up_bytes=up,
        down_bytes=down,
        calls=calls,
    )
    ns = nodes(client_load, server_load, speed)
    plan = choose([stack], ns, CONFIG)
    assert plan.current.converged and plan.best.converged
    assert plan.best.mean_response_s <= plan.current.mean_response_s + 1e-6
    for move in plan.executed:
        assert move.net_s > CONFIG.threshold_s


def test_a_fan_out_object_pays_for_its_other_nodes_on_the_client_link_only_at_the_client() -> None:
    # A RAID object writes 1 MB to this node and 4 MB to four others per window.
    base = filter_stack(down_bytes=1_000_000, up_bytes=1_000_000, calls=10)
    raid = StackView(
        base.stack_id,
        base.client,
        base.server,
        base.objects,
        base.edges,
        1,
        base.bandwidth_bytes_per_s,
        base.latency_s,
        EdgeView(4_000_000, 40),
    )
    # At the client: all 5 MB over the 1.25 MB/s link, 50 round trips.
    assert stall_s(raid, 1) == pytest.approx(5e6 / LAN + 2 * 0.0005 * 50)
    # At the server: the console's 1 MB crosses the link; the nodes' network is free.
    assert stall_s(raid, 0) == pytest.approx(1e6 / LAN + 2 * 0.0005 * 10)
    assert stall_s(raid, 1) - stall_s(base, 1) == pytest.approx(4e6 / LAN + 0.04)
