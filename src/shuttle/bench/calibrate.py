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
* **A local read** (an object at the node reading through the node's own storage
  object): ``filter`` objects at the node reading small and 64 KiB blocks, less the
  call (``local_request_cycles``, ``local_block_read_cycles``).
* **The hosted-object overhead**: a CPU-heavy grep over a small generated corpus, run
  in process (as ``record-object`` records), hosted at the client and hosted at the
  node; what the hosted runs cost beyond their reads and calls, per CPU second in
  process (``mobile_client_cpu_ratio``, ``mobile_server_cpu_ratio``).
* **Per-message overhead.** The wall time of a read and of a console call on the link
  in force, with the link's bucket full before each, less the link's own time (the
  token bucket's closed form) and the node's CPU: the client's and the node's own
  time per call (``rpc_overhead_s``, ``call_overhead_s``).
* **The link** as the live shaping has it: bandwidth, latency and bucket depth of the
  profile (``shuttle.net.profiles``), and the header bytes a request and a reply
  carry, counted on a shaped connection.
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
#: The hosted-object overhead's reference work is a ``count`` (its Python work per
#: byte outweighs its reads, so the ratio is well determined, and it answers a few
#: numbers, so no result is walked or packed) over a generated corpus of this shape.
RATIO_CORPUS = CorpusSpec(files=48, median_bytes=16384, sigma=0.5, seed=7)
#: A ratio below this is a measurement disturbed by the machine, not an object that
#: runs faster hosted: it is clamped (and the raw figures kept beside it).
RATIO_MIN = 0.8
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

        bw = self.link.bandwidth_bits_per_s
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
            rpc_header_bytes=round(m["header_bytes"]),
            rpc_overhead_s=max(0.0, m["rpc_overhead_s"]),
            call_overhead_s=max(0.0, m["call_overhead_s"]),
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
    """Per call: wall seconds (median and mean), node CPU, client CPU."""

    wall_s: float
    wall_mean_s: float
    node_cpu_s: float
    client_cpu_s: float
    calls: int

    def to_json(self) -> dict[str, float]:
        return dict(self.__dict__)


def timed_calls(
    call: Callable[[], Any],
    node_cpu: Callable[[], float],
    *,
    calls: int = CALLS,
    gap_s: float = 0.0,
    budget_s: float | None = None,
) -> Timed:
    """Time ``call`` ``calls`` times (after a few untimed), ``gap_s`` apart."""
    for _ in range(WARMUP_CALLS):
        call()
    walls: list[float] = []
    n0, c0 = node_cpu(), time.process_time()
    started = time.perf_counter()
    for _ in range(calls):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter()
        call()
        walls.append(time.perf_counter() - t)
        if budget_s is not None and time.perf_counter() - started > budget_s and len(walls) >= 5:
            break
    n = len(walls)
    return Timed(
        statistics.median(walls),
        statistics.fmean(walls),
        (node_cpu() - n0) / n,
        (time.process_time() - c0) / n,
        n,
    )


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


@contextlib.contextmanager
def _corpus(client: Client, node: str, spec: CorpusSpec) -> Iterator[list[str]]:
    prefix = f".shuttle-calibrate/{secrets.token_hex(4)}/corpus/"
    keys = []
    try:
        for i, (_name, data) in enumerate(generate_corpus(spec)):
            key = _key_on(client, node, prefix, f"{i:04d}")
            client.put(key, data)
            keys.append(key)
        yield keys
    finally:
        for key in keys:
            with contextlib.suppress(Exception):
                client.remove(key)


def _drain(ref: Ref) -> None:
    done = False
    while not done:
        done, _ = ref.next()


def _bucket_gap_s(link: LinkProfile) -> float:
    """Idle time that refills the link's bucket (twice its depth at the rate)."""
    rate = link.bandwidth_bytes_per_s
    if rate is None:
        return 0.0
    return 2.0 * link.effective_burst_bytes / rate


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
        with _objects(client, node_id, sizes) as keys:
            # Everything that is CPU: over loopback (the link adds only waiting).
            with Runtime.connect(cluster, link="loopback") as rt:
                progress("node CPU per read (loopback)")
                cpu_reads = _reads(rt, node_id, keys, node_cpu, link=None, calls=calls)
                progress("node CPU per console call (loopback)")
                cpu_call = _calls(rt, node_id, node_cpu, link=None, calls=calls)
                progress("local reads at the node")
                local = _local_reads(rt, node_id, keys, node_cpu, calls=calls)
            measured["reads_loopback"] = {k: v.to_json() for k, v in cpu_reads.items()}
            measured["call_loopback"] = cpu_call.to_json()
            measured["local_reads"] = {k: v.to_json() for k, v in local.items()}
            per_block = (cpu_reads["large"].node_cpu_s - cpu_reads["small"].node_cpu_s) / (
                LARGE_BYTES // LIVE_BLOCK_BYTES - 1
            )
            measured["read_node_cpu_per_block_s"] = max(0.0, per_block)
            measured["read_node_cpu_per_request_s"] = cpu_reads["small"].node_cpu_s - per_block
            measured["call_node_cpu_s"] = cpu_call.node_cpu_s
            local_block = (local["large"].node_cpu_s - local["small"].node_cpu_s) / (
                LARGE_BYTES // LIVE_BLOCK_BYTES - 1
            )
            measured["local_read_cpu_per_block_s"] = max(0.0, local_block)
            measured["local_read_cpu_per_request_s"] = max(
                0.0, local["small"].node_cpu_s - cpu_call.node_cpu_s - local_block
            )
            # Header bytes, counted on a shaped connection that adds no delay.
            with Runtime.connect(cluster, link=COUNTING_LINK) as rt:
                progress("header bytes of a request and a reply")
                measured.update(_header_bytes(rt, node_id, keys))
            # The link in force: what a message costs beyond the model's link time.
            with Runtime.connect(cluster, link=link) as rt:
                progress(f"per-message overhead on {profile.name}")
                on_link = _reads(rt, node_id, keys, node_cpu, link=profile, calls=calls)
                call_on_link = _calls(rt, node_id, node_cpu, link=profile, calls=calls)
            measured["reads_link"] = {k: v.to_json() for k, v in on_link.items()}
            measured["call_link"] = call_on_link.to_json()
            header = measured["header_bytes"]
            residuals = []
            for name, timed in on_link.items():
                size = sizes[name]
                link_s = profile.transfer_time_s(header) + profile.transfer_time_s(header + size)
                node_s = measured["read_node_cpu_per_request_s"] + measured[
                    "read_node_cpu_per_block_s"
                ] * max(1, math.ceil(size / LIVE_BLOCK_BYTES))
                residuals.append(timed.wall_mean_s - link_s - node_s)
            measured["rpc_overhead_s"] = statistics.fmean(residuals)
            call_link_s = profile.transfer_time_s(
                header + measured["call_request_bytes"]
            ) + profile.transfer_time_s(header + measured["call_reply_bytes"])
            measured["call_overhead_s"] = (
                call_on_link.wall_mean_s - call_link_s - measured["call_node_cpu_s"]
            )
            if disk:
                progress("disk: cold reads against warm")
                measured["disk"] = _disk(client, keys["blocks"])
        progress("hosted-object overhead (a CPU-heavy grep, three ways)")
        with _corpus(client, node_id, RATIO_CORPUS) as corpus:
            measured.update(_ratios(cluster, node_id, corpus, node_cpu, measured, ratio_runs))
    return Calibration(node_id, profile, factor, speed, measured)


def _reads(
    rt: Runtime,
    node: str,
    keys: dict[str, str],
    node_cpu: Callable[[], float],
    *,
    link: LinkProfile | None,
    calls: int,
) -> dict[str, Timed]:
    storage = rt.storage(node)
    out = {}
    gap = _bucket_gap_s(link) if link is not None else 0.0
    budget = LINK_BUDGET_S if link is not None and not link.is_unshaped else None
    with rt.console("calibrate"):
        for name in ("small", "large"):
            key = keys[name]
            out[name] = timed_calls(
                lambda key=key: storage.read(key, 0, LARGE_BYTES),  # type: ignore[misc]
                node_cpu,
                calls=calls,
                gap_s=gap,
                budget_s=budget,
            )
    return out


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
    gap = _bucket_gap_s(link) if link is not None else 0.0
    budget = LINK_BUDGET_S if link is not None and not link.is_unshaped else None
    try:
        with rt.console("calibrate"):
            return timed_calls(grep.progress, node_cpu, calls=calls, gap_s=gap, budget_s=budget)
    finally:
        rt.destroy(grep)


def _local_reads(
    rt: Runtime, node: str, keys: dict[str, str], node_cpu: Callable[[], float], *, calls: int
) -> dict[str, Timed]:
    """Console calls to a filter at the node, each making one local read."""
    out = {}
    for name, block in (("small", SMALL_BYTES), ("large", LARGE_BYTES)):
        ref = rt.create(
            "filter",
            at=node,
            placement="static",
            storage=rt.storage(node),
            key=keys["blocks"],
            pass_fraction=0.0,
            block_bytes=block,
        )
        try:
            with rt.console("calibrate"):
                n = min(calls, DISK_BYTES // block - WARMUP_CALLS)
                out[name] = timed_calls(ref.next, node_cpu, calls=n)
        finally:
            rt.destroy(ref)
    return out


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
        "header_bytes": statistics.fmean([request, reply, call_request, call_reply]),
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


def _ratios(
    cluster: Path,
    node: str,
    corpus: list[str],
    node_cpu: Callable[[], float],
    measured: dict[str, Any],
    runs: int,
) -> dict[str, Any]:
    """The hosted-object overhead at the client and at the node: a CPU-heavy ``count``
    (it splits every line into words, and answers a few numbers) in process, hosted at
    the client and hosted at the node (over loopback), each compared with what its
    reads and calls cost there. The cheapest of a few runs counts."""
    run = ObjectRun("count", list(corpus))
    best: dict[str, float] = {}
    per_read_client = statistics.fmean(
        r["client_cpu_s"] for r in measured["reads_loopback"].values()
    )
    with Runtime.connect(cluster, link="loopback") as rt:
        for _ in range(runs):
            rec = ObjectTraceRecorder(time.thread_time)
            record_stack(rt, run, node, list(corpus), rec)
            best["think_s"] = min(best.get("think_s", math.inf), _object_think_s(rec))
            reads, calls = rec.storage_calls, rec.console_calls
            # Hosted at the client: the process's CPU beyond its reads' client CPU.
            ref = rt.create("count", placement="static", storage=rt.storage(node),
                            keys=list(corpus))  # fmt: skip
            c0 = time.process_time()
            with rt.console("calibrate"):
                _drain(ref)
            client_s = time.process_time() - c0 - reads * per_read_client
            rt.destroy(ref)
            best["client_s"] = min(best.get("client_s", math.inf), client_s)
            # Hosted at the node: the node's CPU beyond its local reads and calls.
            ref = rt.create("count", at=node, placement="static", storage=rt.storage(node),
                            keys=list(corpus))  # fmt: skip
            n0 = node_cpu()
            with rt.console("calibrate"):
                _drain(ref)
            node_s = node_cpu() - n0
            rt.destroy(ref)
            blocks = sum(
                max(1, math.ceil(r.size / LIVE_BLOCK_BYTES)) for r in rec.records if r.op is Op.READ
            )
            node_s -= (
                calls * measured["call_node_cpu_s"]
                + reads * measured["local_read_cpu_per_request_s"]
                + blocks * measured["local_read_cpu_per_block_s"]
            )
            best["server_s"] = min(best.get("server_s", math.inf), node_s)
    factor = float(measured["node_cpu_factor"])
    think = best["think_s"]
    return {
        "ratio_object": "count",
        "ratio_think_s": think,
        "ratio_client_object_cpu_s": best["client_s"],
        "ratio_server_object_cpu_s": best["server_s"],
        "mobile_client_cpu_ratio": max(RATIO_MIN, best["client_s"] / think),
        # The node burns 1/f of the work: stated at speed 1.
        "mobile_server_cpu_ratio": max(RATIO_MIN, best["server_s"] * factor / think),
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
