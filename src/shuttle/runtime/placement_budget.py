"""The servers' CPU as the many-clients rule budgets it (docs/runtime.md, "Many
clients" and "Saturation"): the CPU seconds a window each server may be planned to
take, whether a placement's arrivals fit, what a stack saves its client per second of
the server's CPU (:func:`worth_per_server_cpu_s`), and when a stack must leave for the
budget. Pure, no I/O; used by :func:`~shuttle.runtime.placement_choice.choose` and its
verdicts (:mod:`~shuttle.runtime.placement_verdicts`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from shuttle.runtime.placement_costs import (
    client_work_s,
    modelled_stall_s,
    queue_s,
    server_work_s,
)
from shuttle.runtime.placement_load import Coefficients, Prediction, server_cpu_s
from shuttle.runtime.placement_views import (
    CLIENTS_SATURATED_BUSY,
    SATURATED_SCORE_MIN,
    TOLERANCE_S,
    NodeView,
    PlacementConfig,
    StackView,
)


@dataclass(frozen=True, slots=True)
class CpuBudget:
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
    #: The servers whose clients are saturated (:func:`clients_busy` at least
    #: :data:`CLIENTS_SATURATED_BUSY`): their clients' busy share and the share of
    #: their CPU they plan instead (:attr:`PlacementConfig.server_cpu_share_saturated`).
    raised: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    #: Of those, the servers whose raise is held, not read: their clients read under
    #: :data:`CLIENTS_SATURATED_BUSY` while the node is the bound (:func:`raise_held`).
    held: frozenset[str] = frozenset()

    @staticmethod
    def of(
        stacks: Sequence[StackView],
        nodes: Mapping[str, NodeView],
        config: PlacementConfig,
        table: Coefficients,
        raised_before: Collection[str] = (),
    ) -> CpuBudget:
        """The budget of one evaluation. ``raised_before``: the servers whose budget
        the clients' saturation raised at the last evaluation (the resource manager's
        memory; :attr:`PlacementConfig.saturated_hold`)."""
        capacity: dict[str, float] = {}
        evict_at: dict[str, float] = {}
        shedding: set[str] = set()
        raised: dict[str, tuple[float, float]] = {}
        held: set[str] = set()
        if config.aggregate(len({s.client for s in stacks})):
            for server in {s.server for s in stacks}:
                node = nodes[server]
                share = config.server_cpu_share_max
                busy = clients_busy(stacks, nodes, server)
                saturated = busy is not None and busy >= CLIENTS_SATURATED_BUSY
                hold = (
                    not saturated
                    and config.saturated_hold
                    and server in raised_before
                    and raise_held(node, config)
                )
                if hold:
                    held.add(server)
                if saturated or hold:
                    # The clients' CPUs are the bound: what the node takes off them is
                    # throughput, up to where its own queue waits about as long as
                    # theirs (and under the share that sends stacks back: its band).
                    raised_share = min(
                        config.server_cpu_share_saturated, config.server_cpu_share_evict
                    )
                    share = max(share, raised_share)
                cap = node.cpu_capacity_s(share, config.window_s)
                evict = node.cpu_capacity_s(config.server_cpu_share_evict, config.window_s)
                if cap is None or evict is None or node.cpu_busy is None:
                    continue
                if share > config.server_cpu_share_max and busy is not None:
                    raised[server] = (busy, share)
                elif share > config.server_cpu_share_max:
                    raised[server] = (math.nan, share)  # held, no client measured now
                capacity[server] = cap
                evict_at[server] = evict
                if node.cpu_busy * config.window_s > evict:
                    shedding.add(server)
        return CpuBudget(
            stacks,
            nodes,
            config.window_s,
            table,
            capacity,
            frozenset(shedding),
            evict_at,
            raised,
            frozenset(held),
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


def raise_held(node: NodeView, config: PlacementConfig) -> bool:
    """Whether a server whose clients read saturated at the last evaluation keeps its
    raised budget although they read less now: its measured use is above the base
    budget (:attr:`PlacementConfig.server_cpu_share_max`), so the node is the bound
    and its clients wait on it, and their CPUs read less busy for that, not for room
    of their own. On the idle machine (64 clients, share 0.5) a node at 0.99 of its
    core read its clients at 0.64-0.78 busy, lost the raise, and shed from 24 cheap
    filters to 12 down to 0.7 over 5 s before filling again (benchmarks/README.md)."""
    base = node.cpu_capacity_s(config.server_cpu_share_max, 1.0)
    return base is not None and node.cpu_busy is not None and node.cpu_busy > base


def clients_busy(
    stacks: Sequence[StackView], nodes: Mapping[str, NodeView], server: str
) -> float | None:
    """The median share of their CPUs busy (with any process) over the clients with
    stacks at ``server`` that measured it (None: none did). The median, so that a
    few clients on idle machines do not raise the node's budget for the rest, nor a
    few on busy ones hold it."""
    busy = [
        b
        for c in {s.client for s in stacks if s.server == server}
        if (b := nodes[c].cpus_busy) is not None
    ]
    return statistics.median(busy) if busy else None


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


def cpu_over_if_kept(s: StackView, best: Prediction, cpu: CpuBudget, worth: float) -> str | None:
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
