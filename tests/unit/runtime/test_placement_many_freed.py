"""A node over its CPU sends back only stacks whose leaving frees it (docs/runtime.md,
"What a send-back frees"; ``PlacementConfig.shed_by_freed_cpu``, ``shuttle serve
--no-shed-by-freed-cpu`` to turn it off).

The stacks are the mix benchmark's (tests/unit/runtime/test_placement_many.py): a
cheap filter takes 1 ms of the node's CPU a window and keeps 0.95 of a 256 KiB block
off the link, which costs the node 2.7 ms to serve (``SERVE_CPU_S_PER_BYTE``, measured
by benchmarks/move_node_cpu.py); a heavy one takes 40 ms there and keeps nothing off."""

from __future__ import annotations

import pytest

from shuttle.runtime.placement import PlacementConfig, choose
from shuttle.runtime.placement_many import cpu_freed_s, pushback
from shuttle.runtime.placement_views import SERVE_CPU_S_PER_BYTE
from tests.unit.runtime.test_placement_many import NODE_SPEED, mix
from tests.unit.runtime.test_placement_many_saturation import (
    SHED_ANY,
    arrivals,
    backs,
    node,
)


def test_a_cheap_filter_sent_back_frees_none_of_the_node_s_cpu() -> None:
    stacks, _ = mix(1, kinds=("cheap", "heavy"), at_node=("cheap", "heavy"))
    cheap, heavy = stacks
    # 1 ms of filtering against 2.7 ms of serving the block's 0.95 over the link.
    assert cpu_freed_s(cheap, 1, NODE_SPEED, SERVE_CPU_S_PER_BYTE) == pytest.approx(
        -0.0017, abs=1e-4
    )
    assert cpu_freed_s(heavy, 1, NODE_SPEED, SERVE_CPU_S_PER_BYTE) == pytest.approx(0.04)
    # Serving taken as free (the rule as it was): each frees its own CPU.
    assert cpu_freed_s(cheap, 1, NODE_SPEED, 0.0) == pytest.approx(0.001)


def test_a_saturated_node_sends_back_what_frees_its_cpu_and_no_cheap_filter() -> None:
    # The idle run of 12:47 (share 0.5, run 3): the node at 0.97-0.99 of its CPU sent
    # 1-5 cheap filters back an evaluation for 5.5 s, from 24 to 12, without its use
    # coming down. Sixteen cheap filters and four heavy ones at a node at 0.95 (past
    # 0.9, budget 0.7): ceil(20 x 0.25 / 0.95) = 6 to go, and only the heavy four free
    # its CPU by leaving.
    stacks, nodes = mix(16, kinds=("cheap",), node=node(0.95), at_node=("cheap",))
    heavy, _ = mix(4, kinds=("heavy",), at_node=("heavy",))  # clients app0-app3's
    plan = choose([*stacks, *heavy], nodes, PlacementConfig())
    back = backs(plan.moves)
    assert sorted(back) == sorted(s.stack_id for s in heavy)
    assert arrivals(plan.moves) == []
    # The rule as it was: cheap filters go too, six in all.
    old = choose([*stacks, *heavy], nodes, SHED_ANY)
    assert len(backs(old.moves)) == 6
    assert any("cheap" in b for b in backs(old.moves))


def test_with_only_cheap_filters_there_nothing_goes_back_and_the_log_says_why() -> None:
    stacks, nodes = mix(16, node=node(0.95), at_node=("cheap",))
    plan = choose(stacks, nodes, PlacementConfig())
    assert backs(plan.moves) == [] and arrivals(plan.moves) == []
    assert (
        "many clients: n1 over its CPU (0.950 s a window > 0.700 s), sends nothing back: "
        "no stack it hosts frees its CPU by leaving (serving its reads over the link "
        "would cost the node more)" in plan.notes
    )
    assert len(backs(choose(stacks, nodes, SHED_ANY).moves)) == 5
    # The share to go is still counted of all it hosts: 16 cheap and 1 heavy at 0.95
    # would send back ceil(17 x 0.25 / 0.95) = 5, of which only the heavy one frees CPU.
    client = {s.stack_id: 1 for s in stacks}
    assert len(pushback(stacks, nodes["n1"], 0.95, 0.7, client)) == 5
    assert pushback(stacks, nodes["n1"], 0.95, 0.7, client, SERVE_CPU_S_PER_BYTE) == []
