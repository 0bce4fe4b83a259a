"""Measure on a live node what the simulator needs to predict it (``shuttle sim calibrate``).

The simulator's server model (``shuttle.sim``) prices a request by server CPU cycles,
a message by a link, and a mobile program by its recorded think time. This module
fills those prices in for one node of a live cluster, by measuring the real thing:

* **Node CPU per read and per request.** Reads of a small and a 64 KiB object through
  the run-time's storage reference, as a grep at the client makes them; the node's
  process CPU clock (the node runs on this machine) over many reads, split into a
  part per request and a part per block (``request_cycles``, ``block_read_cycles``).
* **A console call** to an object at the node (``progress`` of a grep there): node
  CPU per call (``call_cycles``).
* **The objects' work at the node and at the client.** Three reference objects, each
  recorded in process (as ``record-object`` does) and run hosted at the node (and
  the first at the client): a ``count`` over small files (Python work per byte), a
  grep over many tiny objects (a local read each), a grep over one large object
  (64 KiB reads). Each hosted drain's wall time, less its console calls, is fitted
  to ``ratio x think + reads x L_request + blocks x L_block`` (non-negative least
  squares): the hosted-object overhead and a local read's cost at the node
  (``mobile_server_cpu_ratio``, ``local_request_cycles``, ``local_block_read_cycles``),
  and at the client the ``count``'s wall less its reads, per think second
  (``mobile_client_cpu_ratio``). Wall times, because a prediction is of wall time: on
  a shared machine they hold the waiting for a core that CPU clocks leave out.
* **Opening a connection**: a fresh run-time's first read over the link, less a later
  one (``connect_s``).
* **Per-message overhead.** The wall time of reads and console calls on the link in
  force, made back to back as a program makes them, less the link's own time (each
  call replayed through the link's token buckets, :mod:`shuttle.sim.link`, at the
  instant it was made) and the node's CPU: the client's and the node's own time per
  call (``rpc_overhead_s``, ``call_overhead_s``).
* **The link** as the live shaping has it: latency and bucket depth of the profile
  (``shuttle.net.profiles``); the bandwidth the shaper achieved for back-to-back
  64 KiB reads (:func:`achieved_bandwidth_bits_per_s`: at most the profile's); and
  the header bytes a request and a reply carry, counted on a shaped connection.
* **The disk**: reads of an object dropped from the page cache
  (``posix_fadvise(DONTNEED)`` on its file) against the same reads warm; recorded,
  and used when a prediction is asked for a cold start.

All CPU figures are stated at speed 1 (this machine): a node of CPU factor ``f``
burns ``1/f`` times its work (``shuttle.net.cpu``), so its measured costs are
multiplied by ``f``, and ``server_speed`` (``--cpu-factor``, default the node's own
factor) scales them back. The cycle counts are at ``cpu_reference_hz`` = this host's
clock, the speed of the machine the object traces are recorded on.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuttle.bench.corpus import CorpusSpec, generate_corpus
from shuttle.bench.objrecord import ObjectRun, record_stack
from shuttle.client.client import Client
from shuttle.client.connect import connect
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import ConfigError
from shuttle.net.profiles import LinkProfile, parse_link_profile
from shuttle.runtime.client import Runtime
from shuttle.runtime.refs import Ref
from shuttle.sim.config import ServerConfig, to_dict
from shuttle.sim.link import Link
from shuttle.traces.objtrace import ObjectTraceRecorder, host_info
from shuttle.traces.record import Op

#: The simulator's block for a live node: a page, so a read's per-byte cost is
#: charged to within 4 KiB (the node reads and sends whole requests, not blocks).
LIVE_BLOCK_BYTES = 4096
#: Reads of these sizes time the node's cost per request and per byte: one block,
#: and a grep's default read (``objects.lines.BLOCK_BYTES_DEFAULT``).
SMALL_BYTES = 512
LARGE_BYTES = 64 << 10
#: Repetitions of each timed call (after WARMUP_CALLS untimed): enough that the
#: node's CPU clock, read once before and once after, averages out.
CALLS = 200
WARMUP_CALLS = 10
#: On a shaped link a call may take most of a second (64 KiB at 1 Mbit/s); the
#: message measurements there stop after this much wall time per size.
LINK_BUDGET_S = 4.0
#: ... and the larger read there moves at most this much of the link's time.
LINK_READ_S = 0.05
#: The corpus of the ``think`` reference workload (below).
RATIO_CORPUS = CorpusSpec(files=48, median_bytes=16384, sigma=0.5, seed=7)
#: A ratio below this is a measurement disturbed by the machine, not an object that
#: runs faster hosted: it is clamped (and the raw figures kept beside it).
RATIO_MIN = 0.8
#: Fresh run-times whose first call times opening a connection.
CONNECT_SAMPLES = 3
#: A run of the reference grep is repeated this often; the cheapest run counts (the
#: least disturbed on a shared machine).
RATIO_RUNS = 3
#: Bytes of the object read cold for the disk figures (64 KiB reads).
DISK_BYTES = 4 << 20
#: A link profile that shapes nothing measurable but counts bytes.
COUNTING_LINK = "bw=1000Gbit,lat=0ms"


@dataclass
class Calibration:
    """What was measured, the configuration it gives, and how it was measured."""

    node: str
    link: LinkProfile
    node_cpu_factor: float
    server_speed: float
    measured: dict[str, Any] = field(default_factory=dict)

    def server_config(self) -> ServerConfig:
        """The simulator's configuration for this node and link."""
        m = self.measured
        hz = float(m["cpu_reference_hz"])
        f = self.node_cpu_factor  # measured costs at factor f, stated at speed 1

        def cycles(seconds: float) -> float:
            return max(0.0, seconds) * f * hz

        # The rate the live shaper achieved where it was measured, else the profile's.
        bw = m.get("link_bandwidth_bits_per_s", self.link.bandwidth_bits_per_s)
        disk = m.get("disk", {})
        return ServerConfig(
            block_size_bytes=LIVE_BLOCK_BYTES,
            cache_infinite=True,
            metadata_io_bytes=LIVE_BLOCK_BYTES,
            metadata_write_through=False,
            disk_seek_s=float(disk.get("seek_s", 0.0)),
            disk_bandwidth_bytes_per_s=float(disk.get("bandwidth_bytes_per_s", math.inf)),
            cpu_reference_hz=hz,
            server_speed=self.server_speed,
            client_speed=1.0,
            metadata_read_cycles=0.0,
            metadata_write_cycles=0.0,
            block_read_cycles=cycles(m["read_node_cpu_per_block_s"]),
            block_write_cycles=cycles(m["read_node_cpu_per_block_s"]),
            request_cycles=cycles(m["read_node_cpu_per_request_s"]),
            local_request_cycles=cycles(m["local_read_cpu_per_request_s"]),
            local_block_read_cycles=cycles(m["local_read_cpu_per_block_s"]),
            call_cycles=cycles(m["call_node_cpu_s"]),
            network_latency_s=self.link.latency_s,
            network_bandwidth_bits_per_s=math.inf if bw is None else bw,
            network_burst_bytes=self.link.effective_burst_bytes,
            network_exact_bytes=True,
            rpc_header_bytes=round(m["reply_header_bytes"]),
            rpc_request_header_bytes=round(m["request_header_bytes"]),
            rpc_overhead_s=max(0.0, m["rpc_overhead_s"]),
            call_overhead_s=max(0.0, m["call_overhead_s"]),
            connect_s=max(0.0, m.get("connect_s", 0.0)),
            mobile_footprint_bytes=0,
            client_request_bytes_max=16 << 20,
            client_cache_blocks=0,
            mobile_client_cpu_ratio=m["mobile_client_cpu_ratio"],
            mobile_server_cpu_ratio=m["mobile_server_cpu_ratio"],
            mobile_trace_speed=1.0,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "link": {"name": self.link.name, "spec": self.link.spec()},
            "node_cpu_factor": self.node_cpu_factor,
            "server_speed": self.server_speed,
            "measured": self.measured,
            "server": to_dict(self.server_config()),
        }

    def to_toml(self) -> str:
        """The ``[server]`` table ``shuttle sim`` commands read (``--config``), with
        what was measured as comments above it."""
        lines = [
            "# shuttle sim calibrate: the simulator's configuration for one live node.",
            f"# node {self.node} (CPU factor {self.node_cpu_factor:g}), link {self.link}",
            f"# modelled server speed {self.server_speed:g}; cycles at "
            f"{self.measured['cpu_reference_hz'] / 1e6:.0f} MHz (this host)",
        ]
        for key, value in sorted(self.measured.items()):
            if isinstance(value, float):
                lines.append(f"# {key} = {value:.6g}")
        lines.append("[server]")
        for key, value in to_dict(self.server_config()).items():
            if value is None:
                continue  # TOML has no null: an unset parameter is left out
            lines.append(f"{key} = {_toml_value(value)}")
        return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "inf"
    if isinstance(value, float):
        return repr(value)
    return str(value)


# --- clocks ---------------------------------------------------------------------------


def node_cpu_clock(entry_pid: int | None, node: str) -> Callable[[], float]:
    """The node process's CPU clock (seconds, all its threads).

    Raises :class:`ConfigError` when the node does not run on this machine (the
    cluster file records no pid, or the process is gone)."""
    if entry_pid is None:
        raise ConfigError(
            f"node {node} has no process id in the cluster file: calibration reads the "
            "node's CPU clock, so the node must run on this machine (start it with "
            "`shuttle cluster up`)"
        )
    clock_id = ((~entry_pid) << 3) | 2  # CPUCLOCK_SCHED of the whole process

    def read() -> float:
        try:
            return time.clock_gettime(clock_id)
        except OSError as exc:
            raise ConfigError(
                f"cannot read the CPU clock of node {node} (pid {entry_pid}): {exc}; "
                "is it running on this machine?"
            ) from None

    read()
    return read


@dataclass(frozen=True)
class Timed:
    """Per call: wall seconds (median and mean), node CPU, client CPU; and each call's
    start and wall time, warm-up calls first (``warmup`` of them)."""

    wall_s: float
    wall_mean_s: float
    node_cpu_s: float
    client_cpu_s: float
    calls: int
    starts: tuple[float, ...] = ()
    walls: tuple[float, ...] = ()
    warmup: int = 0

    def to_json(self) -> dict[str, float]:
        return {
            "wall_s": self.wall_s,
            "wall_mean_s": self.wall_mean_s,
            "node_cpu_s": self.node_cpu_s,
            "client_cpu_s": self.client_cpu_s,
            "calls": self.calls,
        }


#: Timed calls are made in this many batches; a CPU figure is the smallest batch's
#: per call, so a burst of the node's own background work (its planner's tick, a
#: digest) in one batch does not count as the calls' cost.
BATCHES = 3


def timed_calls(
    call: Callable[[], Any],
    node_cpu: Callable[[], float],
    *,
    calls: int = CALLS,
    budget_s: float | None = None,
) -> Timed:
    """Time ``call`` ``calls`` times, back to back as a program makes them, after a
    few untimed (their times are kept too: a link's bucket remembers them)."""
    starts: list[float] = []
    walls: list[float] = []

    def one() -> None:
        t = time.perf_counter()
        call()
        starts.append(t)
        walls.append(time.perf_counter() - t)

    for _ in range(WARMUP_CALLS):
        one()
    node_per_call: list[float] = []
    client_per_call: list[float] = []
    started = time.perf_counter()
    per_batch = max(1, calls // BATCHES)
    done = 0
    while done < calls:
        n0, c0 = node_cpu(), time.process_time()
        batch = 0
        while batch < per_batch and done < calls:
            one()
            batch += 1
            done += 1
            if budget_s is not None and time.perf_counter() - started > budget_s and done >= 5:
                calls = done
        node_per_call.append((node_cpu() - n0) / batch)
        client_per_call.append((time.process_time() - c0) / batch)
    timed = walls[WARMUP_CALLS:]
    return Timed(
        statistics.median(timed),
        statistics.fmean(timed),
        min(node_per_call),
        min(client_per_call),
        len(timed),
        tuple(starts),
        tuple(walls),
        WARMUP_CALLS,
    )


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
    bw = profile.bandwidth_bits_per_s if bandwidth_bits_per_s is None else bandwidth_bits_per_s
    link = Link(math.inf if bw is None else bw, profile.effective_burst_bytes, profile.latency_s)
    residuals = []
    for i, (start, wall) in enumerate(zip(timed.starts, timed.walls, strict=True)):
        arrive = link.up.transmit(start, up_bytes)
        back = link.down.transmit(arrive + node_s, down_bytes)
        if i >= timed.warmup:
            residuals.append(wall - (back - start))
    return statistics.fmean(residuals)


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


# --- the measurement ------------------------------------------------------------------


def _key_on(client: Client, node: str, prefix: str, name: str) -> str:
    """A key under ``prefix`` that the cluster places on ``node``."""
    for i in range(10_000):
        key = f"{prefix}{name}-{i}"
        if client.node_for(key).node_id == node:
            return key
    raise ConfigError(f"found no key that lands on node {node}")  # pragma: no cover


@contextlib.contextmanager
def _objects(client: Client, node: str, sizes: dict[str, int]) -> Iterator[dict[str, str]]:
    """Calibration objects of the given sizes on ``node``, removed afterwards."""
    prefix = f".shuttle-calibrate/{secrets.token_hex(4)}/"
    keys = {name: _key_on(client, node, prefix, name) for name in sizes}
    try:
        for name, size in sizes.items():
            client.put(keys[name], (b"shuttle calibrates a node.\n" * (size // 27 + 1))[:size])
        yield keys
    finally:
        for key in keys.values():
            with contextlib.suppress(Exception):
                client.remove(key)


def _drain(ref: Ref) -> None:
    done = False
    while not done:
        done, _ = ref.next()


def calibrate(
    cluster: Path,
    *,
    node: str | None = None,
    link: str | None = None,
    cpu_factor: float | None = None,
    disk: bool = True,
    calls: int = CALLS,
    ratio_runs: int = RATIO_RUNS,
    progress: Callable[[str], None] = lambda _m: None,
) -> Calibration:
    """Measure node ``node`` (default: the cluster's first) of ``cluster`` over
    ``link`` (default: the cluster file's link for it); model it at ``cpu_factor``
    (default: the node's own factor). ``calls``: repetitions of each timed call;
    ``ratio_runs``: runs of the hosted-overhead reference (fewer: quicker, noisier)."""
    info = ClusterFile.load(cluster)
    entries = {e.id: e for e in info.nodes}
    node_id = node or info.nodes[0].id
    if node_id not in entries:
        raise ConfigError(f"no node {node_id!r} in {cluster}; its nodes: {', '.join(entries)}")
    entry = entries[node_id]
    node_cpu = node_cpu_clock(entry.pid, node_id)
    measured: dict[str, Any] = {"host": host_info()}
    mhz = float(measured["host"]["cpu_mhz"]) or 1000.0
    measured["cpu_reference_hz"] = mhz * 1e6

    with connect(cluster=cluster, link=link) as shaped:
        target = next(n for n in shaped.nodes if n.node_id == node_id)
        profile = target.link or parse_link_profile("loopback")
    # Objects are put and the disk is timed over loopback: the link is measured apart.
    with connect(cluster=cluster, link="loopback") as client:
        target = next(n for n in client.nodes if n.node_id == node_id)
        factor = float(client.node_stats(target).get("cpu", {}).get("factor", entry.cpu_factor))
        speed = factor if cpu_factor is None else cpu_factor
        measured["node_cpu_factor"] = factor
        sizes = {"small": SMALL_BYTES, "large": LARGE_BYTES, "blocks": DISK_BYTES}
        progress("writing the calibration objects")
        with _objects(client, node_id, sizes) as keys, _workloads(client, node_id) as work:
            work["bytes"] = [keys["blocks"]]
            # The node's CPU and the run-time's costs: over loopback, where the link
            # adds nothing.
            with Runtime.connect(cluster, link="loopback") as rt:
                progress("remote reads (loopback): node CPU per request and per block")
                sources = _read_sources(work, keys, LARGE_BYTES)
                cpu_reads = _reads(rt, node_id, sources, node_cpu, link=None, calls=calls)
                progress("console calls to an object at the node (loopback)")
                cpu_call = _calls(rt, node_id, node_cpu, link=None, calls=calls)
                progress("reference objects in process, at the client and at the node")
                runs = _reference_runs(rt, node_id, work, node_cpu, runs=ratio_runs)
            measured["reads_loopback"] = {k: v.to_json() for k, v in cpu_reads.items()}
            measured["call_loopback"] = cpu_call.to_json()
            measured["reference_runs"] = runs
            per_block = (cpu_reads["large"].node_cpu_s - cpu_reads["small"].node_cpu_s) / (
                LARGE_BYTES // LIVE_BLOCK_BYTES - 1
            )
            measured["read_node_cpu_per_block_s"] = max(0.0, per_block)
            measured["read_node_cpu_per_request_s"] = cpu_reads["small"].node_cpu_s - per_block
            measured["call_node_cpu_loopback_s"] = cpu_call.node_cpu_s
            measured.update(_fit_hosted(runs, cpu_reads, cpu_call, factor))
            # Header bytes, counted on a shaped connection that adds no delay.
            with Runtime.connect(cluster, link=COUNTING_LINK) as rt:
                progress("header bytes of a request and a reply")
                measured.update(_header_bytes(rt, node_id, keys))
            # The link in force: what a message costs beyond the model's link time.
            progress(f"opening a connection over {profile.name}")
            measured["connect_s"] = _connect_s(cluster, link, node_id, keys["small"])
            with Runtime.connect(cluster, link=link) as rt:
                progress(f"per-message overhead on {profile.name}")
                link_large = _link_large_bytes(profile)
                on_link = _reads(rt, node_id, _read_sources(work, keys, link_large), node_cpu,
                                 link=profile, calls=calls)  # fmt: skip
                call_on_link = _calls(rt, node_id, node_cpu, link=profile, calls=calls)
            measured["reads_link"] = {k: v.to_json() for k, v in on_link.items()}
            measured["call_link"] = call_on_link.to_json()
            # Only the small reads count: a large one's client work overlaps the
            # transfer (the link is busy meanwhile), which the model's bucket has.
            request, reply = measured["request_header_bytes"], measured["reply_header_bytes"]
            small_node_s = (
                measured["read_node_cpu_per_request_s"] + measured["read_node_cpu_per_block_s"]
            )
            measured["rpc_overhead_s"] = link_residual_s(
                on_link["small"], profile, request, reply + TINY_BYTES, small_node_s
            )
            large_node_s = measured["read_node_cpu_per_request_s"] + measured[
                "read_node_cpu_per_block_s"
            ] * math.ceil(link_large / LIVE_BLOCK_BYTES)
            large = (on_link["large"], profile, request, reply + link_large, large_node_s)
            measured["rpc_overhead_large_s"] = link_residual_s(*large)
            # What the large reads took beyond a small one's residual is the shaper
            # moving fewer bytes a second than its profile: the model gets the rate
            # achieved (lan on a loaded machine: 13-30 % slow, issue 24).
            achieved = achieved_bandwidth_bits_per_s(*large, measured["rpc_overhead_s"])
            if achieved is not None:
                measured["link_bandwidth_bits_per_s"] = achieved
            # A console call's node CPU as the link paces it (calls spaced by the link
            # cost the node more than back-to-back ones on loopback: colder caches).
            measured["call_node_cpu_s"] = call_on_link.node_cpu_s
            measured["call_overhead_s"] = link_residual_s(
                call_on_link,
                profile,
                request + measured["call_request_bytes"],
                reply + measured["call_reply_bytes"],
                measured["call_node_cpu_s"],
            )
            if disk:
                progress("disk: cold reads against warm")
                measured["disk"] = _disk(client, keys["blocks"])
    return Calibration(node_id, profile, factor, speed, measured)


#: Where the timed reads read: ``(keys, bytes of each object, bytes per read)``. The
#: reads go round the keys, and through each key's bytes, so each touches other data
#: as a program's do (one key read again and again is faster than a program's reads:
#: hot in every cache).
ReadSources = dict[str, tuple[list[str], int, int]]


def _read_sources(work: dict[str, list[str]], keys: dict[str, str], large: int) -> ReadSources:
    return {
        "small": (work["requests"], TINY_BYTES, TINY_BYTES),
        "large": ([keys["blocks"]], DISK_BYTES, large),
    }


def _reads(
    rt: Runtime,
    node: str,
    sources: ReadSources,
    node_cpu: Callable[[], float],
    *,
    link: LinkProfile | None,
    calls: int,
) -> dict[str, Timed]:
    """Timed reads of each source, round its keys and through their bytes."""
    storage = rt.storage(node)
    out = {}
    budget = LINK_BUDGET_S if link is not None and not link.is_unshaped else None
    with rt.console("calibrate"):
        for name, (names, object_bytes, size) in sources.items():
            spots = [(k, offset) for k in names for offset in range(0, object_bytes, size)]

            read = _round_robin(storage, spots, size)
            out[name] = timed_calls(read, node_cpu, calls=calls, budget_s=budget)
    return out


def _round_robin(storage: Ref, spots: list[tuple[str, int]], size: int) -> Callable[[], Any]:
    """A read of ``size`` bytes at the next of ``spots`` (key, offset), round and round."""
    turn = itertools.count()

    def read() -> Any:
        key, offset = spots[next(turn) % len(spots)]
        return storage.read(key, offset, size)

    return read


def _link_large_bytes(link: LinkProfile) -> int:
    """The larger read timed on a link: 64 KiB, or what the link moves in
    :data:`LINK_READ_S` if less (a 1 Mbit/s link takes half a second for 64 KiB)."""
    rate = link.bandwidth_bytes_per_s
    if rate is None:
        return LARGE_BYTES
    return max(2 * SMALL_BYTES, min(LARGE_BYTES, int(rate * LINK_READ_S)))


def _calls(
    rt: Runtime,
    node: str,
    node_cpu: Callable[[], float],
    *,
    link: LinkProfile | None,
    calls: int,
) -> Timed:
    grep = rt.create(
        "grep", at=node, placement="static", pattern="x", storage=rt.storage(node), keys=[]
    )
    budget = LINK_BUDGET_S if link is not None and not link.is_unshaped else None
    try:
        with rt.console("calibrate"):
            return timed_calls(grep.progress, node_cpu, calls=calls, budget_s=budget)
    finally:
        rt.destroy(grep)


def _header_bytes(rt: Runtime, node: str, keys: dict[str, str]) -> dict[str, float]:
    """Bytes a read's request and reply carry besides the data, and a console call's,
    from the shaped connection's counters."""
    from shuttle.runtime import values

    storage = rt.storage(node)
    n = 20
    with rt.console("calibrate"):
        storage.read(keys["small"], 0, LARGE_BYTES)  # the connection exists from here
        link = rt.peers.connection(node).link
        if link is None:  # pragma: no cover - the counting profile always shapes
            raise ConfigError("the counting link was not shaped")
        up0, down0 = link.up.counters.bytes, link.down.counters.bytes
        for _ in range(n):
            storage.read(keys["small"], 0, LARGE_BYTES)
        up, down = link.up.counters.bytes - up0, link.down.counters.bytes - down0
        grep = rt.create("grep", at=node, placement="static", pattern="x", storage=storage, keys=[])
        try:
            result = grep.progress()
            up1, down1 = link.up.counters.bytes, link.down.counters.bytes
            for _ in range(n):
                grep.progress()
            call_up = link.up.counters.bytes - up1
            call_down = link.down.counters.bytes - down1
        finally:
            rt.destroy(grep)
    request = up / n
    reply = down / n - SMALL_BYTES
    args = len(values.pack([[], {}]))
    answer = len(values.pack(result))
    call_request = call_up / n - args
    call_reply = call_down / n - answer
    return {
        "read_request_header_bytes": request,
        "read_reply_header_bytes": reply,
        "call_request_header_bytes": call_request,
        "call_reply_header_bytes": call_reply,
        "request_header_bytes": (request + call_request) / 2,
        "reply_header_bytes": (reply + call_reply) / 2,
        "call_request_bytes": float(args),
        "call_reply_bytes": float(answer),
    }


def _disk(client: Client, key: str) -> dict[str, Any]:
    """Reads of ``key`` 64 KiB at a time through the node, cold (the node's block cache
    and the page cache of its file dropped: ``Client.drop_caches``) against warm: the
    disk's time per read."""
    reads = DISK_BYTES // LARGE_BYTES

    def read_all() -> float:
        started = time.perf_counter()
        for offset in range(0, DISK_BYTES, LARGE_BYTES):
            client.read(key, offset, LARGE_BYTES)
        return time.perf_counter() - started

    warm = min(read_all() for _ in range(2))
    client.drop_caches([key])
    cold = read_all()
    per_read = max(0.0, (cold - warm) / reads)
    return {
        "reads": reads,
        "warm_s": warm,
        "cold_s": cold,
        "per_read_s": per_read,
        "seek_s": 0.0,
        "bandwidth_bytes_per_s": LARGE_BYTES / per_read if per_read > 0 else math.inf,
    }


def _object_think_s(rec: ObjectTraceRecorder) -> float:
    """The object's own CPU in a recording: every gap but the console's (before a call)."""
    total = 0.0
    previous = 0.0
    for r in rec.records:
        if r.op is not Op.CALL:
            total += r.time - previous
        previous = r.time
    return total


# --- the hosted objects: reference runs and their fit -----------------------------------

#: The reference workloads: each makes one of the hosted costs dominate, so the three
#: are well told apart. ``think``: count of the lines matching a vowel over small files
#: (its Python work per line dominates); ``requests``: a grep over many tiny objects
#: (a local read each); ``bytes``: a grep over one large object (64 KiB reads). The
#: greps' pattern never matches generated text (no word repeats a letter ten times).
REFERENCE_PATTERN = "qqqqqqqqqq"
THINK_PATTERN = "[aeiou]"
TINY_OBJECTS = 400
TINY_BYTES = 64


@contextlib.contextmanager
def _workloads(client: Client, node: str) -> Iterator[dict[str, list[str]]]:
    """The reference workloads' objects on ``node`` (``bytes`` is added by the caller),
    removed afterwards."""
    prefix = f".shuttle-calibrate/{secrets.token_hex(4)}/"
    made: list[str] = []
    work: dict[str, list[str]] = {"think": [], "requests": []}
    try:
        for i, (_name, data) in enumerate(generate_corpus(RATIO_CORPUS)):
            key = _key_on(client, node, prefix + "think/", f"{i:04d}")
            client.put(key, data)
            made.append(key)
            work["think"].append(key)
        tiny = b"calibrate\n" * (TINY_BYTES // 10)
        for i in range(TINY_OBJECTS):
            key = _key_on(client, node, prefix + "tiny/", f"{i:04d}")
            client.put(key, tiny)
            made.append(key)
            work["requests"].append(key)
        yield work
    finally:
        with contextlib.suppress(Exception):
            client.remove_many(made)


def _reference_object(name: str, keys: list[str]) -> ObjectRun:
    if name == "think":
        # Counting the lines that match a pattern most lines match: Python work on
        # every line (``matching_lines``), and a few numbers as the answer.
        return ObjectRun("count", keys, {"pattern": THINK_PATTERN})
    return ObjectRun("grep", keys, {"pattern": REFERENCE_PATTERN})


def _reference_runs(
    rt: Runtime,
    node: str,
    work: dict[str, list[str]],
    node_cpu: Callable[[], float],
    *,
    runs: int,
) -> dict[str, dict[str, float]]:
    """Each workload recorded in process (think, reads, blocks, calls), hosted at the
    node (wall and node CPU of its drain) and, for ``think``, hosted at the client
    (wall of its drain): the median of ``runs`` interleaved runs of each."""
    samples: dict[str, dict[str, list[float]]] = {}
    for _ in range(runs):
        for name, keys in work.items():
            run = _reference_object(name, keys)
            rec = ObjectTraceRecorder(time.thread_time)
            record_stack(rt, run, node, list(keys), rec)
            blocks = sum(
                max(1, math.ceil(r.size / LIVE_BLOCK_BYTES)) for r in rec.records if r.op is Op.READ
            )
            got = samples.setdefault(name, {})
            for key, value in (
                ("think_s", _object_think_s(rec)),
                ("reads", float(rec.storage_calls)),
                ("blocks", float(blocks)),
                ("calls", float(rec.console_calls)),
                ("bytes", float(rec.bytes_read)),
            ):
                got.setdefault(key, []).append(value)
            sites = ("node", "client") if name == "think" else ("node",)
            for site in sites:
                ref = rt.create(
                    run.kind,
                    at=node if site == "node" else None,
                    placement="static",
                    **run.object_params(rt.storage(node), list(keys)),
                )
                try:
                    n0, w0 = node_cpu(), time.perf_counter()
                    with rt.console("calibrate"):
                        _drain(ref)
                    got.setdefault(f"{site}_wall_s", []).append(time.perf_counter() - w0)
                    got.setdefault(f"{site}_node_cpu_s", []).append(node_cpu() - n0)
                finally:
                    rt.destroy(ref)
    return {
        name: {key: statistics.median(values) for key, values in got.items()}
        for name, got in samples.items()
    }


def _nnls3(rows: list[list[float]], y: list[float]) -> list[float]:
    """Least squares with non-negative unknowns, for a handful of them: the best of
    the unconstrained solutions over every subset of unknowns left free."""
    import itertools

    import numpy as np

    a = np.asarray(rows, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    n = a.shape[1]
    best: tuple[float, list[float]] | None = None
    for k in range(n, 0, -1):
        for free in itertools.combinations(range(n), k):
            x_free, *_ = np.linalg.lstsq(a[:, free], b, rcond=None)
            if (x_free < 0).any():
                continue
            x = [0.0] * n
            for i, v in zip(free, x_free.tolist(), strict=True):
                x[i] = v
            residual = float(np.sum((a @ np.asarray(x) - b) ** 2))
            if best is None or residual < best[0]:
                best = (residual, x)
    return best[1] if best is not None else [0.0] * n


def _fit_hosted(
    runs: dict[str, dict[str, float]],
    reads: dict[str, Timed],
    call: Timed,
    factor: float,
) -> dict[str, Any]:
    """The hosted costs from the reference runs' wall times (what a prediction is of):

    * at the node, each drain's wall less its console calls (each a loopback call's
      wall) is the object's work there: ``ratio x think + reads x L_request + blocks x
      L_block``, fitted over the three workloads (non-negative least squares);
    * at the client, the ``think`` drain's wall less its reads (each a loopback read's
      wall, by its blocks) is ``ratio x think``.

    Node figures are at the node's factor; the configuration states them at speed 1."""
    names = ("think", "requests", "bytes")
    rows, y = [], []
    for name in names:
        r = runs[name]
        rows.append([r["think_s"], r["reads"], r["blocks"]])
        y.append(r["node_wall_s"] - r["calls"] * call.wall_mean_s)
    ratio_s, l_request, l_block = _nnls3(rows, y)
    small, large = reads["small"].wall_mean_s, reads["large"].wall_mean_s
    per_block = max(0.0, (large - small) / (LARGE_BYTES // LIVE_BLOCK_BYTES - 1))
    think = runs["think"]
    read_wall = think["reads"] * (small - per_block) + think["blocks"] * per_block
    client_object_s = think["client_wall_s"] - read_wall - think["calls"] * 0.0
    return {
        "hosted_fit": {"rows": rows, "y": y},
        # What the node's work costs at its factor, per think second / read / block.
        "mobile_server_cpu_ratio_at_factor": ratio_s,
        "local_read_cpu_per_request_s": l_request,
        "local_read_cpu_per_block_s": l_block,
        "mobile_server_cpu_ratio": max(RATIO_MIN, ratio_s * factor),
        "mobile_client_cpu_ratio": max(RATIO_MIN, client_object_s / think["think_s"]),
        "client_object_wall_s": client_object_s,
    }


def _connect_s(cluster: Path, link: str | None, node: str, key: str) -> float:
    """What a program's first call to the node costs beyond a later one: dialling,
    the challenge and the proof (median of a few fresh run-times)."""
    firsts, laters = [], []
    for _ in range(CONNECT_SAMPLES):
        with Runtime.connect(cluster, link=link) as rt:
            storage = rt.storage(node)
            with rt.console("calibrate"):
                t = time.perf_counter()
                storage.read(key, 0, SMALL_BYTES)
                firsts.append(time.perf_counter() - t)
                for _ in range(3):
                    t = time.perf_counter()
                    storage.read(key, 0, SMALL_BYTES)
                    laters.append(time.perf_counter() - t)
    return max(0.0, statistics.median(firsts) - statistics.median(laters))
