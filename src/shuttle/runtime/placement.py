"""The placement model of ABACUS section 5.4: measurements in, decisions out. No I/O.

Vocabulary (the paper's). A *stack* is a chain of objects ``O_0 .. O_n``: ``O_0`` is
the application's console (anchored at the client), ``O_n`` a storage object
(anchored at the server), and every object between may run at either end. A stack
is *split at k* when ``O_0 .. O_k`` run at the client and ``O_k+1 .. O_n`` at the
server. Over an observation window ``H`` the run-time measured, for each object,
``h_j b_j``: the CPU it used, in *reference CPU seconds* (what a node of speed 1
would have spent; a node of speed ``R`` spends ``h_j b_j / R``), and for each edge
``O_j -> O_j+1`` the bytes that crossed it and the calls made. Each node has a raw
speed ``R`` and a load ``L`` (average runnable threads over ``H``); an object on a
node runs at the effective rate ``R / max(1, L)`` (an idle node gives an object the
whole CPU).

Equation 4, the application's response time when split at ``k``::

    T_app(k) = L_client Σ_{j≤k} h_j b_j / R_client + C_k + L_server(k) Σ_{j>k} h_j b_j / R_server

with ``C_k`` the network stall on the edge ``O_k -> O_k+1``: its bytes over the
link's bandwidth plus a round trip of latency per call (on one node, calls are free).

Equations 5 and 6: moving objects changes the server's load by the fraction of
time they will spend computing there, which depends on the new response time, which
depends on the load; iterate from the measured values until it converges::

    L_server(k') = L_server(k) + Σ_{moved} h_j b_j / (R_server T_app(k'))

Objects leaving the server take away the fraction of the window they used there.
The client's load is taken as constant (the server controls neither the client's CPU
nor which applications start there), as in the paper.

Equation 7: with several stacks a placement is a vector of splits, the server loads
couple them, and the objective is the average ``T_app``. :func:`predict` solves the
coupled fixed point for any placement vector.

Section 5.4.3, the choice (:func:`choose`): the server's resources are allocated
greedily, candidate by candidate, favouring the larger benefit per server CPU second
(the benefit of placing a stack's objects at the server divided by the CPU time they
cost it there), within the server's memory for hosted objects. Each move that the
resulting placement asks for is made only if its own net benefit (the response time
it saves per window, minus the migration cost: quiesce time from history plus
checkpoint bytes over the link) is over ``B_thresh``. Where the paper is silent,
decisions are ours and are named in docs/runtime.md:

* A stack evicted from the server only to make room (memory) for a better one moves
  with the admission that needs the room, provided the newcomer's benefit per CPU
  second beats the evicted stack's by ``eviction_ratio`` (no churn between equals).
* Objects the caller marks as pinned (recently moved: the planner's residence rule
  against thrashing) are treated as non-migratable for this evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shuttle.errors import ConfigError

#: Bisection steps solving equations 5/6 (7) for a server's load: each halves the
#: bracket, so 100 reach any precision a float holds.
ITERATIONS_MAX = 100
#: Convergence: the load is known to this (relative) precision.
TOLERANCE_S = 1e-12
#: Quiesce time assumed for an object with no migration history: a few calls' worth
#: of draining on a busy node (measured quiesce times replace it after one move).
QUIESCE_S_DEFAULT = 0.01


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """The model's knobs (``H`` and ``B_thresh`` as the paper names them)."""

    #: H: the observation window, seconds.
    window_s: float = 1.0
    #: B_thresh as a fraction of H: a move must save more than this per window.
    threshold_fraction: float = 0.3
    #: A newcomer evicts a hosted stack for room only if its benefit per server CPU
    #: second is at least this many times the evicted one's.
    eviction_ratio: float = 1.25

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ConfigError(f"window H must be > 0 seconds, got {self.window_s!r}")
        if not (math.isfinite(self.threshold_fraction) and self.threshold_fraction >= 0):
            raise ConfigError(
                f"threshold B_thresh must be a fraction ≥ 0 of H, got {self.threshold_fraction!r}"
            )
        if not (math.isfinite(self.eviction_ratio) and self.eviction_ratio >= 1):
            raise ConfigError(f"eviction ratio must be ≥ 1, got {self.eviction_ratio!r}")

    @property
    def threshold_s(self) -> float:
        """B_thresh in seconds."""
        return self.threshold_fraction * self.window_s


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as the model sees it: raw speed R, measured load L, memory for objects."""

    node_id: str
    speed: float = 1.0
    load: float = 0.0
    #: Bytes of memory the node lends to hosted mobile objects (None: no limit).
    memory_capacity_bytes: int | None = None

    def __post_init__(self) -> None:
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ConfigError(f"node {self.node_id}: speed R must be > 0, got {self.speed!r}")
        if not (self.load >= 0 and math.isfinite(self.load)):
            raise ConfigError(f"node {self.node_id}: load L must be ≥ 0, got {self.load!r}")


@dataclass(frozen=True, slots=True)
class ObjectView:
    """One object of a stack over the window."""

    rid: str
    #: h_j b_j: reference CPU seconds (speed-1 seconds) the object used in the window.
    cpu_s: float = 0.0
    memory_bytes: int = 0
    migratable: bool = True
    #: Size of its checkpoint (what a migration ships).
    checkpoint_bytes: int = 0
    #: Expected time to quiesce it (from the history of migrations), seconds.
    quiesce_s: float = QUIESCE_S_DEFAULT


@dataclass(frozen=True, slots=True)
class EdgeView:
    """Traffic on the edge ``O_j -> O_j+1`` over the window."""

    bytes: float = 0.0
    calls: float = 0.0


@dataclass(frozen=True, slots=True)
class StackView:
    """One application stack ``O_0 .. O_n`` and where it is split now."""

    stack_id: str
    client: str
    server: str
    objects: tuple[ObjectView, ...]
    edges: tuple[EdgeView, ...]
    #: k: objects 0..k run at the client.
    split: int
    #: The client–server link: bytes per second (None: unlimited) and one-way latency.
    bandwidth_bytes_per_s: float | None = None
    latency_s: float = 0.0
    #: Fan-out: the last mobile object (index n-1) also calls anchored objects on
    #: other nodes (a RAID object's other columns). That traffic crosses the client's
    #: links while the object runs at the client, and the nodes' own network
    #: (``peer_*``; None: unlimited) while it runs at the server.
    peer: EdgeView | None = None
    peer_bandwidth_bytes_per_s: float | None = None
    peer_latency_s: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.objects) - 1
        if n < 1:
            raise ConfigError(f"stack {self.stack_id}: needs a console and a storage object")
        if len(self.edges) != n:
            raise ConfigError(
                f"stack {self.stack_id}: {n + 1} objects need {n} edges, got {len(self.edges)}"
            )
        if not 0 <= self.split < n:
            raise ConfigError(f"stack {self.stack_id}: split {self.split} is not in 0..{n - 1}")

    @property
    def n(self) -> int:
        """Index of the storage object (the last)."""
        return len(self.objects) - 1

    def at_server(self, k: int) -> range:
        """Indices of the objects at the server when split at ``k``."""
        return range(k + 1, len(self.objects))

    def moved(self, k_from: int, k_to: int) -> range:
        """Indices of the objects that change sides going from split ``k_from`` to ``k_to``."""
        return range(min(k_from, k_to) + 1, max(k_from, k_to) + 1)


# --- equations 3-6: one stack ------------------------------------------------------


def effective_load(load: float) -> float:
    """The factor by which load slows an object: ``max(1, L)`` (an idle node gives
    the object a whole CPU; the paper's ``r = R / L`` for a busy one)."""
    return load if load > 1.0 else 1.0


def _link_s(edge: EdgeView, bandwidth: float | None, latency_s: float) -> float:
    transfer = 0.0 if bandwidth is None else edge.bytes / bandwidth
    return transfer + 2.0 * latency_s * edge.calls


def stall_s(stack: StackView, k: int) -> float:
    """``C_k``: time on the network for the edge ``O_k -> O_k+1`` over the window,
    plus a fan-out object's traffic to other nodes (over the client's links when it
    runs at the client, over the nodes' network when it runs at the server)."""
    c = _link_s(stack.edges[k], stack.bandwidth_bytes_per_s, stack.latency_s)
    if stack.peer is not None:
        if k == stack.n - 1:
            c += _link_s(stack.peer, stack.bandwidth_bytes_per_s, stack.latency_s)
        else:
            c += _link_s(stack.peer, stack.peer_bandwidth_bytes_per_s, stack.peer_latency_s)
    return c


def client_work_s(stack: StackView, k: int) -> float:
    """``Σ_{j≤k} h_j b_j``: reference CPU seconds of the objects at the client."""
    return sum(stack.objects[j].cpu_s for j in range(k + 1))


def server_work_s(stack: StackView, k: int) -> float:
    """``Σ_{j>k} h_j b_j``: reference CPU seconds of the objects at the server."""
    return sum(stack.objects[j].cpu_s for j in stack.at_server(k))


def response_time_s(
    stack: StackView, k: int, client: NodeView, server: NodeView, server_load: float
) -> float:
    """Equation 4: ``T_app(k)`` with the server at load ``server_load``."""
    return (
        effective_load(client.load) * client_work_s(stack, k) / client.speed
        + stall_s(stack, k)
        + effective_load(server_load) * server_work_s(stack, k) / server.speed
    )


def load_change(
    stack: StackView, k_new: int, server: NodeView, response_s: float, window_s: float
) -> float:
    """How much moving ``stack`` from its split to ``k_new`` changes the server's load.

    Objects arriving add the fraction of the new response time they will compute at
    the server (equation 5); objects leaving take away the fraction of the window
    they computed there."""
    k = stack.split
    if k_new < k:  # objects k_new+1..k move to the server
        work = sum(stack.objects[j].cpu_s for j in stack.moved(k, k_new)) / server.speed
        return work / response_s if response_s > 0 else 0.0
    if k_new > k:  # objects k+1..k_new move to the client
        work = sum(stack.objects[j].cpu_s for j in stack.moved(k, k_new)) / server.speed
        return -work / window_s
    return 0.0


# --- equation 7: a placement vector -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Prediction:
    """Response times and server loads under one placement (equation 7)."""

    placement: Mapping[str, int]
    response_s: Mapping[str, float]
    server_load: Mapping[str, float]
    iterations: int
    converged: bool

    @property
    def mean_response_s(self) -> float:
        values = list(self.response_s.values())
        return sum(values) / len(values) if values else 0.0


def predict(
    stacks: Sequence[StackView],
    placement: Mapping[str, int],
    nodes: Mapping[str, NodeView],
    window_s: float,
) -> Prediction:
    """Each stack's ``T_app`` when the stacks are split as ``placement`` says (missing
    stacks keep their split): equations 5 and 6 solved jointly for every server.

    The paper iterates the two equations from the measured values. That plain
    iteration converges slowly, or oscillates, when the moved work is large next to
    the stall, so we solve the same equation exactly: for each server, find the load
    ``L`` with ``L = L_measured + Σ_stacks change_s(T_s(L))``. The right side falls as
    ``L`` rises (each ``T_s`` grows with ``L``), so the root is unique and bisection
    finds it. Stacks couple only through their server, so servers are solved apart.
    """
    splits = {s.stack_id: placement.get(s.stack_id, s.split) for s in stacks}
    loads: dict[str, float] = {}
    iterations = 0
    converged = True
    for server in sorted({s.server for s in stacks}):
        mine = [s for s in stacks if s.server == server]
        load, steps, ok = _solve_load(mine, splits, nodes, window_s)
        loads[server] = load
        iterations = max(iterations, steps)
        converged = converged and ok
    response = {
        s.stack_id: response_time_s(
            s, splits[s.stack_id], nodes[s.client], nodes[s.server], loads[s.server]
        )
        for s in stacks
    }
    return Prediction(splits, response, loads, iterations, converged)


def _solve_load(
    stacks: Sequence[StackView],
    splits: Mapping[str, int],
    nodes: Mapping[str, NodeView],
    window_s: float,
) -> tuple[float, int, bool]:
    """The server load under ``splits`` for the stacks of one server, by bisection."""
    server = nodes[stacks[0].server]

    def implied(load: float) -> float:
        total = server.load
        for s in stacks:
            k = splits[s.stack_id]
            if k != s.split:
                t = response_time_s(s, k, nodes[s.client], server, load)
                total += load_change(s, k, server, t, window_s)
        return max(0.0, total)

    low = implied(math.inf)  # arrivals add nothing at infinite load: only removals count
    high = implied(low)
    if high - low <= TOLERANCE_S:
        return high, 1, True
    for step in range(1, ITERATIONS_MAX + 1):
        mid = (low + high) / 2
        if implied(mid) > mid:
            low = mid
        else:
            high = mid
        if high - low <= TOLERANCE_S * max(1.0, high):
            return (low + high) / 2, step, True
    return (low + high) / 2, ITERATIONS_MAX, False


def predict_single(
    stack: StackView, k_new: int, nodes: Mapping[str, NodeView], window_s: float
) -> float:
    """Equations 5 and 6 for one stack alone: ``T_app(k_new)``."""
    return predict([stack], {stack.stack_id: k_new}, nodes, window_s).response_s[stack.stack_id]


# --- migration cost -----------------------------------------------------------------


def migration_cost_s(stack: StackView, k_from: int, k_to: int) -> float:
    """Time lost moving ``stack`` from split ``k_from`` to ``k_to``: for each moved
    object its quiesce time (history) plus its checkpoint over the link and a round
    trip to install it (5.4.3)."""
    cost = 0.0
    bw = stack.bandwidth_bytes_per_s
    for j in stack.moved(k_from, k_to):
        obj = stack.objects[j]
        transfer = 0.0 if bw is None else obj.checkpoint_bytes / bw
        cost += obj.quiesce_s + transfer + 2.0 * stack.latency_s
    return cost


# --- feasibility --------------------------------------------------------------------


def feasible_splits(stack: StackView, pinned: Iterable[str] = ()) -> range:
    """Splits that keep anchored, non-migratable and pinned objects where they are
    now (the console at the client, the storage object at the server)."""
    fixed = set(pinned)
    lo, hi = 0, stack.n - 1
    for j, obj in enumerate(stack.objects):
        if j == 0 or j == stack.n or not obj.migratable or obj.rid in fixed:
            if j <= stack.split:
                lo = max(lo, j)
            else:
                hi = min(hi, j - 1)
    return range(lo, hi + 1)


def hosted_memory_bytes(stack: StackView, k: int) -> int:
    """Memory the stack's mobile objects take at the server when split at ``k``."""
    return sum(stack.objects[j].memory_bytes for j in stack.at_server(k) if j != stack.n)


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
    current = predict(stacks, {}, nodes, window)
    feasible = {s.stack_id: feasible_splits(s, pinned) for s in stacks}
    # The baseline the greedy allocates from: everything that may be at the client is.
    base = {sid: max(r) for sid, r in feasible.items()}
    baseline = predict(stacks, base, nodes, window)

    candidates: list[Candidate] = []
    for s in stacks:
        for k in feasible[s.stack_id]:
            if k == base[s.stack_id]:
                continue
            alone = predict(stacks, {**base, s.stack_id: k}, nodes, window)
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
        trial = predict(stacks, {**chosen, cand.stack_id: cand.split}, nodes, window)
        if trial.mean_response_s >= best.mean_response_s - TOLERANCE_S:
            continue
        chosen[cand.stack_id] = cand.split
        admitted[cand.stack_id] = cand
        if room is not None:
            free[stack.server] = room - need
        best = trial

    moves = _moves(stacks, current, best, admitted, candidates, nodes, config, pinned)
    return Plan(current, best, tuple(candidates), moves, config.threshold_s)


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
    threshold = config.threshold_s
    best_score = {c.stack_id: c.score for c in candidates if admitted.get(c.stack_id) == c}
    # The score each stack has at the split it holds now (what an eviction gives up).
    held_score: dict[str, float] = {}
    for c in candidates:
        stack = next(s for s in stacks if s.stack_id == c.stack_id)
        if c.split == stack.split:
            held_score[c.stack_id] = c.score
    moves: list[Move] = []
    admissions: list[Move] = []
    evictions: list[tuple[StackView, int, float, float]] = []
    for s in stacks:
        k_to = best.placement[s.stack_id]
        if k_to == s.split:
            continue
        benefit = current.response_s[s.stack_id] - best.response_s[s.stack_id]
        cost = migration_cost_s(s, s.split, k_to)
        if k_to < s.split:
            order = tuple(s.objects[j].rid for j in reversed(s.moved(s.split, k_to)))
            net = benefit - cost
            ok = net > threshold
            reason = (
                f"net benefit {net:.3f} s > B_thresh {threshold:.3f} s"
                if ok
                else f"net benefit {net:.3f} s ≤ B_thresh {threshold:.3f} s"
            )
            move = Move(s.stack_id, s.split, k_to, order, True, benefit, cost, ok, reason)
            admissions.append(move)
            moves.append(move)
        else:
            evictions.append((s, k_to, benefit, cost))
    executed_admissions = [m for m in admissions if m.execute]
    for s, k_to, benefit, cost in evictions:
        order = tuple(s.objects[j].rid for j in s.moved(s.split, k_to))
        net = benefit - cost
        if net > threshold:
            execute, why = True, f"net benefit {net:.3f} s > B_thresh {threshold:.3f} s"
        else:
            # Not worth it alone: only as room for an admission that needs it.
            evicted_score = held_score.get(s.stack_id, 0.0)
            winners = [
                m
                for m in executed_admissions
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
            elif not needs_room or not executed_admissions:
                why = f"net benefit {net:.3f} s ≤ B_thresh {threshold:.3f} s"
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
