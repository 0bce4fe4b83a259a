"""Three placement sites for a filter over data in Ceph: client, Shuttle node, OSD. No I/O.

:mod:`shuttle.runtime.placement` splits a stack between two places, the client and
the node whose storage ends it. When the node keeps its objects in a RADOS pool
(``shuttle serve --store rados:POOL``) the bytes live one hop further, at an OSD, and
a filter with a ``cls_lua`` implementation (``grep`` and ``count`` with a fixed
string: :mod:`shuttle.runtime.osd`) can run there too, on the OSD's CPU. The sites lie
on a path, joined by links::

    client (0) ── link 0 ── node (1) ── link 1 ── OSD (2, holds the bytes)

A filter at site ``s`` reads its input where the bytes are: ``input_bytes`` in
``input_calls`` reads cross links ``s .. 1`` (none at the OSD). The console calls it
from the client: ``output_bytes`` in ``output_calls`` calls cross links ``0 .. s-1``
(at the OSD they pass through the node). Equation 4 of ABACUS, with one more term::

    T(s) = max(1, L_s') · W_s / R_s
           + Σ_{i ≥ s} (input_bytes / bw_i + 2 lat_i · input_calls)
           + Σ_{i < s} (output_bytes / bw_i + 2 lat_i · output_calls)

``W_s`` is the filter's work in reference CPU seconds over the window: the same at
the client and the node (one Python implementation) and ``W · osd_cpu_ratio`` at the
OSD (Lua's ``string.find`` against Python's ``re``: a different program). A site the
filter does not run at now gains its work as load (equation 5), solved exactly as in
:func:`shuttle.runtime.placement.predict`: ``L' = L + (W_s / R_s) / T(L')`` has one root
and bisection finds it. The site it runs at has its work in its measured load already,
and the client's load is taken as measured, as in the two-site model. The OSD's load
is the OSD's own (ready threads of its op shards over ``H``): a busy OSD slows the
filter as a busy node does.

The choice (:func:`choose_site`) is the two-site rule made three-way: the site with the
least predicted ``T``; a move from the current site is made only if its benefit per
window minus its cost (quiesce, the cursor over the links between the two sites, a
round trip) is over ``B_thresh``. The OSD is a candidate only when the filter has an
OSD implementation (``osd_capable``: a fixed-string pattern).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shuttle.errors import ConfigError
from shuttle.runtime.placement import QUIESCE_S_DEFAULT, PlacementConfig, effective_load
from shuttle.runtime.placement_load import bisect_load

#: The sites, in path order (index = position on the path).
SITES = ("client", "node", "osd")
CLIENT, NODE, OSD = range(3)


@dataclass(frozen=True, slots=True)
class SiteView:
    """One site as the model sees it: raw speed R and measured load L."""

    name: str
    speed: float = 1.0
    load: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in SITES:
            raise ConfigError(f"site must be one of {', '.join(SITES)}, got {self.name!r}")
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ConfigError(f"site {self.name}: speed R must be > 0, got {self.speed!r}")
        if not (math.isfinite(self.load) and self.load >= 0):
            raise ConfigError(f"site {self.name}: load L must be ≥ 0, got {self.load!r}")


@dataclass(frozen=True, slots=True)
class LinkView:
    """A link of the path: bandwidth (None: unlimited) and one-way latency."""

    bandwidth_bytes_per_s: float | None = None
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        bw = self.bandwidth_bytes_per_s
        if bw is not None and not (math.isfinite(bw) and bw > 0):
            raise ConfigError(f"link bandwidth must be > 0 bytes/s or None, got {bw!r}")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ConfigError(f"link latency must be ≥ 0 s, got {self.latency_s!r}")

    def time_s(self, nbytes: float, calls: float) -> float:
        """Bytes over the bandwidth plus a round trip of latency per call."""
        transfer = (
            0.0 if self.bandwidth_bytes_per_s is None else nbytes / self.bandwidth_bytes_per_s
        )
        return transfer + 2.0 * self.latency_s * calls


@dataclass(frozen=True, slots=True)
class FilterView:
    """A filter over the window ``H``: its work and its traffic, wherever measured."""

    filter_id: str
    #: Reference CPU seconds (speed-1 seconds) of the Python implementation.
    cpu_s: float
    input_bytes: float
    output_bytes: float
    input_calls: float = 0.0
    output_calls: float = 0.0
    #: Where it runs now (a name in SITES), or None for a placement not yet made.
    site: str | None = None
    #: Whether it has an OSD implementation (grep/count with a fixed string).
    osd_capable: bool = False
    #: Work at the OSD over work in Python for the same bytes (Lua against ``re``).
    osd_cpu_ratio: float = 1.0
    #: What a move ships (the cursor) and the time to quiesce it.
    checkpoint_bytes: int = 0
    quiesce_s: float = QUIESCE_S_DEFAULT

    def __post_init__(self) -> None:
        for name in ("cpu_s", "input_bytes", "output_bytes", "input_calls", "output_calls"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"filter {self.filter_id}: {name} must be ≥ 0, got {value!r}")
        if not (math.isfinite(self.osd_cpu_ratio) and self.osd_cpu_ratio > 0):
            raise ConfigError(
                f"filter {self.filter_id}: osd_cpu_ratio must be > 0, got {self.osd_cpu_ratio!r}"
            )
        if self.site is not None and self.site not in SITES:
            raise ConfigError(f"filter {self.filter_id}: site {self.site!r} is not in {SITES}")

    def work_s(self, site: int) -> float:
        """``W_s``: reference CPU seconds of the implementation that runs at ``site``."""
        return self.cpu_s * (self.osd_cpu_ratio if site == OSD else 1.0)


def network_s(f: FilterView, site: int, links: Sequence[LinkView]) -> float:
    """Time on the links with the filter at ``site``: its input from the OSD up to
    ``site``, its output from ``site`` down to the client."""
    inbound = sum(links[i].time_s(f.input_bytes, f.input_calls) for i in range(site, OSD))
    outbound = sum(links[i].time_s(f.output_bytes, f.output_calls) for i in range(site))
    return inbound + outbound


def response_time_s(
    f: FilterView, site: int, sites: Sequence[SiteView], links: Sequence[LinkView], load: float
) -> float:
    """Equation 4 over three sites: ``T(site)`` with ``site`` at load ``load``."""
    return effective_load(load) * f.work_s(site) / sites[site].speed + network_s(f, site, links)


def site_load(
    f: FilterView, site: int, sites: Sequence[SiteView], links: Sequence[LinkView]
) -> tuple[float, bool]:
    """The load at ``site`` with the filter there (equation 5), and whether the
    bisection converged. Its measured load already holds it if it runs there now, and
    the client's load is taken as measured (as in the paper: the node controls neither
    the client's CPU nor what else runs there)."""
    base = sites[site].load
    if f.site == SITES[site] or site == CLIENT:
        return base, True
    work = f.work_s(site) / sites[site].speed
    net = network_s(f, site, links)

    def implied(load: float) -> float:
        t = effective_load(load) * work + net
        return base + (work / t if t > 0 else 0.0)

    load, _steps, converged = bisect_load(implied, base, implied(base))
    return load, converged


def feasible_sites(f: FilterView) -> tuple[int, ...]:
    """The sites the filter may run at: the OSD only with an OSD implementation."""
    return (CLIENT, NODE, OSD) if f.osd_capable else (CLIENT, NODE)


def move_cost_s(f: FilterView, src: int, dst: int, links: Sequence[LinkView]) -> float:
    """Time lost moving the filter from ``src`` to ``dst``: quiesce, then its checkpoint
    and a round trip over every link between the two."""
    lo, hi = sorted((src, dst))
    return f.quiesce_s + sum(links[i].time_s(f.checkpoint_bytes, 1) for i in range(lo, hi))


@dataclass(frozen=True, slots=True)
class SitePlan:
    """One evaluation: every feasible site's prediction and the verdict."""

    filter_id: str
    current: str | None
    best: str
    response_s: Mapping[str, float]
    load: Mapping[str, float]
    benefit_s: float
    cost_s: float
    threshold_s: float
    execute: bool
    reason: str

    @property
    def target(self) -> str | None:
        """Where the filter should run after this evaluation (None: stay)."""
        return self.best if self.execute else self.current

    def to_json(self) -> dict[str, Any]:
        return {
            "filter": self.filter_id,
            "current": self.current,
            "best": self.best,
            "response_s": {k: round(v, 6) for k, v in self.response_s.items()},
            "load": {k: round(v, 4) for k, v in self.load.items()},
            "benefit_s": round(self.benefit_s, 6),
            "cost_s": round(self.cost_s, 6),
            "threshold_s": round(self.threshold_s, 6),
            "execute": self.execute,
            "reason": self.reason,
        }


def predict_sites(
    f: FilterView, sites: Sequence[SiteView], links: Sequence[LinkView]
) -> tuple[dict[str, float], dict[str, float]]:
    """``T`` and the site's load for every feasible site, by site name."""
    _check_path(sites, links)
    times: dict[str, float] = {}
    loads: dict[str, float] = {}
    for s in feasible_sites(f):
        load, _ok = site_load(f, s, sites, links)
        loads[SITES[s]] = load
        times[SITES[s]] = response_time_s(f, s, sites, links, load)
    return times, loads


def choose_site(
    f: FilterView,
    sites: Sequence[SiteView],
    links: Sequence[LinkView],
    config: PlacementConfig,
) -> SitePlan:
    """Where ``f`` should run (see the module docstring). A filter not yet placed
    (``site`` None) goes to the best site at once; a placed one moves only if the net
    benefit of the move is over ``B_thresh``."""
    times, loads = predict_sites(f, sites, links)
    # Ties go to the site nearer the client (less to undo, nothing shipped to the OSD).
    best = min(times, key=lambda name: (times[name], SITES.index(name)))
    threshold = config.threshold_s
    if f.site is None:
        return SitePlan(
            f.filter_id, None, best, times, loads, 0.0, 0.0, threshold, True, "initial placement"
        )
    if f.site not in times:
        # Running where it may no longer run (an OSD filter whose pattern changed): move.
        return SitePlan(
            f.filter_id,
            f.site,
            best,
            times,
            loads,
            math.inf,
            0.0,
            threshold,
            True,
            f"{f.site} is not a feasible site for it",
        )
    if best == f.site:
        return SitePlan(
            f.filter_id,
            f.site,
            best,
            times,
            loads,
            0.0,
            0.0,
            threshold,
            False,
            f"{best} is already the best site",
        )
    benefit = times[f.site] - times[best]
    cost = move_cost_s(f, SITES.index(f.site), SITES.index(best), links)
    net = benefit - cost
    ok = net > threshold
    verdict = ">" if ok else "≤"
    return SitePlan(
        f.filter_id,
        f.site,
        best,
        times,
        loads,
        benefit,
        cost,
        threshold,
        ok,
        f"net benefit {net:.3f} s {verdict} B_thresh {threshold:.3f} s",
    )


def _check_path(sites: Sequence[SiteView], links: Sequence[LinkView]) -> None:
    if [s.name for s in sites] != list(SITES):
        raise ConfigError(f"sites must be {SITES} in that order, got {[s.name for s in sites]}")
    if len(links) != len(SITES) - 1:
        raise ConfigError(f"a path of {len(SITES)} sites needs {len(SITES) - 1} links")
