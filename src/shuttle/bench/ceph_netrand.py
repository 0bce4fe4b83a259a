"""``shuttle bench ceph netrand``: random 4 KiB reads (the paper's generator) from a
node on the RADOS store, a node on local files, librados and (``rados_node_direct``) a
client with Ceph credentials that reads a RADOS node's misses from the OSDs itself
(:mod:`shuttle.client.rados_direct`), interleaved round by round on one stand
(:mod:`shuttle.bench.ceph_stand`), client cache off, each mode warm (the round before
read the same pages): per-read latency percentiles (issue 12).

It times a RADOS node once its probation is over (its warm reads then ask RADOS
nothing) and reports how the node answered its timed reads: its counters
(``rados_counters``: inline hits, validations, cold reads, cache hits and misses, per
round), each pass's p50 round by round, and the ratios paired by round. Each node's
CPU per read (from /proc) and this process's are reported too.

Target (issue 26): the RADOS node's warm 4 KiB p50 within 2× the file node's when the
object fits the node's block cache, within 1.0× librados's when it does not. When this
build's ``shuttle serve`` has no RADOS store yet, the report says so and compares the
file-backed node with librados only.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import shuttle.compiled as compiled
from shuttle.bench.ceph_node_stats import (
    CounterLog,
    cache_capacity,
    node_coherence,
    rados_counters,
    wait_for_trust,
)
from shuttle.bench.ceph_stand import (
    COMPARE_MODE,
    DIRECT_MODE,
    KEY,
    OID,
    Progress,
    check_compare_src,
    load,
    process_cpu_s,
    ratio,
    stand,
)
from shuttle.bench.netrand import GENERATORS, Samples, make_file, timed_run
from shuttle.client.client import Client
from shuttle.errors import ConfigError

PAGE_BYTES = 4096
#: librados reading the RADOS object of the key the RADOS nodes serve (``librados``
#: reads a copy of its own, ``OID``, which may sit on another primary OSD).
LIBRADOS_KEY_MODE = "librados_key"


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
    #: Measure ``rados_node_direct`` too, its client remembering a key its node named
    #: this many seconds (0: it asks the node every time); None: not measured.
    direct_remember_s: float | None = 1.0

    def __post_init__(self) -> None:
        if self.generator not in GENERATORS:
            raise ConfigError(f"--generator must be one of {', '.join(GENERATORS)}")
        if self.pages < 1 or self.rounds < 1 or self.file_bytes < PAGE_BYTES:
            raise ConfigError("--pages and --rounds must be ≥ 1 and --file-bytes ≥ 4096")
        if self.compare_src is not None:
            check_compare_src(Path(self.compare_src))
        if self.direct_remember_s is not None and self.direct_remember_s < 0:
            raise ConfigError(
                f"--direct-remember-s must be ≥ 0 (0: ask the node every time), got "
                f"{self.direct_remember_s}"
            )
        if self.node_cache_bytes is not None and self.node_cache_bytes < 0:
            raise ConfigError(f"--node-cache-bytes must be ≥ 0, got {self.node_cache_bytes}")
        b = self.node_block_bytes
        if b is not None and (b < 512 or b & (b - 1)):
            raise ConfigError(f"--node-block-bytes must be a power of two ≥ 512, got {b}")


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
        direct_remember_s=config.direct_remember_s,
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
        if DIRECT_MODE in bench.clients:
            # And the very object the RADOS nodes serve (the key's RADOS object): the
            # same placement group and primary OSD as rados_node_direct's own reads.
            fetchers[LIBRADOS_KEY_MODE] = lambda p: ioctx.read(KEY, PAGE_BYTES, p * PAGE_BYTES)
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
            wait_for_trust(bench.clients[mode], progress, probation=config.wait_for_trust)
        for mode in rados_modes:
            logs[mode].at_start = node_coherence(bench.clients[mode])
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
        direct_client = bench.clients.get(DIRECT_MODE)
        bench_direct_stats = (
            direct_client.rados_direct.stats()
            if direct_client is not None and direct_client.rados_direct is not None
            else None
        )
        cache_bytes = (
            cache_capacity(bench.clients["rados_node"]) if "rados_node" in bench.clients else None
        )
    report: dict[str, Any] = {
        "experiment": "ceph-netrand",
        "config": asdict(config),
        # Whether this process (and the nodes it started, from the same tree) ran
        # Shuttle's compiled modules: a stale build falls back to pure Python.
        "compiled": compiled.active().reason,
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
        m: ratio(s["p50_us"], lib) for m, s in report["modes"].items() if m != "librados"
    }
    files = report["modes"]["file_node"]["p50_us"]
    report["p50_over_file_node"] = {m: ratio(report["modes"][m]["p50_us"], files) for m in logs}
    # The same ratios round by round (each pass against the anchor's pass of the same
    # round), their median: load that comes and goes on a shared machine hits the
    # passes of one round alike, so this is the steadier figure.
    report["p50_over_file_node_paired"] = {m: _paired(by_round, m, "file_node") for m in logs}
    report["p50_over_librados_paired"] = {m: _paired(by_round, m, "librados") for m in logs}
    if LIBRADOS_KEY_MODE in report["modes"]:
        same = report["modes"][LIBRADOS_KEY_MODE]["p50_us"]
        report["p50_over_librados_key"] = {
            m: ratio(report["modes"][m]["p50_us"], same) for m in (*logs, "librados")
        }
        report["p50_over_librados_key_paired"] = {
            m: _paired(by_round, m, LIBRADOS_KEY_MODE) for m in (*logs, "librados")
        }
    if COMPARE_MODE in by_round and "rados_node" in by_round:
        # This checkout's RADOS node over the one compared against (after / before).
        modes = report["modes"]
        report["p50_over_compare"] = ratio(
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
    if DIRECT_MODE in report["modes"]:
        report["target_direct"] = _netrand_target(
            config.file_bytes,
            cache_bytes,
            report["p50_over_file_node"][DIRECT_MODE],
            report["p50_over_librados"][DIRECT_MODE],
        )
        # How the direct client's timed reads went (its own counters, all rounds).
        direct = bench_direct_stats
        if direct is not None:
            report["direct_client"] = direct
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


def _page_reader(client: Client) -> Callable[[int], bytes]:
    def fetch(page: int) -> bytes:
        return client.read(KEY, page * PAGE_BYTES, PAGE_BYTES)

    return fetch
