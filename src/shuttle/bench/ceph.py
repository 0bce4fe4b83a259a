"""``shuttle bench ceph netrand|stream``: a node on the RADOS store against a node on
local files and against librados directly, in the same run (issue 12).

One local Ceph (:class:`shuttle.cluster.ceph.LocalCeph`) and, beside it, two nodes on
loopback: one storing its objects in the Ceph pool (``shuttle serve --store
rados:POOL``) and one on local files. The same bytes go into both nodes and, as one
RADOS object, into the pool for librados. Modes run interleaved, round by round, so
drift on a shared machine hits them all alike.

* ``netrand``: random 4 KiB reads (the paper's generator), client cache off, each mode
  warm (the round before read the same pages): per-read latency percentiles.
* ``stream``: the whole object in 1 MiB reads: the nodes with ``Client.iter_read``
  (``window`` reads in flight), librados with one 1 MiB read at a time and with the
  same window of asynchronous reads. The report also gives each node's ratio run by
  run (against the windowed librados run beside it) and the most reads the RADOS node
  had waiting on RADOS at once (``reads_in_flight_peak``).

``netrand`` times a RADOS node once its probation is over (its warm reads then ask
RADOS nothing) and reports how the node answered its timed reads: its counters
(``rados_counters``: inline hits, validations, cold reads, cache hits and misses, per
round), each pass's p50 round by round, and the ratios paired by round.

Targets: issue 12, the RADOS-backed node within 1.5× of librados's throughput
(``stream``); issue 26, its warm 4 KiB p50 within 2× the file node's when the object
fits the node's block cache, within 1.0× librados's when it does not (``netrand``).
When this build's ``shuttle serve`` has no RADOS store yet, the report says so and
compares the file-backed node with librados only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shuttle.bench.netrand import GENERATORS, Samples, make_file, timed_run
from shuttle.bench.session import scratch_dir
from shuttle.client.client import Client
from shuttle.client.connect import connect
from shuttle.cluster import local
from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import CephInfo
from shuttle.cluster.cephclient import connect as rados_connect
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import ConfigError

KEY = "bench/ceph.dat"
#: The mode, and the RADOS namespace, of the node started from ``--compare SRC``.
COMPARE_MODE = "rados_node_compare"
COMPARE_NAMESPACE = "compare"
OID = "bench-ceph-direct"
PAGE_BYTES = 4096
PIECE_BYTES = 1 << 20
#: The issue's target: the RADOS-backed node within this factor of librados.
TARGET_RATIO = 1.5
#: RADOS write size when loading the object (the OSD's default max write is 90 MiB).
LOAD_BYTES = 4 << 20

Progress = Callable[[str], None]


@dataclass
class Stand:
    """The benchmark's Ceph, its nodes and clients, and librados on the same pool."""

    info: CephInfo
    ioctx: Any
    #: Clients by mode name: ``file_node`` and, when this build has it, ``rados_node``.
    clients: dict[str, Client] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    #: Each node's process id, by mode (its CPU is read from /proc around each pass).
    pids: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def stand(
    osds: int,
    progress: Progress,
    workdir: Path | None = None,
    compare_src: Path | None = None,
    node_cache_bytes: int | None = None,
    node_block_bytes: int | None = None,
    **client_options: Any,
) -> Iterator[Stand]:
    """Start Ceph and the two nodes; yield them with clients; tear it all down.

    ``compare_src``: also start a RADOS node (mode ``rados_node_compare``) from another
    checkout's ``src`` folder, on a namespace of its own in the same pool, so that two
    versions of the node are measured in one run, interleaved. ``node_cache_bytes``:
    every node's block cache (None: the node's default); ``node_block_bytes``: its
    block size (None: the node's default, 4 KiB)."""
    block_args = [] if node_block_bytes is None else ["--cache-block-bytes", str(node_block_bytes)]
    scratch = scratch_dir("shuttle-bench-ceph-", workdir)
    ceph = LocalCeph(scratch / "ceph", osds=osds)
    clusters: list[ClusterFile] = []
    rados = None
    try:
        progress(f"starting a local Ceph ({osds} OSDs)")
        info = ceph.start()
        rados = rados_connect(info.conf_path, info.keyring_path, op_timeout_s=60)
        ioctx = rados.open_ioctx(info.pool)
        bench = Stand(info, ioctx)
        with contextlib.ExitStack() as stack:
            progress("starting a node on local files")
            file_cluster = local.up(
                scratch / "file", nodes=1, cache_bytes=node_cache_bytes, node_args=block_args
            )
            clusters.append(file_cluster)
            assert file_cluster.path is not None
            bench.clients["file_node"] = stack.enter_context(
                connect(cluster=file_cluster.path, **client_options)
            )
            _note_pid(bench, "file_node", file_cluster)
            if has_rados_store():
                if compare_src is not None:
                    # First: with --no-wait-for-trust, this node's probation then ends
                    # before the other's, which favours the code compared against.
                    progress(f"starting a RADOS node from {compare_src}")
                    bench.clients[COMPARE_MODE] = stack.enter_context(
                        connect(
                            cluster=_compare_cluster(
                                scratch,
                                info,
                                compare_src,
                                clusters,
                                node_cache_bytes,
                                block_args,
                            ),
                            **client_options,
                        )
                    )
                    _note_pid(bench, COMPARE_MODE, clusters[-1])
                progress(f"starting a node on the RADOS pool {info.pool}")
                rados_cluster = local.up(
                    scratch / "rados",
                    nodes=1,
                    node_args=[*info.store_args(), *block_args],
                    cache_bytes=node_cache_bytes,
                )
                clusters.append(rados_cluster)
                assert rados_cluster.path is not None
                bench.clients["rados_node"] = stack.enter_context(
                    connect(cluster=rados_cluster.path, **client_options)
                )
                _note_pid(bench, "rados_node", rados_cluster)
            else:
                bench.skipped["rados_node"] = (
                    "this build's `shuttle serve` has no --store rados:POOL yet; only the "
                    "file-backed node and librados were measured"
                )
            yield bench
            ioctx.close()
    finally:
        for cluster in clusters:
            local.down(cluster)
        if rados is not None:
            rados.shutdown()
        ceph.down()
        shutil.rmtree(scratch, ignore_errors=True)


def _note_pid(bench: Stand, mode: str, cluster: ClusterFile) -> None:
    pid = cluster.nodes[0].pid
    if pid is not None:
        bench.pids[mode] = pid


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system, every thread: librados's too) the process ``pid``
    has used, from /proc (None where there is no /proc or the process is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _compare_cluster(
    scratch: Path,
    info: CephInfo,
    src: Path,
    clusters: list[ClusterFile],
    cache_bytes: int | None = None,
    block_args: list[str] | None = None,
) -> Path:
    """A one-node cluster on ``info``'s pool (namespace ``compare``) whose node runs the
    code in ``src`` (``PYTHONPATH``: the node process inherits this one's environment);
    returns its cluster file."""
    check_compare_src(src)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(src.resolve())
    try:
        cluster = local.up(
            scratch / "compare",
            nodes=1,
            node_args=[*info.store_args(COMPARE_NAMESPACE), *(block_args or [])],
            cache_bytes=cache_bytes,
        )
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    clusters.append(cluster)
    assert cluster.path is not None
    return cluster.path


def check_compare_src(src: Path) -> None:
    """ConfigError unless ``src`` holds a ``shuttle`` package to start a node from."""
    if not (src / "shuttle" / "__init__.py").is_file():
        raise ConfigError(
            f"--compare {src}: no shuttle package there; give another checkout's src "
            "folder (git archive main src | tar -x -C /tmp/main; --compare /tmp/main/src)"
        )


def has_rados_store() -> bool:
    """Whether this build's nodes take ``--store rados:POOL`` (``shuttle.store.rados``)."""
    return importlib.util.find_spec("shuttle.store.rados") is not None


def load(bench: Stand, path: Path, progress: Progress) -> int:
    """Put the file into every node and into the pool as one RADOS object."""
    size = path.stat().st_size
    for mode, client in bench.clients.items():
        progress(f"putting {size >> 20} MiB into the {mode.replace('_', ' ')}")
        client.put(KEY, path)
    progress(f"writing {size >> 20} MiB to RADOS object {OID}")
    with open(path, "rb") as f:
        offset = 0
        while piece := f.read(LOAD_BYTES):
            bench.ioctx.write(OID, piece, offset)
            offset += len(piece)
    return size


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


# --- netrand ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CephNetrandConfig:
    pages: int = 400
    rounds: int = 10
    file_bytes: int = 64 << 20
    generator: str = "lcg"
    seed: int = 1
    osds: int = 3
    #: Another checkout's ``src``: its RADOS node is measured too (``rados_node_compare``).
    compare_src: str | None = None
    #: Wait until each RADOS node's probation is over before the rounds (its watch is
    #: waited for either way); False times a node's first seconds, as a client that
    #: reads from a node just started (or whose watch just broke) sees them, and as
    #: this benchmark did before issue 26.
    wait_for_trust: bool = True
    #: Every node's block cache (None: the node's default, 64 MiB); smaller than the
    #: pages read (``pages`` × 4 KiB) times the RADOS node's reads that miss it.
    node_cache_bytes: int | None = None
    #: Every node's cache block size (None: the node's default, 4 KiB): what a node
    #: reads for a 4 KiB page that misses its cache.
    node_block_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.generator not in GENERATORS:
            raise ConfigError(f"--generator must be one of {', '.join(GENERATORS)}")
        if self.pages < 1 or self.rounds < 1 or self.file_bytes < PAGE_BYTES:
            raise ConfigError("--pages and --rounds must be ≥ 1 and --file-bytes ≥ 4096")
        if self.compare_src is not None:
            check_compare_src(Path(self.compare_src))
        if self.node_cache_bytes is not None and self.node_cache_bytes < 0:
            raise ConfigError(f"--node-cache-bytes must be ≥ 0, got {self.node_cache_bytes}")
        b = self.node_block_bytes
        if b is not None and (b < 512 or b & (b - 1)):
            raise ConfigError(f"--node-block-bytes must be a power of two ≥ 512, got {b}")


#: Seconds to wait for a RADOS node's cache to be trusted (its watch registered and
#: its probation over, docs/ceph.md "Coherence between gateways") before timing it.
TRUST_WAIT_S = 30.0


def _wait_for_trust(client: Client, progress: Progress, probation: bool = True) -> None:
    """Wait until the RADOS node behind ``client`` trusts its cache (its watch is
    confirmed) and, with ``probation``, its probation is over, so the timed rounds
    measure its steady state, not the first seconds after it started (when every read
    is still confirmed with a ``stat``: docs/ceph.md, "Coherence between gateways")."""
    deadline = time.monotonic() + TRUST_WAIT_S
    while True:
        stats = client.node_stats(client.nodes[0]).get("store", {}).get("rados", {})
        coherence = stats.get("coherence", {})
        if not coherence:  # an older node, without coherence
            return
        if coherence.get("trusted") and (not probation or coherence.get("probation_s_left") == 0):
            return
        if time.monotonic() > deadline:
            progress(
                f"the RADOS node's cache is not trusted after {TRUST_WAIT_S:g} s; timing it anyway"
            )
            return
        left = coherence.get("probation_s_left")
        progress(f"waiting for the RADOS node's watch ({left} s of probation left)")
        time.sleep(0.5)


#: The read counters of a RADOS node (``stats()["store"]["rados"]``, docs/ceph.md) the
#: report gives for its timed reads: how each was answered.
RADOS_COUNTERS = (
    "inline_hits",
    "stat_free_hits",
    "validations",
    "cold_reads",
    "aio_reads",
    # Of the misses read on the loop: only the bytes asked for (the block would not
    # stay), whole blocks, misses of a block missed within the cache's reach, and the
    # bytes read from RADOS for them (docs/ceph.md, "Reads that miss a node's cache").
    "partial_reads",
    "whole_reads",
    "ghost_hits",
    "aio_bytes",
    "announced",
)


def rados_counters(client: Client) -> dict[str, int]:
    """The RADOS node's read counters and its block cache's hits and misses, now."""
    store = client.node_stats(client.nodes[0]).get("store", {})
    rados, cache = store.get("rados", {}), store.get("cache", {})
    out = {name: int(rados.get(name, 0)) for name in RADOS_COUNTERS}
    out["cache_hits"] = int(cache.get("hits", 0))
    out["cache_misses"] = int(cache.get("misses", 0))
    return out


@dataclass
class CounterLog:
    """What a RADOS node's counters did over the timed passes (each the delta of one
    pass, taken between passes so that asking costs no timed read)."""

    reads: int = 0
    totals: dict[str, int] = field(default_factory=dict)
    per_round: list[dict[str, int]] = field(default_factory=list)
    #: The node's coherence (watch, probation) when the timed rounds began.
    at_start: dict[str, Any] = field(default_factory=dict)

    def add(self, reads: int, before: dict[str, int], after: dict[str, int]) -> None:
        delta = {name: after[name] - before[name] for name in after}
        self.reads += reads
        for name, n in delta.items():
            self.totals[name] = self.totals.get(name, 0) + n
        self.per_round.append({"reads": reads, **delta})

    def summary(self) -> dict[str, Any]:
        reads = self.reads or 1
        return {
            "timed_reads": self.reads,
            **self.totals,
            # The share of the timed reads answered on the node's event loop from its
            # cache, asking RADOS nothing (1.0 is the goal of a warm read), the share
            # read from RADOS by a read the loop started and completed (a miss of the
            # node's cache, without a pool thread), and the RADOS stats sent per read to
            # confirm a cached version (0 is the goal).
            "inline_share": round(self.totals.get("inline_hits", 0) / reads, 4),
            "aio_share": round(self.totals.get("aio_reads", 0) / reads, 4),
            "partial_share": round(self.totals.get("partial_reads", 0) / reads, 4),
            "aio_bytes_per_read": round(self.totals.get("aio_bytes", 0) / reads),
            "validations_per_read": round(self.totals.get("validations", 0) / reads, 4),
            "at_start": self.at_start,
            "per_round": self.per_round,
        }


def _cache_capacity(client: Client) -> int | None:
    """The block cache's capacity of the node behind ``client``, in bytes."""
    cache = client.node_stats(client.nodes[0]).get("store", {}).get("cache", {})
    capacity = cache.get("capacity_bytes")
    return capacity if isinstance(capacity, int) else None


def _coherence(client: Client) -> dict[str, Any]:
    """The node's coherence (watch, probation) and how its misses complete
    (``aio_completion``: "c", "ctypes", or None when they all take the pool)."""
    rados = client.node_stats(client.nodes[0]).get("store", {}).get("rados", {})
    coherence: dict[str, Any] = dict(rados.get("coherence", {}))
    coherence["aio_completion"] = rados.get("aio_completion")
    return coherence


def run_netrand(config: CephNetrandConfig, progress: Progress) -> dict[str, Any]:
    """Random 4 KiB reads: the nodes against librados, interleaved, warm."""
    pages_in_file = config.file_bytes // PAGE_BYTES
    compare = Path(config.compare_src) if config.compare_src else None
    with stand(
        config.osds,
        progress,
        compare_src=compare,
        node_cache_bytes=config.node_cache_bytes,
        node_block_bytes=config.node_block_bytes,
        cache_bytes=0,
    ) as bench:
        with tempfile.TemporaryDirectory(prefix="shuttle-bench-ceph-") as tmp:
            path = Path(tmp) / "netrand.dat"
            make_file(path, config.file_bytes)
            load(bench, path, progress)
        fetchers: dict[str, Callable[[int], bytes]] = {
            mode: _page_reader(client) for mode, client in bench.clients.items()
        }
        ioctx = bench.ioctx
        fetchers["librados"] = lambda p: ioctx.read(OID, PAGE_BYTES, p * PAGE_BYTES)
        samples = {mode: Samples() for mode in fetchers}
        by_round: dict[str, list[float]] = {mode: [] for mode in fetchers}
        rados_modes = [m for m in bench.clients if m.startswith("rados_node")]
        logs = {mode: CounterLog() for mode in rados_modes}
        # Each node's process CPU (every thread) over its timed passes.
        cpu_s: dict[str, float] = {mode: 0.0 for mode in bench.pids}
        cpu_reads: dict[str, int] = {mode: 0 for mode in bench.pids}
        # And this process's (the client's, every thread: librados's for ``librados``).
        client_cpu_s: dict[str, float] = {mode: 0.0 for mode in fetchers}
        for mode in rados_modes:
            _wait_for_trust(bench.clients[mode], progress, probation=config.wait_for_trust)
        for mode in rados_modes:
            logs[mode].at_start = _coherence(bench.clients[mode])
        gen = GENERATORS[config.generator]
        for rnd in range(config.rounds + 1):
            pages = list(gen(config.seed + rnd, config.pages, pages_in_file))
            progress(f"round {rnd}/{config.rounds}" + (" (warm-up)" if rnd == 0 else ""))
            for mode, fetch in fetchers.items():
                # Round 0 warms every cache; afterwards each round reads its pages twice
                # and keeps the second pass (warm, as netrand's remote_warm).
                timed_run(pages, fetch, PAGE_BYTES, Samples())
                if rnd:
                    log = logs.get(mode)
                    before = rados_counters(bench.clients[mode]) if log else None
                    pid = bench.pids.get(mode)
                    cpu0 = process_cpu_s(pid) if pid is not None else None
                    mine0 = time.process_time()
                    timed_run(pages, fetch, PAGE_BYTES, samples[mode])
                    client_cpu_s[mode] += time.process_time() - mine0
                    cpu1 = process_cpu_s(pid) if pid is not None else None
                    if cpu0 is not None and cpu1 is not None:
                        cpu_s[mode] += cpu1 - cpu0
                        cpu_reads[mode] += len(pages)
                    this_pass = samples[mode].latencies_ns[-len(pages) :]
                    by_round[mode].append(round(statistics.median(this_pass) / 1e3, 1))
                    if log is not None and before is not None:
                        log.add(len(pages), before, rados_counters(bench.clients[mode]))
        skipped = dict(bench.skipped)
        cache_bytes = (
            _cache_capacity(bench.clients["rados_node"]) if "rados_node" in bench.clients else None
        )
    report: dict[str, Any] = {
        "experiment": "ceph-netrand",
        "config": asdict(config),
        "modes": {m: s.summary() for m, s in samples.items()},
        "skipped": skipped,
        # How the RADOS node answered its timed (warm) reads: from its cache on the
        # event loop (inline_hits), after a RADOS stat (validations), from RADOS.
        "rados_counters": {m: log.summary() for m, log in logs.items()},
        # Each timed pass's p50 (µs), round by round: drift, and a node's first rounds.
        "p50_us_by_round": by_round,
        # Each node process's CPU (user + system, all its threads, librados's included)
        # over its timed passes, per read (µs; /proc's clock ticks: 10 ms, so about
        # 2.5 µs a read over 4,000 reads).
        "node_cpu_us_per_read": {
            m: round(cpu_s[m] / cpu_reads[m] * 1e6, 1) for m in cpu_s if cpu_reads[m]
        },
        # This process's CPU over each mode's timed passes, per read (µs): the client's
        # side of a read (for ``librados``, the whole of it: librados's threads included).
        "client_cpu_us_per_read": {
            m: round(client_cpu_s[m] / (config.pages * config.rounds) * 1e6, 1)
            for m in client_cpu_s
        },
    }
    lib = report["modes"]["librados"]["p50_us"]
    report["p50_over_librados"] = {
        m: _ratio(s["p50_us"], lib) for m, s in report["modes"].items() if m != "librados"
    }
    files = report["modes"]["file_node"]["p50_us"]
    report["p50_over_file_node"] = {m: _ratio(report["modes"][m]["p50_us"], files) for m in logs}
    # The same ratios round by round (each pass against the anchor's pass of the same
    # round), their median: load that comes and goes on a shared machine hits the
    # passes of one round alike, so this is the steadier figure.
    report["p50_over_file_node_paired"] = {m: _paired(by_round, m, "file_node") for m in logs}
    report["p50_over_librados_paired"] = {m: _paired(by_round, m, "librados") for m in logs}
    if COMPARE_MODE in by_round and "rados_node" in by_round:
        # This checkout's RADOS node over the one compared against (after / before).
        modes = report["modes"]
        report["p50_over_compare"] = _ratio(
            modes["rados_node"]["p50_us"], modes[COMPARE_MODE]["p50_us"]
        )
        report["p50_over_compare_paired"] = _paired(by_round, "rados_node", COMPARE_MODE)
    if "rados_node" in report["modes"]:
        report["target"] = _netrand_target(
            config.file_bytes,
            cache_bytes,
            report["p50_over_file_node"]["rados_node"],
            report["p50_over_librados"]["rados_node"],
        )
    return report


def _paired(by_round: dict[str, list[float]], mode: str, anchor: str) -> float | None:
    """The median over rounds of ``mode``'s p50 over ``anchor``'s in the same round."""
    pairs = [a / b for a, b in zip(by_round[mode], by_round[anchor], strict=True) if b]
    return round(statistics.median(pairs), 3) if pairs else None


#: Issue 26's targets for a RADOS node's warm 4 KiB p50: within this factor of a file
#: node's when the object fits the node's block cache, and ...
WARM_OVER_FILE_NODE_MAX = 2.0
#: ... within this factor of librados's when it does not.
WARM_OVER_LIBRADOS_MAX = 1.0


def _netrand_target(
    file_bytes: int, cache_bytes: int | None, over_files: float | None, over_lib: float | None
) -> dict[str, Any]:
    """The target that applies (the object fits the node's cache or not), and whether
    the run met it."""
    fits = cache_bytes is not None and file_bytes <= cache_bytes
    if fits:
        return {
            "fits_cache": True,
            "cache_bytes": cache_bytes,
            "rados_node_p50_over_file_node_max": WARM_OVER_FILE_NODE_MAX,
            "met": over_files is not None and over_files <= WARM_OVER_FILE_NODE_MAX,
        }
    return {
        "fits_cache": False,
        "cache_bytes": cache_bytes,
        "rados_node_p50_over_librados_max": WARM_OVER_LIBRADOS_MAX,
        "met": over_lib is not None and over_lib <= WARM_OVER_LIBRADOS_MAX,
    }


# --- stream ----------------------------------------------------------------------------


@dataclass(frozen=True)
class CephStreamConfig:
    nbytes: int = 256 << 20
    repeat: int = 3
    window: int = 8
    osds: int = 3

    def __post_init__(self) -> None:
        if self.nbytes < PIECE_BYTES or self.repeat < 1 or self.window < 1:
            raise ConfigError("--bytes must be ≥ 1 MiB, --repeat and --window ≥ 1")


def _page_reader(client: Client) -> Callable[[int], bytes]:
    def fetch(page: int) -> bytes:
        return client.read(KEY, page * PAGE_BYTES, PAGE_BYTES)

    return fetch


def _streamer(client: Client) -> Callable[[], int]:
    info = client.stat(KEY)

    def once() -> int:
        return sum(len(piece) for piece in client.iter_read(KEY, info=info))

    return once


def _reads_in_flight_peak(client: Client) -> int | None:
    """The most reads the node behind ``client`` has had waiting on RADOS at once."""
    stats = client.node_stats(client.nodes[0]).get("store", {}).get("rados", {})
    peak = stats.get("reads_in_flight_peak")
    return peak if isinstance(peak, int) else None


def _librados_sync(ioctx: Any, nbytes: int) -> int:
    got = 0
    for offset in range(0, nbytes, PIECE_BYTES):
        got += len(ioctx.read(OID, PIECE_BYTES, offset))
    return got


def _librados_window(ioctx: Any, nbytes: int, window: int) -> int:
    """Asynchronous 1 MiB reads, ``window`` in flight (what the nodes' clients do)."""
    slots = threading.Semaphore(window)
    done = threading.Event()
    lock = threading.Lock()
    state = {"got": 0, "left": -(-nbytes // PIECE_BYTES), "error": 0}

    def finished(_completion: Any, data: bytes) -> None:
        with lock:
            if data is None:
                state["error"] += 1
            else:
                state["got"] += len(data)
            state["left"] -= 1
            if state["left"] == 0:
                done.set()
        slots.release()

    completions = []
    for offset in range(0, nbytes, PIECE_BYTES):
        slots.acquire()
        completions.append(ioctx.aio_read(OID, PIECE_BYTES, offset, finished))
    if not done.wait(300):
        raise TimeoutError("librados reads did not complete within 300 s")
    if state["error"]:
        raise OSError(f"{state['error']} librados reads failed")
    return state["got"]


def run_stream(config: CephStreamConfig, progress: Progress) -> dict[str, Any]:
    """The whole object in 1 MiB reads: the nodes against librados, interleaved."""
    times: dict[str, list[float]] = {}
    with stand(
        config.osds, progress, cache_bytes=0, piece_bytes=PIECE_BYTES, window=config.window
    ) as bench:
        with tempfile.TemporaryDirectory(prefix="shuttle-bench-ceph-") as tmp:
            path = Path(tmp) / "stream.dat"
            make_file(path, config.nbytes)
            load(bench, path, progress)
        runs: dict[str, Callable[[], int]] = {
            mode: _streamer(client) for mode, client in bench.clients.items()
        }
        ioctx = bench.ioctx
        runs["librados"] = lambda: _librados_sync(ioctx, config.nbytes)
        runs["librados_window"] = lambda: _librados_window(ioctx, config.nbytes, config.window)
        for i in range(config.repeat + 1):
            progress(f"run {i}/{config.repeat}" + (" (warm-up)" if i == 0 else ""))
            for mode, once in runs.items():
                t0 = time.perf_counter()
                got = once()
                elapsed = time.perf_counter() - t0
                if got != config.nbytes:
                    raise AssertionError(f"{mode} read {got} of {config.nbytes} bytes")
                if i:
                    times.setdefault(mode, []).append(elapsed)
        skipped = dict(bench.skipped)
        in_flight = {
            mode: _reads_in_flight_peak(client)
            for mode, client in bench.clients.items()
            if mode == "rados_node"
        }
    mib = config.nbytes / (1 << 20)
    modes: dict[str, dict[str, Any]] = {
        m: {
            "runs_s": [round(t, 4) for t in ts],
            "median_s": round(statistics.median(ts), 4),
            "mib_per_s": round(mib / statistics.median(ts), 1),
        }
        for m, ts in times.items()
    }
    report: dict[str, Any] = {
        "experiment": "ceph-stream",
        "config": asdict(config),
        "modes": modes,
        "skipped": skipped,
    }
    best_lib = max(modes["librados"]["mib_per_s"], modes["librados_window"]["mib_per_s"])
    report["throughput_over_librados"] = {
        m: _ratio(s["mib_per_s"], best_lib) for m, s in modes.items() if "librados" not in m
    }
    # The same ratio run by run (each run of a node against the windowed librados run
    # right after it): drift on a shared machine then cancels out.
    window = times["librados_window"]
    report["paired_over_librados_window"] = {
        m: round(statistics.median(w / t for w, t in zip(window, ts, strict=True)), 3)
        for m, ts in times.items()
        if "librados" not in m
    }
    # How many of the stream's reads the RADOS node had waiting on RADOS at once.
    report["reads_in_flight_peak"] = in_flight
    if "rados_node" in modes:
        ratio = report["throughput_over_librados"]["rados_node"]
        report["target"] = {
            "rados_node_throughput_over_librados_min": round(1 / TARGET_RATIO, 3),
            "met": ratio >= 1 / TARGET_RATIO,
        }
    return report
