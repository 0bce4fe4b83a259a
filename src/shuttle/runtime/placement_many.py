"""What the many-clients rule reads differently from the paper (docs/runtime.md, "Many
clients"): the node's load with the calls queued for its interpreter, and each stack's
traffic from its completed calls only. Pure, no I/O; applied by
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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from shuttle.runtime.placement_views import EdgeView, NodeView, StackView

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
        )
        for e in stack.edges[1:]
    )
    peer = None if stack.peer is None else _scaled(stack.peer, share)
    return replace(stack, edges=(top, *below), peer=peer)


def _scaled(edge: EdgeView, share: float) -> EdgeView:
    return replace(edge, bytes=edge.bytes * share, calls=edge.calls * share)


def many_clients_view(
    stacks: Sequence[StackView], nodes: Mapping[str, NodeView]
) -> tuple[list[StackView], dict[str, NodeView]]:
    """The stacks and nodes as the many-clients rule decides on them: each server's
    load with its queued calls (:func:`queued_load`), each stack's traffic from its
    completed calls (:func:`settled`)."""
    servers = {s.server for s in stacks}
    view = {
        n: replace(node, load=queued_load(node)) if n in servers else node
        for n, node in nodes.items()
    }
    return [settled(s) for s in stacks], view
