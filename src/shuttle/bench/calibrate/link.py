"""The link's share of a timed call, replayed through the live shaper's arithmetic.

A call's wall time on a shaped link is the link's time (each message through the
token bucket of its direction, :mod:`shuttle.sim.link`, at the instant it was sent),
the node's CPU, and what is left: the run-times' own time per call at both ends. The
residual is what the model adds per call (``rpc_overhead_s``); the bandwidth at which
large reads leave no more residual than small ones is the rate the shaper achieved.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from shuttle.bench.calibrate.timing import Timed
from shuttle.net.profiles import LinkProfile
from shuttle.sim.link import Link


def link_residual_s(
    timed: Timed,
    profile: LinkProfile,
    up_bytes: float,
    down_bytes: float,
    node_s: float,
    *,
    bandwidth_bits_per_s: float | None = None,
) -> float:
    """Mean time per call beyond what the link and the node account for: each call
    replayed through the link's token buckets (:mod:`shuttle.sim.link`, the live
    shaper's arithmetic) at the instant it was made, the reply handed over once the
    node has done its CPU work. ``bandwidth_bits_per_s`` replays at another rate than
    the profile's (its bucket depth and latency kept)."""
    n = len(timed.walls)
    residuals = call_residuals_s(
        timed.starts,
        timed.walls,
        profile,
        [up_bytes] * n,
        [down_bytes] * n,
        [node_s] * n,
        bandwidth_bits_per_s=bandwidth_bits_per_s,
    )
    return statistics.fmean(residuals[timed.warmup :])


def call_residuals_s(
    starts: Sequence[float],
    walls: Sequence[float],
    profile: LinkProfile,
    up_bytes: Sequence[float],
    down_bytes: Sequence[float],
    node_s: Sequence[float],
    *,
    bandwidth_bits_per_s: float | None = None,
) -> list[float]:
    """Each call's wall time less its link time and node time: call ``i`` started at
    ``starts[i]`` sent ``up_bytes[i]``, the node worked ``node_s[i]``, and the reply of
    ``down_bytes[i]`` crossed back, each message through the link's token buckets
    (which remember the calls before it)."""
    bw = profile.bandwidth_bits_per_s if bandwidth_bits_per_s is None else bandwidth_bits_per_s
    link = Link(math.inf if bw is None else bw, profile.effective_burst_bytes, profile.latency_s)
    out = []
    for start, wall, up, down, node in zip(
        starts, walls, up_bytes, down_bytes, node_s, strict=True
    ):
        arrive = link.up.transmit(start, up)
        back = link.down.transmit(arrive + node, down)
        out.append(wall - (back - start))
    return out


#: The achieved rate is searched down to this fraction of the profile's; a link that
#: seems slower still is reported at the floor (and the raw residuals kept beside it).
ACHIEVED_RATE_FLOOR = 0.2
#: Bisection steps of that search: 2**-40 of the range, far below any measurement.
ACHIEVED_RATE_STEPS = 40


def achieved_bandwidth_bits_per_s(
    timed: Timed,
    profile: LinkProfile,
    up_bytes: float,
    down_bytes: float,
    node_s: float,
    per_message_s: float,
) -> float | None:
    """The rate the live shaper achieved for the large reads ``timed``: the bandwidth
    at which replaying them through the link's buckets leaves the same residual per
    call as a small message (``per_message_s``), so what the large reads took beyond
    that is charged to their bytes. The shaper sends a bucket's worth, then sleeps
    until it refills; on a busy machine a sleep overshoots and the time is lost for
    good (the bucket is too small to catch up), so the live link moves fewer bytes a
    second than its profile says. Never above the profile's rate (a faster replay is
    noise, not a faster link); ``None`` for an unlimited link."""
    nominal = profile.bandwidth_bits_per_s
    if nominal is None:
        return None

    def excess(bw: float) -> float:
        args = (timed, profile, up_bytes, down_bytes, node_s)
        return link_residual_s(*args, bandwidth_bits_per_s=bw) - per_message_s

    if excess(nominal) <= 0.0:
        return nominal
    lo, hi = nominal * ACHIEVED_RATE_FLOOR, nominal
    if excess(lo) > 0.0:
        return lo
    for _ in range(ACHIEVED_RATE_STEPS):  # the residual grows with the rate replayed
        mid = math.sqrt(lo * hi)
        if excess(mid) > 0.0:
            hi = mid
        else:
            lo = mid
    return lo
