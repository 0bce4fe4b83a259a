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
    #: one client run in turn; :func:`~shuttle.runtime.placement_choice.client_shares`).
    #: Off: the paper's threshold for every stack.
    threshold_per_share: bool = False
    #: Leave undecided a stack whose top edge completed no call in the window while
    #: the edges below it did (:func:`~shuttle.runtime.placement_costs.unfinished`).
    #: Off: such a stack is decided on what the window shows (a console stuck in one
    #: long call, ABACUS 6.5, needs that).
    settle_calls: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ConfigError(f"window H must be > 0 seconds, got {self.window_s!r}")
        if not (math.isfinite(self.threshold_fraction) and self.threshold_fraction >= 0):
            raise ConfigError(
                f"threshold B_thresh must be a fraction ≥ 0 of H, got {self.threshold_fraction!r}"
            )
        if not (math.isfinite(self.eviction_ratio) and self.eviction_ratio >= 1):
            raise ConfigError(f"eviction ratio must be ≥ 1, got {self.eviction_ratio!r}")

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

    def __post_init__(self) -> None:
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ConfigError(f"node {self.node_id}: speed R must be > 0, got {self.speed!r}")
        if not (self.load >= 0 and math.isfinite(self.load)):
            raise ConfigError(f"node {self.node_id}: load L must be ≥ 0, got {self.load!r}")


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

    def __post_init__(self) -> None:
        if not (math.isfinite(self.measured_s) and self.measured_s >= 0):
            raise ConfigError(f"measured stall must be ≥ 0 seconds, got {self.measured_s!r}")


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
