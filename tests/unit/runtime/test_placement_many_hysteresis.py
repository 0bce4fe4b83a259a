"""The many-clients rule against its own swings (docs/runtime.md, "Many clients"): a
move back is judged alone by the paper's ``B_thresh`` while moves in are judged
together; the node sends stacks back for its CPU only once its use passes a higher
share than the one it plans to (a band); its load counts the calls queued for its
interpreter; and a stack's traffic is judged from its completed calls only. Each
rule applies from ``aggregate_clients_min`` clients; below it the paper's per-stack
model sees the window as it was measured.

The stacks are the mix benchmark's (tests/unit/runtime/test_placement_many.py)."""

from __future__ import annotations

import threading

import pytest

from shuttle.errors import ConfigError, InvalidArgumentError
from shuttle.runtime.digest import Digest, EdgeDigest
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.placement import (
    EdgeView,
    NodeView,
    ObjectView,
    PlacementConfig,
    StackView,
    choose,
)
from shuttle.runtime.placement_many import queued_load, settled
from shuttle.runtime.planner_input import NodeFacts, PlannerKnobs, model_input
from shuttle.testing import FakeClock
from tests.unit.runtime.test_placement_many import (
    BLOCK,
    CHEAP_CPU_S,
    LAN,
    NODE_SPEED,
    mix,
)
from tests.unit.runtime.test_planner import CLIENT, client_digest

# --- a move back is judged alone --------------------------------------------------------


def test_a_move_back_must_save_b_thresh_alone_while_moves_in_are_judged_together() -> None:
    # Eight cheap filters at a node whose load reads 400: each call's 1 ms of node CPU
    # takes 0.4 s there against the 0.21 s transfer at its client, so each stack would
    # save about 0.19 s a window back at its client, 1.5 s together. Judged together
    # they all went back (and came in again once the load fell: the swing). Alone,
    # each saves less than B_thresh (0.3 s): they stay.
    both_ways = ("cheap",)
    stacks, nodes = mix(8, node=NodeView("n1", NODE_SPEED, 400.0), at_node=both_ways)
    plan = choose(stacks, nodes, PlacementConfig())
    assert len(plan.moves) == 8 and all(not m.to_server for m in plan.moves)
    assert all(0.15 < m.net_s < 0.3 for m in plan.moves)
    assert not any(m.execute for m in plan.moves)
    assert plan.moves[0].reason.endswith(
        "≤ B_thresh 0.300 s (many clients: a move back is judged alone)"
    )
    # At a load of 600 each saves 0.39 s back at its client: over B_thresh alone.
    stacks, nodes = mix(8, node=NodeView("n1", NODE_SPEED, 600.0), at_node=both_ways)
    plan = choose(stacks, nodes, PlacementConfig())
    assert sum(m.execute for m in plan.moves) == 8
    assert plan.moves[0].reason.startswith("net benefit 0.3")
    assert plan.moves[0].reason.endswith(
        "> B_thresh 0.300 s (many clients: a move back is judged alone)"
    )


def cheap(client: str, split: int, edges: tuple[EdgeView, EdgeView]) -> StackView:
    return StackView(
        f"{client}/console-cheap",
        client,
        "n1",
        (
            ObjectView(f"{client}/console-cheap", migratable=False),
            ObjectView(f"{client}/filter-cheap", CHEAP_CPU_S),
            ObjectView("n1/storage", 0.0001, migratable=False),
        ),
        edges,
        split,
        LAN,
        0.0005,
    )


def test_moves_back_do_not_carry_the_moves_in_over_b_thresh() -> None:
    # Two cheap filters at their clients read half a block a window: moving one saves
    # 0.1 s, the two together 0.19 s net, under B_thresh. Six at the node waited 0.6 s
    # a window on one call (0.59 s over the estimate), while their reads there made
    # half a call: back at the client they would pay that overhead on half a call,
    # and save 0.2 s each. Counted with the moves in, those six carried them over
    # B_thresh (1.4 s together); a move back is judged alone, and so are they. (The two
    # newcomers' reads wait as long at the node, 0.59 s a call over the estimate: the
    # node's wait costs them nothing more there, test_placement_many_arrivals.py.)
    stacks = [
        cheap(
            f"app{i}",
            1,
            (EdgeView(BLOCK * 0.025, 0.5), EdgeView(BLOCK / 2, 0.5, measured_s=0.4004)),
        )
        for i in range(2)
    ]
    stacks += [
        cheap(f"app{i}", 0, (EdgeView(BLOCK * 0.05, 1, measured_s=0.6), EdgeView(BLOCK / 2, 0.5)))
        for i in range(2, 8)
    ]
    nodes = {"n1": NodeView("n1", NODE_SPEED, 1.0)}
    nodes.update({s.client: NodeView(s.client) for s in stacks})
    plan = choose(stacks, nodes, PlacementConfig())
    inbound = [m for m in plan.moves if m.to_server]
    back = [m for m in plan.moves if not m.to_server]
    assert len(inbound) == 2 and len(back) == 6
    assert all(0.15 < m.net_s < 0.3 for m in back)
    assert all(0.05 < m.net_s < 0.15 for m in inbound)
    assert not any(m.execute for m in plan.moves)
    assert "the 2 moves that repay themselves together 0.1" in inbound[0].reason


# --- the CPU band -----------------------------------------------------------------------


def test_a_node_between_its_budget_and_the_share_that_sends_back_keeps_its_stacks() -> None:
    # Eight heavy filters and eight cheap ones at the node, which used 0.85 s of its CPU
    # in the window: over the budget (0.7 s), so nothing more comes in, but under the
    # share that sends stacks back (0.9 s), so nothing goes back for the CPU either.
    # At 0.91 s the heavy ones go back until it is under its budget
    # (test_placement_many.py: six of them).
    both = ("cheap", "heavy")
    for busy, back in ((0.85, 0), (0.91, 6)):
        node = NodeView("n1", NODE_SPEED, 1.0, cpu_busy=busy)
        stacks, nodes = mix(8, kinds=both, client_load=35.0, node=node, at_node=both)
        plan = choose(stacks, nodes, PlacementConfig())
        sent = [m for m in plan.moves if m.execute and "the node's CPU" in m.reason]
        assert len(sent) == back
        assert sum(m.execute for m in plan.moves) == back
    # The band is a knob: with no band (evict at the budget) 0.85 s sends them back.
    node = NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.85)
    stacks, nodes = mix(8, kinds=both, client_load=35.0, node=node, at_node=both)
    plan = choose(stacks, nodes, PlacementConfig(server_cpu_share_evict=0.7))
    assert sum(m.execute for m in plan.moves) > 0


def test_the_share_that_sends_back_is_between_the_budget_and_the_whole_cpu() -> None:
    with pytest.raises(ConfigError, match="between the share planned"):
        PlacementConfig(server_cpu_share_evict=0.5)
    with pytest.raises(ConfigError, match="between the share planned"):
        PlacementConfig(server_cpu_share_evict=1.2)
    PlacementConfig(server_cpu_share_max=0.8, server_cpu_share_evict=0.8)


# --- calls queued for the node's interpreter ---------------------------------------------


def test_calls_queued_for_the_interpreter_count_in_the_nodes_load() -> None:
    assert queued_load(NodeView("n1", load=2.0, calls_in_progress=0.5)) == 2.0
    assert queued_load(NodeView("n1", load=2.0, calls_in_progress=11.0)) == 12.0
    with pytest.raises(ConfigError, match="calls in progress must be ≥ 0"):
        NodeView("n1", calls_in_progress=-1.0)


def test_a_node_whose_calls_queue_takes_no_heavy_filter() -> None:
    # Clients at a load of 40: alone on a node with room, the eight cheap filters go
    # and one heavy one (40 x 2 ms at its client against 40 ms at the node). With 30
    # calls in progress in its objects on average (29 waiting for its interpreter) a
    # heavy filter takes 30 x 40 ms there: none goes; the cheap ones (30 ms against a
    # 0.21 s transfer) still do. (No limit on the stacks on their way:
    # test_placement_many_arrivals.py has it.)
    def at_node(node: NodeView, clients: int = 8) -> list[str]:
        stacks, nodes = mix(clients, kinds=("cheap", "heavy"), client_load=40.0, node=node)
        plan = choose(stacks, nodes, PlacementConfig(arrivals_max=0))
        return sorted(sid for sid, k in plan.best.placement.items() if k == 0)

    idle = at_node(NodeView("n1", NODE_SPEED, 1.0))
    assert sum("heavy" in sid for sid in idle) == 1 and len(idle) == 9
    queued = at_node(NodeView("n1", NODE_SPEED, 1.0, calls_in_progress=30.0))
    assert len(queued) == 8 and all(sid.endswith("cheap") for sid in queued)
    # Four clients: the paper's rule, which reads L as measured.
    assert at_node(NodeView("n1", NODE_SPEED, 1.0, calls_in_progress=30.0), 4) == at_node(
        NodeView("n1", NODE_SPEED, 1.0), 4
    )


def test_the_monitor_averages_the_calls_in_progress_over_the_window() -> None:
    # Two threads inside objects for half of a one-second window, one of them with a
    # nested call (counted once: it is one thread): 1.0 on average.
    clock = FakeClock()
    monitor = ResourceMonitor(window_s=1.0, clock=clock)
    clock.jump_to(1.0)
    monitor.tick()
    entered = threading.Event()
    leave = threading.Event()
    left = threading.Event()

    def other_thread() -> None:
        frame = monitor.enter("c1/b")
        entered.set()
        leave.wait(10)
        monitor.exit(frame)
        left.set()

    outer = monitor.enter("c1/a")
    inner = monitor.enter("c1/storage")
    worker = threading.Thread(target=other_thread)
    worker.start()
    assert entered.wait(10)
    clock.jump_to(1.5)
    monitor.exit(inner)
    monitor.exit(outer)
    leave.set()
    assert left.wait(10)
    worker.join(10)
    clock.jump_to(2.0)
    assert monitor.window().calls_in_progress == pytest.approx(1.0)


def test_the_node_view_carries_the_calls_in_progress_of_the_nodes_own_digest() -> None:
    knobs = PlannerKnobs(window_s=1.0, residence_after_move_s=5.0, retry_after_s=5.0)
    local = Digest("n1", speed=0.05, load=1.0, span_s=1.0, calls_in_progress=3.5)
    clients = {CLIENT: Digest.parse(client_digest())}
    given = model_input(local, clients, NodeFacts("n1"), knobs)
    assert given.nodes["n1"].calls_in_progress == 3.5
    assert Digest.parse(local.to_wire()).calls_in_progress == 3.5
    with pytest.raises(InvalidArgumentError, match="digest: calls_in_progress must be"):
        Digest.parse({**local.to_wire(), "calls_in_progress": -1})


# --- completed calls only --------------------------------------------------------------


def heavy_mid_call(client: str, in_flight: float) -> StackView:
    """A heavy filter at its client whose window holds one completed call and two
    reads: the second read's call is still burning its CPU as the window ends."""
    return StackView(
        f"{client}/console-heavy",
        client,
        "n1",
        (
            ObjectView(f"{client}/console-heavy", migratable=False),
            ObjectView(f"{client}/filter-heavy", 0.002),
            ObjectView("n1/storage", 0.0001, migratable=False),
        ),
        (EdgeView(BLOCK, 1, in_flight=in_flight), EdgeView(2 * BLOCK, 2, measured_s=0.5)),
        1,
        LAN,
        0.0005,
    )


def test_a_stack_is_judged_from_its_completed_calls_only() -> None:
    full = heavy_mid_call("app0", 1)
    half = settled(full)
    assert half.edges[0] == full.edges[0]
    assert half.edges[1] == EdgeView(BLOCK, 1, measured_s=0.25)
    assert settled(heavy_mid_call("app0", 0)) == heavy_mid_call("app0", 0)
    none_done = StackView(
        full.stack_id,
        full.client,
        full.server,
        full.objects,
        (EdgeView(0, 0, in_flight=1), full.edges[1]),
        1,
        LAN,
        0.0005,
    )
    # None completed: nothing to judge from; as measured (--settle-calls leaves it).
    assert settled(none_done) == none_done


def test_a_read_of_a_call_in_progress_does_not_send_a_heavy_filter_to_the_node() -> None:
    # Each of eight heavy filters moved one block up to its console and read two: one
    # block more at the client than at the node, 0.21 s a window the model would save,
    # less the 40 ms of node CPU: they went to the node together. The second read is
    # the call still in progress: from completed calls, the move saves no transfer.
    def moved(in_flight: float, clients: int = 8) -> int:
        nodes = {"n1": NodeView("n1", NODE_SPEED, 1.0)}
        stacks = []
        for i in range(clients):
            nodes[f"app{i}"] = NodeView(f"app{i}", 1.0, 1.0)
            stacks.append(heavy_mid_call(f"app{i}", in_flight))
        plan = choose(stacks, nodes, PlacementConfig())
        return sum(1 for k in plan.best.placement.values() if k == 0)

    assert moved(0) == 8
    assert moved(1) == 0
    assert moved(1, clients=4) == moved(0, clients=4)  # the paper's rule: as measured


def test_the_monitor_counts_the_calls_in_flight_on_each_edge_of_the_window() -> None:
    clock = FakeClock()
    monitor = ResourceMonitor(window_s=1.0, clock=clock)
    monitor.record_edge("c1/console-a", "c1/f", bytes_down=0, bytes_up=10)
    token = monitor.begin_call("c1/console-a", "c1/f")
    clock.jump(0.5)
    window = monitor.window()
    assert window.in_flight == {("c1/console-a", "c1/f"): 1}
    monitor.end_call(token)
    assert monitor.window().in_flight == {}


def test_a_digest_carries_the_calls_in_flight_of_each_edge() -> None:
    edge = EdgeDigest("c1/console-a", "c1/f", 10, 1, in_flight=1)
    d = Digest("c1", edges=(edge,))
    assert Digest.parse(d.to_wire()).edges[0].in_flight == 1
    bad = {**d.to_wire(), "edges": [{"caller": "c1/console-a", "callee": "c1/f", "in_flight": -1}]}
    with pytest.raises(InvalidArgumentError, match=r"edges\[0\]\.in_flight must be"):
        Digest.parse(bad)
