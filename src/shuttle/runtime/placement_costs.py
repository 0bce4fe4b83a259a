"""One stack's costs (ABACUS equations 3-6, and a move's price): what a split costs in
compute and network stall, how moving objects changes the server's load, what a
migration costs, and which splits are allowed. Pure, no I/O; the overview of the model
is in :mod:`shuttle.runtime.placement`."""

from __future__ import annotations

from collections.abc import Iterable

from shuttle.runtime.placement_views import EdgeView, NodeView, StackView

# --- equations 3-6: one stack ------------------------------------------------------


def effective_load(load: float) -> float:
    """The factor by which load slows an object: ``max(1, L)`` (an idle node gives
    the object a whole CPU; the paper's ``r = R / L`` for a busy one)."""
    return load if load > 1.0 else 1.0


def _link_s(edge: EdgeView, bandwidth: float | None, latency_s: float) -> float:
    transfer = 0.0 if bandwidth is None else edge.bytes / bandwidth
    return transfer + 2.0 * latency_s * edge.calls


def _peer_s(stack: StackView, k: int, overhead_s: float = 0.0) -> float:
    """A fan-out object's traffic to other nodes: over the client's links when it runs
    at the client (each call paying ``overhead_s`` besides, as every call across
    them does), over the nodes' network when it runs at the server."""
    if stack.peer is None:
        return 0.0
    if k == stack.n - 1:
        link = _link_s(stack.peer, stack.bandwidth_bytes_per_s, stack.latency_s)
        return link + stack.peer.calls * overhead_s
    return _link_s(stack.peer, stack.peer_bandwidth_bytes_per_s, stack.peer_latency_s)


def modelled_stall_s(stack: StackView, k: int) -> float:
    """The paper's ``C_k``: the edge ``O_k -> O_k+1``'s bytes over the link's bandwidth
    plus a round trip per call, plus a fan-out object's traffic to other nodes."""
    return _link_s(stack.edges[k], stack.bandwidth_bytes_per_s, stack.latency_s) + _peer_s(stack, k)


def call_overhead_s(stack: StackView) -> float:
    """Seconds each call across the client–server link costs beyond the estimate
    (bytes over bandwidth, a round trip), as measured on the edge that crosses the
    link now: its measured stall (less the callee's own time) minus the estimate,
    per call; 0 when the measurement is not above the estimate.

    That excess is what crossing costs per call on this link under today's
    conditions: the run-time's own RPC overhead, the queues at both ends, and under
    contention the far end's callbacks and queue behind other clients' remote
    commits. It is per call, so a split whose edge makes fewer calls (a directory
    object at the server takes one call per insert where at the client it makes a
    dozen: reads, commits, retries) is charged for fewer."""
    edge = stack.edges[stack.split]
    if edge.measured_s <= 0:
        return 0.0
    estimate = _link_s(edge, stack.bandwidth_bytes_per_s, stack.latency_s)
    # Fewer than one call completed (one long call still in progress): one call.
    return max(0.0, edge.measured_s - estimate) / max(1.0, edge.calls)


def stall_s(stack: StackView, k: int) -> float:
    """``C_k`` as the model uses it: the paper's estimate for the edge ``O_k ->
    O_k+1`` plus, per call on it, the overhead measured on the edge that crosses the
    link now (:func:`call_overhead_s`), plus the fan-out traffic, whose calls pay the
    same overhead while they cross the client's links (a RAID object at the client
    calls four other nodes over them as it calls the stack's own).

    At the split in force this prices the edge at its measured stall when that is
    more than the estimate (and at the estimate otherwise); every other split gets
    the same per-call overhead for the calls its own edge makes. Without a
    measurement above the estimate, this is the paper's ``C_k``."""
    edge = stack.edges[k]
    link = _link_s(edge, stack.bandwidth_bytes_per_s, stack.latency_s)
    overhead = call_overhead_s(stack)
    if k == stack.split:
        return max(link, edge.measured_s) + _peer_s(stack, k, overhead)
    return link + edge.calls * overhead + _peer_s(stack, k, overhead)


def queue_s(stack: StackView, k: int, server: NodeView) -> float:
    """The wait at ``server`` a split that moves objects there (``k`` below the split
    in force) adds to the stack's response time: a call on the edge that would cross
    the link, per call, at the wait the stacks already at the server measure beyond
    what equation 4 prices for them (:attr:`NodeView.queue_s_per_call`, set by the
    many-clients rule; 0 otherwise, and nothing changes). The stacks already there
    are priced at what they measure; a stack not there yet measured nothing of the
    queue it would join, and an idle node's load priced every cheap filter in at
    once (docs/runtime.md, "Many clients").

    Less what the stack pays per call already at every split: the overhead its own
    calls across the link measured (:func:`call_overhead_s`, its reads waiting at
    the same node), which :func:`stall_s` charges at the server's split too."""
    if k >= stack.split or server.queue_s_per_call <= 0:
        return 0.0
    return stack.edges[k].calls * max(0.0, server.queue_s_per_call - call_overhead_s(stack))


def client_work_s(stack: StackView, k: int) -> float:
    """``Σ_{j≤k} h_j b_j``: reference CPU seconds of the objects at the client."""
    return sum(stack.objects[j].cpu_s for j in range(k + 1))


def server_work_s(stack: StackView, k: int) -> float:
    """``Σ_{j>k} h_j b_j``: reference CPU seconds of the objects at the server."""
    return sum(stack.objects[j].cpu_s for j in stack.at_server(k))


def response_time_s(
    stack: StackView, k: int, client: NodeView, server: NodeView, server_load: float
) -> float:
    """Equation 4: ``T_app(k)`` with the server at load ``server_load`` (and, for a
    split that moves objects to the server, the wait there: :func:`queue_s`)."""
    return (
        effective_load(client.load) * client_work_s(stack, k) / client.speed
        + stall_s(stack, k)
        + queue_s(stack, k, server)
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


def unfinished(stack: StackView) -> bool:
    """Whether the window saw calls below an edge that completed none: the objects
    above that edge are in the middle of their calls, and a call's CPU and the bytes
    it returns are counted when it returns, while the stall below it is counted as it
    accrues. Such a window shows those objects as free and everything below as stall:
    a heavy filter whose first call had not returned when its stack's first digest
    went out (``H/4`` after it started) read as 0 CPU over 0.7-0.85 s of reads, and
    every such stack was moved to the node, and back once its calls returned
    (benchmarks/README.md, "Placement for aggregate throughput"). Such a stack is not
    decided on until the next window."""
    return any(
        above.calls <= 0 and below.calls > 0
        for above, below in zip(stack.edges, stack.edges[1:], strict=False)
    )


def hosted_memory_bytes(stack: StackView, k: int) -> int:
    """Memory the stack's mobile objects take at the server when split at ``k``."""
    return sum(stack.objects[j].memory_bytes for j in stack.at_server(k) if j != stack.n)
