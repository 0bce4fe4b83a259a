"""The choice (ABACUS 5.4.3): candidates scored by benefit per server CPU second,
allocated greedily within the server's memory (and, with many clients, the servers'
CPU budget and the limit on arrivals), each resulting move then judged on its own net
benefit against ``B_thresh``. Pure, no I/O; the overview of the model is in
:mod:`shuttle.runtime.placement`.

The greedy allocation lives here; what an evaluation records is in
:mod:`~shuttle.runtime.placement_plan`, the verdict on each move (evictions for room
among them) in :mod:`~shuttle.runtime.placement_verdicts`, the servers' CPU budget
(many clients) in :mod:`~shuttle.runtime.placement_budget`."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from shuttle.runtime.placement_budget import CpuBudget, worth_per_server_cpu_s
from shuttle.runtime.placement_costs import (
    feasible_splits,
    hosted_memory_bytes,
    unfinished,
)
from shuttle.runtime.placement_load import Coefficients, predict
from shuttle.runtime.placement_many import (
    arrival_limits,
    many_clients_view,
    pushback,
)
from shuttle.runtime.placement_plan import Candidate, Plan
from shuttle.runtime.placement_verdicts import judge
from shuttle.runtime.placement_views import (
    SATURATED_SCORE_MIN,
    SERVE_CPU_S_PER_BYTE,
    TOLERANCE_S,
    NodeView,
    PlacementConfig,
    StackView,
)

# --- the choice (5.4.3) ---------------------------------------------------------------


def choose(
    stacks: Sequence[StackView],
    nodes: Mapping[str, NodeView],
    config: PlacementConfig,
    *,
    pinned: Iterable[str] = (),
    arriving: Mapping[str, int] | None = None,
    send_back: Mapping[str, str] | None = None,
    raised_before: Collection[str] = (),
) -> Plan:
    """Decide the placement of ``stacks`` (5.4.3); see the module docstring.

    ``nodes`` must hold every stack's client and server. ``pinned`` names objects
    that must not move in this evaluation. ``arriving``: per server, the stacks
    decided to move there and not yet observed there for a window (the many-clients
    rule limits them: :func:`~shuttle.runtime.placement_many.arrival_limits`).
    ``send_back``: stacks to send back to their clients whatever they save, with the
    reason (many clients: the stacks a failed step of the admission edge let in,
    :class:`~shuttle.runtime.placement_climb.AdmissionClimb`); those not at their
    server, or pinned there, are left as they are. ``raised_before``: the servers
    whose budget the clients' saturation raised at the last evaluation
    (:attr:`Plan.raised` of it), whose raise holds while they are the bound
    (:func:`~shuttle.runtime.placement_budget.raise_held`)."""
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
    # What each saves its client per second of the node's CPU (the budget's measure,
    # and with many clients the order).
    worth_of = {
        (c.stack_id, c.split): worth_per_server_cpu_s(
            by_id[c.stack_id], base[c.stack_id], c.split, nodes
        )
        for c in candidates
    }
    if many and config.rank_by_node_cpu:
        # The client's CPU unweighted by its load: the paper's score weighs it by that
        # load, and at 64 clients on one core (load 150+) a heavy filter that saves no
        # transfer ranked among the cheap ones and took places in the arrivals' batches.
        candidates.sort(
            key=lambda c: (-worth_of[c.stack_id, c.split], -c.benefit_s, c.stack_id, c.split)
        )
    else:
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
    cpu = CpuBudget.of(stacks, nodes, config, table, raised_before)
    # Many clients: a few stacks on their way to a server at once, then observe the
    # wait and the CPU they make there (docs/runtime.md, "Many clients").
    limit = arrival_limits(stacks, config, cpu.raised) if many else {}
    admit = {srv: max(0, n - (arriving or {}).get(srv, 0)) for srv, n in limit.items()}
    # Many clients: a server over the share of its CPU that sends stacks back sends
    # back the ones with the most CPU per byte saved (docs/runtime.md, "Saturation").
    shed: dict[str, str] = {}
    serve = SERVE_CPU_S_PER_BYTE if config.shed_by_freed_cpu else 0.0
    for srv in sorted(cpu.shedding):
        used_s = (nodes[srv].cpu_busy or 0.0) * window
        cap_s = cpu.capacity_s[srv]
        back = pushback(stacks, nodes[srv], used_s, cap_s, base, serve)
        if not back and used_s > cap_s and serve:
            notes.append(
                f"many clients: {srv} over its CPU ({used_s:.3f} s a window > "
                f"{cap_s:.3f} s), sends nothing back: no stack it hosts frees its CPU by "
                "leaving (serving its reads over the link would cost the node more)"
            )
        for s, ratio in back:
            per_mb = "no bytes saved" if math.isinf(ratio) else f"{ratio * 1e6:.4f} s per MB saved"
            shed[s.stack_id] = (
                f"the node's CPU saturated: {used_s:.3f} s a window > "
                f"{cpu.evict_s[srv]:.3f} s; back first of {len(back)} for the most CPU per "
                f"byte saved ({per_mb}) (many clients)"
            )
    if many:
        for s in stacks:
            why = (send_back or {}).get(s.stack_id)
            if why is not None and s.stack_id not in shed and s.split < base[s.stack_id]:
                shed[s.stack_id] = why
    capped: dict[str, int] = {}
    full: dict[str, int] = {}
    unworthy: dict[str, int] = {}
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
        worth = worth_of[cand.stack_id, cand.split]
        if cpu.over(stack.server, trial_used, best_used, worth):
            continue
        arrival = many and cand.split < stack.split
        if arrival and not cpu.arrival_fits(stack.server, trial.placement, shed):
            # The node's measured use with what it hosts kept, and this stack's CPU,
            # would pass its budget: no arrival, whatever it saves its client (the
            # server's measured saturation admits: Bhardwaj et al., ATC 2020).
            full[stack.server] = full.get(stack.server, 0) + 1
            continue
        if (
            arrival
            and config.rank_by_node_cpu
            and stack.server in cpu.raised
            and worth < SATURATED_SCORE_MIN
        ):
            # Its clients saturated, the node plans its CPU for their throughput: an
            # arrival that saves them less than the node CPU it takes (a heavy filter:
            # 2 ms of its client's for 48-66 ms of the node's) only lengthens the queue
            # its cheap stacks wait in.
            unworthy[stack.server] = unworthy.get(stack.server, 0) + 1
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
    for srv, (busy, share) in sorted(cpu.raised.items()):
        if srv in cpu.held:
            notes.append(
                f"many clients: {srv}'s clients saturated at the last evaluation, their "
                f"CPUs {busy:.2f} busy now (median) while the node is over its base "
                f"budget ({nodes[srv].cpu_busy or 0.0:.2f} of a CPU busy): they wait on "
                f"it; it holds its raise, up to {share:.2f} of its CPU"
            )
            continue
        notes.append(
            f"many clients: {srv}'s clients saturated (their CPUs {busy:.2f} busy, "
            f"median): it plans up to {share:.2f} of its CPU"
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
    for srv in sorted(unworthy):
        notes.append(
            f"many clients: {srv}'s clients saturated: {unworthy[srv]} arrivals held back "
            f"that save them less than the node's CPU they take"
        )
    for srv in sorted(full):
        notes.append(
            f"many clients: {srv} has no CPU for arrivals (its budget with what it hosts): "
            f"{full[srv]} held back"
        )

    moves = judge(stacks, current, best, admitted, candidates, nodes, config, pinned, cpu, shed)
    return Plan(
        current,
        best,
        tuple(candidates),
        moves,
        config.threshold_s,
        tuple(notes),
        frozenset(cpu.raised),
    )
