"""The many-clients rule at a saturating node (docs/runtime.md, "Many clients",
"Saturation"): an arrival comes only while the node's measured CPU, with every stack
it hosts kept, has room for it under ``server_cpu_share_max`` (whatever the arrival
saves its client), and a node past ``server_cpu_share_evict`` sends back a share of
its stacks, those with the most CPU per byte saved first. Below
``aggregate_clients_min`` clients neither applies.

The stacks are the mix benchmark's (tests/unit/runtime/test_placement_many.py): a
cheap filter takes 1 ms of the node's CPU a window by what its client measures, and
saves its client a 256 KiB transfer (0.21 s)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from shuttle.runtime.placement import (
    EdgeView,
    Move,
    NodeView,
    ObjectView,
    PlacementConfig,
    choose,
)
from shuttle.runtime.placement_many import (
    anchored_shares,
    cpu_per_byte_saved,
    many_clients_view,
    pushback,
)
from tests.unit.runtime.test_placement_many import BLOCK, NODE_SPEED, mix

#: The share a saturated node sends back, counted with every cheap filter it hosts
#: eligible: the rule before a send-back had to free the node's CPU (a cheap filter's
#: does not; tests/unit/runtime/test_placement_many_freed.py).
SHED_ANY = PlacementConfig(shed_by_freed_cpu=False)


def arrivals(plan_moves: tuple[Move, ...]) -> list[str]:
    return [m.stack_id for m in plan_moves if m.execute and m.to_server]


def backs(plan_moves: tuple[Move, ...]) -> list[str]:
    return [m.stack_id for m in plan_moves if m.execute and not m.to_server]


def node(busy: float) -> NodeView:
    return NodeView("n1", NODE_SPEED, 1.0, cpu_busy=busy)


def test_no_arrival_past_the_node_s_cpu_budget_whatever_it_saves() -> None:
    # A cheap filter saves its client about 200 s per second of the node's CPU, so the
    # budget's exception for stacks worth their CPU let every one in past the budget,
    # the limit on arrivals alone holding them (eight at a time): at 64 clients the
    # passes ended with 41-52 at a node whose best split held 16 or 32.
    stacks, nodes = mix(16, node=node(0.72))
    plan = choose(stacks, nodes, PlacementConfig())
    assert arrivals(plan.moves) == []
    assert (
        "many clients: n1 has no CPU for arrivals (its budget with what it hosts): 16 held back"
        in plan.notes
    )
    # Under the budget, the limit's eight (the node observes them before more come).
    nodes["n1"] = node(0.3)
    assert len(arrivals(choose(stacks, nodes, PlacementConfig()).moves)) == 8
    # With room for five by the budget, five.
    nodes["n1"] = node(0.695)
    assert len(arrivals(choose(stacks, nodes, PlacementConfig()).moves)) == 5


def test_an_arrival_does_not_take_the_room_of_the_stacks_already_there() -> None:
    # Eight cheap filters at the node measure 40 ms of its CPU a window each (their
    # window's share of its use): with them kept, the node at 0.698 s has room for two
    # newcomers (1 ms each). The greedy takes every stack from its client split, so
    # before a hosted stack is taken again its CPU reads as free: room that is not an
    # arrival's (eight would come, the limit's).
    stacks, nodes = mix(16, node=node(0.698))
    heavy_there = [
        replace(
            s,
            split=0,
            objects=(s.objects[0], ObjectView(s.objects[1].rid, 0.002), s.objects[2]),
        )
        for s in stacks[:8]
    ]
    stacks = heavy_there + stacks[8:]
    plan = choose(stacks, nodes, PlacementConfig())
    assert len(arrivals(plan.moves)) == 2
    assert backs(plan.moves) == []


def test_a_saturated_node_sends_back_the_stacks_with_the_most_cpu_per_byte_saved() -> None:
    # Sixteen cheap filters at a node whose measured use is 0.95 s a window (past 0.9,
    # the share that sends stacks back; the budget is 0.7): it sends back
    # ceil(16 x (0.95 - 0.7) / 0.95) = 5 of them, first the four whose reads return a
    # quarter of each block (they save less per CPU second), then the first by name.
    stacks, nodes = mix(16, node=node(0.95), at_node=("cheap",))
    lean = {stacks[i].stack_id for i in (3, 7, 11, 15)}
    stacks = [
        replace(s, edges=(EdgeView(BLOCK * 0.25, 1), s.edges[1])) if s.stack_id in lean else s
        for s in stacks
    ]
    plan = choose(stacks, nodes, SHED_ANY)
    back = backs(plan.moves)
    assert len(back) == 5 and lean < set(back) and "app0/console-cheap" in back
    assert arrivals(plan.moves) == []
    reason = next(m.reason for m in plan.moves if m.stack_id == "app3/console-cheap")
    assert reason.startswith(
        "the node's CPU saturated: 0.950 s a window > 0.900 s; back first of 5"
    )
    # The same node between the budget and that share: nothing moves either way.
    nodes["n1"] = node(0.8)
    plan = choose(stacks, nodes, SHED_ANY)
    assert backs(plan.moves) == [] and arrivals(plan.moves) == []


def test_the_share_sent_back_and_its_order() -> None:
    stacks, nodes = mix(8, node=node(1.0), at_node=("cheap",))
    client = {s.stack_id: 1 for s in stacks}
    # Half the use over the budget: half the stacks (rounded up), none under it.
    assert len(pushback(stacks, nodes["n1"], 1.4, 0.7, client)) == 4
    assert len(pushback(stacks, nodes["n1"], 0.71, 0.7, client)) == 1
    assert pushback(stacks, nodes["n1"], 0.7, 0.7, client) == []
    # A stack that saves no bytes goes first, whatever its CPU.
    nothing = replace(stacks[5], edges=(EdgeView(BLOCK, 1), stacks[5].edges[1]))
    assert cpu_per_byte_saved(nothing, 1, NODE_SPEED) == math.inf
    first, _ = pushback([*stacks[:5], nothing, *stacks[6:]], nodes["n1"], 0.8, 0.7, client)[0]
    assert first.stack_id == nothing.stack_id
    # One that did nothing in the window (no CPU, no bytes) frees nothing: it goes last.
    filt = ObjectView(stacks[2].objects[1].rid)
    idle = replace(
        stacks[2],
        objects=(stacks[2].objects[0], filt, stacks[2].objects[2]),
        edges=(EdgeView(), EdgeView()),
    )
    assert cpu_per_byte_saved(idle, 1, NODE_SPEED) == 0.0
    rated = pushback([*stacks[:2], idle, *stacks[3:]], nodes["n1"], 1.0, 0.1, client)
    assert rated[-1][0].stack_id == idle.stack_id
    # 1 ms of the node's CPU for the 0.95 of a block it keeps off the link.
    assert cpu_per_byte_saved(stacks[0], 1, NODE_SPEED) == pytest.approx(0.001 / (BLOCK * 0.95))


def test_below_the_many_clients_condition_the_node_s_cpu_moves_nothing() -> None:
    # Four clients: the paper's per-stack rule, at any measured use of the node.
    stacks, nodes = mix(4, node=node(0.99), at_node=("cheap",))
    plan = choose(stacks, nodes, PlacementConfig())
    assert backs(plan.moves) == []
    stacks, nodes = mix(4, node=node(0.99))
    config = PlacementConfig(threshold_fraction=0.1)  # each move clears it alone
    assert len(arrivals(choose(stacks, nodes, config).moves)) == 4


def saturated(nodes: dict[str, NodeView], busy: float | None, clients: int = 0) -> None:
    """The first ``clients`` clients (all, if 0) report their CPUs ``busy``."""
    names = [c for c in nodes if c != "n1"]
    for c in names[: clients or len(names)]:
        nodes[c] = replace(nodes[c], cpus_busy=busy)


def test_clients_saturated_raise_the_share_arrivals_may_fill() -> None:
    # 64 clients on one core read 0.95-0.97 busy in every pass on the idle machine,
    # and the best static splits ran the node at 0.79-0.87 of its core while adaptive
    # stopped at 0.63-0.78 under the budget of 0.7 (benchmarks/README.md): the node
    # at 0.75 here takes arrivals only when its clients say their CPUs are full.
    stacks, nodes = mix(16, node=node(0.75))
    assert arrivals(choose(stacks, nodes, PlacementConfig()).moves) == []
    saturated(nodes, 0.96)
    plan = choose(stacks, nodes, PlacementConfig())
    # Room for 0.1 s, 1 ms each by their clients: all sixteen, the limit with the
    # clients saturated being 32 (test_placement_many_raise.py).
    assert len(arrivals(plan.moves)) == 16
    assert (
        "many clients: n1's clients saturated (their CPUs 0.96 busy, median): "
        "it plans up to 0.85 of its CPU" in plan.notes
    )
    # Up to 0.85, no further: with room for three by the raised share, three.
    nodes["n1"] = node(0.847)
    assert len(arrivals(choose(stacks, nodes, PlacementConfig()).moves)) == 3
    # Turned off (the share raised to the budget itself): as before.
    off = PlacementConfig(server_cpu_share_saturated=0.7)
    nodes["n1"] = node(0.75)
    assert arrivals(choose(stacks, nodes, off).moves) == []


@pytest.mark.parametrize(
    ("half", "rest"),
    [(0.85, 0.85), (None, None), (0.97, 0.4)],
    ids=["clients-not-full", "not-measured", "half-the-clients"],
)
def test_the_share_stays_unless_most_clients_are_saturated(
    half: float | None, rest: float | None
) -> None:
    # The median client decides: a few on full machines do not raise the node's
    # budget for the rest (half of them here: the median is 0.685).
    stacks, nodes = mix(16, node=node(0.75))
    saturated(nodes, rest)
    saturated(nodes, half, clients=8)
    plan = choose(stacks, nodes, PlacementConfig())
    assert arrivals(plan.moves) == []
    assert not any("clients saturated" in n for n in plan.notes)


def test_the_raised_share_keeps_the_band_under_the_share_that_sends_back() -> None:
    stacks, nodes = mix(16, node=node(0.88), at_node=("cheap",))
    saturated(nodes, 0.96)
    # Between the raised share and 0.9 nothing moves either way.
    plan = choose(stacks, nodes, SHED_ANY)
    assert backs(plan.moves) == [] and arrivals(plan.moves) == []
    # Past 0.9 it sheds down to the raised share: ceil(16 x (0.95 - 0.85) / 0.95) = 2.
    nodes["n1"] = node(0.95)
    assert len(backs(choose(stacks, nodes, SHED_ANY).moves)) == 2
    # Never above the share that sends stacks back, whatever it is set to.
    stacks, nodes = mix(16, node=node(0.75))
    saturated(nodes, 0.96)
    fenced = PlacementConfig(server_cpu_share_saturated=0.85, server_cpu_share_evict=0.7)
    assert arrivals(choose(stacks, nodes, fenced).moves) == []


def test_each_stack_carries_its_share_of_the_node_s_storage() -> None:
    # The node's digest reports its storage's CPU over all its callers: at 64 clients
    # on the idle machine's share-0.5 passes, 0.0146 reference seconds a window (0.29 s
    # at the node's speed), the reads it serves. Each of the stacks through it carried
    # all of it, so an arrival, raising the node's load by its own share, read as
    # slowing every stack by that share of all the reads: a node at 0.5 of its CPU,
    # its budget raised to 0.85, took no cheap filter for the 13 s of a pass
    # (benchmarks/README.md, "The clients' saturation"). With each stack's share (by
    # its calls into the storage), the limit's batch comes (32, the clients saturated).
    stacks, nodes = mix(60, node=NodeView("n1", NODE_SPEED, 1.4, cpu_busy=0.5))
    saturated(nodes, 1.0)
    stacks = [
        replace(s, objects=(*s.objects[:2], ObjectView("n1/storage", 0.0146, migratable=False)))
        for s in stacks
    ]
    plan = choose(stacks, nodes, PlacementConfig())
    assert len(arrivals(plan.moves)) == 32
    shared, _ = many_clients_view(stacks, nodes)
    assert [s.objects[-1].cpu_s for s in shared] == [pytest.approx(0.0146 / 60)] * 60
    # A storage no stack called this window keeps its CPU whole (no share to go by).
    idle = [replace(s, edges=(s.edges[0], EdgeView(0, 0))) for s in stacks[:2]]
    assert [s.objects[-1].cpu_s for s in anchored_shares(idle)] == [0.0146, 0.0146]
