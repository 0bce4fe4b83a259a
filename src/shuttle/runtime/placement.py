"""The placement model of ABACUS section 5.4: measurements in, decisions out. No I/O.

This module is the model's front: it names every piece the rest of the run-time uses,
from eight modules, one per concept:

* :mod:`~shuttle.runtime.placement_views`   the inputs: knobs, nodes, objects, edges, stacks
* :mod:`~shuttle.runtime.placement_costs`   one stack's equations 3-6, a move's price,
  feasible splits
* :mod:`~shuttle.runtime.placement_load`    equations 5-7 over a placement vector: the
  server load's fixed point
* :mod:`~shuttle.runtime.placement_choice`  the greedy choice of 5.4.3
* :mod:`~shuttle.runtime.placement_verdicts`  its verdict on each move: ``B_thresh``,
  evictions for room
* :mod:`~shuttle.runtime.placement_plan`    what an evaluation considered and decided,
  and its decision-log record
* :mod:`~shuttle.runtime.placement_budget`  with many clients: the servers' CPU budget,
  a stack's worth per server CPU second
* :mod:`~shuttle.runtime.placement_many`    with many clients: the node's queued calls
  in its load, each stack's traffic from its completed calls, the node's wait per
  call as the price of a call there for a stack not there yet, the limit on arrivals,
  the moves in judged together

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
Where we differ from the paper: when the edge that crosses the link now was measured
to block for longer than that estimate (less the callee's own time at the far end),
the excess per call is charged to every call across the link, at the split in force
and at the others (:func:`stall_s`, :func:`call_overhead_s`: RPC overhead, queues,
and contention's callbacks are time the estimate cannot see; docs/runtime.md).

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

from shuttle.runtime.placement_choice import choose
from shuttle.runtime.placement_costs import (
    call_overhead_s,
    client_work_s,
    effective_load,
    feasible_splits,
    hosted_memory_bytes,
    load_change,
    migration_cost_s,
    modelled_stall_s,
    queue_s,
    response_time_s,
    server_work_s,
    stall_s,
)
from shuttle.runtime.placement_load import Prediction, predict, predict_single, server_cpu_s
from shuttle.runtime.placement_plan import Candidate, Move, Plan
from shuttle.runtime.placement_views import (
    AGGREGATE_CLIENTS_MIN_DEFAULT,
    ARRIVALS_MAX_DEFAULT,
    ARRIVALS_MAX_SATURATED_DEFAULT,
    ITERATIONS_MAX,
    QUIESCE_S_DEFAULT,
    SERVER_CPU_SHARE_EVICT_DEFAULT,
    SERVER_CPU_SHARE_MAX_DEFAULT,
    SERVER_CPU_SHARE_SATURATED_DEFAULT,
    TOLERANCE_S,
    EdgeView,
    NodeView,
    ObjectView,
    PlacementConfig,
    StackView,
)

__all__ = [
    "AGGREGATE_CLIENTS_MIN_DEFAULT",
    "ARRIVALS_MAX_DEFAULT",
    "ARRIVALS_MAX_SATURATED_DEFAULT",
    "ITERATIONS_MAX",
    "QUIESCE_S_DEFAULT",
    "SERVER_CPU_SHARE_EVICT_DEFAULT",
    "SERVER_CPU_SHARE_MAX_DEFAULT",
    "SERVER_CPU_SHARE_SATURATED_DEFAULT",
    "TOLERANCE_S",
    "Candidate",
    "EdgeView",
    "Move",
    "NodeView",
    "ObjectView",
    "PlacementConfig",
    "Plan",
    "Prediction",
    "StackView",
    "call_overhead_s",
    "choose",
    "client_work_s",
    "effective_load",
    "feasible_splits",
    "hosted_memory_bytes",
    "load_change",
    "migration_cost_s",
    "modelled_stall_s",
    "predict",
    "predict_single",
    "queue_s",
    "response_time_s",
    "server_cpu_s",
    "server_work_s",
    "stall_s",
]
