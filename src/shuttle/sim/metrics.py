"""What a run measures, per traffic: counts and sums the server model adds to.

A :class:`TrafficStats` collects one traffic (the background, or the mobile
application's server requests). Response time is split into the parts of the
paper's Figure 5: queueing and service at the CPU and the disk, time on the network
(no contention, so service only) and waiting at the cache (for a block another
request has locked during its I/O, or for a free block when every block is locked).
For a request with one disk access the parts add up to the response time exactly.

Sums, not lists: a run of a million requests keeps a few dozen floats.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

#: The response-time components, in the order plots stack them.
COMPONENTS = (
    "cpu_queue_s",
    "cpu_service_s",
    "disk_queue_s",
    "disk_service_s",
    "network_s",
    "cache_wait_s",
)


@dataclass(slots=True)
class TrafficStats:
    """Counters and sums for one traffic in one run (or pooled over runs)."""

    requests: int = 0
    response_s_sum: float = 0.0
    response_s_max: float = 0.0
    block_requests: int = 0
    block_response_s_sum: float = 0.0
    cpu_queue_s: float = 0.0
    cpu_service_s: float = 0.0
    disk_queue_s: float = 0.0
    disk_service_s: float = 0.0
    network_s: float = 0.0
    cache_wait_s: float = 0.0
    #: Block accesses at the server cache and how many found their block there
    #: (a block being read in by another request counts as a hit after the wait).
    block_accesses: int = 0
    block_hits: int = 0
    read_accesses: int = 0
    read_hits: int = 0
    lock_waits: int = 0
    metadata_accesses: int = 0
    metadata_hits: int = 0

    def add(self, other: TrafficStats) -> None:
        """Pool ``other`` into this one (max for the maximum, sum for the rest)."""
        for f in fields(self):
            name = f.name
            if name == "response_s_max":
                self.response_s_max = max(self.response_s_max, other.response_s_max)
            else:
                setattr(self, name, getattr(self, name) + getattr(other, name))

    # --- derived figures (NaN-free: 0 when there is nothing to average) --------------

    @property
    def mean_response_s(self) -> float:
        return self.response_s_sum / self.requests if self.requests else 0.0

    @property
    def mean_block_response_s(self) -> float:
        return self.block_response_s_sum / self.block_requests if self.block_requests else 0.0

    @property
    def block_hit_rate(self) -> float:
        return self.block_hits / self.block_accesses if self.block_accesses else 0.0

    @property
    def read_hit_rate(self) -> float:
        return self.read_hits / self.read_accesses if self.read_accesses else 0.0

    @property
    def metadata_hit_rate(self) -> float:
        return self.metadata_hits / self.metadata_accesses if self.metadata_accesses else 0.0

    def breakdown_s(self) -> dict[str, float]:
        """Mean seconds per request in each component of the response time."""
        n = self.requests or 1
        return {name: getattr(self, name) / n for name in COMPONENTS}

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            mean_response_s=self.mean_response_s,
            mean_block_response_s=self.mean_block_response_s,
            block_hit_rate=self.block_hit_rate,
            read_hit_rate=self.read_hit_rate,
            metadata_hit_rate=self.metadata_hit_rate,
            breakdown_s=self.breakdown_s(),
        )
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrafficStats:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(slots=True)
class ResourceUse:
    """Busy seconds of the server's CPU and disk within a window."""

    window_s: float = 0.0
    cpu_busy_s: float = 0.0
    disk_busy_s: float = 0.0
    mobile_cpu_s: float = 0.0

    @property
    def cpu_utilisation(self) -> float:
        return self.cpu_busy_s / self.window_s if self.window_s else 0.0

    @property
    def disk_utilisation(self) -> float:
        return self.disk_busy_s / self.window_s if self.window_s else 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(cpu_utilisation=self.cpu_utilisation, disk_utilisation=self.disk_utilisation)
        return out


@dataclass(slots=True)
class MobileStats:
    """The mobile application's own figures in one run."""

    placement: str = "client"
    started_s: float = 0.0
    finished: bool = False
    run_time_s: float = 0.0
    records: int = 0
    client_cache_accesses: int = 0
    client_cache_hits: int = 0
    compute_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
