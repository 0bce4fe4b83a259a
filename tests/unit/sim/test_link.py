"""The simulator's token-bucket link: its closed form, and the live shaper's instants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import ConfigError
from shuttle.net.profiles import LinkProfile
from shuttle.net.shaping import LinkShaper
from shuttle.sim.link import Bucket, Link, transfer_time_s
from shuttle.testing import FakeClock

LAN = (10e6, 4096, 0.5e-3)  # bit/s, burst bytes, latency s (the "lan" profile)


@pytest.mark.parametrize("nbytes", [0, 100, 4096, 4097, 65536, 1 << 20])
@pytest.mark.parametrize(
    ("bandwidth", "burst", "latency"), [LAN, (100e6, 12500, 1e-4), (1e6, 4096, 0.02)]
)
def test_an_idle_link_with_a_full_bucket_takes_the_closed_form(
    nbytes: int, bandwidth: float, burst: int, latency: float
) -> None:
    bucket = Bucket(bandwidth, burst, latency)
    expected = max(0, nbytes - burst) * 8 / bandwidth + latency
    assert bucket.transmit(5.0, nbytes) == pytest.approx(5.0 + expected, rel=1e-12)
    assert transfer_time_s(nbytes, bandwidth, burst, latency) == pytest.approx(expected)


def test_back_to_back_messages_wait_for_tokens_and_an_idle_link_refills() -> None:
    bw, burst, lat = LAN
    rate = bw / 8
    bucket = Bucket(bw, burst, lat)
    first = bucket.transmit(0.0, 65536)
    assert first == pytest.approx((65536 - burst) / rate + lat)
    # Handed over at once behind it: no tokens left, the whole message serialises.
    second = bucket.transmit(0.0, 65536)
    assert second == pytest.approx(first + 65536 / rate)
    # After the link has idled long enough for the bucket to refill, the burst is back.
    later = second + 1.0
    assert bucket.transmit(later, 65536) == pytest.approx(later + (65536 - burst) / rate + lat)


def test_an_unlimited_link_adds_only_its_latency() -> None:
    bucket = Bucket(math.inf, 4096, 0.001)
    assert bucket.transmit(2.0, 10**9) == 2.001
    assert Link(math.inf, 0, 0.0).down.transmit(3.0, 5) == 3.0


def test_bad_parameters_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match='"bandwidth"'):
        Bucket(0.0, 4096, 0.0)
    with pytest.raises(ConfigError, match='"burst"'):
        Bucket(1e6, -1, 0.0)
    with pytest.raises(ConfigError, match='"latency"'):
        Bucket(1e6, 4096, -0.1)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.05, allow_nan=False),
            st.integers(min_value=0, max_value=200_000),
        ),
        min_size=1,
        max_size=30,
    ),
    bandwidth=st.sampled_from([1e6, 10e6, 100e6]),
    burst=st.sampled_from([None, 4096, 65536]),
    latency=st.sampled_from([0.0, 1e-4, 0.02]),
)
def test_the_bucket_gives_the_live_shapers_instants(
    steps: list[tuple[float, int]], bandwidth: float, burst: int | None, latency: float
) -> None:
    """Hand the same bytes at the same (fake-clock) instants to the live system's
    LinkShaper and to the simulator's Bucket: every arrival is the same."""
    profile = LinkProfile("p", bandwidth, latency, burst)
    clock = FakeClock()
    shaper = LinkShaper(profile, clock)
    bucket = Bucket(bandwidth, profile.effective_burst_bytes, latency)
    for wait_s, nbytes in steps:
        clock.jump(wait_s)
        live = shaper.transmit(nbytes)
        simulated = bucket.transmit(clock.now(), nbytes)
        assert simulated == pytest.approx(live, rel=1e-12, abs=1e-15)
