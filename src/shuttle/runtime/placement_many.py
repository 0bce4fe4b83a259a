"""What the many-clients rule reads and judges differently from the paper
(docs/runtime.md, "Many clients"): the node's load with the calls queued for its
interpreter, each stack's traffic from its completed calls only, and the wait per
call at the node that the stacks already there measure, the price of a call there for
a stack not there yet; the limit on the stacks on their way to a node
(:func:`arrival_limits`), and the moves in of an evaluation judged together
(:func:`moves_in_together`). Pure, no I/O; applied by
:func:`~shuttle.runtime.placement_choice.choose` only in that regime, so the paper's
per-stack decisions (one to four clients) see the window as it was measured.

Both come from the mix benchmark's decision logs (benchmarks/README.md, "Placement for
aggregate throughput"):

* A node's ``L`` counts runnable threads, and a thread waiting for Python's
  interpreter lock sleeps: a node whose hosted objects' calls queue for the lock read
  ``L`` as 1 plus its competitors, and equation 4 priced one more object there at that.
* A call's CPU and its result are counted when it returns, the reads it made below it
  as they complete. A heavy filter's window often held one more 256 KiB read than
  completed calls (the read of a call still burning its CPU at the client), which
  equation 4 reads as a transfer the node would save: 0.2 s at 10 Mbit/s, enough to
  send a filter that saves nothing to the node.
* A stack not at the node measured nothing of the queue it would join there. At 64
  clients every cheap filter was priced in at an idle node's load, and 20-32 of
  the 93-106 that went in per pass stayed: the others were sent back once their
  calls queued (150-500 ms each against 11 ms estimated), and came in again.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from shuttle.runtime.placement_costs import (
    effective_load,
    migration_cost_s,
    modelled_stall_s,
    server_work_s,
)
from shuttle.runtime.placement_load import Prediction
from shuttle.runtime.placement_views import EdgeView, NodeView, PlacementConfig, StackView

#: Calls one interpreter runs at a time: of the calls in progress in a node's hosted
#: objects, those beyond this wait for its lock (asleep, so not in ``L``).
INTERPRETER_CALLS = 1.0


def queued_load(node: NodeView) -> float:
    """``node``'s load with the calls waiting for its interpreter: ``L`` plus the calls
    in progress in its hosted objects beyond the one that holds the lock."""
    return node.load + max(0.0, node.calls_in_progress - INTERPRETER_CALLS)


def settled(stack: StackView) -> StackView:
    """``stack`` as its completed calls show it: with calls on its top edge (the
    console's) still in progress as the window ended, the edges below carry traffic of
    calls not done yet, whose CPU and result the window has not counted. Their
    bytes, calls and measured stall are taken in proportion to the top edge's
    completed calls, ``c / (c + in flight)``. With none completed there is nothing to
    judge from, and the stack is left as measured: ``--settle-calls``
    (:func:`~shuttle.runtime.placement_costs.unfinished`) leaves it undecided. (Scaled
    to nothing, a cheap filter at the node in the middle of its first call of the
    window read as one whose move back costs no transfer, and was sent back for the
    node's CPU.)"""
    top = stack.edges[0]
    if top.in_flight <= 0 or top.calls <= 0:
        return stack
    share = top.calls / (top.calls + top.in_flight)
    below = tuple(
        replace(
            e,
            bytes=e.bytes * share,
            calls=e.calls * share,
            measured_s=e.measured_s * share,
            far_s=e.far_s * share,
        )
        for e in stack.edges[1:]
    )
    peer = None if stack.peer is None else _scaled(stack.peer, share)
    return replace(stack, edges=(top, *below), peer=peer)


def _scaled(edge: EdgeView, share: float) -> EdgeView:
    return replace(edge, bytes=edge.bytes * share, calls=edge.calls * share)


def queue_wait_s(stacks: Sequence[StackView], node: NodeView) -> float:
    """Seconds each call to ``node``'s hosted objects waited beyond what equation 4
    prices, as the stacks hosted there (split with a mobile object at ``node``)
    measured it over the window: on the edge that crosses their link, what a call
    took in all (the caller's measured wait beyond the callee's own time, and the
    callee's own time) less what the model gives it (the link's estimate, and the
    server's work at its load), summed over those stacks and divided by their calls;
    0 when none is there or none waited more than priced.

    It is what the queue at the node costs a call now: the executor's and the
    interpreter's queue, and the node's CPU shared with its own serving of reads,
    which a node's ``L`` sees only in part. A stack not there yet is charged it per
    call (:func:`~shuttle.runtime.placement_costs.queue_s`), so that arrivals stop
    when the queue they make outweighs the transfer they save."""
    waited = calls = 0.0
    for s in stacks:
        if s.server != node.node_id or s.split >= s.n - 1:
            continue
        edge = s.edges[s.split]
        if edge.calls <= 0:
            continue
        took = edge.measured_s + edge.far_s
        priced = (
            modelled_stall_s(s, s.split)
            + effective_load(node.load) * server_work_s(s, s.split) / node.speed
        )
        waited += took - priced
        calls += edge.calls
    return max(0.0, waited) / calls if calls > 0 else 0.0


def anchored_shares(stacks: Sequence[StackView]) -> list[StackView]:
    """Each stack with only its share of the CPU of the anchored object it ends at
    (the node's storage): the share of the calls into that object its last edge
    made. The node's digest reports the object's CPU over all its callers, and each
    stack through it carried all of it: at 64 clients the whole CPU of the node's
    reads (0.29 node seconds a window) in each of 120 stacks, so a cheap filter
    arriving, which raises the node's load by its own small share, read as slowing
    every stack by that share of all the reads, more than the 0.2 s it saves its own
    client, and no more came with the node at 0.5 of its CPU (docs/runtime.md, "The
    clients' saturation"). An object no stack called keeps its CPU whole."""
    calls: dict[str, float] = {}
    for s in stacks:
        rid = s.objects[-1].rid
        calls[rid] = calls.get(rid, 0.0) + s.edges[-1].calls
    out = []
    for s in stacks:
        anchor = s.objects[-1]
        total = calls[anchor.rid]
        if total <= 0 or anchor.cpu_s <= 0:
            out.append(s)
            continue
        mine = replace(anchor, cpu_s=anchor.cpu_s * s.edges[-1].calls / total)
        out.append(replace(s, objects=(*s.objects[:-1], mine)))
    return out


def many_clients_view(
    stacks: Sequence[StackView], nodes: Mapping[str, NodeView]
) -> tuple[list[StackView], dict[str, NodeView]]:
    """The stacks and nodes as the many-clients rule decides on them: each server's
    load with its queued calls (:func:`queued_load`), each stack's traffic from its
    completed calls (:func:`settled`), and each server's wait per call as its hosted
    stacks measure it (:func:`queue_wait_s`), and each stack's share of the
    anchored object it ends at (:func:`anchored_shares`)."""
    servers = {s.server for s in stacks}
    settled_stacks = anchored_shares([settled(s) for s in stacks])
    view = {}
    for n, node in nodes.items():
        if n in servers:
            node = replace(node, load=queued_load(node))
            node = replace(node, queue_s_per_call=queue_wait_s(settled_stacks, node))
        view[n] = node
    return settled_stacks, view


def arrival_limits(
    stacks: Sequence[StackView], config: PlacementConfig, saturated: Collection[str] = ()
) -> dict[str, int]:
    """Per server, how many stacks may be on their way there and not observed yet:
    :attr:`PlacementConfig.arrivals_max` (:attr:`~PlacementConfig.arrivals_max_saturated`
    at a server in ``saturated``, whose clients' CPUs are saturated: what it takes off
    them is throughput and its raised CPU budget stops the arrivals; eight at a time
    spread 64 cheap filters' arrival over most of a 16 s pass), or as many as the
    server hosts already, whichever is more. Empty with no limit (``arrivals_max`` 0).

    A node's measurements price only the stacks already there: the wait a newcomer
    will add is not in them until it has been there for a window. At 64 clients
    every cheap filter was admitted on an idle node's figures within a few
    evaluations, and most came back once their calls queued; a few at a time, each
    batch priced at the wait the ones before it made
    (:func:`~shuttle.runtime.placement_costs.queue_s`), stop where the queue
    outweighs the transfer saved. A batch may be as large as all the stacks there (a
    slow start: 8, 16, 32, 64 as each is observed), so that a node with the CPU for
    every one of 64 cheap filters has them in four batches, not eight; the node's
    measured CPU and the queue's price, not the batch, are what stop them
    (:func:`~shuttle.runtime.placement_choice.choose` admits no arrival past the
    node's CPU budget). The batch is never larger with room in the budget: the CPU a
    call to a hosted object costs the node shows only once it is there (about 14 ms
    a cheap call in the mix benchmark, against 1 ms by what its client measures)."""
    if config.arrivals_max <= 0:
        return {}
    hosted: dict[str, int] = {}
    for s in stacks:
        hosted.setdefault(s.server, 0)
        if s.split < s.n - 1:  # a mobile object of it is at the server
            hosted[s.server] += 1
    return {
        srv: max(
            config.arrivals_max,
            config.arrivals_max_saturated if srv in saturated else 0,
            there,
        )
        for srv, there in hosted.items()
    }


def moves_in_together(
    stacks: Sequence[StackView],
    current: Prediction,
    best: Prediction,
    config: PlacementConfig,
) -> tuple[int, float] | None:
    """With many clients: how many moves of the evaluation save more than they cost,
    and their net benefits summed (None: not that regime).

    The paper's ``B_thresh`` asks each move to save 30 % of ``H`` for its own stack,
    against moving on noise. A client that calls a cheap function among others gains
    from moving it a fraction of that, while the node's clients together gain the sum:
    in the mix benchmark every cheap move was refused at 0.07-0.27 s. The evaluation's
    moves are one placement (equation 7's vector, chosen greedily over every stack), so
    they are judged together: each must repay its migration, and all of them together
    must save ``B_thresh``. Only the moves to the server: a move back must save
    ``B_thresh`` alone (the hysteresis against a measured wait that swings)."""
    if not config.aggregate(len({s.client for s in stacks})):
        return None
    nets = [
        current.response_s[s.stack_id]
        - best.response_s[s.stack_id]
        - migration_cost_s(s, s.split, best.placement[s.stack_id])
        for s in stacks
        if best.placement[s.stack_id] < s.split  # moves back are judged alone
    ]
    paying = [n for n in nets if n > 0]
    return len(paying), sum(paying)


def together_verdict(net: float, together: tuple[int, float], threshold: float) -> tuple[bool, str]:
    """Whether a move in with net benefit ``net`` goes ahead, given the evaluation's
    ``(count, total)`` from :func:`moves_in_together`, and the reason for the log."""
    count, total = together
    if net <= 0:
        return False, f"net benefit {net:.3f} s ≤ 0 (many clients: each move must repay itself)"
    if total <= threshold:
        return False, (
            f"net benefit {net:.3f} s > 0, but the {count} moves that repay themselves "
            f"together {total:.3f} s ≤ B_thresh {threshold:.3f} s (many clients)"
        )
    return True, (
        f"net benefit {net:.3f} s > 0, and the {count} moves that repay themselves "
        f"together {total:.3f} s > B_thresh {threshold:.3f} s (many clients)"
    )


def cpu_per_byte_saved(stack: StackView, k_client: int, speed: float) -> float:
    """The node's CPU seconds ``stack``'s objects there take per byte they keep off the
    link: what they measured over the window (in the node's seconds) over the bytes
    the edge at ``k_client`` (its split with them at the client) carries beyond the
    edge that crosses now. A stack that takes CPU and saves no bytes is ``inf``: it
    goes back first; one that did nothing in the window (no CPU, no bytes) is 0: its
    leaving would free nothing we can see. (In the first loaded run of this rule two
    cheap filters with no call in the window went back first, as saving nothing.)"""
    cpu = sum(stack.objects[j].cpu_s for j in stack.moved(stack.split, k_client)) / speed
    saved = stack.edges[k_client].bytes - stack.edges[stack.split].bytes
    if saved <= 0:
        return math.inf if cpu > 0 else 0.0
    return cpu / saved


def cpu_freed_s(stack: StackView, k_client: int, speed: float, serve_s_per_byte: float) -> float:
    """The node's CPU seconds a window ``stack``'s leaving for ``k_client`` frees: its
    objects' measured CPU there, less what serving the bytes the link would then carry
    beyond the edge that crosses now costs the node (``serve_s_per_byte`` reference
    seconds a byte; :data:`~shuttle.runtime.placement_views.SERVE_CPU_S_PER_BYTE`).
    Negative: the node would work more with it gone (its client then reads whole
    blocks at the window's rate)."""
    cpu = sum(stack.objects[j].cpu_s for j in stack.moved(stack.split, k_client))
    extra = max(0.0, stack.edges[k_client].bytes - stack.edges[stack.split].bytes)
    return (cpu - extra * serve_s_per_byte) / speed


def pushback(
    stacks: Sequence[StackView],
    node: NodeView,
    used_s: float,
    cap_s: float,
    client_split: Mapping[str, int],
    serve_s_per_byte: float = 0.0,
) -> list[tuple[StackView, float]]:
    """The stacks a node over its CPU sends back, with their CPU per byte saved: of the
    stacks it hosts, the share ``(used − cap) / used`` of them (rounded up), those with
    the most CPU per byte saved first (:func:`cpu_per_byte_saved`; Bhardwaj, Kulkarni
    and Stutsman, ATC 2020, push back the functions that gain least per CPU second).

    Why a share of the stacks, not the CPU their windows measured: a call to a hosted
    object costs the node far more than the object's own CPU (the run-time's dispatch,
    the local read, the reply, all at the node's speed), and that cost shows only in the
    node's own measured use. In the mix benchmark's static passes a cheap filter at the
    node measured about 1 ms a call, and the node's use rose by 14 ms per hosted call
    (0.50 to 0.83 of its core at 64 clients, share 0.5, from none to 16 hosted). So the
    node sheds as if its whole use were its hosted stacks' (which sheds less than that
    share of the stacks would free), and sheds again at the next evaluation if it is
    still over: a multiplicative decrease, measured at each step. ``client_split``:
    each stack's split with everything movable at the client.

    ``serve_s_per_byte`` > 0 (:attr:`PlacementConfig.shed_by_freed_cpu`): only stacks
    whose leaving frees the node's CPU (:func:`cpu_freed_s` > 0) go back, the share
    still counted of all it hosts. Measured one call at a time
    (benchmarks/move_node_cpu.py): a cheap filter's call costs the node 4.7-5.0 ms at
    the node and 6.2-6.7 ms from its client; by the idle passes' CPU per call at 64
    clients a hosted one costs it about 0.8 ms more than serving its read. Either way
    sending one back frees little: in the idle run of 12:47 (share 0.5, run 3) the node
    sent 1-5 back an evaluation for 5.5 s, from 24 down to 12, and stayed at 0.97-0.99
    of its CPU throughout."""
    hosted = [
        s
        for s in stacks
        if s.server == node.node_id and s.split < client_split.get(s.stack_id, s.split)
    ]
    if not hosted or used_s <= cap_s or used_s <= 0:
        return []
    count = math.ceil(len(hosted) * (used_s - cap_s) / used_s)
    if serve_s_per_byte > 0:
        hosted = [
            s
            for s in hosted
            if cpu_freed_s(s, client_split[s.stack_id], node.speed, serve_s_per_byte) > 0
        ]
    count = min(len(hosted), count)
    rated = [(s, cpu_per_byte_saved(s, client_split[s.stack_id], node.speed)) for s in hosted]
    rated.sort(key=lambda x: (-x[1], x[0].stack_id))
    return rated[:count]
