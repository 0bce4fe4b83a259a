"""Which placement is faster for one mobile program, and where the answer flips.

:func:`forecast` runs the program alone (:func:`shuttle.sim.alone.simulate_alone`) at
the client and at the server under one :class:`~shuttle.sim.config.ServerConfig` and
names the faster side; :func:`break_even_bandwidth` and :func:`break_even_speed`
search, by bisection on a logarithmic scale, the link bandwidth and the server CPU
speed at which the two placements take the same time. No I/O: the live measurements
that fill the configuration are made above this package (``shuttle sim calibrate``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shuttle.sim.alone import AloneResult, simulate_alone
from shuttle.sim.config import ServerConfig, replace
from shuttle.sim.workload import Columns

#: The bandwidths searched for a break-even point, bit/s: the link profiles' bounds
#: (1 kbit/s, below which nothing useful finishes, to 1 Tbit/s, where no link on one
#: machine is the bottleneck).
BANDWIDTH_BITS_PER_S_RANGE = (1e3, 1e12)
#: The server speeds searched, relative to the configuration's reference: the live
#: CPU factor's bounds (a node 100 times slower to 100 times faster).
SPEED_RANGE = (0.01, 100.0)
#: Bisection stops when the bracket is this narrow (ratio of its ends): 0.5 %, far
#: below what any input to the model is known to.
BISECTION_RATIO = 1.005


#: One stack of a program: its trace (the records of one ``client`` id) and the
#: configuration of the server it runs against.
Stack = tuple[ServerConfig, Columns]


@dataclass(frozen=True, slots=True)
class Forecast:
    """Both placements' predicted run times and the verdict.

    A program whose objects read from several servers runs one stack per server, all
    at once (``shuttle grep`` does); its run time is the slowest stack's."""

    client: tuple[AloneResult, ...]
    server: tuple[AloneResult, ...]

    @property
    def client_s(self) -> float:
        return max(r.run_time_s for r in self.client)

    @property
    def server_s(self) -> float:
        return max(r.run_time_s for r in self.server)

    @property
    def faster(self) -> str:
        """``client`` or ``server`` (the client on an exact tie: nothing moves)."""
        return "server" if self.server_s < self.client_s else "client"

    def to_json(self) -> dict[str, Any]:
        return {
            "client_s": self.client_s,
            "server_s": self.server_s,
            "faster": self.faster,
            "stacks": [
                {"client": c.to_json(), "server": s.to_json()}
                for c, s in zip(self.client, self.server, strict=True)
            ],
        }


def forecast(stacks: Sequence[Stack], *, warm: bool = True) -> Forecast:
    """The program at the client and at the server, each stack alone on its server."""
    return Forecast(
        tuple(simulate_alone(config, trace, "client", warm=warm) for config, trace in stacks),
        tuple(simulate_alone(config, trace, "server", warm=warm) for config, trace in stacks),
    )


def split_stacks(trace: Columns) -> list[Columns]:
    """The trace's stacks (one per ``client`` id, in order of id), each starting at 0 s."""
    out = []
    for client in np.unique(trace.client).tolist():
        mask = trace.client == client
        times = trace.time_s[mask]
        out.append(
            Columns(
                times - times[0],
                trace.client[mask],
                trace.kind[mask],
                trace.file[mask],
                trace.offset[mask],
                trace.size[mask],
                trace.file_count,
            )
        )
    return out


def _difference(stacks: Sequence[Stack], warm: bool, **changes: Any) -> float:
    changed = [(replace(config, **changes) if changes else config, t) for config, t in stacks]
    f = forecast(changed, warm=warm)
    return f.client_s - f.server_s


def _bisect_log(
    gap: Callable[[float], float], lo: float, hi: float
) -> tuple[float | None, float, float]:
    """The point in ``[lo, hi]`` where ``gap`` changes sign (None if it does not),
    with ``gap`` at both ends."""
    g_lo, g_hi = gap(lo), gap(hi)
    if g_lo == 0.0:
        return lo, g_lo, g_hi
    if g_hi == 0.0:
        return hi, g_lo, g_hi
    if (g_lo > 0) == (g_hi > 0):
        return None, g_lo, g_hi
    a, b, g_a = lo, hi, g_lo
    while b / a > BISECTION_RATIO:
        mid = math.sqrt(a * b)
        g_mid = gap(mid)
        if (g_mid > 0) == (g_a > 0):
            a, g_a = mid, g_mid
        else:
            b = mid
    return math.sqrt(a * b), g_lo, g_hi


@dataclass(frozen=True, slots=True)
class BreakEven:
    """Where the two placements take the same time, or which side wins throughout."""

    #: The parameter's value at the break-even point (None: no sign change in range).
    value: float | None
    #: The faster side at the low and the high end of the range searched.
    faster_low: str
    faster_high: str
    range: tuple[float, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "faster_low": self.faster_low,
            "faster_high": self.faster_high,
            "range": list(self.range),
        }


def _side(gap: float) -> str:
    return "server" if gap > 0 else "client"


def break_even_bandwidth(
    stacks: Sequence[Stack],
    *,
    warm: bool = True,
    burst_for: Callable[[float], int] | None = None,
) -> BreakEven:
    """The link bandwidth at which client and server take the same time.

    ``burst_for(bandwidth)`` gives the token bucket's depth at each bandwidth (the
    live profiles' rule); without it each configuration's depth is kept."""
    bucket = any(config.network_burst_bytes > 0 for config, _ in stacks)

    def gap(bandwidth: float) -> float:
        changes: dict[str, Any] = {"network_bandwidth_bits_per_s": bandwidth}
        if burst_for is not None and bucket:
            changes["network_burst_bytes"] = burst_for(bandwidth)
        return _difference(stacks, warm, **changes)

    value, g_lo, g_hi = _bisect_log(gap, *BANDWIDTH_BITS_PER_S_RANGE)
    return BreakEven(value, _side(g_lo), _side(g_hi), BANDWIDTH_BITS_PER_S_RANGE)


def break_even_speed(stacks: Sequence[Stack], *, warm: bool = True) -> BreakEven:
    """The server CPU speed (``server_speed``) at which client and server take the
    same time, the rest of the configuration unchanged."""

    def gap(speed: float) -> float:
        return _difference(stacks, warm, server_speed=speed)

    value, g_lo, g_hi = _bisect_log(gap, *SPEED_RANGE)
    return BreakEven(value, _side(g_lo), _side(g_hi), SPEED_RANGE)
