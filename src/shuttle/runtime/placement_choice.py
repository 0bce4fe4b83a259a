"""The choice (ABACUS 5.4.3): candidates scored by benefit per server CPU second,
allocated greedily within the server's memory, each resulting move made only if its
own net benefit clears ``B_thresh``; evictions for room. Pure, no I/O; the overview of
the model is in :mod:`shuttle.runtime.placement`."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shuttle.runtime.placement_costs import (
    feasible_splits,
    hosted_memory_bytes,
    migration_cost_s,
    unfinished,
)
from shuttle.runtime.placement_load import Coefficients, Prediction, predict
from shuttle.runtime.placement_views import TOLERANCE_S, NodeView, PlacementConfig, StackView

# --- the choice (5.4.3) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Candidate:
    """Stack ``stack_id`` split at ``split``: its benefit over keeping everything
    possible at the client, and what that costs the server."""

    stack_id: str
    split: int
    response_s: float
    benefit_s: float
    server_cpu_s: float
    memory_bytes: int

    @property
    def score(self) -> float:
        """Benefit per server CPU second (the greedy order)."""
        if self.server_cpu_s <= 0:
            return math.inf if self.benefit_s > 0 else 0.0
        return self.benefit_s / self.server_cpu_s


@dataclass(frozen=True, slots=True)
class Move:
    """One stack's change of split, with the arithmetic behind the verdict."""

    stack_id: str
    split_from: int
    split_to: int
    #: Objects (rids) that change side, in the order they should move.
    rids: tuple[str, ...]
    to_server: bool
    benefit_s: float
    cost_s: float
    execute: bool
    reason: str

    @property
    def net_s(self) -> float:
        return self.benefit_s - self.cost_s


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of one evaluation: what was considered and what to do."""

    current: Prediction
    best: Prediction
    candidates: tuple[Candidate, ...]
    moves: tuple[Move, ...]
    threshold_s: float
    notes: tuple[str, ...] = field(default=())

    @property
    def executed(self) -> tuple[Move, ...]:
        return tuple(m for m in self.moves if m.execute)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record of the evaluation (the decision log's body)."""
        return {
            "threshold_s": round(self.threshold_s, 6),
            "current": _prediction_json(self.current),
            "best": _prediction_json(self.best),
            "candidates": [
                {
                    "stack": c.stack_id,
                    "split": c.split,
                    "response_s": round(c.response_s, 6),
                    "benefit_s": round(c.benefit_s, 6),
                    "server_cpu_s": round(c.server_cpu_s, 6),
                    "memory_bytes": c.memory_bytes,
                    "score": None if math.isinf(c.score) else round(c.score, 4),
                }
                for c in self.candidates
            ],
            "moves": [
                {
                    "stack": m.stack_id,
                    "from_split": m.split_from,
                    "to_split": m.split_to,
                    "objects": list(m.rids),
                    "direction": "to_server" if m.to_server else "to_client",
                    "benefit_s": round(m.benefit_s, 6),
                    "cost_s": round(m.cost_s, 6),
                    "net_s": round(m.net_s, 6),
                    "execute": m.execute,
                    "reason": m.reason,
                }
                for m in self.moves
            ],
            "notes": list(self.notes),
        }


def _prediction_json(p: Prediction) -> dict[str, Any]:
    return {
        "splits": dict(p.placement),
        "response_s": {k: round(v, 6) for k, v in p.response_s.items()},
        "mean_response_s": round(p.mean_response_s, 6),
        "server_load": {k: round(v, 4) for k, v in p.server_load.items()},
        "converged": p.converged,
    }


def choose(
    stacks: Sequence[StackView],
    nodes: Mapping[str, NodeView],
    config: PlacementConfig,
    *,
    pinned: Iterable[str] = (),
) -> Plan:
    """Decide the placement of ``stacks`` (5.4.3); see the module docstring.

    ``nodes`` must hold every stack's client and server. ``pinned`` names objects
    that must not move in this evaluation."""
    pinned = frozenset(pinned)
    window = config.window_s
    stacks = list(stacks)
    by_id = {s.stack_id: s for s in stacks}
    table = Coefficients(nodes)  # one evaluation's terms, kept across its predictions
    current = predict(stacks, {}, nodes, window, table)
    feasible = {s.stack_id: feasible_splits(s, pinned) for s in stacks}
    notes = []
    for s in stacks:
        if config.settle_calls and unfinished(s):
            # Calls in progress at the top: their cost is not in this window yet.
            feasible[s.stack_id] = range(s.split, s.split + 1)
            notes.append(f"{s.stack_id}: calls in progress above measured ones; not decided")
    # The baseline the greedy allocates from: everything that may be at the client is.
    base = {sid: max(r) for sid, r in feasible.items()}
    baseline = predict(stacks, base, nodes, window, table)

    candidates: list[Candidate] = []
    for s in stacks:
        for k in feasible[s.stack_id]:
            if k == base[s.stack_id]:
                continue
            alone = predict(stacks, {**base, s.stack_id: k}, nodes, window, table)
            moved_cpu = sum(s.objects[j].cpu_s for j in s.moved(base[s.stack_id], k))
            candidates.append(
                Candidate(
                    s.stack_id,
                    k,
                    alone.response_s[s.stack_id],
                    baseline.response_s[s.stack_id] - alone.response_s[s.stack_id],
                    moved_cpu / nodes[s.server].speed,
                    hosted_memory_bytes(s, k),
                )
            )
    candidates.sort(key=lambda c: (-c.score, -c.benefit_s, c.stack_id, c.split))

    # Greedy allocation: take candidates best first while they fit and help.
    chosen = dict(base)
    admitted: dict[str, Candidate] = {}
    free: dict[str, int | None] = {}
    for server in {s.server for s in stacks}:
        capacity = nodes[server].memory_capacity_bytes
        free[server] = (
            None
            if capacity is None
            else capacity
            - sum(hosted_memory_bytes(s, base[s.stack_id]) for s in stacks if s.server == server)
        )
    best = baseline
    for cand in candidates:
        stack = by_id[cand.stack_id]
        need = cand.memory_bytes - hosted_memory_bytes(stack, chosen[cand.stack_id])
        room = free[stack.server]
        if room is not None and need > room:
            continue
        trial = predict(stacks, {**chosen, cand.stack_id: cand.split}, nodes, window, table)
        if trial.mean_response_s >= best.mean_response_s - TOLERANCE_S:
            continue
        chosen[cand.stack_id] = cand.split
        admitted[cand.stack_id] = cand
        if room is not None:
            free[stack.server] = room - need
        best = trial

    moves = _moves(stacks, current, best, admitted, candidates, nodes, config, pinned)
    return Plan(current, best, tuple(candidates), moves, config.threshold_s, tuple(notes))


def _moves(
    stacks: Sequence[StackView],
    current: Prediction,
    best: Prediction,
    admitted: Mapping[str, Candidate],
    candidates: Sequence[Candidate],
    nodes: Mapping[str, NodeView],
    config: PlacementConfig,
    pinned: frozenset[str],
) -> tuple[Move, ...]:
    """The moves from the current placement to ``best`` and whether to make each."""
    shares = (
        client_shares(stacks, current)
        if config.threshold_per_share
        else {s.stack_id: 1.0 for s in stacks}
    )
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
        if net > threshold:
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
