"""Link profiles: the bandwidth and one-way latency of a client–node link, by name.

A profile is what the shaper (:mod:`shuttle.net.shaping`) enforces and what the
kernel shaping in :mod:`shuttle.net.netns` is configured from. Built-in profiles
(:data:`BUILTIN_PROFILES`) cover the cases the papers measure; any other value can be
written as a string, ``"bw=5Mbit,lat=2ms"``, or as a TOML table, as in the cluster
file's ``[links]`` table::

    [links]
    default = "lan"                               # a built-in name
    node-1 = "bw=5Mbit,lat=2ms"                   # a spec string
    node-2 = { bandwidth = "1Mbit", latency = "20ms", burst = "8KiB" }
    node-3 = { bandwidth_bits_per_s = 1e6, latency_s = 0.02 }

Bandwidth units are SI (``kbit`` = 1000 bit/s): ``bit kbit Mbit Gbit`` are bits per
second, ``B/s KB/s MB/s GB/s`` bytes per second; ``none`` means unlimited. Latency
units: ``s ms us ns``. Every error is a :class:`~shuttle.errors.ConfigError` that
names the profile, the field and a valid example.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shuttle.errors import ConfigError

#: Smallest token-bucket depth: one full Ethernet frame (1514 B) must fit, as kernel
#: ``tbf`` requires, with room for a second; 4 KiB is also one page-sized request.
BURST_BYTES_MIN = 4096
#: Default bucket depth in time: 1 ms of traffic at the link's rate, the same order
#: as a NIC's interrupt coalescing, so bursts never hide the bandwidth.
BURST_WINDOW_S = 0.001
#: Bandwidth bounds: below 1 kbit/s nothing useful finishes; above 1 Tbit/s the link
#: is not the bottleneck anywhere on one machine (use bandwidth ``none``).
BANDWIDTH_BITS_PER_S_MIN = 1e3
BANDWIDTH_BITS_PER_S_MAX = 1e12
#: Latency bound: beyond 10 s every client timeout fires anyway.
LATENCY_S_MAX = 10.0

_BANDWIDTH_UNITS: dict[str, float] = {
    # bits per second (SI prefixes, as tc and link vendors use them)
    "bit": 1.0,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
}
_BYTE_RATE_UNITS: dict[str, float] = {
    # bytes per second, case-sensitive "B" so that "Mb" is never mistaken for bytes
    "B/s": 8.0,
    "KB/s": 8e3,
    "kB/s": 8e3,
    "MB/s": 8e6,
    "GB/s": 8e9,
}
_LATENCY_UNITS: dict[str, float] = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "kib": 1024,
    "mib": 1024**2,
}
_UNLIMITED = {"none", "inf", "unlimited"}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")

_EXAMPLE = 'e.g. "bw=5Mbit,lat=2ms" or { bandwidth = "5Mbit", latency = "2ms" }'


@dataclass(frozen=True)
class LinkProfile:
    """One direction's worth of link conditions (both directions use the same profile).

    * ``bandwidth_bits_per_s``: serialisation rate; ``None`` means unlimited.
    * ``latency_s``: one-way propagation delay added to every byte.
    * ``burst_bytes``: token-bucket depth; ``None`` means the default
      (:attr:`effective_burst_bytes`).
    """

    name: str
    bandwidth_bits_per_s: float | None
    latency_s: float
    burst_bytes: int | None = None

    def __post_init__(self) -> None:
        where = f"link profile {self.name!r}"
        bw = self.bandwidth_bits_per_s
        if bw is not None and not (
            math.isfinite(bw) and BANDWIDTH_BITS_PER_S_MIN <= bw <= BANDWIDTH_BITS_PER_S_MAX
        ):
            raise ConfigError(
                f"{where}: bandwidth {bw!r} bit/s is out of range; it must be between "
                f"{BANDWIDTH_BITS_PER_S_MIN:g} and {BANDWIDTH_BITS_PER_S_MAX:g} bit/s, or "
                f"none for unlimited ({_EXAMPLE})"
            )
        if not (math.isfinite(self.latency_s) and 0.0 <= self.latency_s <= LATENCY_S_MAX):
            raise ConfigError(
                f"{where}: latency {self.latency_s!r} s is out of range; it must be between "
                f"0 and {LATENCY_S_MAX:g} s ({_EXAMPLE})"
            )
        if self.burst_bytes is not None and self.burst_bytes < BURST_BYTES_MIN:
            raise ConfigError(
                f"{where}: burst {self.burst_bytes!r} bytes is too small; it must be at "
                f"least {BURST_BYTES_MIN} bytes so that one full packet fits"
            )

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        """The bandwidth in bytes per second (``None``: unlimited)."""
        bw = self.bandwidth_bits_per_s
        return None if bw is None else bw / 8.0

    @property
    def effective_burst_bytes(self) -> int:
        """The bucket depth in force: the explicit one, or 1 ms at the rate, at least
        :data:`BURST_BYTES_MIN`."""
        if self.burst_bytes is not None:
            return self.burst_bytes
        rate = self.bandwidth_bytes_per_s
        if rate is None:
            return BURST_BYTES_MIN
        return max(BURST_BYTES_MIN, int(rate * BURST_WINDOW_S))

    @property
    def is_unshaped(self) -> bool:
        """True when the profile adds nothing (unlimited bandwidth, zero latency)."""
        return self.bandwidth_bits_per_s is None and self.latency_s == 0.0

    def transfer_time_s(self, nbytes: int) -> float:
        """Closed form: time for ``nbytes`` handed to an idle link to reach the far end.

        ``max(0, nbytes - burst) * 8 / bandwidth + latency`` (the first ``burst`` bytes
        leave at once from a full bucket).
        """
        rate = self.bandwidth_bytes_per_s
        serialise_s = 0.0 if rate is None else max(0, nbytes - self.effective_burst_bytes) / rate
        return serialise_s + self.latency_s

    def spec(self) -> str:
        """The profile as a spec string that :func:`parse_link_profile` reads back."""
        parts = [f"bw={format_bandwidth(self.bandwidth_bits_per_s)}"]
        parts.append(f"lat={format_latency(self.latency_s)}")
        if self.burst_bytes is not None:
            parts.append(f"burst={self.burst_bytes}B")
        return ",".join(parts)

    def to_toml(self) -> dict[str, Any]:
        """A TOML table for the cluster file (read back by :func:`parse_link_profile`)."""
        table: dict[str, Any] = {"latency_s": self.latency_s}
        if self.bandwidth_bits_per_s is None:
            table["bandwidth"] = "none"
        else:
            table["bandwidth_bits_per_s"] = self.bandwidth_bits_per_s
        if self.burst_bytes is not None:
            table["burst_bytes"] = self.burst_bytes
        return table

    def without_bandwidth(self) -> LinkProfile:
        """The same latency with unlimited bandwidth (used when the kernel shapes the
        bandwidth and only the delay must be emulated)."""
        return LinkProfile(f"{self.name}-latency", None, self.latency_s)

    def __str__(self) -> str:
        return f"{self.name} ({self.spec()})"


#: The profiles every cluster file may name without defining them.
BUILTIN_PROFILES: dict[str, LinkProfile] = {
    p.name: p
    for p in (
        LinkProfile("loopback", None, 0.0),
        LinkProfile("san", 100e6, 0.1e-3),
        LinkProfile("lan", 10e6, 0.5e-3),
        LinkProfile("wan", 1e6, 20e-3),
    )
}


def format_bandwidth(bits_per_s: float | None) -> str:
    """``10000000.0`` -> ``"10Mbit"``; ``None`` -> ``"none"``."""
    if bits_per_s is None:
        return "none"
    for unit, scale in (("Gbit", 1e9), ("Mbit", 1e6), ("kbit", 1e3)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g}{unit}"
    return f"{bits_per_s:g}bit"


def format_latency(latency_s: float) -> str:
    """``0.0005`` -> ``"0.5ms"``."""
    if latency_s == 0.0:
        return "0ms"
    if latency_s >= 1.0:
        return f"{latency_s:g}s"
    if latency_s >= 1e-3:
        return f"{latency_s * 1e3:g}ms"
    return f"{latency_s * 1e6:g}us"


def _quantity(text: str, where: str, what: str) -> tuple[float, str]:
    match = _QUANTITY.match(text)
    if match is None:
        raise ConfigError(f"{where}: {what} {text!r} is not a number with a unit ({_EXAMPLE})")
    return float(match.group(1)), match.group(2)


def parse_bandwidth(text: str, where: str = "link profile") -> float | None:
    """Parse ``"5Mbit"``, ``"2MB/s"`` or ``"none"`` into bits per second (``None``:
    unlimited). Raises :class:`ConfigError` naming ``where`` on a bad value."""
    if text.strip().lower() in _UNLIMITED:
        return None
    value, unit = _quantity(text, where, "bandwidth")
    if unit in _BYTE_RATE_UNITS:
        return value * _BYTE_RATE_UNITS[unit]
    scale = _BANDWIDTH_UNITS.get(unit.lower())
    if scale is None:
        raise ConfigError(
            f"{where}: bandwidth {text!r} has no known unit; use bit, kbit, Mbit, Gbit "
            f"(bits per second) or B/s, KB/s, MB/s, GB/s (bytes per second), or none "
            f"({_EXAMPLE})"
        )
    return value * scale


def parse_latency(text: str, where: str = "link profile") -> float:
    """Parse ``"2ms"``, ``"150us"`` or ``"0.02s"`` into seconds."""
    value, unit = _quantity(text, where, "latency")
    scale = _LATENCY_UNITS.get(unit)
    if scale is None:
        raise ConfigError(
            f"{where}: latency {text!r} has no known unit; use s, ms, us or ns ({_EXAMPLE})"
        )
    return value * scale


def parse_size(text: str, where: str = "link profile") -> int:
    """Parse ``"16KiB"``, ``"4096B"`` or ``"4kB"`` into bytes."""
    value, unit = _quantity(text, where, "burst")
    scale = _SIZE_UNITS.get(unit.lower())
    if scale is None:
        raise ConfigError(
            f"{where}: burst {text!r} has no known unit; use B, KB, KiB, MB or MiB "
            f'(e.g. burst="16KiB")'
        )
    return int(value * scale)


_SPEC_KEYS = {"bw": "bandwidth", "bandwidth": "bandwidth", "lat": "latency"}
_SPEC_KEYS |= {"latency": "latency", "delay": "latency", "burst": "burst"}


def _parse_spec(text: str, name: str) -> LinkProfile:
    where = f"link profile {name!r}"
    fields: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        canonical = _SPEC_KEYS.get(key.strip().lower())
        if not sep or canonical is None:
            raise ConfigError(
                f"{where}: cannot read {part.strip()!r} in {text!r}; write key=value pairs "
                f"with keys bw, lat and optionally burst, or a built-in name "
                f"({', '.join(BUILTIN_PROFILES)}) ({_EXAMPLE})"
            )
        if canonical in fields:
            raise ConfigError(f"{where}: {canonical} is given twice in {text!r}")
        fields[canonical] = value.strip()
    if "bandwidth" not in fields or "latency" not in fields:
        missing = sorted({"bandwidth", "latency"} - fields.keys())
        raise ConfigError(
            f"{where}: {text!r} lacks {' and '.join(missing)}; give both, {_EXAMPLE} "
            f"(use bw=none for unlimited bandwidth, lat=0ms for no delay)"
        )
    return LinkProfile(
        name,
        parse_bandwidth(fields["bandwidth"], where),
        parse_latency(fields["latency"], where),
        parse_size(fields["burst"], where) if "burst" in fields else None,
    )


_TABLE_KEYS = {
    "bandwidth",
    "bandwidth_bits_per_s",
    "latency",
    "latency_s",
    "burst",
    "burst_bytes",
    "name",
}


def _number(value: object, where: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key} must be a number, not {value!r}")
    return float(value)


def _parse_table(table: Mapping[str, object], name: str) -> LinkProfile:
    where = f"link profile {name!r}"
    unknown = sorted(set(table) - _TABLE_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(unknown)}; known keys are "
            f"{', '.join(sorted(_TABLE_KEYS))} ({_EXAMPLE})"
        )
    for short, long in (("bandwidth", "bandwidth_bits_per_s"), ("latency", "latency_s")):
        if short in table and long in table:
            raise ConfigError(f"{where}: give either {short} or {long}, not both")
        if short not in table and long not in table:
            raise ConfigError(f"{where}: {short} is missing ({_EXAMPLE})")
    bandwidth: float | None
    if "bandwidth" in table:
        raw = table["bandwidth"]
        if not isinstance(raw, str):
            raise ConfigError(
                f'{where}: bandwidth must be a string with a unit such as "5Mbit" (or use '
                f"bandwidth_bits_per_s = 5e6), not {raw!r}"
            )
        bandwidth = parse_bandwidth(raw, where)
    else:
        bandwidth = _number(table["bandwidth_bits_per_s"], where, "bandwidth_bits_per_s")
    if "latency" in table:
        raw = table["latency"]
        if not isinstance(raw, str):
            raise ConfigError(
                f'{where}: latency must be a string with a unit such as "2ms" (or use '
                f"latency_s = 0.002), not {raw!r}"
            )
        latency_s = parse_latency(raw, where)
    else:
        latency_s = _number(table["latency_s"], where, "latency_s")
    burst_bytes: int | None = None
    if "burst" in table and "burst_bytes" in table:
        raise ConfigError(f"{where}: give either burst or burst_bytes, not both")
    if "burst" in table:
        raw = table["burst"]
        if not isinstance(raw, str):
            raise ConfigError(f'{where}: burst must be a string such as "16KiB", not {raw!r}')
        burst_bytes = parse_size(raw, where)
    elif "burst_bytes" in table:
        burst_bytes = int(_number(table["burst_bytes"], where, "burst_bytes"))
    display = table.get("name", name)
    return LinkProfile(str(display), bandwidth, latency_s, burst_bytes)


def parse_link_profile(
    value: str | Mapping[str, object] | LinkProfile,
    *,
    name: str | None = None,
    known: Mapping[str, LinkProfile] | None = None,
) -> LinkProfile:
    """Read one profile from a name, a spec string or a TOML table.

    ``value`` may be the name of a built-in profile (or of one in ``known``), a spec
    string ``"bw=5Mbit,lat=2ms[,burst=16KiB]"``, or a table (see the module
    docstring). ``name`` labels a custom profile (default: its spec string). Raises
    :class:`ConfigError` saying what was wrong and giving a valid example.
    """
    if isinstance(value, LinkProfile):
        return value
    if isinstance(value, Mapping):
        return _parse_table(value, name or "custom")
    if not isinstance(value, str):
        raise ConfigError(
            f"link profile {name or '?'!r}: expected a profile name, a spec string or a "
            f"table, not {value!r} ({_EXAMPLE})"
        )
    key = value.strip()
    named = dict(BUILTIN_PROFILES) | dict(known or {})
    if key in named:
        return named[key]
    if "=" not in key:
        raise ConfigError(
            f"unknown link profile {key!r}; use one of {', '.join(sorted(named))} or a "
            f"custom value ({_EXAMPLE})"
        )
    return _parse_spec(key, name or key)


def parse_links_table(table: Mapping[str, object]) -> dict[str, LinkProfile]:
    """Read a cluster file's ``[links]`` table: each key (a node name, or ``default``)
    to its profile. Values are anything :func:`parse_link_profile` reads; a string
    value may also name another key of the same table that holds a custom table."""
    custom = {
        key: _parse_table(value, key) for key, value in table.items() if isinstance(value, Mapping)
    }
    result: dict[str, LinkProfile] = {}
    for key, value in table.items():
        if isinstance(value, Mapping):
            result[key] = custom[key]
        elif isinstance(value, str):
            result[key] = parse_link_profile(value, name=key, known=custom)
        else:
            raise ConfigError(
                f"[links] {key}: expected a profile name, a spec string or a table, "
                f"not {value!r} ({_EXAMPLE})"
            )
    return result
