"""The choice's room-making (ABACUS 5.4.3, ``runtime/placement_choice.py``): the server
memory free for admissions with pinned and anchored objects present, evictions decided
by their migration cost, evictions only when the room is needed (never with unlimited
memory, never counting another server's stacks), and admissions that go ahead only if
they fit beside the stacks that stay.

The scenario is test_placement.py's competition (6.7), with numbers worked by hand: a
1 MB/s link, no latency, 0.1 s of CPU per filter, 4 MB per filter, the server's load
0.1. ``f2`` (passes 20% of what it reads) wants in; ``f1``, hosted, passes up 1.2 MB
for every 1 MB it reads (a decompressor): it is better at the client, by 0.2 s, which
is below B_thresh (0.3 s) after its 0.01 s migration cost, so it moves only to make
room. Each test names the mutants it was seen to fail against (docs/testing.md).
"""

from __future__ import annotations

import pytest

from shuttle.runtime.placement import (
    EdgeView,
    Move,
    NodeView,
    ObjectView,
    PlacementConfig,
    Plan,
    StackView,
    choose,
)

MB = 1_000_000
CONFIG = PlacementConfig(window_s=1.0, threshold_fraction=0.3)


def filt(
    stack_id: str,
    split: int,
    up_bytes: float,
    *,
    server: str = "n1",
    memory: int = 4 * MB,
    checkpoint_bytes: int = 0,
    pinned_memory: int = 0,
) -> StackView:
    """console -> filter -> storage reading 1 MB per window over a 1 MB/s link; with
    ``pinned_memory``, an anchored (non-migratable) object of that size sits at the
    server between the filter and the storage."""
    objects = [
        ObjectView(f"c/console-{stack_id}", migratable=False),
        ObjectView(
            f"c/filter-{stack_id}", 0.1, memory_bytes=memory, checkpoint_bytes=checkpoint_bytes
        ),
    ]
    edges = [EdgeView(up_bytes, 0), EdgeView(MB, 0)]
    if pinned_memory:
        objects.append(
            ObjectView(f"{server}/index-{stack_id}", memory_bytes=pinned_memory, migratable=False)
        )
        edges.append(EdgeView(MB, 0))
    objects.append(ObjectView(f"{server}/storage", migratable=False))
    return StackView(stack_id, "c", server, tuple(objects), tuple(edges), split, 1e6, 0.0)


def cluster(capacity: int | None, *servers: str) -> dict[str, NodeView]:
    nodes = {"c": NodeView("c", 1.0, 0.0)}
    for s in servers or ("n1",):
        nodes[s] = NodeView(s, 1.0, 0.1, capacity)
    return nodes


def verdicts(plan: Plan) -> list[tuple[str, bool, bool, str]]:
    return [(m.stack_id, m.to_server, m.execute, m.reason) for m in plan.moves]


def hosted_and_newcomer() -> list[StackView]:
    return [filt("f1", 0, 1.2 * MB), filt("f2", 1, 0.2 * MB)]


KEEPS_F1 = ("f1", False, False, "net benefit 0.190 s ≤ B_thresh 0.300 s")
ADMITS_F2 = ("f2", True, True, "net benefit 0.790 s > B_thresh 0.300 s")


@pytest.mark.parametrize("capacity", [None, 8 * MB], ids=["unlimited", "room-for-both"])
def test_no_eviction_when_the_room_is_not_needed(capacity: int | None) -> None:
    """With memory for both (8 MB exactly, or no limit), f1 is not worth moving on its
    own and nothing needs its room: it stays, and f2 goes in beside it."""
    # Mutants: _needs_room's `if capacity is None: return False` returning True,
    # `used > capacity` turned into >=; _fits's `used <= capacity` turned into <, its
    # `capacity is None` case returning False.
    plan = choose(hosted_and_newcomer(), cluster(capacity), CONFIG)
    assert plan.best.placement == {"f1": 1, "f2": 0}
    assert verdicts(plan) == [KEEPS_F1, ADMITS_F2]
    keep, admit = plan.moves
    assert keep.benefit_s == pytest.approx(0.2) and keep.cost_s == pytest.approx(0.01)
    assert admit.benefit_s == pytest.approx(0.8) and admit.rids == ("c/filter-f2",)


def test_an_eviction_that_makes_needed_room_goes_first() -> None:
    # One byte short of room for both: f1 is moved out for f2, whose benefit per server
    # CPU second (8) is more than 1.25× f1's (negative). Mutants: _needs_room's memory
    # sum (the evicted stack's current split, the others' best), the room branch's
    # `winners and needs_room`, the eviction ratio's comparison.
    plan = choose(hosted_and_newcomer(), cluster(8 * MB - 1), CONFIG)
    assert verdicts(plan) == [
        (
            "f1",
            False,
            True,
            "makes room at n1 for f2 (benefit per server CPU second ≥ 1.25× this stack's)",
        ),
        ADMITS_F2,
    ]
    assert plan.moves[0].rids == ("c/filter-f1",)


def test_an_admission_without_room_is_refused_while_the_hosted_stack_stays() -> None:
    """f1 is worth as much as f2 (both pass 20%): no 1.25× margin, so f1 keeps its
    place, and f2, which needs f1's room, cannot go in."""
    # Mutants: _fits deleted or returning True (f2 admitted into memory f1 still holds),
    # the refusal's fields (benefit, cost, rids, direction) changed, `kept` computed from
    # the wrong moves.
    stacks = [filt("f1", 0, 0.2 * MB), filt("f2", 1, 0.19 * MB)]
    plan = choose(stacks, cluster(8 * MB - 1), CONFIG)
    assert verdicts(plan) == [
        ("f1", False, False, "no admission beats it by 1.25× per server CPU second"),
        ("f2", True, False, "no room at the server while the hosted stacks stay"),
    ]
    refused = plan.moves[1]
    assert (refused.split_from, refused.split_to, refused.rids) == (1, 0, ("c/filter-f2",))
    assert refused.benefit_s == pytest.approx(0.81) and refused.cost_s == pytest.approx(0.01)
    assert not plan.executed


def test_the_migration_cost_decides_an_eviction() -> None:
    """f1 gains 0.7 s per window back at the client: its server runs at a tenth of the
    speed with a load of 1.7, so f1 takes 0.1 + 1.7 s there and 0.1 + 1.0 s (the 1 MB it
    reads over the link) at the client. With a small checkpoint it goes; with 0.5 MB to
    ship over the link the move costs 0.51 s and its net 0.19 s no longer clears
    B_thresh."""
    # Mutants: net = benefit - cost turned (+), migration_cost_s's split arguments,
    # `net > threshold` turned into >= or <, the reason's numbers.
    nodes = {"c": NodeView("c", 1.0, 0.0), "n1": NodeView("n1", 0.1, 1.7)}
    cheap = choose([filt("f1", 0, 0.1 * MB)], nodes, CONFIG)
    assert [(m.execute, m.to_server) for m in cheap.moves] == [(True, False)]
    (move,) = cheap.moves
    assert move.benefit_s == pytest.approx(0.7) and move.cost_s == pytest.approx(0.01)
    assert move.reason == "net benefit 0.690 s > B_thresh 0.300 s"
    dear = choose([filt("f1", 0, 0.1 * MB, checkpoint_bytes=MB // 2)], nodes, CONFIG)
    (move,) = dear.moves
    assert move.cost_s == pytest.approx(0.51) and move.net_s == pytest.approx(0.19)
    assert not move.execute
    assert move.reason == "net benefit 0.190 s ≤ B_thresh 0.300 s"


def test_the_migration_cost_decides_an_admission() -> None:
    # f2 would gain 0.8 s, but shipping a 0.6 MB checkpoint costs 0.61 s: net 0.19 s.
    cheap = choose([filt("f2", 1, 0.2 * MB)], cluster(None), CONFIG)
    assert verdicts(cheap) == [ADMITS_F2]
    dear = choose([filt("f2", 1, 0.2 * MB, checkpoint_bytes=600_000)], cluster(None), CONFIG)
    assert verdicts(dear) == [("f2", True, False, "net benefit 0.190 s ≤ B_thresh 0.300 s")]


@pytest.mark.parametrize("kind", ["pinned", "anchored"])
def test_memory_held_by_objects_that_cannot_leave_is_not_free(kind: str) -> None:
    """A 7 MB object that must stay at the server (pinned in this evaluation, or not
    migratable at all) leaves 3 MB of 10: f2's 4 MB filter does not fit, whatever the
    benefit. The same stack with that object free to go leaves room."""
    # Mutants: the free memory computed without the stacks' baseline memory (capacity -
    # sum turned +, the stack's server test turned), `need > room` turned into >=, room
    # not charged after an admission (free[...] = room - need).
    nodes = cluster(10 * MB)
    if kind == "pinned":
        holder = filt("h", 0, 0.2 * MB, memory=7 * MB)
        pinned = ["c/filter-h"]
    else:
        holder = filt("h", 1, 0.2 * MB, memory=0, pinned_memory=7 * MB)
        pinned = []
    newcomer = filt("f2", 1, 0.2 * MB)
    plan = choose([holder, newcomer], nodes, CONFIG, pinned=pinned)
    assert plan.best.placement["f2"] == 1
    assert not any(m.stack_id == "f2" for m in plan.moves)
    # 6 MB held instead of 7: exactly 4 MB free, and f2 fits.
    if kind == "pinned":
        holder = filt("h", 0, 0.2 * MB, memory=6 * MB)
    else:
        holder = filt("h", 1, 0.2 * MB, memory=0, pinned_memory=6 * MB)
    plan = choose([holder, newcomer], nodes, CONFIG, pinned=pinned)
    assert plan.best.placement["f2"] == 0
    assert ("f2", True, True) in [(m.stack_id, m.to_server, m.execute) for m in plan.moves]


def test_two_admissions_share_the_free_memory() -> None:
    # 10 MB free, three newcomers of 4 MB: the two best go in, the third does not fit.
    # Mutant: free[server] not reduced by an admission.
    stacks = [filt("a", 1, 0.1 * MB), filt("b", 1, 0.2 * MB), filt("c", 1, 0.3 * MB)]
    plan = choose(stacks, cluster(10 * MB), CONFIG)
    assert plan.best.placement == {"a": 0, "b": 0, "c": 1}
    assert [(m.stack_id, m.execute) for m in plan.moves] == [("a", True), ("b", True)]


def test_room_is_counted_per_server() -> None:
    """f1 and f2 at n1, g (6 MB) hosted at n2; 8 MB each. Neither the room test for
    f1 nor the fit test for f2 may count g, which is on another server."""
    # Mutants: `if s.server != evicted.server: continue` and `if s.server !=
    # stack.server: continue` deleted or turned (n2's 6 MB counted at n1).
    g = filt("g", 0, 0.1 * MB, server="n2", memory=6 * MB)
    plan = choose([*hosted_and_newcomer(), g], cluster(8 * MB, "n1", "n2"), CONFIG)
    assert plan.best.placement == {"f1": 1, "f2": 0, "g": 0}
    assert verdicts(plan) == [KEEPS_F1, ADMITS_F2]


def test_moves_list_evictions_first_then_by_stack() -> None:
    # Mutant: the final sort's key changed.
    stacks = [filt("b", 1, 0.2 * MB), filt("a", 1, 0.3 * MB), filt("z", 0, 1.5 * MB)]
    nodes = {"c": NodeView("c", 1.0, 0.0), "n1": NodeView("n1", 1.0, 0.1)}
    plan = choose(stacks, nodes, CONFIG)
    assert [(m.stack_id, m.to_server) for m in plan.moves] == [
        ("z", False),
        ("a", True),
        ("b", True),
    ]
    assert all(isinstance(m, Move) for m in plan.moves)
