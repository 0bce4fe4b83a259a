"""LinkShaper against the closed form and against an independent token-bucket model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuttle.net.profiles import BUILTIN_PROFILES, LinkProfile
from shuttle.net.shaping import LinkShaper
from shuttle.testing import FakeClock

LAN = BUILTIN_PROFILES["lan"]


def test_one_transfer_on_an_idle_link_is_the_closed_form() -> None:
    clock = FakeClock(start_s=100.0)
    shaper = LinkShaper(LAN, clock)
    n = 1_000_000
    arrival = shaper.transmit(n)
    assert arrival == pytest.approx(100.0 + (n - 4096) * 8 / 10e6 + 0.5e-3, abs=1e-12)
    assert arrival - 100.0 == pytest.approx(LAN.transfer_time_s(n))


def test_a_full_bucket_sends_its_burst_at_once() -> None:
    shaper = LinkShaper(LAN, FakeClock())
    assert shaper.transmit(4096) == pytest.approx(0.5e-3)
    # The bucket is now empty: the next byte waits for its token.
    assert shaper.transmit(1250) == pytest.approx(1e-3 + 0.5e-3)


def test_latency_pipelines_many_frames_in_flight() -> None:
    """100 frames written back to back share one latency, they do not queue behind it."""
    wan = BUILTIN_PROFILES["wan"]
    shaper = LinkShaper(wan, FakeClock())
    arrivals = [shaper.transmit(1000) for _ in range(100)]
    assert arrivals == sorted(arrivals)
    assert arrivals[-1] == pytest.approx((100_000 - 4096) * 8 / 1e6 + 20e-3)


def test_idle_time_refills_the_bucket() -> None:
    clock = FakeClock()
    shaper = LinkShaper(LAN, clock)
    shaper.transmit(100_000)
    clock.jump_to(10.0)  # long idle: the bucket is full again, and no fuller
    assert shaper.transmit(5000) == pytest.approx(10.0 + (5000 - 4096) * 8 / 10e6 + 0.5e-3)


def test_unlimited_bandwidth_adds_only_latency() -> None:
    shaper = LinkShaper(LinkProfile("lat", None, 0.02), FakeClock(5.0))
    assert shaper.transmit(10**9) == pytest.approx(5.02)


def test_counters() -> None:
    clock = FakeClock()
    shaper = LinkShaper(LAN, clock)
    a = shaper.transmit(10_000)
    b = shaper.transmit(0)
    assert b == pytest.approx(a)  # an end-of-stream marker arrives right after the bytes
    c = shaper.transmit(2_000)
    assert shaper.counters.bytes == 12_000
    assert shaper.counters.frames == 2  # the empty marker is not a frame
    assert shaper.counters.delay_s_total == pytest.approx(a + c)


def _reference(
    rate_bytes_per_s: float, burst_bytes: int, latency_s: float, sends: list[tuple[float, int]]
) -> list[float]:
    """A fluid token bucket with a FIFO queue, written the plain way: track when the
    queue empties and how many tokens are left then."""
    free_at = -math.inf
    tokens_at_free = float(burst_bytes)
    out = []
    for t, n in sends:
        start = max(t, free_at)
        tokens = (
            float(burst_bytes)
            if math.isinf(free_at)
            else min(float(burst_bytes), tokens_at_free + rate_bytes_per_s * (start - free_at))
        )
        if n <= tokens:
            done, tokens = start, tokens - n
        else:
            done, tokens = start + (n - tokens) / rate_bytes_per_s, 0.0
        free_at, tokens_at_free = done, tokens
        out.append(done + latency_s)
    return out


@given(
    bandwidth_bits_per_s=st.sampled_from([1e6, 10e6, 100e6, 3.3e5]),
    latency_s=st.sampled_from([0.0, 0.1e-3, 0.5e-3, 0.02]),
    burst_bytes=st.integers(min_value=4096, max_value=200_000),
    sends=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.5, allow_nan=False),
            st.integers(min_value=0, max_value=300_000),
        ),
        max_size=40,
    ),
)
def test_matches_the_reference_model(
    bandwidth_bits_per_s: float,
    latency_s: float,
    burst_bytes: int,
    sends: list[tuple[float, int]],
) -> None:
    profile = LinkProfile("p", bandwidth_bits_per_s, latency_s, burst_bytes)
    clock = FakeClock()
    shaper = LinkShaper(profile, clock)
    timeline: list[tuple[float, int]] = []
    got: list[float] = []
    for gap_s, n in sends:
        clock.jump(gap_s)
        timeline.append((clock.now(), n))
        got.append(shaper.transmit(n))
    want = _reference(bandwidth_bits_per_s / 8, burst_bytes, latency_s, timeline)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert got == sorted(got)  # FIFO: delivery order is hand-over order
    for (t, _), arrival in zip(timeline, got, strict=True):
        assert arrival >= t + latency_s - 1e-12


def test_bytes_handed_over_in_the_past_are_timed_from_then() -> None:
    """A socket read late hands its bytes over at their kernel receive time."""
    clock = FakeClock(start_s=10.0)
    shaper = LinkShaper(LAN, clock)
    late = shaper.transmit(50_000, at_s=9.5)
    assert late == pytest.approx(9.5 + (50_000 - 4096) * 8 / 10e6 + 0.5e-3)
    # Never before the previous hand-over (FIFO) ...
    assert shaper.transmit(0, at_s=1.0) == pytest.approx(late)
    # ... and never in the future.
    clock.jump_to(20.0)
    assert shaper.transmit(0, at_s=30.0) == pytest.approx(20.0 + 0.5e-3)
