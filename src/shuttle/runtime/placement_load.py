"""Equations 5-7 (ABACUS 5.4): the server loads and response times under a placement
vector, the load's fixed point solved exactly. Pure, no I/O; the overview of the model
is in :mod:`shuttle.runtime.placement`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shuttle.runtime.placement_costs import load_change, response_time_s
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


def predict_single(
    stack: StackView, k_new: int, nodes: Mapping[str, NodeView], window_s: float
) -> float:
    """Equations 5 and 6 for one stack alone: ``T_app(k_new)``."""
    return predict([stack], {stack.stack_id: k_new}, nodes, window_s).response_s[stack.stack_id]
