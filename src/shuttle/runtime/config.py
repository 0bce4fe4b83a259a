"""The run-time's settings: one dataclass, filled from flags or a node's TOML file.

Every knob has a default with its reason; ``H`` and ``B_thresh`` are the paper's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from shuttle.errors import ConfigError
from shuttle.runtime.placement import (
    AGGREGATE_CLIENTS_MIN_DEFAULT,
    ARRIVALS_MAX_DEFAULT,
    ARRIVALS_MAX_SATURATED_DEFAULT,
    SERVER_CPU_SHARE_EVICT_DEFAULT,
    SERVER_CPU_SHARE_MAX_DEFAULT,
    SERVER_CPU_SHARE_SATURATED_DEFAULT,
    PlacementConfig,
)

#: H, the observation window (ABACUS used 1 s in every experiment).
WINDOW_S_DEFAULT = 1.0
#: B_thresh as a fraction of H (ABACUS: 30 %).
THRESHOLD_FRACTION_DEFAULT = 0.3
#: A new stack's first digest goes out after this fraction of H: waiting a whole H
#: before anything is known is what made ABACUS adapt late on short runs.
FIRST_DIGEST_FRACTION = 0.25
#: Anti-thrashing: an object that moved is not moved again for this many H.
RESIDENCE_WINDOWS_DEFAULT = 5.0
#: Longest a migration waits for active calls to drain before it is cancelled.
DRAIN_TIMEOUT_S_DEFAULT = 5.0
#: Threads running object methods on a node (CPU-bound filters hold the GIL, so
#: more would not run faster; enough that a few stacks never queue behind one).
EXECUTOR_THREADS_DEFAULT = 8
#: A staged (installed, not yet activated) object is dropped if its source does not
#: activate it within this time (the source died mid-migration).
STAGED_TTL_S_DEFAULT = 30.0
#: A node drops the objects of a home (an application's run-time) it has not heard
#: from for this long: the application died or lost the node. Clients send a digest
#: every H to the nodes that host their objects, busy or not.
LEASE_S_DEFAULT = 30.0
#: A durable object's lease (docs/runtime.md, "Durable objects"): a host serves it this
#: long without word from its home, which waits it out before bringing the object
#: back elsewhere. Long enough that a renewal every quarter of it survives a few lost
#: ones on a loaded machine; short enough that the callers of an object whose node
#: died wait seconds, not minutes.
DURABLE_LEASE_S_DEFAULT = 4.0
#: A migration that failed is not tried again for this long, doubled after each
#: further failure (capped at 16 times): a move that cannot work must not quiesce
#: the object every window.
RETRY_AFTER_S_DEFAULT = 5.0


@dataclass(frozen=True)
class RuntimeConfig:
    """Settings of one run-time (a node's or a client's)."""

    window_s: float = WINDOW_S_DEFAULT
    threshold_fraction: float = THRESHOLD_FRACTION_DEFAULT
    #: How often clients push digests (default: every H).
    digest_interval_s: float | None = None
    #: When a new stack's first digest goes (default: H/4).
    first_digest_s: float | None = None
    #: Anti-thrashing residence (default: 5 H; 0 turns it off).
    residence_s: float | None = None
    #: A newcomer evicts a hosted stack for room only if it is this many times better
    #: per server CPU second.
    eviction_ratio: float = 1.25
    #: Each stack's B_thresh scaled by its share of its client's time (docs/runtime.md,
    #: "Many clients"); off: the paper's threshold for every stack.
    threshold_per_share: bool = False
    #: Leave a stack undecided while its top calls have not returned (docs/runtime.md,
    #: "Many clients"); off: decide on what the window shows.
    settle_calls: bool = False
    #: From this many clients with stacks at the node, decide for their aggregate
    #: throughput (docs/runtime.md, "Many clients"); 0: never.
    aggregate_clients_min: int = AGGREGATE_CLIENTS_MIN_DEFAULT
    #: With many clients, the stacks that may be on their way to the node and not yet
    #: observed there (docs/runtime.md, "Many clients"); 0: no limit.
    arrivals_max: int = ARRIVALS_MAX_DEFAULT
    #: The same while the clients report their CPUs saturated (docs/runtime.md,
    #: "The ramp"); never fewer than ``arrivals_max``.
    arrivals_max_saturated: int = ARRIVALS_MAX_SATURATED_DEFAULT
    #: With many clients, the share of its CPU a node lets arrivals fill (docs/runtime.md,
    #: "Saturation"); the share that sends stacks back is the larger of this and 0.9.
    cpu_budget: float = SERVER_CPU_SHARE_MAX_DEFAULT
    #: With many clients, the share arrivals may fill instead while the clients report
    #: their CPUs saturated (docs/runtime.md, "The clients' saturation"; never less
    #: than ``cpu_budget``: set it to that to turn the raise off).
    cpu_budget_saturated: float = SERVER_CPU_SHARE_SATURATED_DEFAULT
    #: With many clients, raise the share arrivals may fill from ``cpu_budget`` while
    #: the clients' aggregate calls a second do not fall (docs/runtime.md, "The
    #: admission edge"); off: the fixed budget.
    cpu_climb: bool = False
    #: With many clients, keep the raised share while the node is the bound
    #: (docs/runtime.md, "The raise held"; :attr:`PlacementConfig.saturated_hold`).
    raise_hold: bool = True
    #: With many clients, rank arrivals by what they save per node CPU second
    #: (docs/runtime.md, "Ranked by the node's CPU"; :attr:`PlacementConfig.rank_by_node_cpu`).
    rank_by_node_cpu: bool = True
    #: With many clients, a node over its CPU sends back only stacks whose leaving
    #: frees it (docs/runtime.md, "What a send-back frees";
    #: :attr:`PlacementConfig.shed_by_freed_cpu`).
    shed_by_freed_cpu: bool = True
    drain_timeout_s: float = DRAIN_TIMEOUT_S_DEFAULT
    staged_ttl_s: float = STAGED_TTL_S_DEFAULT
    lease_s: float = LEASE_S_DEFAULT
    durable_lease_s: float = DURABLE_LEASE_S_DEFAULT
    retry_after_s: float = RETRY_AFTER_S_DEFAULT
    #: Memory a node lends to hosted mobile objects (None: no limit).
    object_memory_bytes: int | None = None
    executor_threads: int = EXECUTOR_THREADS_DEFAULT
    #: False: measure and report, but never decide to move anything.
    adaptive: bool = True
    #: Where a node appends its placement decisions (JSON lines); None: memory only.
    decision_log: Path | None = None
    #: The decision log kept in memory as its JSON lines, which no garbage collection
    #: traverses (docs/runtime.md, "The node profiled"); False: as dicts, as before.
    log_as_text: bool = True
    #: Where a node keeps its durable objects' records (docs/runtime.md, "Durable
    #: objects"); None (a client's run-time): it is the home of none.
    durable_dir: Path | None = None

    def __post_init__(self) -> None:
        self.placement()  # validates window and threshold
        for name in ("digest_interval_s", "first_digest_s", "residence_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"run-time setting {name} must be ≥ 0 seconds, got {value!r}")
        if self.digest_interval_s is not None and self.digest_interval_s <= 0:
            raise ConfigError("run-time setting digest_interval_s must be > 0 seconds")
        if not (self.lease_s > 0 and self.retry_after_s >= 0):
            raise ConfigError("lease_s must be > 0 and retry_after_s ≥ 0 seconds")
        if not (math.isfinite(self.durable_lease_s) and self.durable_lease_s > 0):
            raise ConfigError(f"durable_lease_s must be > 0 seconds, got {self.durable_lease_s!r}")
        if not self.drain_timeout_s > 0:
            raise ConfigError(f"drain_timeout_s must be > 0 seconds, got {self.drain_timeout_s!r}")
        if self.object_memory_bytes is not None and self.object_memory_bytes < 0:
            raise ConfigError(
                f"object memory must be ≥ 0 bytes (or unset), got {self.object_memory_bytes}"
            )
        if self.executor_threads < 1:
            raise ConfigError(f"executor_threads must be ≥ 1, got {self.executor_threads}")

    def placement(self) -> PlacementConfig:
        return PlacementConfig(
            self.window_s,
            self.threshold_fraction,
            self.eviction_ratio,
            self.threshold_per_share,
            self.settle_calls,
            self.aggregate_clients_min,
            arrivals_max=self.arrivals_max,
            arrivals_max_saturated=self.arrivals_max_saturated,
            server_cpu_share_max=self.cpu_budget,
            server_cpu_share_saturated=self.cpu_budget_saturated,
            server_cpu_share_evict=max(
                SERVER_CPU_SHARE_EVICT_DEFAULT, self.cpu_budget, self.cpu_budget_saturated
            ),
            saturated_hold=self.raise_hold,
            rank_by_node_cpu=self.rank_by_node_cpu,
            shed_by_freed_cpu=self.shed_by_freed_cpu,
        )

    @property
    def digest_every_s(self) -> float:
        return self.digest_interval_s if self.digest_interval_s is not None else self.window_s

    @property
    def first_digest_after_s(self) -> float:
        if self.first_digest_s is not None:
            return self.first_digest_s
        return FIRST_DIGEST_FRACTION * self.window_s

    @property
    def residence_after_move_s(self) -> float:
        if self.residence_s is not None:
            return self.residence_s
        return RESIDENCE_WINDOWS_DEFAULT * self.window_s
