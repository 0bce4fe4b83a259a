"""The model with many clients (docs/runtime.md, "Many clients"): from
``aggregate_clients_min`` clients with stacks at a node, the node decides for their
aggregate throughput. Its CPU is allocated like its memory (no more than
``server_cpu_share_max`` of it planned; over it, the stacks with the least benefit per
server CPU second go back), and the moves of one evaluation are judged together.
Below that many clients the paper's per-stack rule decides, as before.

The stacks are the mix benchmark's: each client calls a cheap filter (5 % of each
256 KiB block passed up, little CPU) and a CPU-heavy one (everything passed up) over a
10 Mbit/s LAN, one block a window each, at a node of speed 0.05."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shuttle.errors import ConfigError, InvalidArgumentError
from shuttle.runtime.digest import CpuUse, Digest
from shuttle.runtime.load import LoadSample, available_cpu_s
from shuttle.runtime.placement import (
    EdgeView,
    NodeView,
    ObjectView,
    PlacementConfig,
    StackView,
    choose,
    server_cpu_s,
)
from shuttle.runtime.placement_choice import worth_per_server_cpu_s
from shuttle.runtime.planner_input import NodeFacts, PlannerKnobs, model_input
from tests.unit.runtime.test_planner import CLIENT, client_digest

LAN = 1.25e6  # 10 Mbit/s in bytes per second
BLOCK = 262_144
#: Reference CPU seconds of one block through each filter (0.2 and 8 ms per MiB).
CHEAP_CPU_S = 0.00005
HEAVY_CPU_S = 0.002
NODE_SPEED = 0.05


def stack(client: str, kind: str, split: int = 1) -> StackView:
    cheap = kind == "cheap"
    return StackView(
        f"{client}/console-{kind}",
        client,
        "n1",
        (
            ObjectView(f"{client}/console-{kind}", migratable=False),
            ObjectView(f"{client}/filter-{kind}", CHEAP_CPU_S if cheap else HEAVY_CPU_S),
            ObjectView("n1/storage", 0.0001, migratable=False),
        ),
        (EdgeView(BLOCK * (0.05 if cheap else 1.0), 1), EdgeView(BLOCK, 1)),
        split,
        LAN,
        0.0005,
    )


def mix(
    clients: int,
    *,
    kinds: tuple[str, ...] = ("cheap",),
    client_load: float = 1.0,
    node: NodeView | None = None,
    at_node: tuple[str, ...] = (),
) -> tuple[list[StackView], dict[str, NodeView]]:
    """``clients`` clients with a stack of each of ``kinds``; those in ``at_node``
    (kinds) run their filter at the node now."""
    nodes = {"n1": node or NodeView("n1", NODE_SPEED, 1.0)}
    stacks = []
    for i in range(clients):
        c = f"app{i}"
        nodes[c] = NodeView(c, 1.0, client_load)
        stacks += [stack(c, k, 0 if k in at_node else 1) for k in kinds]
    return stacks, nodes


def executed(plan_moves: tuple[object, ...]) -> int:
    return sum(1 for m in plan_moves if getattr(m, "execute", False))


def test_cheap_moves_too_small_alone_are_made_together_with_many_clients() -> None:
    # Moving a cheap filter saves its stack the 256 KiB transfer (0.21 s a window) less
    # the migration: about 0.19 s, under the paper's B_thresh of 0.3 s.
    stacks, nodes = mix(8)
    plan = choose(stacks, nodes, PlacementConfig(aggregate_clients_min=0))
    assert len(plan.moves) == 8 and executed(plan.moves) == 0
    assert all(0.15 < m.net_s < 0.3 for m in plan.moves)
    together = choose(stacks, nodes, PlacementConfig())
    assert executed(together.moves) == 8
    assert all(m.to_server for m in together.moves)
    assert "the 8 moves that repay themselves together" in together.moves[0].reason
    assert together.moves[0].reason.endswith("> B_thresh 0.300 s (many clients)")


def test_below_the_many_clients_condition_each_stack_is_decided_alone() -> None:
    # Four clients (ABACUS 6.5 has four): the paper's rule, whatever the default.
    stacks, nodes = mix(4)
    plan = choose(stacks, nodes, PlacementConfig())
    assert len(plan.moves) == 4 and executed(plan.moves) == 0
    assert plan.moves[0].reason.startswith("net benefit 0.1")
    assert plan.moves[0].reason.endswith("≤ B_thresh 0.300 s")
    # The same stacks with five clients are judged together.
    stacks, nodes = mix(5)
    assert executed(choose(stacks, nodes, PlacementConfig()).moves) == 5


def test_moves_that_do_not_repay_their_migration_are_not_carried_by_the_others() -> None:
    stacks, nodes = mix(8)
    # One client's filter has a checkpoint that takes a second over the LAN.
    slow = stacks[0]
    stacks[0] = StackView(
        slow.stack_id,
        slow.client,
        slow.server,
        (
            slow.objects[0],
            ObjectView(slow.objects[1].rid, CHEAP_CPU_S, checkpoint_bytes=int(LAN)),
            slow.objects[2],
        ),
        slow.edges,
        slow.split,
        LAN,
        0.0005,
    )
    plan = choose(stacks, nodes, PlacementConfig())
    verdict = {m.stack_id: m for m in plan.moves}
    assert not verdict["app0/console-cheap"].execute
    assert "≤ 0 (many clients: each move must repay itself)" in verdict["app0/console-cheap"].reason
    assert executed(plan.moves) == 7
    assert "the 7 moves that repay themselves" in verdict["app1/console-cheap"].reason


def test_the_node_cpu_budget_holds_back_stacks_not_worth_the_cpu_they_take() -> None:
    # Clients on one shared core measure a load of 44: per stack the model finds a heavy
    # filter faster at the node (44 x 2 ms at the client against 1 x 40 ms there). Alone
    # on a node with room, the eight cheap filters go and two heavy ones (the next would
    # load the node more than it saves: equation 5). With the node's use measured at
    # 0.66 s a window, its budget (0.7 s) takes the cheap filters (1 ms of node CPU
    # each, 0.2 s saved: 200 s per CPU second) and not the heavy ones (40 ms for 0.04 s).
    # (No limit on the stacks on their way: test_placement_many_arrivals.py has it.)
    # At a load of 40, as this test had it before each stack got only its share of the
    # node's storage (anchored_shares), one heavy filter went: its own stack carried
    # all 16 stacks' storage CPU, which the move's load change weighed in its favour;
    # with its share it saves 0.001 s less than its migration costs, and none goes.
    stacks, nodes = mix(8, kinds=("cheap", "heavy"), client_load=44.0)
    cheap = {s.stack_id for s in stacks if s.stack_id.endswith("cheap")}

    def at_node(node: NodeView) -> set[str]:
        nodes["n1"] = node
        plan = choose(stacks, nodes, PlacementConfig(arrivals_max=0))
        there = {sid for sid, k in plan.best.placement.items() if k == 0}
        assert {m.stack_id for m in plan.moves if m.execute} == there  # made together
        return there

    roomy = at_node(NodeView("n1", NODE_SPEED, 1.0))
    assert cheap < roomy and len(roomy - cheap) == 2
    assert at_node(NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.3)) == roomy
    assert at_node(NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.66)) == cheap
    plan = choose(stacks, nodes, PlacementConfig(arrivals_max=0))
    assert plan.notes == ("many clients: n1 CPU 0.660 s now, 0.668 s planned, of 0.700 s a window",)
    assert server_cpu_s(stacks, plan.best.placement, nodes, 1.0)["n1"] == pytest.approx(0.668)


def test_the_budget_weighs_what_a_stack_saves_its_client_unweighted_by_its_load() -> None:
    # At a client load of 100 the paper's score finds a heavy filter worth 3.8 s per
    # second of the node's CPU (100 x 2 ms saved at the client for 40 ms there); for
    # the clients' aggregate it frees 2 ms of their CPU and no transfer for 40 ms of
    # the node's: 0.05, and over the budget it stays at its client. A cheap filter
    # saves a 256 KiB transfer (0.21 s) for 1 ms: it goes even at a node over its
    # budget by the reads it serves.
    stacks, nodes = mix(8, kinds=("cheap", "heavy"), client_load=100.0)
    heavy = next(
        c for c in choose(stacks, nodes, PlacementConfig()).candidates if "heavy" in c.stack_id
    )
    assert heavy.score == pytest.approx(3.8, abs=0.1)
    assert worth_per_server_cpu_s(stacks[1], 1, 0, nodes) == pytest.approx(0.05)
    assert worth_per_server_cpu_s(stacks[0], 1, 0, nodes) == pytest.approx(199.3, abs=0.1)
    # Past the budget no arrival comes, whatever it saves (test_placement_many_saturation.py).
    for busy, cheap in ((0.66, 8), (0.95, 0)):
        nodes["n1"] = NodeView("n1", NODE_SPEED, 1.0, cpu_busy=busy)
        plan = choose(stacks, nodes, PlacementConfig())
        made = [m.stack_id for m in plan.moves if m.execute]
        assert len(made) == cheap and all(sid.endswith("cheap") for sid in made)


def test_other_processes_on_the_node_cpus_shrink_its_budget() -> None:
    # (No limit on the stacks on their way: test_placement_many_arrivals.py has it.)
    stacks, nodes = mix(8, kinds=("cheap", "heavy"), client_load=44.0)
    # Other processes leave the node 45 % of its one CPU: 0.7 x 0.45 = 0.315 s a window.
    nodes["n1"] = NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.3, cpu_available=0.45)
    assert nodes["n1"].cpu_capacity_s(0.7, 1.0) == pytest.approx(0.315)
    plan = choose(stacks, nodes, PlacementConfig(arrivals_max=0))
    there = [sid for sid, k in plan.best.placement.items() if k == 0]
    # 0.3 s + 8 ms of cheap filters leaves 7 ms: not one heavy filter.
    assert len(there) == 8 and all(sid.endswith("cheap") for sid in there)
    # With the whole CPU available, two go, as on a node with room.
    nodes["n1"] = NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.3, cpu_available=1.0)
    assert executed(choose(stacks, nodes, PlacementConfig(arrivals_max=0)).moves) == 10


def test_a_node_over_its_cpu_budget_sends_back_stacks_not_worth_their_cpu() -> None:
    # Eight heavy filters and eight cheap ones at the node, which used 0.91 s of CPU in
    # the window (budget 0.7): heavy filters (0.05 s of their clients' CPU saved per
    # CPU second) go back until it fits (6 of them: 0.67 s with two), though each is
    # faster at the node for its own stack; the cheap ones (200 s) stay. The first
    # four go as the share a saturated node sends back (ceil(16 x 0.21 / 0.91), those
    # that save no bytes first: test_placement_many_saturation.py), the other two
    # for the CPU their windows measured.
    node = NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.91)
    both = ("cheap", "heavy")
    stacks, nodes = mix(8, kinds=both, client_load=35.0, node=node, at_node=both)
    plan = choose(stacks, nodes, PlacementConfig())
    back = [m for m in plan.moves if not m.to_server]
    assert len(back) == 6 and len(plan.moves) == 6 and all("heavy" in m.stack_id for m in back)
    assert all(m.execute and m.net_s < 0 for m in back)
    assert [m.reason for m in back].count(
        "the node's CPU saturated: 0.910 s a window > 0.900 s; back first of 4 for the most "
        "CPU per byte saved (no bytes saved) (many clients)"
    ) == 4
    assert back[-1].reason == (
        "the node's CPU: 0.710 s a window with it kept > 0.700 s planned at most, "
        "and it saves its client 0.05 s of CPU and link per second of it (many clients)"
    )
    # With four clients the paper's rule keeps them all (each is faster at the node).
    stacks, nodes = mix(4, kinds=both, client_load=35.0, node=node, at_node=both)
    assert executed(choose(stacks, nodes, PlacementConfig()).moves) == 0


def test_a_node_whose_cpu_was_not_measured_has_no_budget() -> None:
    assert NodeView("n1").cpu_capacity_s(0.7, 1.0) is None
    stacks, nodes = mix(8, kinds=("heavy",), client_load=40.0)
    assert server_cpu_s(stacks, {}, nodes, 1.0) == {}


def test_bad_many_clients_knobs_say_which() -> None:
    with pytest.raises(ConfigError, match="aggregate clients must be ≥ 0"):
        PlacementConfig(aggregate_clients_min=-1)
    with pytest.raises(ConfigError, match=r"server CPU share must be in \(0, 1\]"):
        PlacementConfig(server_cpu_share_max=1.5)
    with pytest.raises(ConfigError, match="cpus must be ≥ 1"):
        NodeView("n1", cpus=0)


def test_a_digest_carries_the_cpu_its_process_used() -> None:
    d = Digest("n1", cpu=CpuUse(own_per_s=0.4, available_per_s=1.5, cpus=2))
    back = Digest.parse(d.to_wire())
    assert back.cpu == CpuUse(0.4, 1.5, 2)
    assert Digest.parse(Digest("n1").to_wire()).cpu is None
    with pytest.raises(InvalidArgumentError, match=r"digest: cpu\.own_per_s must be a number ≥ 0"):
        Digest.parse({**d.to_wire(), "cpu": {"own_per_s": -1}})
    with pytest.raises(InvalidArgumentError, match="digest: cpu must be a map or null"):
        Digest.parse({**d.to_wire(), "cpu": 3})


def test_a_digest_carries_the_share_of_its_cpus_busy() -> None:
    # A client's tells the node whether the clients' CPUs are the bound
    # (docs/runtime.md, "The clients' saturation"); a sender that leaves it out did
    # not measure it.
    d = Digest("c-a", cpu=CpuUse(0.02, 0.05, 1, busy_share=0.97))
    assert Digest.parse(d.to_wire()).cpu == CpuUse(0.02, 0.05, 1, 0.97)
    assert Digest.parse({**d.to_wire(), "cpu": {"own_per_s": 0.1}}).cpu == CpuUse(0.1)
    with pytest.raises(InvalidArgumentError, match=r"cpu\.busy_share must be a share from 0 to 1"):
        Digest.parse({**d.to_wire(), "cpu": {"busy_share": 1.5}})
    with pytest.raises(ConfigError, match="busy share of its CPUs must be from 0 to 1"):
        NodeView("c-a", cpus_busy=-0.1)


def test_the_node_view_carries_the_cpu_of_the_nodes_own_digest() -> None:
    knobs = PlannerKnobs(window_s=1.0, residence_after_move_s=5.0, retry_after_s=5.0)
    local = Digest("n1", speed=0.05, load=1.0, span_s=1.0, cpu=CpuUse(0.4, 0.9, 1))
    clients = {CLIENT: Digest.parse(client_digest())}
    given = model_input(local, clients, NodeFacts("n1"), knobs)
    assert given.stacks  # the client's stack ends at n1
    node = given.nodes["n1"]
    assert (node.cpu_busy, node.cpu_available, node.cpus) == (0.4, 0.9, 1)
    assert given.nodes[CLIENT].cpu_busy is None  # a client's CPU is not budgeted
    assert given.nodes[CLIENT].cpus_busy is None  # nor measured, in this digest
    busy = {CLIENT: replace(clients[CLIENT], cpu=CpuUse(0.02, 0.05, 1, busy_share=0.96))}
    assert model_input(local, busy, NodeFacts("n1"), knobs).nodes[CLIENT].cpus_busy == 0.96
    bare = model_input(Digest("n1", speed=0.05, span_s=1.0), clients, NodeFacts("n1"), knobs)
    assert bare.nodes["n1"].cpu_busy is None


def test_the_cpu_a_node_could_have_is_what_others_leave_or_its_fair_share() -> None:
    # Others ran 0.8 s of the second and we waited 0.8 s behind them for our 0.2 s:
    # four competitors, a fifth of the CPU, which is also what they left.
    queued = LoadSample(1.0, 0.0, own_run_s=0.2, own_wait_s=0.8, others_run_s=0.8, cpus=1)
    assert available_cpu_s(queued) == pytest.approx(0.2)
    # Others filled the CPU we left idle, never making us wait: it was ours to take.
    idle = LoadSample(1.0, 0.0, own_run_s=0.1, own_wait_s=0.0, others_run_s=0.9, cpus=1)
    assert available_cpu_s(idle) == pytest.approx(1.0)
    # Two CPUs, others ran one of them: the other is left.
    two = LoadSample(1.0, 0.0, own_run_s=0.5, own_wait_s=0.0, others_run_s=1.0, cpus=2)
    assert available_cpu_s(two) == pytest.approx(2.0)


def test_a_stack_that_frees_no_cpu_is_not_sent_back_for_the_budget() -> None:
    # A cheap filter at the node whose window completed no call (one call in progress:
    # no CPU counted, the console's edge blocked 0.3 s) scores 0 per CPU second, at a
    # node over its budget with the reads it serves. Sending it back frees nothing.
    node = NodeView("n1", NODE_SPEED, 1.0, cpu_busy=0.9)
    stacks, nodes = mix(8, node=node, at_node=("cheap",))
    busy = stacks[0]
    stacks[0] = StackView(
        busy.stack_id,
        busy.client,
        busy.server,
        (busy.objects[0], ObjectView(busy.objects[1].rid, 0.0), busy.objects[2]),
        (EdgeView(0, 0, measured_s=0.3), EdgeView(0, 0)),
        busy.split,
        LAN,
        0.0005,
    )
    plan = choose(stacks, nodes, PlacementConfig())
    assert not any("the node's CPU" in m.reason for m in plan.moves)
    assert not any(m.execute for m in plan.moves)


def test_the_worth_of_a_move_prices_the_link_by_its_bytes_not_by_the_measured_wait() -> None:
    # A heavy filter's two reads (the object wrapped around) blocked 0.3 s a window
    # beyond their transfer (the queue at a loaded node): equation 4 prices that wait
    # per call, at the node one call of the console's, and by it the move would save
    # 0.15 s and be worth 3.8 node CPU seconds. It moves a block either way: the bytes
    # and a round trip price it at 0.075.
    stacks, nodes = mix(8, kinds=("heavy",))
    waited = stacks[0]
    stacks[0] = StackView(
        waited.stack_id,
        waited.client,
        waited.server,
        waited.objects,
        (waited.edges[0], EdgeView(BLOCK, 2, measured_s=BLOCK / LAN + 0.002 + 0.3)),
        waited.split,
        LAN,
        0.0005,
    )
    assert worth_per_server_cpu_s(stacks[0], 1, 0, nodes) == pytest.approx(0.075)
