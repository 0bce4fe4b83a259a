"""Link profiles: built-ins, spec strings, TOML tables and their error messages."""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuttle.errors import ConfigError
from shuttle.net.profiles import (
    BUILTIN_PROFILES,
    BURST_BYTES_MIN,
    LinkProfile,
    parse_bandwidth,
    parse_latency,
    parse_link_profile,
    parse_links_table,
)


def test_builtins_match_the_issue() -> None:
    assert BUILTIN_PROFILES["loopback"].is_unshaped
    assert BUILTIN_PROFILES["san"] == LinkProfile("san", 100e6, 0.1e-3)
    assert BUILTIN_PROFILES["lan"] == LinkProfile("lan", 10e6, 0.5e-3)
    assert BUILTIN_PROFILES["wan"] == LinkProfile("wan", 1e6, 20e-3)


@pytest.mark.parametrize(
    ("text", "bits_per_s"),
    [
        ("5Mbit", 5e6),
        ("5mbit", 5e6),
        ("100kbit", 1e5),
        ("1.5Gbit", 1.5e9),
        ("2000bit", 2000.0),
        ("2MB/s", 16e6),
        ("10KB/s", 80e3),
        ("none", None),
        ("unlimited", None),
    ],
)
def test_bandwidth_units(text: str, bits_per_s: float | None) -> None:
    assert parse_bandwidth(text) == bits_per_s


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2ms", 2e-3), ("0.5ms", 0.5e-3), ("150us", 150e-6), ("1s", 1.0), ("0ms", 0.0)],
)
def test_latency_units(text: str, seconds: float) -> None:
    assert parse_latency(text) == pytest.approx(seconds)


def test_spec_string() -> None:
    p = parse_link_profile("bw=5Mbit,lat=2ms")
    assert (p.bandwidth_bits_per_s, p.latency_s, p.burst_bytes) == (5e6, 2e-3, None)
    p = parse_link_profile(" bandwidth = 1Mbit , latency = 20ms , burst = 16KiB ", name="slow")
    assert (p.name, p.bandwidth_bits_per_s, p.burst_bytes) == ("slow", 1e6, 16384)


def test_names_resolve_to_builtins() -> None:
    assert parse_link_profile("lan") is BUILTIN_PROFILES["lan"]


def test_toml_links_table() -> None:
    doc = tomllib.loads(
        """
        [links]
        default = "lan"
        node-1 = "bw=5Mbit,lat=2ms"
        node-2 = { bandwidth = "1Mbit", latency = "20ms", burst = "8KiB" }
        node-3 = { bandwidth_bits_per_s = 1e6, latency_s = 0.02 }
        node-4 = "node-2"
        """
    )
    links = parse_links_table(doc["links"])
    assert links["default"] is BUILTIN_PROFILES["lan"]
    assert links["node-1"].bandwidth_bits_per_s == 5e6
    assert links["node-2"] == LinkProfile("node-2", 1e6, 0.02, 8192)
    assert links["node-3"] == LinkProfile("node-3", 1e6, 0.02)
    assert links["node-4"] is links["node-2"]


@given(
    bw=st.one_of(st.none(), st.floats(min_value=1e3, max_value=1e12)),
    lat=st.floats(min_value=0.0, max_value=10.0),
    burst=st.one_of(st.none(), st.integers(min_value=BURST_BYTES_MIN, max_value=2**30)),
)
def test_toml_round_trip(bw: float | None, lat: float, burst: int | None) -> None:
    p = LinkProfile("x", bw, lat, burst)
    assert parse_link_profile(p.to_toml(), name="x") == p


@pytest.mark.parametrize("name", list(BUILTIN_PROFILES))
def test_spec_round_trip_of_builtins(name: str) -> None:
    p = BUILTIN_PROFILES[name]
    q = parse_link_profile(p.spec())
    assert q.bandwidth_bits_per_s == p.bandwidth_bits_per_s
    assert q.latency_s == pytest.approx(p.latency_s)


def test_closed_form() -> None:
    lan = BUILTIN_PROFILES["lan"]
    assert lan.effective_burst_bytes == BURST_BYTES_MIN  # 1 ms at 10 Mbit/s is 1250 B
    assert lan.transfer_time_s(1_000_000) == pytest.approx(
        (1_000_000 - BURST_BYTES_MIN) * 8 / 10e6 + 0.5e-3
    )
    assert BUILTIN_PROFILES["san"].effective_burst_bytes == 12_500
    assert BUILTIN_PROFILES["loopback"].transfer_time_s(10**9) == 0.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("fast", "unknown link profile 'fast'; use one of lan, loopback, san, wan"),
        ("bw=5Mbps,lat=2ms", "bandwidth '5Mbps' has no known unit"),
        ("bw=5Mbit,lat=2", "latency '2' has no known unit; use s, ms, us or ns"),
        ("bw=5Mbit", "lacks latency"),
        ("bw=5Mbit,lat=2ms,jitter=1ms", "cannot read 'jitter=1ms'"),
        ("bw=5Mbit,bw=6Mbit,lat=1ms", "bandwidth is given twice"),
        ("bw=0.5bit,lat=1ms", "bandwidth 0.5 bit/s is out of range"),
        ("bw=fast,lat=1ms", "bandwidth 'fast' is not a number with a unit"),
        ("bw=1Mbit,lat=1h", "latency '1h' has no known unit"),
        ("bw=1Mbit,lat=11s", "latency 11.0 s is out of range"),
        ("bw=1Mbit,lat=1ms,burst=100B", "burst 100 bytes is too small"),
        ({"bandwidth": "1Mbit"}, "latency is missing"),
        ({"bandwidth": 5, "latency": "1ms"}, "bandwidth must be a string with a unit"),
        ({"bandwidth": "1Mbit", "latency_s": "1ms"}, "latency_s must be a number"),
        ({"bandwidth": "1Mbit", "latency": "1ms", "loss": 0.1}, "unknown key(s) loss"),
        (
            {"bandwidth": "1Mbit", "bandwidth_bits_per_s": 1e6, "latency": "1ms"},
            "either bandwidth or bandwidth_bits_per_s",
        ),
    ],
)
def test_errors_say_what_and_how(value: str | dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_link_profile(value, name="p")
    assert message in str(info.value)


def test_links_table_rejects_other_types() -> None:
    with pytest.raises(ConfigError, match=r"\[links\] node-1: expected a profile name"):
        parse_links_table({"node-1": 5})
