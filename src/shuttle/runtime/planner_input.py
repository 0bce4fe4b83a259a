"""The planner's input as data: digests in, the stacks the model sees out. No I/O.

:func:`model_input` is a pure function of the fresh digests (the node's own and its
clients', :class:`~shuttle.runtime.digest.Digest`), what the node knows of itself
(:class:`NodeFacts`: its id, its memory for objects, and from its location table
the objects it hosts and those moving away) and the planner's knobs. It merges the
digests' counts into rates, follows each console's chain of edges to one of the
node's anchored objects, and returns the stacks, nodes and pinned objects
:func:`~shuttle.runtime.placement.choose` takes. :func:`route_moves` turns the
plan's moves into who must act: decisions for the client that hosts an object, and
moves the node starts itself. The resource manager
(:mod:`shuttle.runtime.planner`) only gathers the inputs, locks and logs; the
simulator or a test can drive the same two functions with digests of its own.

Rates, not counts, are merged: each source's counts are divided by the span its
window covers, summed across sources (an object that just moved appears in both the
old and the new host's window), and multiplied by ``H`` for the model.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from shuttle.runtime.digest import Digest, ObjectDigest
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.placement import (
    QUIESCE_S_DEFAULT,
    EdgeView,
    NodeView,
    ObjectView,
    Plan,
    StackView,
)

#: Longest chain followed from a console (a stack deeper than this is a loop).
STACK_DEPTH_MAX = 16
#: Failed migrations back off up to 2**this times retry_after_s.
RETRY_DOUBLINGS_MAX = 4
#: Shortest observation a rate is computed over (a call or two is not a rate).
OBSERVED_S_MIN = 0.05
#: Shortest span a digest's counts are divided by (an empty window is not a rate).
SPAN_S_MIN = 1e-3
#: The nodes' own network, for a fan-out object at a node calling the others: the
#: nodes of a cluster share a fast network (loopback here; the servers' SAN in
#: ABACUS), taken as unlimited with no latency next to the client's links.
PEER_BANDWIDTH_BYTES_PER_S: float | None = None
PEER_LATENCY_S = 0.0
#: A stack decided to move to the node counts as on its way there (the many-clients
#: rule admits a few at a time: ``PlacementConfig.arrivals_max``) until the node has
#: hosted its object for this many windows, so that a window of its calls there is in
#: the measurements the next stacks are priced by.
ARRIVAL_OBSERVED_WINDOWS = 1.0
#: ... or until this many windows after the decision: a decision not delivered (2 H),
#: a move that failed or went back, stops holding the others up.
ARRIVAL_WINDOWS_MAX = 4.0

#: What an object no digest describes counts as: nothing measured, not movable.
_UNSEEN = ObjectDigest(rid="")


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the deciding node knows of itself besides its digest."""

    node_id: str
    #: Bytes of memory the node lends to hosted mobile objects (None: no limit).
    memory_capacity_bytes: int | None = None
    #: From its location table: the objects hosted here, and those moving away.
    hosted: frozenset[str] = frozenset()
    migrating: frozenset[str] = frozenset()
    #: Objects with a decision on its way to their client (not decided again).
    pending: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PlannerKnobs:
    """The run-time's settings the input depends on."""

    window_s: float
    residence_after_move_s: float
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class ModelInput:
    """The model's view of the node's stacks, and what the evaluation noticed."""

    stacks: tuple[StackView, ...]
    nodes: Mapping[str, NodeView]
    #: Objects not to move now (moving, just moved, backing off, decision pending).
    pinned: frozenset[str]
    #: Where each object runs, as the digests (and the location table) say.
    hosts: Mapping[str, str]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Routing:
    """A plan's executed moves, by who carries them out."""

    #: Every executed move, one per object: ``{rid, from, to, reason}`` (logged).
    actions: tuple[dict[str, str], ...] = ()
    #: Per client run-time: ``{rid, to, reason}`` for the objects it hosts.
    decisions: Mapping[str, tuple[dict[str, str], ...]] = field(default_factory=dict)
    #: (rid, target, reason) of objects hosted at the deciding node.
    local_moves: tuple[tuple[str, str, str], ...] = ()


@dataclass
class _Merged:
    """Per object and per edge rates, merged from several digests."""

    cpu_ref_per_s: dict[str, float] = field(default_factory=dict)
    host: dict[str, str] = field(default_factory=dict)
    info: dict[str, ObjectDigest] = field(default_factory=dict)
    edge_bytes_per_s: dict[tuple[str, str], float] = field(default_factory=dict)
    edge_calls_per_s: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Seconds per second callers blocked on each remote edge beyond the callee's own
    #: time (the measured stall less what the callee reported as its own).
    edge_wait_per_s: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Seconds per second of that stall the callees reported as their own.
    edge_far_per_s: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Calls in progress on each edge as its caller's window ended (not a rate).
    edge_in_flight: dict[tuple[str, str], float] = field(default_factory=dict)
    quiesce: dict[str, float | None] = field(default_factory=dict)


def model_input(
    local: Digest,
    clients: Mapping[str, Digest],
    facts: NodeFacts,
    knobs: PlannerKnobs,
) -> ModelInput:
    """The stacks that end at ``facts.node_id``'s anchored objects, as the model sees
    them, from the node's own digest ``local`` and its clients' fresh digests (by
    client id). Pure: the same arguments give the same result."""
    merged = _merge([local, *clients.values()], facts)
    notes: list[str] = []
    stacks, nodes = _stacks(merged, clients, local, facts, knobs.window_s, notes)
    return ModelInput(
        tuple(stacks),
        nodes,
        frozenset(_pinned(merged, facts, knobs)),
        dict(merged.host),
        tuple(notes),
    )


def route_moves(plan: Plan, given: ModelInput, node_id: str, *, adaptive: bool) -> Routing:
    """Who carries out each of ``plan``'s executed moves: the client hosting the
    object (in the reply to its digest) or this node. In measure-only mode
    (``adaptive`` false) the actions are listed and nobody is told."""
    decisions: dict[str, list[dict[str, str]]] = {}
    local_moves: list[tuple[str, str, str]] = []
    actions: list[dict[str, str]] = []
    by_id: dict[str, StackView] = {}
    for s in given.stacks:
        by_id.setdefault(s.stack_id, s)
    for move in plan.executed:
        stack = by_id[move.stack_id]
        for rid in move.rids:
            target = stack.server if move.to_server else stack.client
            host = given.hosts.get(rid, "")
            actions.append({"rid": rid, "from": host, "to": target, "reason": move.reason})
            if not adaptive:
                continue
            if host == node_id:
                local_moves.append((rid, target, move.reason))
            elif host:
                decisions.setdefault(host, []).append(
                    {"rid": rid, "to": target, "reason": move.reason}
                )
    return Routing(
        tuple(actions),
        {client: tuple(items) for client, items in decisions.items()},
        tuple(local_moves),
    )


def _merge(digests: Sequence[Digest], facts: NodeFacts) -> _Merged:
    m = _Merged()
    me = facts.node_id
    for d in digests:
        span = max(d.span_s, SPAN_S_MIN)
        for o in d.objects:
            rid = o.rid
            # Reference CPU seconds per second: raw CPU at a node of speed R is
            # h·b/R, so h·b = raw·R. Over the time the object was there to count.
            seen = _observed(span, o.active_s)
            m.cpu_ref_per_s[rid] = m.cpu_ref_per_s.get(rid, 0.0) + o.cpu_s * d.speed / seen
            if rid not in m.host or d.runtime == me:
                m.host[rid] = d.runtime
                m.info[rid] = o
                m.quiesce[rid] = d.quiesce_s
        for e in d.edges:
            key = (e.caller, e.callee)
            seen = _observed(span, e.active_s)
            m.edge_bytes_per_s[key] = m.edge_bytes_per_s.get(key, 0.0) + e.bytes / seen
            m.edge_calls_per_s[key] = m.edge_calls_per_s.get(key, 0.0) + e.calls / seen
            wait = max(0.0, e.stall_s - e.far_s) / seen
            m.edge_wait_per_s[key] = m.edge_wait_per_s.get(key, 0.0) + wait
            far = min(e.far_s, e.stall_s) / seen
            m.edge_far_per_s[key] = m.edge_far_per_s.get(key, 0.0) + max(0.0, far)
            m.edge_in_flight[key] = m.edge_in_flight.get(key, 0.0) + e.in_flight
    # Objects hosted here are here, whatever an older digest says.
    for rid in facts.hosted:
        m.host[rid] = me
    return m


def _stacks(
    m: _Merged,
    clients: Mapping[str, Digest],
    local: Digest,
    facts: NodeFacts,
    window: float,
    notes: list[str],
) -> tuple[list[StackView], dict[str, NodeView]]:
    me = facts.node_id
    cpu = local.cpu
    nodes = {
        me: NodeView(
            me,
            local.speed,
            local.load,
            facts.memory_capacity_bytes,
            None if cpu is None else cpu.own_per_s,
            None if cpu is None else cpu.available_per_s,
            1 if cpu is None else cpu.cpus,
            local.calls_in_progress,
        )
    }
    stacks: list[StackView] = []
    callees: dict[str, list[tuple[float, str]]] = {}
    for (caller, callee), rate in m.edge_bytes_per_s.items():
        callees.setdefault(caller, []).append((rate, callee))
    for client, digest in clients.items():
        nodes[client] = NodeView(
            client,
            digest.speed,
            digest.load,
            cpus_busy=None if digest.cpu is None else digest.cpu.busy_share,
        )
        link = digest.links.get(me)
        for console in digest.consoles:
            chain = [console]
            while len(chain) <= STACK_DEPTH_MAX and chain[-1] in callees:
                nxt = _next_in_chain(callees[chain[-1]], m.host.get(chain[-1]))
                if nxt in chain:
                    break
                chain.append(nxt)
                if ObjectId.parse(nxt).is_anchored:
                    break  # a node's anchored object ends the stack
            last = chain[-1]
            if (
                len(chain) >= 2
                and not ObjectId.parse(last).is_anchored
                and m.host.get(last) == me
                and last not in callees
            ):
                # An object here that called nothing below it this window (a cache
                # whose reads all hit) still sits on our storage: the edge is idle.
                chain.append(str(ObjectId.storage(me)))
            end = ObjectId.parse(chain[-1])
            if len(chain) < 3 or not (end.is_anchored and end.home == me):
                continue  # not a stack through a mobile object to one of our anchored objects
            hosts = [client, *(m.host.get(r, "?") for r in chain[1:-1]), me]
            k = 0
            while k + 1 < len(hosts) and hosts[k + 1] == client:
                k += 1
            if k >= len(chain) - 1 or any(h != me for h in hosts[k + 1 :]):
                notes.append(f"{console}: objects on {hosts} are not one client/server split")
                continue
            objects = []
            for j, rid in enumerate(chain):
                info = m.info.get(rid, _UNSEEN)
                anchored = j == 0 or j == len(chain) - 1
                quiesce = m.quiesce.get(rid)
                objects.append(
                    ObjectView(
                        rid,
                        m.cpu_ref_per_s.get(rid, 0.0) * window,
                        info.memory_bytes,
                        (not anchored) and info.movable,
                        info.checkpoint_bytes,
                        QUIESCE_S_DEFAULT if quiesce is None else quiesce,
                    )
                )
            edges = tuple(
                EdgeView(
                    m.edge_bytes_per_s.get((a, b), 0.0) * window,
                    m.edge_calls_per_s.get((a, b), 0.0) * window,
                    m.edge_wait_per_s.get((a, b), 0.0) * window,
                    m.edge_in_flight.get((a, b), 0.0),
                    m.edge_far_per_s.get((a, b), 0.0) * window,
                )
                for a, b in itertools.pairwise(chain)
            )
            peer = _fan_out(chain, callees, m, window)
            if peer is not None:
                notes.append(
                    f"{console}: {chain[-2]} also calls other nodes "
                    f"({peer.bytes:.0f} B, {peer.calls:.0f} calls per window)"
                )
            stacks.append(
                StackView(
                    console,
                    client,
                    me,
                    tuple(objects),
                    edges,
                    k,
                    None if link is None else link.bandwidth_bytes_per_s,
                    0.0 if link is None else link.latency_s,
                    peer,
                    PEER_BANDWIDTH_BYTES_PER_S,
                    PEER_LATENCY_S,
                )
            )
    return stacks, nodes


def arrivals_unobserved(
    decided: Mapping[str, float],
    local: Digest,
    hosted: frozenset[str],
    now: float,
    window_s: float,
) -> dict[str, float]:
    """Of the objects the node decided to move to itself (rid -> when, on the
    planner's monotonic clock), those still on their way: not yet hosted here for
    :data:`ARRIVAL_OBSERVED_WINDOWS` windows (by the node's own digest, ``local``:
    the age of its last move), and decided less than :data:`ARRIVAL_WINDOWS_MAX`
    windows ago. The many-clients rule admits more only as these are observed."""
    ages = {o.rid: o.moved_age_s for o in local.objects}
    out = {}
    for rid, at in decided.items():
        if now - at >= ARRIVAL_WINDOWS_MAX * window_s:
            continue  # never arrived, or failed, or went back: stop waiting for it
        age = ages.get(rid)
        if rid in hosted and age is not None and age >= ARRIVAL_OBSERVED_WINDOWS * window_s:
            continue  # here for a whole window: its calls are in the measurements
        out[rid] = at
    return out


def _pinned(m: _Merged, facts: NodeFacts, knobs: PlannerKnobs) -> set[str]:
    """Objects not to move now: moving already, moved less than a residence ago,
    failed to move recently (back-off doubling with each failure), or with a
    decision on its way."""
    pinned = set(facts.migrating)
    for rid, info in m.info.items():
        age = info.moved_age_s
        if age is not None and age < knobs.residence_after_move_s:
            pinned.add(rid)
        failures = info.failures
        backoff = knobs.retry_after_s * 2 ** min(failures - 1, RETRY_DOUBLINGS_MAX)
        if info.failed_age_s is not None and failures and info.failed_age_s < backoff:
            pinned.add(rid)
    pinned |= facts.pending
    return pinned


def _next_in_chain(out: list[tuple[float, str]], host: str | None) -> str:
    """The callee a stack continues through: the one with the most bytes, except that
    an object calling anchored objects on several nodes (a RAID object) continues to
    the one on the node it runs on, so that node alone owns the stack's decisions."""
    if host is not None:
        for _, callee in out:
            rid = ObjectId.parse(callee)
            if rid.is_anchored and rid.home == host:
                return callee
    return max(out)[1]


def _fan_out(
    chain: list[str],
    callees: dict[str, list[tuple[float, str]]],
    m: _Merged,
    window: float,
) -> EdgeView | None:
    """Traffic from the stack's last mobile object to anchored objects on nodes other
    than the stack's end (None if it calls only the one)."""
    end = chain[-1]
    others = [
        callee
        for _, callee in callees.get(chain[-2], [])
        if callee != end and ObjectId.parse(callee).is_anchored
    ]
    if not others:
        return None
    return EdgeView(
        sum(m.edge_bytes_per_s.get((chain[-2], c), 0.0) for c in others) * window,
        sum(m.edge_calls_per_s.get((chain[-2], c), 0.0) for c in others) * window,
    )


def _observed(span_s: float, active_s: float | None) -> float:
    """The seconds a count was gathered over: the window, or less if the object or
    edge is younger than the window."""
    seen = span_s if active_s is None else min(span_s, active_s)
    return max(seen, OBSERVED_S_MIN)
