"""Equations 5-7 (ABACUS 5.4): the server loads and response times under a placement
vector, the load's fixed point solved exactly. Pure, no I/O; the overview of the model
is in :mod:`shuttle.runtime.placement`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shuttle.runtime.placement_costs import (
    client_work_s,
    effective_load,
    queue_s,
    server_work_s,
    stall_s,
)
from shuttle.runtime.placement_views import ITERATIONS_MAX, TOLERANCE_S, NodeView, StackView

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


class Coefficients:
    """Each stack's ``T_app`` under each split as ``a + max(1, L) · b`` in the server's
    load ``L`` (equation 4: ``a`` the client's compute and the stall, ``b`` the server's
    work over its speed), and the server CPU its moved objects take (equations 5 and 6),
    computed once per (stack, split) and kept.

    One evaluation predicts hundreds of placements of the same stacks (every candidate,
    then every greedy trial); with the terms recomputed from the views each time, a node
    with 128 stacks (64 clients of two functions each) spent seconds per evaluation, all
    of it holding the interpreter's lock its hosted objects need. With them kept, a
    prediction is arithmetic over the stacks it changes."""

    def __init__(self, nodes: Mapping[str, NodeView]) -> None:
        self.nodes = nodes
        self._terms: dict[tuple[str, int], tuple[float, float, float]] = {}

    def terms(self, stack: StackView, k: int) -> tuple[float, float, float]:
        """``(a, b, moved)`` of ``stack`` split at ``k``: ``T_app(k) = a + max(1, L)·b``
        (``a`` with the wait at the server for objects not there yet, ``queue_s``),
        and ``moved`` the work (server CPU seconds) of the objects that change side from
        its split in force to ``k``."""
        key = (stack.stack_id, k)
        got = self._terms.get(key)
        if got is None:
            client, server = self.nodes[stack.client], self.nodes[stack.server]
            a = (
                effective_load(client.load) * client_work_s(stack, k) / client.speed
                + stall_s(stack, k)
                + queue_s(stack, k, server)
            )
            b = server_work_s(stack, k) / server.speed
            moved = sum(stack.objects[j].cpu_s for j in stack.moved(stack.split, k)) / server.speed
            got = self._terms[key] = (a, b, moved)
        return got

    def response_s(self, stack: StackView, k: int, server_load: float) -> float:
        """Equation 4: :func:`~shuttle.runtime.placement_costs.response_time_s`."""
        a, b, _ = self.terms(stack, k)
        return a + effective_load(server_load) * b


def predict(
    stacks: Sequence[StackView],
    placement: Mapping[str, int],
    nodes: Mapping[str, NodeView],
    window_s: float,
    coefficients: Coefficients | None = None,
) -> Prediction:
    """Each stack's ``T_app`` when the stacks are split as ``placement`` says (missing
    stacks keep their split): equations 5 and 6 solved jointly for every server.

    The paper iterates the two equations from the measured values. That plain
    iteration converges slowly, or oscillates, when the moved work is large next to
    the stall, so we solve the same equation exactly: for each server, find the load
    ``L`` with ``L = L_measured + Σ_stacks change_s(T_s(L))``. The right side falls as
    ``L`` rises (each ``T_s`` grows with ``L``), so the root is unique and bisection
    finds it. Stacks couple only through their server, so servers are solved apart.
    ``coefficients``: the stacks' terms, kept across the predictions of one
    evaluation (:class:`Coefficients`; None: computed for this one).
    """
    table = coefficients if coefficients is not None else Coefficients(nodes)
    splits = {s.stack_id: placement.get(s.stack_id, s.split) for s in stacks}
    by_server: dict[str, list[StackView]] = {}
    for s in stacks:
        by_server.setdefault(s.server, []).append(s)
    loads: dict[str, float] = {}
    iterations = 0
    converged = True
    for server in sorted(by_server):
        load, steps, ok = _solve_load(by_server[server], splits, table, window_s)
        loads[server] = load
        iterations = max(iterations, steps)
        converged = converged and ok
    response = {
        s.stack_id: table.response_s(s, splits[s.stack_id], loads[s.server]) for s in stacks
    }
    return Prediction(splits, response, loads, iterations, converged)


def _solve_load(
    stacks: Sequence[StackView],
    splits: Mapping[str, int],
    table: Coefficients,
    window_s: float,
) -> tuple[float, int, bool]:
    """The server load under ``splits`` for the stacks of one server, by bisection.

    Objects leaving take away the fraction of the window they used, whatever the load
    (a constant); objects arriving add the fraction of their new ``T_app`` they
    compute there, which depends on the load (:func:`load_change`)."""
    server = table.nodes[stacks[0].server]
    leaving = 0.0
    arriving: list[tuple[float, float, float]] = []
    for s in stacks:
        k = splits[s.stack_id]
        if k == s.split:
            continue
        a, b, moved = table.terms(s, k)
        if k > s.split:
            leaving += moved / window_s
        else:
            arriving.append((moved, a, b))
    base = server.load - leaving

    def implied(load: float) -> float:
        total = base
        eff = effective_load(load)
        for moved, a, b in arriving:
            t = a + eff * b
            if t > 0:
                total += moved / t
        return max(0.0, total)

    low = implied(math.inf)  # arrivals add nothing at infinite load: only removals count
    return bisect_load(implied, low, implied(low))


def bisect_load(
    implied: Callable[[float], float], low: float, high: float
) -> tuple[float, int, bool]:
    """The fixed point ``L = implied(L)`` between ``low`` and ``high`` (``implied``
    falls as ``L`` grows, so the root is unique): the load, the bisection steps it
    took, and whether it converged within :data:`ITERATIONS_MAX`."""
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


def server_cpu_s(
    stacks: Sequence[StackView],
    placement: Mapping[str, int],
    nodes: Mapping[str, NodeView],
    window_s: float,
    coefficients: Coefficients | None = None,
) -> dict[str, float]:
    """CPU seconds per window each measured server's process is predicted to use when
    the stacks are split as ``placement`` says (missing stacks keep their split): what
    it used over the window (``cpu_busy`` × ``H``), less the work of the objects leaving
    it, plus the work of those arriving, each at the rate the window measured (in
    server seconds: reference seconds over its speed). Servers whose use was not
    measured are left out.

    The rate is not extrapolated to the stack's new ``T_app`` as equation 5 does for
    the load: a client that calls several stacks in turn cannot give a faster one the
    whole window (in the mix benchmark a cheap filter's window at the node would be
    a twentieth of a second, and extrapolated it would take a quarter of the node).
    What the stacks then really take shows in the next window's ``cpu_busy``."""
    table = coefficients if coefficients is not None else Coefficients(nodes)
    used: dict[str, float] = {}
    for s in stacks:
        busy = nodes[s.server].cpu_busy
        if busy is None:
            continue
        total = used.setdefault(s.server, busy * window_s)
        k = placement.get(s.stack_id, s.split)
        if k == s.split:
            continue
        moved = table.terms(s, k)[2]
        used[s.server] = total - moved if k > s.split else total + moved
    return {srv: max(0.0, x) for srv, x in used.items()}


def predict_single(
    stack: StackView, k_new: int, nodes: Mapping[str, NodeView], window_s: float
) -> float:
    """Equations 5 and 6 for one stack alone: ``T_app(k_new)``."""
    return predict([stack], {stack.stack_id: k_new}, nodes, window_s).response_s[stack.stack_id]
