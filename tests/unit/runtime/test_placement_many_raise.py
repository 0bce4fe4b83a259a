"""The many-clients rule's raised budget held while the node is the bound, and its
arrivals ranked by the node's CPU (docs/runtime.md, "The raise held", "Ranked by the
node's CPU"). Below ``aggregate_clients_min`` clients neither applies.

The stacks are the mix benchmark's (tests/unit/runtime/test_placement_many.py): a
cheap filter takes 1 ms of the node's CPU a window by what its client measures and
saves its client a 256 KiB transfer (0.21 s); a heavy one takes 40 ms there to save
its client 2 ms of CPU and no transfer."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import CpuUse, Digest
from shuttle.runtime.locations import LocationTable
from shuttle.runtime.peers import Peers
from shuttle.runtime.placement import NodeView, PlacementConfig, StackView, choose
from shuttle.runtime.placement_budget import raise_held
from shuttle.runtime.planner import ResourceManager
from shuttle.testing import FakeClock
from tests.unit.runtime.test_placement_many import NODE_SPEED, mix, stack
from tests.unit.runtime.test_placement_many_arrivals import grep_digest, residents, seed
from tests.unit.runtime.test_placement_many_saturation import (
    SHED_ANY,
    arrivals,
    backs,
    node,
    saturated,
)


def test_the_raise_holds_while_the_node_is_the_bound() -> None:
    # The idle machine's swing (64 clients, share 0.5, run 3): the node took a batch,
    # went to 0.99 of its core, its clients, now waiting on it, read 0.64-0.78 busy,
    # the raise lapsed and the node shed down to 0.7 (24 cheap filters to 12) before
    # filling again. With the raise held it sheds down to the raised share.
    stacks, nodes = mix(16, node=node(0.95), at_node=("cheap",))
    saturated(nodes, 0.75)
    # Read alone, the clients are not saturated: down to 0.7, ceil(16 x 0.25 / 0.95).
    plan = choose(stacks, nodes, SHED_ANY)
    assert len(backs(plan.moves)) == 5 and plan.raised == frozenset()
    # Raised at the last evaluation: held, down to 0.85, ceil(16 x 0.1 / 0.95).
    plan = choose(stacks, nodes, SHED_ANY, raised_before={"n1"})
    assert len(backs(plan.moves)) == 2 and plan.raised == {"n1"}
    assert (
        "many clients: n1's clients saturated at the last evaluation, their CPUs 0.75 "
        "busy now (median) while the node is over its base budget (0.95 of a CPU busy): "
        "they wait on it; it holds its raise, up to 0.85 of its CPU" in plan.notes
    )
    # Turned off, the rule as it was: it lapses.
    off = replace(SHED_ANY, saturated_hold=False)
    plan = choose(stacks, nodes, off, raised_before={"n1"})
    assert len(backs(plan.moves)) == 5 and plan.raised == frozenset()


def test_the_held_raise_admits_up_to_the_raised_share_and_lapses_under_the_base() -> None:
    # Between the base budget and the raised share, a held raise still lets arrivals
    # fill the node to 0.85 (room for 0.1 s: all sixteen, the limit with the clients
    # saturated, a held raise included, being 32).
    stacks, nodes = mix(16, node=node(0.75))
    saturated(nodes, 0.75)
    assert arrivals(choose(stacks, nodes, PlacementConfig()).moves) == []
    plan = choose(stacks, nodes, PlacementConfig(), raised_before={"n1"})
    assert len(arrivals(plan.moves)) == 16 and plan.raised == {"n1"}
    # At or under its base budget the node is not the bound: its clients' reading is
    # room of their own, and the raise lapses (nothing held past that).
    nodes["n1"] = node(0.6)
    plan = choose(stacks, nodes, PlacementConfig(), raised_before={"n1"})
    assert plan.raised == frozenset()
    assert not any("holds its raise" in n for n in plan.notes)
    assert not raise_held(node(0.7), PlacementConfig())
    assert raise_held(node(0.71), PlacementConfig())
    # Saturated clients raise it as before, and the plan says so for the next one.
    saturated(nodes, 0.96)
    assert choose(stacks, nodes, PlacementConfig()).raised == {"n1"}


def test_below_the_many_clients_condition_nothing_is_held() -> None:
    stacks, nodes = mix(4, node=node(0.95), at_node=("cheap",))
    saturated(nodes, 0.75)
    plan = choose(stacks, nodes, PlacementConfig(), raised_before={"n1"})
    assert backs(plan.moves) == [] and plan.raised == frozenset()


@pytest.mark.parametrize("hold", [True, False], ids=["held", "as-it-was"])
def test_the_resource_manager_passes_the_raise_on_to_its_next_evaluation(hold: bool) -> None:
    # Twelve clients whose CPUs read 0.96 busy raise the node's budget; at the next
    # round the node is at 0.95 of its CPU and they read 0.75: held (by default), or
    # lapsed (``--no-raise-hold``).
    cpu = {"node": 0.3, "clients": 0.96}
    clock = FakeClock(100.0)
    rm = ResourceManager(
        "n1",
        RuntimeConfig(raise_hold=hold),
        peers=Peers(),
        locations=LocationTable("n1"),
        local_digest=lambda: Digest(
            "n1", speed=1.0, load=0.1, span_s=1.0, cpu=CpuUse(cpu["node"], 1.0, 1)
        ),
        clock=clock.now,
        wall_clock=lambda: 1_700_000_000.0,
    )
    clients = [f"c{i}" for i in range(12)]

    def digest(c: str) -> dict[str, Any]:
        d = grep_digest(c)
        d["cpu"] = {
            "own_per_s": 0.01,
            "available_per_s": 1.0,
            "cpus": 1,
            "busy_share": cpu["clients"],
        }
        return d

    def notes() -> str:
        seq = rm.log_since(0, limit=1)[-1]["seq"] if rm.records else 0
        for c in clients:
            rm.receive(digest(c))
        # A window after the last evaluation the first digest makes one on the others'
        # old digests; the round completes with the first client's next one.
        rm.receive(digest(clients[0]))
        (last,) = rm.log_since(0, limit=1)
        assert last["seq"] > seq, "the round made no evaluation"
        return " ".join(last["notes"])

    seed(rm, clients, clock)
    assert "n1's clients saturated (their CPUs 0.96 busy, median)" in notes()
    clock.jump_to(101.0)
    cpu.update(node=0.95, clients=0.75)
    assert ("it holds its raise, up to 0.85 of its CPU" in notes()) == hold
    # Under its base budget again, the node lets it lapse either way.
    clock.jump_to(102.0)
    cpu.update(node=0.5)
    lapsed = notes()
    assert "raise" not in lapsed and "saturated" not in lapsed
    assert RuntimeConfig().placement().saturated_hold
    assert not RuntimeConfig(rank_by_node_cpu=False).placement().rank_by_node_cpu


def queued_mix() -> tuple[list[StackView], dict[str, NodeView]]:
    """Four cheap filters at the node whose calls wait 0.19 s beyond the model; eight
    clients on idle machines with a cheap filter each, eight on machines at load 1000
    with a heavy one each. The cheap filters would save their transfer less that wait
    (0.02 s a call for 1 ms of the node's CPU); the heavy ones 2 ms of their client's
    CPU for 40 ms, which the paper's score weighs by the client's load (2 s)."""
    stacks = residents(4, 0.2)
    stacks += [stack(f"idle{i}", "cheap") for i in range(8)]
    stacks += [stack(f"busy{i}", "heavy") for i in range(8)]
    nodes = {"n1": NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.3)}
    for s in stacks:
        load = 1000.0 if s.client.startswith("busy") else 1.0
        nodes.setdefault(s.client, NodeView(s.client, 1.0, load))
    return stacks, nodes


def test_arrivals_are_ranked_by_what_they_save_per_second_of_the_node_s_cpu() -> None:
    # The paper's score ranks the heavy filters of the loaded clients first (2 s saved
    # at a load of 1000, about 45 s per node CPU second, against 10 for a cheap one),
    # and they take the limit's batch of eight. By what each saves per node CPU second
    # unweighted, the cheap ones rank first (about 10, against a heavy one's loss:
    # its calls would wait 0.19 s to save 2 ms) and take the batch; together they do
    # not save B_thresh, and nothing moves.
    stacks, nodes = queued_mix()
    paper = choose(stacks, nodes, PlacementConfig(rank_by_node_cpu=False))
    assert sorted(s.split("/")[1] for s in arrivals(paper.moves)) == ["console-heavy"] * 8
    plan = choose(stacks, nodes, PlacementConfig())
    assert arrivals(plan.moves) == []
    chosen = [sid for sid, k in plan.best.placement.items() if k == 0 and "idle" in sid]
    assert len(chosen) == 8  # the batch went to the cheap ones


def test_saturated_clients_take_no_arrival_that_saves_less_than_its_node_cpu() -> None:
    # At a client load of 44 a node with room takes the eight cheap filters and two
    # heavy ones (test_placement_many.py: each heavy one is faster at the node for its
    # own stack). With the clients saturated the node plans its CPU for their
    # throughput: a heavy filter saves them 0.05 s per second of the node's CPU (a
    # heavy call at the node cost it 48-66 ms to save its client 2 ms in the idle
    # runs), and comes no more; the cheap ones (about 200) still do.
    stacks, nodes = mix(8, kinds=("cheap", "heavy"), client_load=44.0, node=node(0.3))
    saturated(nodes, 0.96)
    config = PlacementConfig(arrivals_max=0)
    paper = arrivals(choose(stacks, nodes, replace(config, rank_by_node_cpu=False)).moves)
    assert len(paper) == 10 and sum("heavy" in s for s in paper) == 2
    plan = choose(stacks, nodes, config)
    made = arrivals(plan.moves)
    assert len(made) == 8 and all(s.endswith("cheap") for s in made)
    assert (
        "many clients: n1's clients saturated: 8 arrivals held back that save them less "
        "than the node's CPU they take" in plan.notes
    )
    # Not saturated: the node's room is for any stack that helps, as before.
    saturated(nodes, 0.5)
    assert len(arrivals(choose(stacks, nodes, config).moves)) == 10


def test_saturated_clients_let_more_stacks_be_on_their_way_at_once() -> None:
    # The idle machine, 64 clients at share 0.25: eight at a time took the cheap filters
    # to the node over 1-12 s of a 16 s pass (adaptive 0.97 of all at the clients,
    # ending where the best split is); 32 at a time had 55-57 there by 4 s (1.11).
    # With the clients saturated the node's raised budget, not the batch, stops them.
    stacks, nodes = mix(64, node=node(0.3))
    plan = choose(stacks, nodes, PlacementConfig())
    assert len(arrivals(plan.moves)) == 8  # clients not saturated: eight, as before
    saturated(nodes, 0.96)
    plan = choose(stacks, nodes, PlacementConfig())
    assert len(arrivals(plan.moves)) == 32
    assert any("32 at most, 32 held back" in n for n in plan.notes)
    # Never fewer than --arrivals-max; set to it, the rule as it was.
    assert len(arrivals(choose(stacks, nodes, PlacementConfig(arrivals_max=40)).moves)) == 40
    off = PlacementConfig(arrivals_max_saturated=8)
    assert len(arrivals(choose(stacks, nodes, off).moves)) == 8
    # The budget still stops them: a node at 0.847 has room for three.
    nodes["n1"] = node(0.847)
    assert len(arrivals(choose(stacks, nodes, PlacementConfig()).moves)) == 3
