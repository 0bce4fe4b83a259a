"""Every parameter of the simulated server and of an experiment, with the paper's defaults.

One source of truth: :class:`ServerConfig` (the hardware and the costs, section 3 of
the paper) and :class:`ExperimentConfig` (how traces are cut into measured
intervals, section 4.1). Both load from a TOML file (tables ``[server]`` and
``[experiment]``) and take ``table.key=value`` overrides from the command line;
every loaded value is checked and a bad one raises
:class:`~shuttle.errors.ConfigError` naming the parameter.

Units are in the names. Where the paper gives no number, the default is ours and
its comment says why.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from shuttle.errors import ConfigError

#: The paper's CPU cost table (Figure 1) is for a 133 MHz Digital AlphaStation.
REFERENCE_CPU_HZ = 133e6


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The simulated file server, its disk, network, clients and mobile application."""

    # --- block cache (3.3.1) --------------------------------------------------------
    #: Cache block size; request sizes are rounded up to whole blocks.
    block_size_bytes: int = 8192
    #: Server block cache capacity (not given in the paper; 4096 blocks = 32 MB, a
    #: mid-point of the cache-size sweep).
    cache_blocks: int = 4096
    #: An infinite cache grows on every miss (only first-access misses remain).
    cache_infinite: bool = False
    #: Bytes a metadata miss reads from disk, and a metadata write writes (one block:
    #: an inode or directory block).
    metadata_io_bytes: int = 8192
    #: Write-through applies to metadata too (NFS servers commit before replying).
    metadata_write_through: bool = True

    # --- disk (3.3.2; ``shuttle.sim.disk``) -----------------------------------------
    #: Average seek, paid by every read (every access unless writes are priced apart;
    #: no layout information in the traces).
    disk_seek_s: float = 0.008
    #: Peak transfer rate of reads (10 MB/s; MB = 10**6 bytes).
    disk_bandwidth_bytes_per_s: float = 10e6
    #: Per-access cost and transfer rate of writes; unset: as reads (the paper's disk).
    #: An SSD writes slower than it reads; a RAID 5 small write costs about 4 accesses.
    disk_write_seek_s: float | None = None
    disk_write_bandwidth_bytes_per_s: float | None = None
    #: Accesses served at once (queue depth): 1 is the paper's one disk; the spindles
    #: of a RAID set or the channels of an SSD serve several, FIFO from one queue.
    disk_parallelism: int = 1

    # --- CPU (3.3.3) ----------------------------------------------------------------
    #: Clock of the machine the cycle table was measured on.
    cpu_reference_hz: float = REFERENCE_CPU_HZ
    #: Server CPU speed relative to the reference (inf: an infinitely fast CPU).
    server_speed: float = 1.0
    #: Client CPU speed relative to the reference: scales the mobile application's
    #: think time at the client and the issue times of background requests.
    client_speed: float = 1.0
    metadata_read_cycles: float = 33_000
    metadata_write_cycles: float = 64_000
    #: Per block of a block request.
    block_read_cycles: float = 100_000
    block_write_cycles: float = 199_000
    #: A request the mobile application makes at the server is a local call: it
    #: skips the network protocol processing the table includes. The paper gives no
    #: split; we charge half.
    local_request_cpu_fraction: float = 0.5
    #: The mobile program's own requests at the server are calls its code makes, so
    #: they run as it does, on idle cycles only (section 3.3.3: "The agrep receives
    #: only idle server CPU cycles"); False queues them FIFO with clients' requests.
    mobile_requests_on_idle_cycles: bool = True

    # --- network (3.3.4) ------------------------------------------------------------
    network_latency_s: float = 20e-6
    network_bandwidth_bits_per_s: float = 100e6
    #: RPC header of every request and reply (NFS over UDP: about 128 bytes).
    rpc_header_bytes: int = 128
    #: A request's header when it differs from a reply's (a live run-time's request
    #: names the object, the method and the caller); unset: ``rpc_header_bytes``.
    rpc_request_header_bytes: int | None = None

    # --- the mobile application (3.1, 3.3.1) ----------------------------------------
    #: Memory the mobile program holds at the server (800 KB = 100 blocks).
    mobile_footprint_bytes: int = 800 * 1024
    #: The client cache the mobile application's accesses pass through at the
    #: client (not given in the paper; 16 MB, a workstation file cache of the time).
    #: 0: no client cache (a live run-time's storage reads all go to the node).
    client_cache_blocks: int = 2048
    #: The client's largest read or write RPC (NFS rsize/wsize: one 8 KB block).
    client_request_bytes_max: int = 8192
    #: Speed, relative to the reference, of the CPU the mobile trace's think times
    #: were measured on.
    mobile_trace_speed: float = 1.0

    # --- what the live system has (issue 24) ----------------------------------------
    # Every default below leaves the paper's model exactly as it was (the reference
    # sweeps are byte-identical in their figures); ``shuttle sim calibrate`` measures
    # them on a live cluster (docs/simulator.md, "Predicting the live system").
    #: Token-bucket depth of the mobile application's link, bytes. 0: the paper's
    #: per-message formula. Above 0 each direction of that link is a token bucket of
    #: this depth at ``network_bandwidth_bits_per_s`` followed by
    #: ``network_latency_s`` (:mod:`shuttle.sim.link`, as the live link emulation).
    network_burst_bytes: int = 0
    #: The mobile application's messages carry the bytes its trace records (plus
    #: ``rpc_header_bytes``), not whole blocks.
    network_exact_bytes: bool = False
    #: Time the mobile application spends per remote call besides the link and the
    #: server: its run-time's encoding, decoding and thread hops at both ends
    #: (``rpc_overhead_s``: a storage request from the client; ``call_overhead_s``:
    #: a console call to the object at the server).
    rpc_overhead_s: float = 0.0
    call_overhead_s: float = 0.0
    #: Time the mobile application's first remote call spends opening its connection
    #: (a live run-time dials and authenticates on its first call, inside the timer of
    #: ``shuttle grep``), paid once as it starts, at either placement.
    connect_s: float = 0.0
    #: Time a live program spends making its object before the object's first call,
    #: paid once as it starts, at each placement: at the client the object is made in
    #: process (``client_setup_s``), at the server by a call whose link and CPU the
    #: trace's first call (the making, with its arguments' bytes) already costs
    #: (``server_setup_s``: the rest).
    client_setup_s: float = 0.0
    server_setup_s: float = 0.0
    #: Server CPU per request of any kind, on top of its kind's cost (which is per
    #: block for block requests): the part of serving a request that does not grow
    #: with its size.
    request_cycles: float = 0.0
    #: A read the mobile program makes at the server (a local call): CPU per request
    #: and per block, when measured. Unset: ``local_request_cpu_fraction`` of a
    #: remote read's cost (the paper's way).
    local_request_cycles: float | None = None
    local_block_read_cycles: float | None = None
    #: Server CPU per console call to the mobile program at the server (receiving the
    #: call, invoking the object, sending its result).
    call_cycles: float = 0.0
    #: CPU the mobile program needs when a run-time hosts it, per CPU second of its
    #: trace (recorded running in process), at the client and at the server.
    mobile_client_cpu_ratio: float = 1.0
    mobile_server_cpu_ratio: float = 1.0

    def __post_init__(self) -> None:
        _positive(self, "block_size_bytes", "cache_blocks")
        _non_negative(self, "client_cache_blocks")
        _positive(self, "client_request_bytes_max", "cpu_reference_hz")
        _positive(self, "server_speed", "client_speed", "mobile_trace_speed")
        _positive(self, "disk_bandwidth_bytes_per_s", "network_bandwidth_bits_per_s")
        _positive(self, "disk_parallelism")
        _non_negative(self, "metadata_io_bytes", "disk_seek_s", "network_latency_s")
        _non_negative(self, "rpc_header_bytes", "mobile_footprint_bytes")
        _non_negative(self, "metadata_read_cycles", "metadata_write_cycles")
        _non_negative(self, "block_read_cycles", "block_write_cycles")
        _non_negative(self, "network_burst_bytes", "rpc_overhead_s", "call_overhead_s")
        _non_negative(self, "connect_s", "client_setup_s", "server_setup_s")
        _non_negative(self, "request_cycles", "call_cycles")
        _positive(self, "mobile_client_cpu_ratio", "mobile_server_cpu_ratio")
        for name in ("local_request_cycles", "local_block_read_cycles", "rpc_request_header_bytes"):
            if getattr(self, name) is not None:
                _non_negative(self, name)
        if self.disk_write_seek_s is not None:
            _non_negative(self, "disk_write_seek_s")
        if self.disk_write_bandwidth_bytes_per_s is not None:
            _positive(self, "disk_write_bandwidth_bytes_per_s")
        if not 0.0 <= self.local_request_cpu_fraction <= 1.0:
            raise ConfigError(
                f'"local_request_cpu_fraction" must be in [0, 1], '
                f"got {self.local_request_cpu_fraction!r}"
            )
        if not self.cache_infinite and self.mobile_blocks >= self.cache_blocks:
            raise ConfigError(
                f'"cache_blocks" ({self.cache_blocks}) must exceed the mobile '
                f"application's footprint ({self.mobile_blocks} blocks) so the server keeps "
                "a cache while it runs; raise cache_blocks or lower mobile_footprint_bytes"
            )

    @property
    def mobile_blocks(self) -> int:
        """Server cache blocks the mobile program occupies (rounded up)."""
        return -(-self.mobile_footprint_bytes // self.block_size_bytes)

    @property
    def disk_write_access_s(self) -> float:
        """Per-access cost of a write (``disk_write_seek_s``, else the read seek)."""
        return self.disk_seek_s if self.disk_write_seek_s is None else self.disk_write_seek_s

    @property
    def disk_write_bandwidth(self) -> float:
        """Transfer rate of writes in bytes/s (else the read rate)."""
        if self.disk_write_bandwidth_bytes_per_s is None:
            return self.disk_bandwidth_bytes_per_s
        return self.disk_write_bandwidth_bytes_per_s

    @property
    def server_hz(self) -> float:
        """Server cycles per second."""
        return self.cpu_reference_hz * self.server_speed

    def cpu_cost_s(self, cycles: float) -> float:
        """Seconds the server CPU needs for ``cycles`` reference cycles."""
        return 0.0 if math.isinf(self.server_hz) else cycles / self.server_hz

    def network_s(self, size_bytes: int) -> float:
        """One message of ``size_bytes`` payload: latency + (header + payload) / bandwidth."""
        bits = 8.0 * (self.rpc_header_bytes + size_bytes)
        return self.network_latency_s + bits / self.network_bandwidth_bits_per_s

    def disk_s(self, size_bytes: int, write: bool = False) -> float:
        """Disk service time of one access: seek + size / bandwidth (read or write)."""
        if write:
            return self.disk_write_access_s + size_bytes / self.disk_write_bandwidth
        return self.disk_seek_s + size_bytes / self.disk_bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True)
class ExperimentConfig:
    """How an experiment cuts the background trace into measured intervals (4.1)."""

    #: K: the number of busiest intervals measured.
    intervals: int = 6
    #: T: the length of each measured interval.
    interval_s: float = 180.0
    #: W: background trace replayed before each interval to warm the caches.
    warmup_s: float = 3 * 3600.0
    #: The last part of the warm-up is simulated in full (CPU, disk, locks) so the
    #: queues are in their steady state when the interval starts; the part before is
    #: replayed through the caches alone (LRU contents do not depend on timing).
    #: Set it equal to warmup_s to simulate the whole warm-up in full.
    warmup_timed_s: float = 60.0
    #: If the mobile application has not finished by the interval's end the
    #: background trace keeps coming until it does, for at most this long; a run
    #: still going then is reported as unfinished (a lower bound).
    overrun_s_max: float = 600.0
    #: The one seed every random choice derives from.
    seed: int = 0

    def __post_init__(self) -> None:
        _positive(self, "intervals", "interval_s")
        _non_negative(self, "warmup_s", "warmup_timed_s", "overrun_s_max")
        if self.warmup_timed_s > self.warmup_s:
            raise ConfigError(
                f'"warmup_timed_s" ({self.warmup_timed_s}) must not exceed '
                f'"warmup_s" ({self.warmup_s})'
            )


def _positive(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not value > 0:
            raise ConfigError(f'"{name}" must be > 0, got {value!r}')


def _non_negative(config: object, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if not value >= 0:
            raise ConfigError(f'"{name}" must be >= 0, got {value!r}')


# --- loading ------------------------------------------------------------------------

C = TypeVar("C")


def from_mapping(cls: type[C], values: Mapping[str, Any], where: str) -> C:
    """Build ``cls`` from ``values``, checking names and types.

    Raises :class:`~shuttle.errors.ConfigError` naming ``where`` for an unknown key
    or a value of the wrong type.
    """
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(
                f"unknown parameter {key!r} in {where}; known: {', '.join(sorted(known))}"
            )
        kwargs[key] = _coerce(key, known[key].type, value, where)
    return cls(**kwargs)


def _coerce(key: str, annotation: Any, value: Any, where: str) -> Any:
    kind = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    # An optional parameter (``float | None``) is unset by leaving it out: TOML has
    # no null, so a given value must be of the type.
    kind = kind.removesuffix(" | None")
    if kind == "bool":
        if isinstance(value, bool):
            return value
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    else:
        return value
    raise ConfigError(f"{where}: {key!r} must be a {kind}, got {value!r}")


def parse_overrides(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Parse ``table.key=value`` flags (values in TOML syntax) into nested tables.

    ``server.cache_blocks=1024``, ``experiment.warmup_s=600``,
    ``server.disk_seek_s=0``, ``server.server_speed=inf``. Raises
    :class:`~shuttle.errors.ConfigError` on a malformed item.
    """
    tables: dict[str, dict[str, Any]] = {}
    for item in items:
        name, sep, text = item.partition("=")
        table, dot, key = name.strip().partition(".")
        if not sep or not dot or not key:
            raise ConfigError(
                f"override {item!r} must look like table.key=value, e.g. server.cache_blocks=1024"
            )
        try:
            value = tomllib.loads(f"v = {text.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = text.strip()  # a bare string such as a path
        tables.setdefault(table, {})[key] = value
    return tables


def load_tables(path: Path | None, overrides: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """The TOML file's tables (if any) with the overrides applied on top."""
    tables: dict[str, dict[str, Any]] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"cannot read config {str(path)!r}: {exc.strerror or exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {str(path)!r} is not valid TOML: {exc}") from exc
        for table, values in data.items():
            if not isinstance(values, dict):
                raise ConfigError(f"config {str(path)!r}: {table!r} must be a [table]")
            tables[table] = dict(values)
    for table, values in parse_overrides(overrides).items():
        tables.setdefault(table, {}).update(values)
    return tables


def replace(config: C, **changes: Any) -> C:
    """A copy of a config dataclass with ``changes`` (re-validated)."""
    return dataclasses.replace(config, **changes)  # type: ignore[type-var]


def to_dict(config: object) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (inf becomes the string "inf")."""
    out: dict[str, Any] = {}
    for f in fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if isinstance(value, float) and math.isinf(value):
            value = "inf"
        out[f.name] = value
    return out
