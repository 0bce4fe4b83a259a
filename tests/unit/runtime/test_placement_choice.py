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

import math

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
    # The anchored holder's own filter joins it (it needs no room of its own: its stack
    # holds the 6 MB already). Mutant: need = memory + what the stack holds (not -).
    assert plan.best.placement == {"h": 0, "f2": 0}
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


def test_an_eviction_makes_room_only_for_admissions_at_its_own_server() -> None:
    """n2 holds g (6 MB) in 5 MB: over full, but g is better where it is and no stack
    wants in at n2. f2's admission at n1 must not count as a reason to send g back: a
    move that frees n2's memory makes no room at n1."""
    # Found by this suite: the winners of an eviction were every executed admission,
    # whatever its server; g was evicted "to make room at n2 for f2". Mutant: the
    # server test on winners dropped.
    nodes = {
        "c": NodeView("c", 1.0, 0.0),
        "n1": NodeView("n1", 1.0, 0.1, 8 * MB),
        "n2": NodeView("n2", 1.0, 0.1, 5 * MB),
    }
    g = filt("g", 0, 0.9 * MB, server="n2", memory=6 * MB)
    plan = choose([g, *hosted_and_newcomer()], nodes, CONFIG)
    assert plan.best.placement == {"g": 1, "f1": 1, "f2": 0}
    assert verdicts(plan) == [
        KEEPS_F1,
        ("g", False, False, "net benefit -0.110 s ≤ B_thresh 0.300 s"),
        ADMITS_F2,
    ]


def test_an_admission_is_fitted_at_its_own_server() -> None:
    # g first in the list, at an over-full n2: the fit test for f2 (at n1) must look at
    # n1. Mutant: _fits picking the first stack that is not the admission's.
    nodes = {
        "c": NodeView("c", 1.0, 0.0),
        "n1": NodeView("n1", 1.0, 0.1, 8 * MB),
        "n2": NodeView("n2", 1.0, 0.1, 5 * MB),
    }
    g = filt("g", 0, 0.1 * MB, server="n2", memory=6 * MB)
    plan = choose([g, *hosted_and_newcomer()], nodes, CONFIG)
    assert ("f2", True, True) in [(m.stack_id, m.to_server, m.execute) for m in plan.moves]


def test_an_eviction_at_an_over_full_server_with_no_newcomer_is_judged_alone() -> None:
    # 6 MB hosted in 5 MB (the node lent less memory since): the room is needed, but no
    # admission asks for it, so f1 moves only if it pays. Mutant: the reason's test
    # `not needs_room or not executed_admissions` turned.
    plan = choose([filt("f1", 0, 1.2 * MB, memory=6 * MB)], cluster(5 * MB), CONFIG)
    assert verdicts(plan) == [KEEPS_F1]


def test_one_eviction_can_make_room_for_several() -> None:
    # Mutant: the winners' names joined differently.
    stacks = [*hosted_and_newcomer(), filt("f3", 1, 0.3 * MB)]
    plan = choose(stacks, cluster(9 * MB), CONFIG)
    assert plan.moves[0].reason == (
        "makes room at n1 for f2, f3 (benefit per server CPU second ≥ 1.25× this stack's)"
    )
    assert [(m.stack_id, m.execute) for m in plan.moves] == [
        ("f1", True),
        ("f2", True),
        ("f3", True),
    ]


def test_a_candidate_that_does_not_fit_does_not_end_the_allocation() -> None:
    # "big" has the best score but needs 8 MB of 5: skipped; "small" (4 MB) still goes
    # in. Mutant: `continue` after the room test turned into `break`.
    stacks = [filt("big", 1, 0.05 * MB, memory=8 * MB), filt("small", 1, 0.3 * MB)]
    plan = choose(stacks, cluster(5 * MB), CONFIG)
    assert [c.stack_id for c in plan.candidates] == ["big", "small"]
    assert plan.best.placement == {"big": 1, "small": 0}


def _stack(stack_id: str, split: int, up: list[float], cpu: list[float]) -> StackView:
    objects = [ObjectView(f"c/console-{stack_id}", migratable=False)]
    objects += [ObjectView(f"c/o{i}-{stack_id}", c) for i, c in enumerate(cpu)]
    objects.append(ObjectView("n1/storage", migratable=False))
    edges = tuple(EdgeView(u, 0) for u in up)
    return StackView(stack_id, "c", "n1", tuple(objects), edges, split, 1e6, 0.0)


def test_a_candidate_that_no_longer_helps_does_not_end_the_allocation() -> None:
    """S's g cuts its data tenfold (g to the server: 9 s saved); S's f passes everything
    (f too: nothing more saved). Once S@1 is in, S@0 does not help; T, next, does."""
    # Mutant: `continue` after the improvement test turned into `break`.
    s = _stack("S", 2, [MB, MB, 10 * MB], [0.3, 0.1])
    t = _stack("T", 1, [0.5 * MB, MB], [0.2])
    nodes = {"c": NodeView("c", 1.0, 0.0), "n1": NodeView("n1", 1.0, 0.0)}
    plan = choose([s, t], nodes, CONFIG)
    assert [(c.stack_id, c.split) for c in plan.candidates] == [("S", 1), ("S", 0), ("T", 0)]
    assert plan.best.placement == {"S": 1, "T": 0}


def test_candidates_of_equal_score_are_ordered_by_benefit_then_name() -> None:
    # a and b both save 4 s per server CPU second (0.5 s for 0.125 s, 1 s for 0.25 s):
    # the larger benefit first. Mutant: the sort's benefit key negated.
    nodes = {"c": NodeView("c", 1.0, 0.0), "n1": NodeView("n1", 1.0, 0.0)}
    plan = choose(
        [_stack("a", 1, [0.5 * MB, MB], [0.125]), _stack("b", 1, [0.0, MB], [0.25])],
        nodes,
        CONFIG,
    )
    assert [(c.stack_id, c.score, c.benefit_s) for c in plan.candidates] == [
        ("b", 4.0, 1.0),
        ("a", 4.0, 0.5),
    ]


def test_a_move_whose_net_equals_b_thresh_is_not_made() -> None:
    """B_thresh must be exceeded, not met (DESIGN.md: move only if benefit - cost
    exceeds it)."""
    # Mutants: `net > threshold` turned into >= for admissions and for evictions.
    admission = choose([filt("f2", 1, 0.2 * MB)], cluster(None), CONFIG).moves[0]
    eviction = choose(
        [filt("f1", 0, 0.1 * MB)],
        {"c": NodeView("c", 1.0, 0.0), "n1": NodeView("n1", 0.1, 1.7)},
        CONFIG,
    ).moves[0]
    for stack, nodes, move in (
        (filt("f2", 1, 0.2 * MB), cluster(None), admission),
        (
            filt("f1", 0, 0.1 * MB),
            {"c": NodeView("c", 1.0, 0.0), "n1": NodeView("n1", 0.1, 1.7)},
            eviction,
        ),
    ):
        at = PlacementConfig(window_s=1.0, threshold_fraction=move.net_s)
        (again,) = choose([stack], nodes, at).moves
        assert again.net_s == at.threshold_s and not again.execute
        below = PlacementConfig(window_s=1.0, threshold_fraction=math.nextafter(move.net_s, 0))
        assert choose([stack], nodes, below).moves[0].execute


def test_an_eviction_ratio_met_exactly_makes_room() -> None:
    """The newcomer must be worth at least eviction_ratio times the hosted stack per
    server CPU second: exactly that ratio is enough."""
    # Mutant: `>= config.eviction_ratio * evicted_score` turned into >.
    stacks = [filt("f1", 0, 0.9 * MB), filt("f2", 1, 0.2 * MB)]
    nodes = cluster(8 * MB - 1)
    scores = {c.stack_id: c.score for c in choose(stacks, nodes, CONFIG).candidates}
    held, newcomer = scores["f1"], scores["f2"]
    ratio = newcomer / held
    for _ in range(8):  # the float whose product with held gives newcomer exactly
        if ratio * held == newcomer:
            break
        ratio = math.nextafter(ratio, math.inf if ratio * held < newcomer else 0.0)
    assert ratio * held == newcomer and ratio >= 1
    exact = choose(stacks, nodes, PlacementConfig(eviction_ratio=ratio))
    assert [(m.stack_id, m.execute) for m in exact.moves] == [("f1", True), ("f2", True)]
    higher = ratio
    while higher * held <= newcomer:  # the next ratio the newcomer no longer meets
        higher = math.nextafter(higher, math.inf)
    above = choose(stacks, nodes, PlacementConfig(eviction_ratio=higher))
    assert [(m.stack_id, m.execute) for m in above.moves] == [("f1", False), ("f2", False)]


def test_the_decision_log_records_every_number() -> None:
    """The plan's JSON record (the node's decision log) for three stacks on a slow
    server: b's filter costs no CPU (its score is infinite: null), z goes back to the
    client. Values are rounded as the log promises: seconds to 6 places, scores and
    loads to 4. A change here changes what operators and tools read."""
    # Mutants: every key's name, every rounding (6 -> 7, 4 -> 5, dropped), the infinite
    # score's null, the direction's names, server_cpu_s dividing by the server's speed.

    def stack(stack_id: str, split: int, up: float, cpu: float) -> StackView:
        return StackView(
            stack_id,
            "c",
            "n1",
            (
                ObjectView(f"c/console-{stack_id}", migratable=False),
                ObjectView(f"c/f-{stack_id}", cpu, memory_bytes=3 * MB, checkpoint_bytes=100_000),
                ObjectView("n1/storage", 0.01, migratable=False),
            ),
            (EdgeView(up, 7), EdgeView(MB, 7)),
            split,
            3e6,
            0.0007,
        )

    stacks = [
        stack("a", 1, 0.2 * MB, 0.1),
        stack("b", 1, 0.1 * MB, 0.0),
        stack("z", 0, 1.3 * MB, 0.05),
    ]
    nodes = {"c": NodeView("c", 1.0, 0.3), "n1": NodeView("n1", 0.7, 0.9, 7 * MB)}
    plan = choose(stacks, nodes, PlacementConfig(window_s=1.0, threshold_fraction=0.1 / 3))
    assert plan.to_json() == {
        "threshold_s": 0.033333,
        "current": {
            "splits": {"a": 1, "b": 1, "z": 0},
            "response_s": {"a": 0.457419, "b": 0.357419, "z": 0.528848},
            "mean_response_s": 0.447895,
            "server_load": {"n1": 0.9},
            "converged": True,
        },
        "best": {
            "splits": {"a": 0, "b": 0, "z": 1},
            "response_s": {"a": 0.285344, "b": 0.062122, "z": 0.412122},
            "mean_response_s": 0.253196,
            "server_load": {"n1": 1.3292},
            "converged": True,
        },
        "candidates": [
            {
                "stack": "b",
                "split": 0,
                "response_s": 0.057419,
                "benefit_s": 0.3,
                "server_cpu_s": 0.0,
                "memory_bytes": 3000000,
                "score": None,
            },
            {
                "stack": "a",
                "split": 0,
                "response_s": 0.285344,
                "benefit_s": 0.172075,
                "server_cpu_s": 0.142857,
                "memory_bytes": 3000000,
                "score": 1.2045,
            },
            {
                "stack": "z",
                "split": 0,
                "response_s": 0.528848,
                "benefit_s": -0.121429,
                "server_cpu_s": 0.071429,
                "memory_bytes": 3000000,
                "score": -1.7,
            },
        ],
        "moves": [
            {
                "stack": "z",
                "from_split": 0,
                "to_split": 1,
                "objects": ["c/f-z"],
                "direction": "to_client",
                "benefit_s": 0.116725,
                "cost_s": 0.044733,
                "net_s": 0.071992,
                "execute": True,
                "reason": "net benefit 0.072 s > B_thresh 0.033 s",
            },
            {
                "stack": "a",
                "from_split": 1,
                "to_split": 0,
                "objects": ["c/f-a"],
                "direction": "to_server",
                "benefit_s": 0.172075,
                "cost_s": 0.044733,
                "net_s": 0.127342,
                "execute": True,
                "reason": "net benefit 0.127 s > B_thresh 0.033 s",
            },
            {
                "stack": "b",
                "from_split": 1,
                "to_split": 0,
                "objects": ["c/f-b"],
                "direction": "to_server",
                "benefit_s": 0.295297,
                "cost_s": 0.044733,
                "net_s": 0.250564,
                "execute": True,
                "reason": "net benefit 0.251 s > B_thresh 0.033 s",
            },
        ],
        "notes": [],
    }


def test_a_stack_on_another_server_does_not_end_the_count() -> None:
    """Memory is summed over the server's stacks wherever they sit in the list: a stack
    on another server between them is skipped, not the end of the sum."""
    # Mutants: `continue` past another server's stack turned into `break` in _needs_room
    # and in _fits.
    other = filt("o", 0, 0.1 * MB, server="n2", memory=MB)
    nodes = cluster(8 * MB - 1, "n1", "n2")
    f1, f2 = hosted_and_newcomer()
    plan = choose([f1, other, f2], nodes, CONFIG)  # the room is needed: f1 goes
    assert [(m.stack_id, m.execute) for m in plan.moves] == [("f1", True), ("f2", True)]
    near = [filt("f1", 0, 0.2 * MB), other, filt("f2", 1, 0.19 * MB)]
    plan = choose(near, nodes, CONFIG)  # f1 stays, so f2 does not fit
    assert [(m.stack_id, m.execute) for m in plan.moves] == [("f1", False), ("f2", False)]
