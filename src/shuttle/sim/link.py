"""The mobile application's link to the server: a token bucket and a fixed delay per
direction, as the live system's link emulation has it.

The paper's network (3.3.4) prices every message alike, ``latency + size /
bandwidth``, with no contention. The live system shapes a link with a token bucket
(``shuttle.net.shaping.LinkShaper``): a message handed to an idle link whose bucket is
full leaves ``burst`` bytes at once, and a bucket refills at the link's rate while
the link idles, so a program that computes between its requests sees its replies
faster than the paper's formula says. :class:`Bucket` is the same model, with the
simulated time passed in instead of read from a clock (the simulator sits beside
``net`` in the layers, not above it; ``tests/unit/sim/test_link.py`` checks the two
against each other, step for step).

The bucket is kept as GCRA's *theoretical arrival time* ``tat``: handing over ``n``
bytes at ``now`` moves ``tat`` to ``max(tat, now) + n / rate``; they have left once
the debt is no larger than the bucket, at ``max(now, tat - burst / rate)``, and
arrive one latency later. Closed form, ``n`` bytes handed to an idle link with a full
bucket: ``max(0, n - burst) / rate + latency``.

Only the mobile application's own link is shaped this way
(``ServerConfig.network_burst_bytes > 0``); background clients keep the paper's
uncontended network.
"""

from __future__ import annotations

import math

from shuttle.errors import ConfigError


class Bucket:
    """One direction of one link: a FIFO token bucket followed by a fixed delay."""

    __slots__ = ("_burst_s", "_last_departure_s", "_rate", "_tat_s", "latency_s")

    def __init__(self, bandwidth_bits_per_s: float, burst_bytes: float, latency_s: float) -> None:
        if not bandwidth_bits_per_s > 0:
            raise ConfigError(f'"bandwidth" must be > 0 bit/s, got {bandwidth_bits_per_s!r}')
        if not burst_bytes >= 0:
            raise ConfigError(f'"burst" must be >= 0 bytes, got {burst_bytes!r}')
        if not latency_s >= 0:
            raise ConfigError(f'"latency" must be >= 0 s, got {latency_s!r}')
        #: Bytes per second (inf: the bandwidth does not limit).
        self._rate = bandwidth_bits_per_s / 8.0
        self._burst_s = 0.0 if math.isinf(self._rate) else burst_bytes / self._rate
        self.latency_s = latency_s
        self._tat_s = -math.inf
        self._last_departure_s = -math.inf

    def transmit(self, now_s: float, nbytes: float) -> float:
        """Hand ``nbytes`` to the link at ``now_s``; return when the last of them
        arrives at the far end. Arrival times of successive calls never decrease."""
        if math.isinf(self._rate):
            departure_s = now_s
        else:
            self._tat_s = max(self._tat_s, now_s) + nbytes / self._rate
            departure_s = max(now_s, self._tat_s - self._burst_s)
        departure_s = max(departure_s, self._last_departure_s)
        self._last_departure_s = departure_s
        return departure_s + self.latency_s


class Link:
    """Both directions of the application's link: ``up`` (to the server) and ``down``."""

    __slots__ = ("down", "up")

    def __init__(self, bandwidth_bits_per_s: float, burst_bytes: float, latency_s: float) -> None:
        self.up = Bucket(bandwidth_bits_per_s, burst_bytes, latency_s)
        self.down = Bucket(bandwidth_bits_per_s, burst_bytes, latency_s)


def transfer_time_s(
    nbytes: float, bandwidth_bits_per_s: float, burst_bytes: float, latency_s: float
) -> float:
    """Closed form: ``nbytes`` handed to an idle link with a full bucket, until they
    have arrived."""
    rate = bandwidth_bits_per_s / 8.0
    serialise = 0.0 if math.isinf(rate) else max(0.0, nbytes - burst_bytes) / rate
    return serialise + latency_s
