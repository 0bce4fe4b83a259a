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
    client_work_s,
    feasible_splits,
    hosted_memory_bytes,
    migration_cost_s,
    modelled_stall_s,
    queue_s,
    server_work_s,
    unfinished,
)
from shuttle.runtime.placement_load import Coefficients, Prediction, predict, server_cpu_s
from shuttle.runtime.placement_many import (
    arrival_limits,
    many_clients_view,
    moves_in_together,
    pushback,
    together_verdict,
)
from shuttle.runtime.placement_views import (
    SATURATED_SCORE_MIN,
    TOLERANCE_S,
    NodeView,
    PlacementConfig,
    StackView,
)

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
    arriving: Mapping[str, int] | None = None,
) -> Plan:
    """Decide the placement of ``stacks`` (5.4.3); see the module docstring.

    ``nodes`` must hold every stack's client and server. ``pinned`` names objects
    that must not move in this evaluation. ``arriving``: per server, the stacks
    decided to move there and not yet observed there for a window (the many-clients
    rule limits them: :func:`~shuttle.runtime.placement_many.arrival_limits`)."""
    pinned = frozenset(pinned)
    window = config.window_s
    stacks = list(stacks)
    many = config.aggregate(len({s.client for s in stacks}))
    if many:
        # The node's queued calls in its load, each stack's completed calls only.
        stacks, nodes = many_clients_view(stacks, nodes)
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
    # Many clients: the servers' CPU is allocated too (docs/runtime.md, "Many clients").
    cpu = _CpuBudget.of(stacks, nodes, config, table)
    # Many clients: a few stacks on their way to a server at once, then observe the
    # wait and the CPU they make there (docs/runtime.md, "Many clients").
    limit = arrival_limits(stacks, config) if many else {}
    admit = {srv: max(0, n - (arriving or {}).get(srv, 0)) for srv, n in limit.items()}
    # Many clients: a server over the share of its CPU that sends stacks back sends
    # back the ones with the most CPU per byte saved (docs/runtime.md, "Saturation").
    shed: dict[str, str] = {}
    for srv in sorted(cpu.shedding):
        used_s = (nodes[srv].cpu_busy or 0.0) * window
        cap_s = cpu.capacity_s[srv]
        back = pushback(stacks, nodes[srv], used_s, cap_s, base)
        for s, ratio in back:
            per_mb = "no bytes saved" if math.isinf(ratio) else f"{ratio * 1e6:.4f} s per MB saved"
            shed[s.stack_id] = (
                f"the node's CPU saturated: {used_s:.3f} s a window > "
                f"{cpu.evict_s[srv]:.3f} s; back first of {len(back)} for the most CPU per "
                f"byte saved ({per_mb}) (many clients)"
            )
    capped: dict[str, int] = {}
    full: dict[str, int] = {}
    best = baseline
    best_used = cpu.used(baseline)
    for cand in candidates:
        stack = by_id[cand.stack_id]
        if cand.stack_id in shed:
            continue  # its server sends it back: not re-admitted
        need = cand.memory_bytes - hosted_memory_bytes(stack, chosen[cand.stack_id])
        room = free[stack.server]
        if room is not None and need > room:
            continue
        trial = predict(stacks, {**chosen, cand.stack_id: cand.split}, nodes, window, table)
        if trial.mean_response_s >= best.mean_response_s - TOLERANCE_S:
            continue
        trial_used = cpu.used(trial)
        worth = worth_per_server_cpu_s(stack, base[stack.stack_id], cand.split, nodes)
        if cpu.over(stack.server, trial_used, best_used, worth):
            continue
        arrival = many and cand.split < stack.split
        if arrival and not cpu.arrival_fits(stack.server, trial.placement, shed):
            # The node's measured use with what it hosts kept, and this stack's CPU,
            # would pass its budget: no arrival, whatever it saves its client (the
            # server's measured saturation admits: Bhardwaj et al., ATC 2020).
            full[stack.server] = full.get(stack.server, 0) + 1
            continue
        if arrival and stack.server in admit and admit[stack.server] <= 0:
            capped[stack.server] = capped.get(stack.server, 0) + 1  # held back: noted
            continue
        chosen[cand.stack_id] = cand.split
        admitted[cand.stack_id] = cand
        if arrival and stack.server in admit:
            admit[stack.server] = max(0, admit[stack.server] - 1)
        if room is not None:
            free[stack.server] = room - need
        best, best_used = trial, trial_used
    if cpu.capacity_s:
        notes.append(
            "many clients: "
            + ", ".join(
                f"{srv} CPU {cpu.used(current).get(srv, 0.0):.3f} s now, "
                f"{best_used.get(srv, 0.0):.3f} s planned, of {cap:.3f} s a window"
                for srv, cap in sorted(cpu.capacity_s.items())
            )
        )

    for srv in sorted(admit):
        waiting = (arriving or {}).get(srv, 0)
        wait = nodes[srv].queue_s_per_call
        if waiting or capped.get(srv) or wait > 0:
            notes.append(
                f"many clients: {srv} waits {wait:.4f} s a call beyond the model (its "
                f"stacks' measure, charged to arrivals); {waiting} stacks on their way "
                f"there, {limit[srv]} at most, {capped.get(srv, 0)} held back"
            )
    for srv in sorted(full):
        notes.append(
            f"many clients: {srv} has no CPU for arrivals (its budget with what it hosts): "
            f"{full[srv]} held back"
        )

    moves = _moves(stacks, current, best, admitted, candidates, nodes, config, pinned, cpu, shed)
    return Plan(current, best, tuple(candidates), moves, config.threshold_s, tuple(notes))


@dataclass(frozen=True, slots=True)
class _CpuBudget:
    """The servers' CPU as the many-clients rule allocates it: per server the CPU
    seconds a window may be planned to take (empty: not that regime, or nothing
    measured), and the prediction of what a placement uses."""

    stacks: Sequence[StackView]
    nodes: Mapping[str, NodeView]
    window_s: float
    table: Coefficients
    capacity_s: Mapping[str, float]
    #: The servers whose measured use is over the share that sends stacks back
    #: (:attr:`PlacementConfig.server_cpu_share_evict`): only these shed stacks for
    #: their CPU, down to ``capacity_s``.
    shedding: frozenset[str] = frozenset()
    #: Per server, the CPU seconds a window past which it sends stacks back.
    evict_s: Mapping[str, float] = field(default_factory=dict)

    @staticmethod
    def of(
        stacks: Sequence[StackView],
        nodes: Mapping[str, NodeView],
        config: PlacementConfig,
        table: Coefficients,
    ) -> _CpuBudget:
        capacity: dict[str, float] = {}
        evict_at: dict[str, float] = {}
        shedding: set[str] = set()
        if config.aggregate(len({s.client for s in stacks})):
            for server in {s.server for s in stacks}:
                node = nodes[server]
                cap = node.cpu_capacity_s(config.server_cpu_share_max, config.window_s)
                evict = node.cpu_capacity_s(config.server_cpu_share_evict, config.window_s)
                if cap is None or evict is None or node.cpu_busy is None:
                    continue
                capacity[server] = cap
                evict_at[server] = evict
                if node.cpu_busy * config.window_s > evict:
                    shedding.add(server)
        return _CpuBudget(
            stacks,
            nodes,
            config.window_s,
            table,
            capacity,
            frozenset(shedding),
            evict_at,
        )

    def used(self, prediction: Prediction) -> dict[str, float]:
        if not self.capacity_s:
            return {}
        return server_cpu_s(
            self.stacks, prediction.placement, self.nodes, self.window_s, self.table
        )

    def arrival_fits(
        self, server: str, placement: Mapping[str, int], leaving: Mapping[str, str]
    ) -> bool:
        """Whether ``server``'s CPU has room for the arrivals of ``placement``: its
        measured use, less the stacks it sends back (``leaving``) but with every other
        stack it hosts kept (the greedy takes those one by one, and their room is not
        an arrival's), plus what the arrivals take, within its budget (True when its
        use is not measured: then only the limit on arrivals holds them)."""
        cap = self.capacity_s.get(server)
        if cap is None:
            return True
        kept = dict(placement)
        for s in self.stacks:
            if s.server == server and s.stack_id not in leaving:
                kept[s.stack_id] = min(kept.get(s.stack_id, s.split), s.split)
        used = server_cpu_s(self.stacks, kept, self.nodes, self.window_s, self.table)
        return used.get(server, 0.0) <= cap + TOLERANCE_S

    def over(
        self, server: str, trial: Mapping[str, float], best: Mapping[str, float], worth: float
    ) -> bool:
        """Whether ``trial`` takes ``server`` over its budget, and further than ``best``
        (a node over it already may still shed work), for a stack worth ``worth``
        per server CPU second (:func:`worth_per_server_cpu_s`; at least
        :data:`SATURATED_SCORE_MIN`: it is worth the CPU it takes from the others, and
        no budget holds it back)."""
        cap = self.capacity_s.get(server)
        if cap is None or worth >= SATURATED_SCORE_MIN:
            return False
        now = trial.get(server, 0.0)
        return now > cap and now > best.get(server, 0.0) + TOLERANCE_S


def _moves(
    stacks: Sequence[StackView],
    current: Prediction,
    best: Prediction,
    admitted: Mapping[str, Candidate],
    candidates: Sequence[Candidate],
    nodes: Mapping[str, NodeView],
    config: PlacementConfig,
    pinned: frozenset[str],
    cpu: _CpuBudget,
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
        over = _cpu_over_if_kept(s, best, cpu, worth_per_server_cpu_s(s, k_to, s.split, nodes))
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


def worth_per_server_cpu_s(
    stack: StackView, k_client: int, k_server: int, nodes: Mapping[str, NodeView]
) -> float:
    """What running ``stack``'s objects at the server (split at ``k_server``, against
    ``k_client`` with more of them at the client) saves its client per second of the
    server's CPU it takes: the client's CPU (at its raw speed, *not* weighted by its
    load) and the link's time (the paper's ``C_k``: bytes over bandwidth and a round
    trip per call), over the server CPU of the objects that move.

    The many-clients rule's measure (:data:`SATURATED_SCORE_MIN`). The paper's score
    (:attr:`Candidate.score`) weighs the client's CPU by the client's load, which is
    right for one application on its own machine; for the clients' aggregate
    throughput a loaded client's CPU is contended by other work, which the freed CPU
    goes to, so a CPU second freed there is worth a second and no more. On this
    machine, where 64 client processes share one core (load 150 in the decision log),
    the paper's score found a CPU-heavy filter that saves no transfer worth 5-15 s
    per node CPU second, and the budget let 86 of them go to the node in one pass;
    by this measure it is worth the node's speed (0.05). The link's time is the
    estimate, not the measured price of equation 4's ``C_k`` (:func:`stall_s`): the
    measured wait includes the queue at the node itself, the thing the budget is
    protecting, and with it a heavy filter's two equal transfers (256 KiB either way)
    differed by up to 0.1 s a window, enough to send some to a node over its budget.
    For a stack not at the server yet, the wait its calls would have there, as the
    stacks there measure it (:func:`queue_s`), is taken from what it saves: a cheap
    filter whose calls would wait at the node longer than its transfer takes is
    worth less than nothing there, and the budget holds it back."""
    client, server = nodes[stack.client], nodes[stack.server]
    saved = (client_work_s(stack, k_client) - client_work_s(stack, k_server)) / client.speed
    saved += modelled_stall_s(stack, k_client) - modelled_stall_s(stack, k_server)
    # A stack not at the server yet would wait there what the stacks there wait.
    saved -= queue_s(stack, k_server, server) - queue_s(stack, k_client, server)
    cpu = (server_work_s(stack, k_server) - server_work_s(stack, k_client)) / server.speed
    if cpu <= 0:
        return math.inf if saved > 0 else 0.0
    return saved / cpu


def _cpu_over_if_kept(s: StackView, best: Prediction, cpu: _CpuBudget, worth: float) -> str | None:
    """Why ``s`` must leave its server for the CPU budget (None: it need not): with it
    kept where it is and the rest of ``best`` done, the server would be over budget
    (and its leaving frees CPU), and what it saves its client per server CPU second,
    ``worth``, is under :data:`SATURATED_SCORE_MIN`."""
    cap = cpu.capacity_s.get(s.server)
    if cap is None or worth >= SATURATED_SCORE_MIN or s.server not in cpu.shedding:
        # Not over the share that sends stacks back: the band between it and the
        # budget is the hysteresis (a use that swings around the budget moves nothing).
        return None
    kept = {**best.placement, s.stack_id: s.split}
    used = server_cpu_s(cpu.stacks, kept, cpu.nodes, cpu.window_s, cpu.table).get(s.server, 0.0)
    planned = cpu.used(best).get(s.server, 0.0)
    # Over the budget, and its leaving frees CPU: a stack whose window showed no CPU
    # at the node (one long call in progress, no call completed) frees nothing.
    if used <= cap or used <= planned + TOLERANCE_S:
        return None
    return (
        f"the node's CPU: {used:.3f} s a window with it kept > {cap:.3f} s planned at most, "
        f"and it saves its client {worth:.2f} s of CPU and link per second of it (many clients)"
    )


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
