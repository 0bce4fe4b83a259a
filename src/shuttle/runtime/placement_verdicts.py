"""The verdicts on an evaluation's moves (ABACUS 5.4.3): each change of split the
greedy choice arrived at is made only if its own net benefit clears ``B_thresh``
(scaled by the stack's share of its client with ``threshold_per_share``), or, with
many clients, if the moves in together clear it, or if the CPU budget sends the stack
back; an eviction not worth it alone goes ahead only as room for an admission at the
same server. Pure, no I/O; called by :func:`~shuttle.runtime.placement_choice.choose`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shuttle.runtime.placement_budget import CpuBudget, cpu_over_if_kept, worth_per_server_cpu_s
from shuttle.runtime.placement_costs import hosted_memory_bytes, migration_cost_s
from shuttle.runtime.placement_load import Prediction
from shuttle.runtime.placement_many import moves_in_together, together_verdict
from shuttle.runtime.placement_plan import Candidate, Move
from shuttle.runtime.placement_views import NodeView, PlacementConfig, StackView


def judge(
    stacks: Sequence[StackView],
    current: Prediction,
    best: Prediction,
    admitted: Mapping[str, Candidate],
    candidates: Sequence[Candidate],
    nodes: Mapping[str, NodeView],
    config: PlacementConfig,
    pinned: frozenset[str],
    cpu: CpuBudget,
    shed: Mapping[str, str],
) -> tuple[Move, ...]:
    """The moves from the current placement to ``best`` and whether to make each.

    With many clients (``cpu.capacity_s`` set, or :meth:`PlacementConfig.aggregate`),
    a move to the server goes ahead if it saves more than it costs and the moves to the
    server of the evaluation together save more than ``B_thresh`` (docs/runtime.md,
    "Many clients"); a move back must save ``B_thresh`` alone, unless the node is over
    the share of its CPU that sends stacks back and the budget sends it back, whatever
    its own benefit."""
    shares = (
        client_shares(stacks, current)
        if config.threshold_per_share
        else {s.stack_id: 1.0 for s in stacks}
    )
    together = moves_in_together(stacks, current, best, config)
    best_score = {c.stack_id: c.score for c in candidates if admitted.get(c.stack_id) == c}
    # The score each stack has at the split it holds now (what an eviction gives up).
    held_score: dict[str, float] = {}
    for c in candidates:
        stack = next(s for s in stacks if s.stack_id == c.stack_id)
        if c.split == stack.split:
            held_score[c.stack_id] = c.score
    moves: list[Move] = []
    admissions: list[Move] = []
    evictions: list[tuple[StackView, int, float, float, float, str]] = []
    for s in stacks:
        k_to = best.placement[s.stack_id]
        if k_to == s.split:
            continue
        benefit = current.response_s[s.stack_id] - best.response_s[s.stack_id]
        cost = migration_cost_s(s, s.split, k_to)
        threshold = config.threshold_s * shares[s.stack_id]
        note = _share_note(shares[s.stack_id])
        if k_to < s.split:
            order = tuple(s.objects[j].rid for j in reversed(s.moved(s.split, k_to)))
            net = benefit - cost
            if together is not None:
                ok, reason = together_verdict(net, together, config.threshold_s)
            else:
                ok = net > threshold
                reason = (
                    f"net benefit {net:.3f} s > B_thresh {threshold:.3f} s{note}"
                    if ok
                    else f"net benefit {net:.3f} s ≤ B_thresh {threshold:.3f} s{note}"
                )
            move = Move(s.stack_id, s.split, k_to, order, True, benefit, cost, ok, reason)
            admissions.append(move)
            moves.append(move)
        else:
            evictions.append((s, k_to, benefit, cost, threshold, note))
    server_of = {s.stack_id: s.server for s in stacks}
    executed_admissions = [m for m in admissions if m.execute]
    for s, k_to, benefit, cost, threshold, note in evictions:
        order = tuple(s.objects[j].rid for j in s.moved(s.split, k_to))
        net = benefit - cost
        over = cpu_over_if_kept(s, best, cpu, worth_per_server_cpu_s(s, k_to, s.split, nodes))
        if together is not None:
            # Many clients: moves in are judged together, a move back alone, by the
            # paper's B_thresh: the hysteresis that keeps a stack from going back and
            # in again as the node's measured wait swings (docs/runtime.md).
            note += " (many clients: a move back is judged alone)"
        if s.stack_id in shed:
            execute, why = True, shed[s.stack_id]
        elif over is not None:
            execute, why = True, over
        elif net > threshold:
            execute, why = True, f"net benefit {net:.3f} s > B_thresh {threshold:.3f} s{note}"
        else:
            # Not worth it alone: only as room for an admission that needs it, at the
            # same server (leaving one node frees no memory at another).
            evicted_score = held_score.get(s.stack_id, 0.0)
            local = [m for m in executed_admissions if server_of[m.stack_id] == s.server]
            winners = [
                m
                for m in local
                if m.stack_id != s.stack_id
                and best_score.get(m.stack_id, 0.0) >= config.eviction_ratio * evicted_score
            ]
            needs_room = _needs_room(s, stacks, best, nodes)
            execute = bool(winners and needs_room)
            if execute:
                names = ", ".join(m.stack_id for m in winners)
                why = (
                    f"makes room at {s.server} for {names} (benefit per server CPU second "
                    f"≥ {config.eviction_ratio:g}× this stack's)"
                )
            elif not needs_room or not local:
                why = f"net benefit {net:.3f} s ≤ B_thresh {threshold:.3f} s{note}"
            else:
                why = f"no admission beats it by {config.eviction_ratio:g}× per server CPU second"
        moves.append(Move(s.stack_id, s.split, k_to, order, False, benefit, cost, execute, why))
    # An admission that needed room another stack does not give up cannot go ahead.
    kept = [m for m in moves if not m.to_server and not m.execute]
    if kept:
        final: list[Move] = []
        for m in moves:
            if m.to_server and m.execute and not _fits(m, stacks, moves, nodes):
                final.append(
                    Move(
                        m.stack_id,
                        m.split_from,
                        m.split_to,
                        m.rids,
                        True,
                        m.benefit_s,
                        m.cost_s,
                        False,
                        "no room at the server while the hosted stacks stay",
                    )
                )
            else:
                final.append(m)
        moves = final
    # Evictions first: they free the room admissions need.
    moves.sort(key=lambda m: (m.to_server, m.stack_id))
    return tuple(moves)


def client_shares(stacks: Sequence[StackView], current: Prediction) -> dict[str, float]:
    """Each stack's share of its client's time in the window: its ``T_app`` now over
    the sum of the ``T_app`` of its client's stacks (1 for a client's only stack).

    ``B_thresh`` is a fraction of the window ``H`` because a lone busy stack takes its
    application the whole window: a move must save that fraction of the
    application's time. A client that runs several stacks in turn (a cheap and a
    CPU-heavy function called one after the other, each from its own console) spends
    only part of its window in each, and a move that saves a stack half its own time
    saves its client less than 30 % of ``H``. With
    :attr:`~shuttle.runtime.placement_views.PlacementConfig.threshold_per_share` a
    stack's threshold is ``B_thresh`` times this share: the move must save that
    fraction of the time the stack itself takes. Stacks of one client that run at the
    same time (two applications in one run-time, ABACUS 6.7) each take the whole
    window, which this share does not know: hence the option, off by default."""
    totals: dict[str, float] = {}
    for s in stacks:
        totals[s.client] = totals.get(s.client, 0.0) + max(0.0, current.response_s[s.stack_id])
    out = {}
    for s in stacks:
        total = totals[s.client]
        mine = max(0.0, current.response_s[s.stack_id])
        out[s.stack_id] = mine / total if total > 0 else 1.0
    return out


def _share_note(share: float) -> str:
    """The reason's note on a threshold scaled by the stack's share of its client."""
    return "" if share >= 1.0 else f" ({share:.0%} of its client's time)"


def _needs_room(
    evicted: StackView,
    stacks: Sequence[StackView],
    best: Prediction,
    nodes: Mapping[str, NodeView],
) -> bool:
    """Whether the best placement would not fit at ``evicted``'s server with it kept."""
    capacity = nodes[evicted.server].memory_capacity_bytes
    if capacity is None:
        return False
    used = 0
    for s in stacks:
        if s.server != evicted.server:
            continue
        k = s.split if s.stack_id == evicted.stack_id else best.placement[s.stack_id]
        used += hosted_memory_bytes(s, k)
    return used > capacity


def _fits(
    admission: Move,
    stacks: Sequence[StackView],
    moves: Sequence[Move],
    nodes: Mapping[str, NodeView],
) -> bool:
    """Whether ``admission`` fits at its server given the moves that will happen."""
    stack = next(s for s in stacks if s.stack_id == admission.stack_id)
    capacity = nodes[stack.server].memory_capacity_bytes
    if capacity is None:
        return True
    decided = {m.stack_id: m for m in moves}
    used = 0
    for s in stacks:
        if s.server != stack.server:
            continue
        m = decided.get(s.stack_id)
        k = m.split_to if m is not None and m.execute else s.split
        used += hosted_memory_bytes(s, k)
    return used <= capacity
