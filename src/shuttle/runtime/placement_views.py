"""The placement model's inputs (ABACUS 5.4): the knobs, and the nodes, objects, edges
and stacks as one window ``H`` measured them. Pure data, no I/O; the overview of the
model is in :mod:`shuttle.runtime.placement`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from shuttle.errors import ConfigError

#: Bisection steps solving equations 5/6 (7) for a server's load: each halves the
#: bracket, so 100 reach any precision a float holds.
ITERATIONS_MAX = 100
#: Convergence: the load is known to this (relative) precision.
TOLERANCE_S = 1e-12
#: Quiesce time assumed for an object with no migration history: a few calls' worth
#: of draining on a busy node (measured quiesce times replace it after one move).
QUIESCE_S_DEFAULT = 0.01
#: From this many clients with stacks at a node, the node decides for their aggregate
#: throughput (docs/runtime.md, "Many clients"). ABACUS's experiments have one to four
#: clients (6.5's directory: four), and decide as the paper does.
AGGREGATE_CLIENTS_MIN_DEFAULT = 5
#: In that regime, the share of its CPUs (less what other processes take of them) the
#: node's planned work may fill. A call queued behind others at a CPU busy a fraction
#: ρ of the time waits ρ/(1-ρ) service times on average (M/M/1): 2.3 at 0.7, 9 at
#: 0.9. Past it, each hosted object's calls queue for the node's one interpreter, and
#: the cheap stacks the node hosts lose more than a CPU-heavy newcomer gains.
SERVER_CPU_SHARE_MAX_DEFAULT = 0.7
#: The share of their CPUs busy (with any process; the median of the clients with
#: stacks at the node, by their digests) from which the clients are the bound: then
#: what the node takes off them is throughput, and it may plan up to
#: :data:`SERVER_CPU_SHARE_SATURATED_DEFAULT` of its own (docs/runtime.md, "Many
#: clients", "The clients' saturation"). The mix benchmark's 64 clients on one core
#: read 0.95-0.97 in every pass on the idle machine.
CLIENTS_SATURATED_BUSY = 0.9
#: The share of its CPU the node's planned work may fill while its clients are
#: saturated. A call queued at a CPU busy ρ of the time waits ρ/(1-ρ) service times
#: (M/M/1): 19-32 at the clients' 0.95-0.97, 5.7 at the node's 0.85, so work moved
#: from them to the node waits less there up to about that share; and it is where the
#: best static splits ran the node at 64 clients on the idle machine (0.79-0.87 of its
#: core), under the share that sends stacks back (0.9), which keeps its band.
SERVER_CPU_SHARE_SATURATED_DEFAULT = 0.85
#: The node sends stacks back for its CPU only once its measured use passes this share
#: of the CPU it could have had (and then down to :data:`SERVER_CPU_SHARE_MAX_DEFAULT`):
#: a band, so that a node whose use swings around its budget with the other processes
#: on its CPU does not send filters back and take them in again from one window to
#: the next. In the mix benchmark's 16-client passes (a node that got a quarter of a
#: core) the use swung by ±0.05 s a window around a 0.18-0.24 s budget.
SERVER_CPU_SHARE_EVICT_DEFAULT = 0.9
#: Beyond that share a stack already at the node is not sent back for its CPU if it
#: saves its client more than this many seconds per second of the node's CPU it
#: takes, by the CPU its window measured (no stack *arrives* past the budget, whatever
#: it saves, and past :data:`SERVER_CPU_SHARE_EVICT_DEFAULT` a share of the hosted
#: stacks goes back, whatever each saves: the CPU a hosted call costs the node shows
#: only in the node's own use; docs/runtime.md, "Saturation"): at a
#: node whose CPU is spoken for, each second given to one stack is taken from those
#: already there, whose response times grow by at least as much in all. A filter that
#: saves its client a 256 KiB transfer for a millisecond of filtering is worth ~50; a
#: CPU-heavy filter that saves no transfer, about 1 or less.
SATURATED_SCORE_MIN = 1.0
#: Reference CPU seconds a node spends per byte it serves a client over the link
#: beyond what the same read costs a hosted object (its dispatch, the reply's frames,
#: the socket), the cost a stack sent back leaves at the node. Measured with the mix
#: benchmark's cheap filter at the node's speed 0.05 (benchmarks/move_node_cpu.py):
#: a call at the node 5.0 ms of its CPU, the same call from its client 6.7 ms for
#: serving the read alone; the filter's own 1.0 ms taken off, 2.7 ms for the 0.95 of
#: a 256 KiB block the link then carries: 1.08e-8 s a byte of the node's, 5.4e-10 in
#: reference seconds (docs/runtime.md, "What a send-back frees"). The idle passes'
#: CPU per call at 64 clients put it about ten times lower: a one-at-a-time figure.
SERVE_CPU_S_PER_BYTE = 5.4e-10
#: In that regime, the stacks that may be on their way to a node at once, decided to
#: move there and not yet observed there for a window
#: (:attr:`PlacementConfig.arrivals_max`; or as many as the node hosts already, if
#: more: a slow start): a node's measured wait cannot price the stacks that are not
#: there yet, so it admits a few, observes the wait they make, and admits more only at
#: that price (docs/runtime.md, "Many clients"). At 64 clients on the idle machine
#: every cheap filter was admitted within a few evaluations on an idle node's
#: measurements, 93-106 went in per pass and 20-32 stayed (the rest sent back once
#: their calls queued). Eight: the 16-client cells, where every cheap filter belongs
#: at the node, take two batches.
ARRIVALS_MAX_DEFAULT = 8
#: The same while the node's clients are saturated (its budget raised: the work it
#: takes off them is throughput, and its budget, not the batch, stops the arrivals).
#: On the idle machine at 64 clients, share 0.25, eight at a time took the cheap
#: filters to the node over 1-12 s of a 16 s pass (adaptive 0.97 of all at the
#: clients, ending where the best split is); 32 had 55-57 there by 4 s (1.11,
#: adaptive / best split 0.99). Below the saturation nothing changes (the 16-client
#: cells, whose clients read 0.73-0.79 busy).
ARRIVALS_MAX_SATURATED_DEFAULT = 32


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
    #: Scale each stack's B_thresh by its share of its client's time (the stacks of
    #: one client run in turn; :func:`~shuttle.runtime.placement_verdicts.client_shares`).
    #: Off: the paper's threshold for every stack.
    threshold_per_share: bool = False
    #: Leave undecided a stack whose top edge completed no call in the window while
    #: the edges below it did (:func:`~shuttle.runtime.placement_costs.unfinished`).
    #: Off: such a stack is decided on what the window shows (a console stuck in one
    #: long call, ABACUS 6.5, needs that).
    settle_calls: bool = False
    #: With stacks from at least this many clients the node decides for their
    #: aggregate throughput: its CPU is allocated like its memory (no more than
    #: :attr:`server_cpu_share_max` of it planned; over it, the stacks with the least
    #: benefit per server CPU second go back), and the moves of one evaluation are
    #: judged together (each must save more than it costs, and all together more
    #: than B_thresh). 0: never (the paper's per-stack rule at any scale).
    aggregate_clients_min: int = AGGREGATE_CLIENTS_MIN_DEFAULT
    server_cpu_share_max: float = SERVER_CPU_SHARE_MAX_DEFAULT
    #: In that regime, the share it may plan instead while the clients with stacks at
    #: it report their CPUs busy past :data:`CLIENTS_SATURATED_BUSY` (never less than
    #: :attr:`server_cpu_share_max` nor more than :attr:`server_cpu_share_evict`; set
    #: it to the former to turn the raise off).
    server_cpu_share_saturated: float = SERVER_CPU_SHARE_SATURATED_DEFAULT
    #: In that regime, the share of its CPU the node's measured use must pass before
    #: it sends stacks back for their CPU (down to :attr:`server_cpu_share_max`).
    server_cpu_share_evict: float = SERVER_CPU_SHARE_EVICT_DEFAULT
    #: In that regime, keep the raise to :attr:`server_cpu_share_saturated` while the
    #: node's use stays above :attr:`server_cpu_share_max`, once its clients read
    #: saturated: their CPUs then read less busy *because* they wait on the node, which
    #: is not room at the clients (docs/runtime.md, "The raise held"). Off: the raise
    #: lapses at the first evaluation whose clients read under
    #: :data:`CLIENTS_SATURATED_BUSY` (the rule as it was).
    saturated_hold: bool = True
    #: In that regime, take the greedy's candidates in order of what they save their
    #: clients per second of the node's CPU
    #: (:func:`~shuttle.runtime.placement_budget.worth_per_server_cpu_s`: the clients'
    #: CPU unweighted by their load, and the link) rather than by the paper's score,
    #: whose client-load weighting ranks a CPU-heavy filter on a loaded client near a
    #: cheap one (docs/runtime.md, "Ranked by the node's CPU"). Off: the paper's order.
    rank_by_node_cpu: bool = True
    #: A node over its CPU sends back only stacks whose leaving frees its CPU: their
    #: objects' CPU there more than what serving their reads over the link would cost
    #: it (:data:`SERVE_CPU_S_PER_BYTE`; a cheap filter's reads cost the node more
    #: from its client than its whole call at the node). Off: any hosted stack, as if
    #: serving bytes cost nothing (docs/runtime.md, "What a send-back frees").
    shed_by_freed_cpu: bool = True
    #: In that regime, the stacks that may be on their way to a node and not yet
    #: observed there (:data:`ARRIVALS_MAX_DEFAULT`); 0: no limit.
    arrivals_max: int = ARRIVALS_MAX_DEFAULT
    #: The same at a node whose clients are saturated (its budget raised); never
    #: fewer than ``arrivals_max`` (:data:`ARRIVALS_MAX_SATURATED_DEFAULT`).
    arrivals_max_saturated: int = ARRIVALS_MAX_SATURATED_DEFAULT

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ConfigError(f"window H must be > 0 seconds, got {self.window_s!r}")
        if not (math.isfinite(self.threshold_fraction) and self.threshold_fraction >= 0):
            raise ConfigError(
                f"threshold B_thresh must be a fraction ≥ 0 of H, got {self.threshold_fraction!r}"
            )
        if not (math.isfinite(self.eviction_ratio) and self.eviction_ratio >= 1):
            raise ConfigError(f"eviction ratio must be ≥ 1, got {self.eviction_ratio!r}")
        if self.aggregate_clients_min < 0:
            raise ConfigError(
                f"aggregate clients must be ≥ 0 (0: never decide for aggregate throughput), "
                f"got {self.aggregate_clients_min!r}"
            )
        if not 0 < self.server_cpu_share_max <= 1:
            raise ConfigError(
                f"server CPU share must be in (0, 1], got {self.server_cpu_share_max!r}"
            )
        if not 0 < self.server_cpu_share_saturated <= 1:
            raise ConfigError(
                f"server CPU share with the clients saturated must be in (0, 1], "
                f"got {self.server_cpu_share_saturated!r}"
            )
        if not self.server_cpu_share_max <= self.server_cpu_share_evict <= 1:
            raise ConfigError(
                f"the server CPU share that sends stacks back must be between the share "
                f"planned ({self.server_cpu_share_max!r}) and 1, got "
                f"{self.server_cpu_share_evict!r}"
            )

        if self.arrivals_max < 0:
            raise ConfigError(
                f"arrivals must be ≥ 0 (0: no limit on the stacks on their way to a node), "
                f"got {self.arrivals_max!r}"
            )
        if self.arrivals_max_saturated < 0:
            raise ConfigError(
                f"arrivals with the clients saturated must be ≥ 0, "
                f"got {self.arrivals_max_saturated!r}"
            )

    def aggregate(self, clients: int) -> bool:
        """Whether stacks from ``clients`` clients are decided for aggregate throughput."""
        return 0 < self.aggregate_clients_min <= clients

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
    #: CPU seconds per second its process used over the window (None: not measured),
    #: and the CPU seconds per second it could have had (what other processes left of
    #: its CPUs, or its fair share beside them; None: all of ``cpus``): the CPU
    #: already committed, and the CPU there is, for the many-clients rule.
    cpu_busy: float | None = None
    cpu_available: float | None = None
    cpus: int = 1
    #: Calls in progress in the objects it hosts, on average over the window (its own
    #: digest's; 0: not measured). A call waiting for the interpreter's lock sleeps,
    #: so ``load`` does not count it; the many-clients rule does
    #: (:func:`~shuttle.runtime.placement_many.queued_load`).
    calls_in_progress: float = 0.0
    #: Seconds each call to its hosted objects waits beyond what equation 4 prices,
    #: as the stacks already there measure it (the many-clients rule's view,
    #: :func:`~shuttle.runtime.placement_many.queue_wait_s`; 0 otherwise): the price
    #: of a call to the node for a stack that is not there yet.
    queue_s_per_call: float = 0.0
    #: The share of its CPUs busy with any process over the window, 0 to 1 (its
    #: digest's; None: not measured). A client's says whether its CPU is the bound
    #: (:func:`~shuttle.runtime.placement_budget.clients_saturated`).
    cpus_busy: float | None = None

    def __post_init__(self) -> None:
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ConfigError(f"node {self.node_id}: speed R must be > 0, got {self.speed!r}")
        if not (self.load >= 0 and math.isfinite(self.load)):
            raise ConfigError(f"node {self.node_id}: load L must be ≥ 0, got {self.load!r}")
        if self.cpus < 1:
            raise ConfigError(f"node {self.node_id}: cpus must be ≥ 1, got {self.cpus!r}")
        if not (self.calls_in_progress >= 0 and math.isfinite(self.calls_in_progress)):
            raise ConfigError(
                f"node {self.node_id}: calls in progress must be ≥ 0, "
                f"got {self.calls_in_progress!r}"
            )
        if not (self.queue_s_per_call >= 0 and math.isfinite(self.queue_s_per_call)):
            raise ConfigError(
                f"node {self.node_id}: wait per call must be ≥ 0 seconds, "
                f"got {self.queue_s_per_call!r}"
            )
        if self.cpus_busy is not None and not 0 <= self.cpus_busy <= 1:
            raise ConfigError(
                f"node {self.node_id}: busy share of its CPUs must be from 0 to 1, "
                f"got {self.cpus_busy!r}"
            )

    def cpu_capacity_s(self, share: float, window_s: float) -> float | None:
        """CPU seconds per window the node's work may be planned to take: ``share`` of
        the CPU it could have (None: its use was not measured)."""
        if self.cpu_busy is None:
            return None
        available = self.cpus if self.cpu_available is None else self.cpu_available
        return share * min(available, self.cpus) * window_s


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
    #: Seconds the caller was measured to block on this edge's remote calls over the
    #: window, less the callee's own time at the far end (0: the edge is local now,
    #: or nothing was measured). Read on the edge of the split in force only: what
    #: the monitor saw crossing the link cost, beyond the estimate from bytes and
    #: calls, becomes a per-call overhead
    #: (:func:`~shuttle.runtime.placement_costs.call_overhead_s`).
    measured_s: float = 0.0
    #: Calls on the edge still in progress as the window ended (their bytes below
    #: them may be counted, their own CPU and result are not yet).
    in_flight: float = 0.0
    #: Of the time the caller blocked on the edge's remote calls, the seconds the
    #: callee reported as its own (its wall time in the calls: its CPU, and its wait
    #: for the interpreter). With :attr:`measured_s`, what a call across the link
    #: took in all (:func:`~shuttle.runtime.placement_many.queue_wait_s`).
    far_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.measured_s) and self.measured_s >= 0):
            raise ConfigError(f"measured stall must be ≥ 0 seconds, got {self.measured_s!r}")
        if not (math.isfinite(self.far_s) and self.far_s >= 0):
            raise ConfigError(f"the callee's own time must be ≥ 0 seconds, got {self.far_s!r}")
        if not (math.isfinite(self.in_flight) and self.in_flight >= 0):
            raise ConfigError(f"calls in flight must be ≥ 0, got {self.in_flight!r}")


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
