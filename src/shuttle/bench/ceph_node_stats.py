"""What a RADOS node says about its reads, as ``shuttle bench ceph netrand`` and
``stream`` read it from ``node.stats`` (docs/ceph.md): whether its cache is trusted yet
(its watch and probation, waited for before timing), its read counters and how they
moved over the timed passes (:class:`CounterLog`), its block cache's capacity, and the
most reads it had waiting on RADOS at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from shuttle.bench.ceph_stand import Progress
from shuttle.client.client import Client

#: Seconds to wait for a RADOS node's cache to be trusted (its watch registered and
#: its probation over, docs/ceph.md "Coherence between gateways") before timing it.
TRUST_WAIT_S = 30.0


def wait_for_trust(client: Client, progress: Progress, probation: bool = True) -> None:
    """Wait until the RADOS node behind ``client`` trusts its cache (its watch is
    confirmed) and, with ``probation``, its probation is over, so the timed rounds
    measure its steady state, not the first seconds after it started (when every read
    is still confirmed with a ``stat``: docs/ceph.md, "Coherence between gateways")."""
    deadline = time.monotonic() + TRUST_WAIT_S
    while True:
        stats = client.node_stats(client.nodes[0]).get("store", {}).get("rados", {})
        coherence = stats.get("coherence", {})
        if not coherence:  # an older node, without coherence
            return
        if coherence.get("trusted") and (not probation or coherence.get("probation_s_left") == 0):
            return
        if time.monotonic() > deadline:
            progress(
                f"the RADOS node's cache is not trusted after {TRUST_WAIT_S:g} s; timing it anyway"
            )
            return
        left = coherence.get("probation_s_left")
        progress(f"waiting for the RADOS node's watch ({left} s of probation left)")
        time.sleep(0.5)


#: The read counters of a RADOS node (``stats()["store"]["rados"]``, docs/ceph.md) the
#: report gives for its timed reads: how each was answered.
RADOS_COUNTERS = (
    "inline_hits",
    "stat_free_hits",
    "validations",
    "cold_reads",
    "aio_reads",
    # Of the misses read on the loop: only the bytes asked for (the block would not
    # stay), whole blocks, misses of a block missed within the cache's reach, and the
    # bytes read from RADOS for them (docs/ceph.md, "Reads that miss a node's cache").
    "partial_reads",
    "whole_reads",
    "ghost_hits",
    "aio_bytes",
    "announced",
    # Reads with ``direct`` answered with the object's location: the client read them.
    "direct_answers",
)


def rados_counters(client: Client) -> dict[str, int]:
    """The RADOS node's read counters and its block cache's hits and misses, now."""
    store = client.node_stats(client.nodes[0]).get("store", {})
    rados, cache = store.get("rados", {}), store.get("cache", {})
    out = {name: int(rados.get(name, 0)) for name in RADOS_COUNTERS}
    out["cache_hits"] = int(cache.get("hits", 0))
    out["cache_misses"] = int(cache.get("misses", 0))
    return out


@dataclass
class CounterLog:
    """What a RADOS node's counters did over the timed passes (each the delta of one
    pass, taken between passes so that asking costs no timed read)."""

    reads: int = 0
    totals: dict[str, int] = field(default_factory=dict)
    per_round: list[dict[str, int]] = field(default_factory=list)
    #: The node's coherence (watch, probation) when the timed rounds began.
    at_start: dict[str, Any] = field(default_factory=dict)

    def add(self, reads: int, before: dict[str, int], after: dict[str, int]) -> None:
        delta = {name: after[name] - before[name] for name in after}
        self.reads += reads
        for name, n in delta.items():
            self.totals[name] = self.totals.get(name, 0) + n
        self.per_round.append({"reads": reads, **delta})

    def summary(self) -> dict[str, Any]:
        reads = self.reads or 1
        return {
            "timed_reads": self.reads,
            **self.totals,
            # The share of the timed reads answered on the node's event loop from its
            # cache, asking RADOS nothing (1.0 is the goal of a warm read), the share
            # read from RADOS by a read the loop started and completed (a miss of the
            # node's cache, without a pool thread), and the RADOS stats sent per read to
            # confirm a cached version (0 is the goal).
            "inline_share": round(self.totals.get("inline_hits", 0) / reads, 4),
            "aio_share": round(self.totals.get("aio_reads", 0) / reads, 4),
            "partial_share": round(self.totals.get("partial_reads", 0) / reads, 4),
            "aio_bytes_per_read": round(self.totals.get("aio_bytes", 0) / reads),
            "validations_per_read": round(self.totals.get("validations", 0) / reads, 4),
            "at_start": self.at_start,
            "per_round": self.per_round,
        }


def cache_capacity(client: Client) -> int | None:
    """The block cache's capacity of the node behind ``client``, in bytes."""
    cache = client.node_stats(client.nodes[0]).get("store", {}).get("cache", {})
    capacity = cache.get("capacity_bytes")
    return capacity if isinstance(capacity, int) else None


def node_coherence(client: Client) -> dict[str, Any]:
    """The node's coherence (watch, probation) and how its misses complete
    (``aio_completion``: "c", "ctypes", or None when they all take the pool)."""
    rados = client.node_stats(client.nodes[0]).get("store", {}).get("rados", {})
    coherence: dict[str, Any] = dict(rados.get("coherence", {}))
    coherence["aio_completion"] = rados.get("aio_completion")
    return coherence


def reads_in_flight_peak(client: Client) -> int | None:
    """The most reads the node behind ``client`` has had waiting on RADOS at once."""
    stats = client.node_stats(client.nodes[0]).get("store", {}).get("rados", {})
    peak = stats.get("reads_in_flight_peak")
    return peak if isinstance(peak, int) else None
