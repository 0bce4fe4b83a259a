"""``shuttle bench netrand``: random page-sized fetches, local file against remote file.

Smith and Maguire's experiment (../shared/papers/page-sized-network-fetches.txt):
read N random 4 KiB pages of a file, picked by the paper's linear congruential
generator (or a seeded one), from a local file with ``os.pread`` and from the same
file through a Shuttle node, with caches cold (OS page cache dropped with
``posix_fadvise(DONTNEED)`` and the node's block cache cleared) and warm (a second
pass over the same pages). In the same run, as the anchor for a fast remote fetch,
a Redis server on loopback serves the same pages as values to the same timing
harness. Modes are interleaved round by round so that drift on a shared machine
hits them all alike. The client, the node and Redis run on one CPU (see
:mod:`shuttle.bench.placement` for why; ``pin=False`` leaves placement to the
scheduler). With ``clients``, the same fetches are then made by N clients at once for
each N (:mod:`shuttle.bench.netrand_clients`): throughput and p99, against Redis with
as many clients. With ``tls``, a second node serving TLS (and Redis's TLS port) are
timed in the same rounds: warm fetches over TLS against Redis over TLS, and against
the same fetches without TLS.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import shuttle.compiled as compiled
from shuttle.bench.netrand_clients import (
    PASS_SECONDS_DEFAULT,
    PASS_TIMEOUT_S,
    SLICES_DEFAULT,
    SLICES_MAX,
    hot_pages,
    paged_object_bytes,
    run_clients,
)
from shuttle.bench.netrand_reruns import rerun_spread
from shuttle.bench.nodes import bench_client
from shuttle.bench.placement import default_cpu, pin_process, pinned, sched_use
from shuttle.bench.redis_anchor import RedisServer, RespClient
from shuttle.blockcache import DEFAULT_BLOCK_SIZE_BYTES
from shuttle.client.client import Client
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import ConfigError
from shuttle.node.config import CACHE_BYTES_DEFAULT

#: The paper's page and its default run length.
PAGE_BYTES = 4096
PAGES_DEFAULT = 400
#: Rounds of N pages per mode: 20 × 400 = 8,000 samples, enough for a stable p99.
ROUNDS_DEFAULT = 20
#: Most runs of each ``--clients`` count (``--repeat``): enough for a spread; each
#: run of 64 clients takes half a minute or more on a loaded machine.
REPEAT_MAX = 10
#: Longest timed pass: well inside the time a pass may take (PASS_TIMEOUT_S).
PASS_SECONDS_MAX = PASS_TIMEOUT_S / 4
#: Default file: larger than the node's default 64 MiB block cache, so cold reads miss.
FILE_BYTES_DEFAULT = 128 << 20
KEY = "bench/netrand.dat"
#: The object the ``--clients`` mixed_paged pass's missing readers cycle over
#: (:func:`~shuttle.bench.netrand_clients.paged_object_bytes`: twice the node's block
#: cache).
PAGED_KEY = "bench/netrand-paged.dat"
#: Largest such object the benchmark writes: a node with a block cache over half of
#: this would have it write gigabytes; its mixed pass needs a smaller cache.
PAGED_BYTES_MAX = 1 << 30

Fetch = Callable[[int], bytes]


def lcg_pages(seed: int, count: int, file_pages: int) -> Iterator[int]:
    """The paper's generator: ``last = (17*last + 123) % 65521``, page = last mod pages."""
    last = seed % 65521 or 1
    for _ in range(count):
        last = (17 * last + 123) % 65521
        yield last % file_pages


def seeded_pages(seed: int, count: int, file_pages: int) -> Iterator[int]:
    rng = random.Random(seed)
    for _ in range(count):
        yield rng.randrange(file_pages)


GENERATORS = {"lcg": lcg_pages, "seeded": seeded_pages}


@dataclass(frozen=True)
class NetrandConfig:
    pages: int = PAGES_DEFAULT
    rounds: int = ROUNDS_DEFAULT
    file_bytes: int = FILE_BYTES_DEFAULT
    generator: str = "lcg"
    seed: int = 1
    node: str | None = None
    link: str | None = None
    cpu_factor: float = 1.0
    redis: bool = True
    page_bytes: int = PAGE_BYTES
    #: Run the client, the node started here and Redis on one CPU (``cpu``, or the
    #: highest-numbered one allowed); False leaves placement to the scheduler.
    pin: bool = True
    cpu: int | None = None
    #: After the one-client rounds, the same reads from this many clients at once, for
    #: each count in turn (:mod:`shuttle.bench.netrand_clients`); each reads ``pages``.
    clients: tuple[int, ...] = ()
    #: How long each client reads in the timed passes of ``clients`` (warm, Redis;
    #: 0: ``pages`` each, as the other passes).
    pass_seconds: float = PASS_SECONDS_DEFAULT
    #: Into how many alternating slices each timed pass is cut (``--slices``).
    slices: int = SLICES_DEFAULT
    #: Also time warm fetches from a node serving TLS, and from Redis over TLS.
    tls: bool = False
    #: The block cache of the node started here (``shuttle serve --cache-bytes``).
    node_cache_bytes: int = CACHE_BYTES_DEFAULT
    #: Its block, the unit a miss fills (``--cache-block-bytes``; None: the default).
    node_cache_block_bytes: int | None = None
    #: Each ``clients`` count's passes this many times back to back (the spread of
    #: their figures: how well a rerun repeats them).
    repeat: int = 1

    def __post_init__(self) -> None:
        if self.generator not in GENERATORS:
            raise ConfigError(
                f"--generator must be one of {', '.join(GENERATORS)}, not {self.generator!r}"
            )
        if self.pages <= 0 or self.rounds <= 0:
            raise ConfigError("--pages and --rounds must be positive")
        if not 1 <= self.repeat <= REPEAT_MAX:
            raise ConfigError(f"--repeat must be in 1..{REPEAT_MAX}, got {self.repeat}")
        if any(n < 1 for n in self.clients):
            raise ConfigError("--clients counts must be at least 1")
        if not 0 <= self.pass_seconds <= PASS_SECONDS_MAX:
            raise ConfigError(
                f"--pass-seconds must be in 0..{PASS_SECONDS_MAX:g} (0: --pages per client, "
                f"as the untimed passes), got {self.pass_seconds:g}"
            )
        if not 1 <= self.slices <= SLICES_MAX:
            raise ConfigError(
                f"--slices must be in 1..{SLICES_MAX} (each timed pass cut into that many "
                f"alternating slices), got {self.slices}"
            )
        if self.file_bytes < self.page_bytes:
            raise ConfigError(f"--file-bytes must be at least one page ({self.page_bytes})")
        block = self.node_cache_block_bytes
        if block is not None and (block < 512 or block & (block - 1)):
            raise ConfigError(
                f"--node-cache-block-bytes must be a power of two of at least 512, got {block}"
            )
        if self.node_cache_bytes < 0:
            raise ConfigError(f"--node-cache-bytes must be 0 or more, got {self.node_cache_bytes}")

    @property
    def file_pages(self) -> int:
        return self.file_bytes // self.page_bytes


@dataclass
class Samples:
    """Per-page latencies (ns) of one mode, and the elapsed time of each run of N pages."""

    latencies_ns: list[int] = field(default_factory=list)
    run_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        lat = sorted(self.latencies_ns)
        if not lat:
            return {}

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(q * len(lat)))] / 1e3

        mean_us = statistics.fmean(lat) / 1e3
        return {
            "samples": len(lat),
            "p50_us": pct(0.50),
            "p90_us": pct(0.90),
            "p99_us": pct(0.99),
            "max_us": lat[-1] / 1e3,
            "mean_us": mean_us,
            "pages_per_s": 1e6 / mean_us,
            "run_s_mean": statistics.fmean(self.run_s),
        }


def timed_run(pages: list[int], fetch: Fetch, page_bytes: int, into: Samples) -> None:
    clock = time.perf_counter_ns
    start = clock()
    lat = into.latencies_ns
    for page in pages:
        t = clock()
        data = fetch(page)
        lat.append(clock() - t)
        if len(data) != page_bytes:
            raise AssertionError(f"page {page}: got {len(data)} bytes")
    into.run_s.append((clock() - start) / 1e9)


def make_file(path: Path, nbytes: int) -> None:
    with open(path, "wb") as f:
        remaining = nbytes
        while remaining:
            piece = os.urandom(min(remaining, 1 << 20))
            f.write(piece)
            remaining -= len(piece)
        f.flush()
        os.fsync(f.fileno())


def run(config: NetrandConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run the benchmark; returns the report (figures and configuration)."""
    pb = config.page_bytes
    modes = ["local_cold", "remote_cold", "local", "remote_warm", "remote_miss"] + (
        ["redis"] if config.redis else []
    )
    if config.tls:
        modes += ["remote_warm_tls"] + (["redis_tls"] if config.redis else [])
    samples = {m: Samples() for m in modes}
    placement: dict[str, Any] = {"pinned_cpu": None}
    concurrent: dict[str, Any] = {}
    concurrent_runs: dict[int, list[dict[str, Any]]] = {}
    # The client cache is off: every remote page is a round trip to the node.
    with contextlib.ExitStack() as stack:
        client, scratch = stack.enter_context(
            bench_client(
                config.node,
                link=config.link,
                cpu_factor=config.cpu_factor,
                node_cache_bytes=config.node_cache_bytes,
                node_args=(
                    ("--cache-block-bytes", str(config.node_cache_block_bytes))
                    if config.node_cache_block_bytes is not None
                    else ()
                ),
                cache_bytes=0,
            )
        )
        tls_client: Client | None = None
        tls_scratch: Path | None = None
        if config.tls:
            tls_client, tls_scratch = stack.enter_context(
                bench_client(
                    config.node,
                    link=config.link,
                    cpu_factor=config.cpu_factor,
                    cache_bytes=0,
                    tls=True,
                )
            )
        path = scratch / "netrand.dat"
        progress(f"writing a {config.file_bytes >> 20} MiB file and putting it into the node")
        make_file(path, config.file_bytes)
        client.put(KEY, path)
        if tls_client is not None:
            progress("putting it into the node that serves TLS")
            tls_client.put(KEY, path)
        cache = _node_cache(client)
        hot = hot_pages(config.file_pages, cache["capacity_bytes"], pb)
        paged_bytes = paged_object_bytes(cache["capacity_bytes"], cache["block_size_bytes"])
        if any(n >= 2 for n in config.clients):
            if paged_bytes > PAGED_BYTES_MAX:
                raise ConfigError(
                    f"--clients: the mixed pass reads an object twice the node's block cache "
                    f"({cache['capacity_bytes'] >> 20} MiB), over the "
                    f"{PAGED_BYTES_MAX >> 20} MiB this benchmark writes; use a node with a "
                    f"smaller cache (--node-cache-bytes), or --clients 1"
                )
            progress(f"writing the mixed pass's {paged_bytes >> 20} MiB object")
            paged_path = scratch / "netrand-paged.dat"
            make_file(paged_path, paged_bytes)
            client.put(PAGED_KEY, paged_path)
            paged_path.unlink()
        fd = os.open(path, os.O_RDONLY)
        redis = RedisServer(scratch, tls=config.tls) if config.redis else None
        resp = None
        resp_tls = None
        try:
            if redis is not None:
                progress("loading the same pages into redis")
                resp = RespClient(redis.port)
                with open(path, "rb") as f:
                    resp.set_many((b"p:%d" % i, f.read(pb)) for i in range(config.file_pages))
                if redis.tls_port is not None:
                    resp_tls = RespClient(redis.tls_port, ca_file=redis.ca_file)
            fetchers: dict[str, Fetch] = {
                "local": lambda p: os.pread(fd, pb, p * pb),
                "remote": _remote_fetch(client, pb),
            }
            if tls_client is not None:
                fetchers["remote_tls"] = _remote_fetch(tls_client, pb)
            if resp is not None:
                r = resp
                fetchers["redis"] = lambda p: r.get(b"p:%d" % p) or b""
            if resp_tls is not None:
                rt = resp_tls
                fetchers["redis_tls"] = lambda p: rt.get(b"p:%d" % p) or b""
            gen = GENERATORS[config.generator]
            # The servers whose CPU the --clients passes count: those started here.
            server_pids = _server_pids(scratch, redis, started_node=config.node is None)
            cpu = (config.cpu if config.cpu is not None else default_cpu()) if config.pin else None
            with pinned(cpu):
                if cpu is not None:
                    placement = _pin_servers(cpu, scratch, redis, started_node=config.node is None)
                    if tls_scratch is not None:
                        _pin_servers(cpu, tls_scratch, None, started_node=config.node is None)
                for rnd in range(config.rounds):
                    progress(f"round {rnd + 1}/{config.rounds}")
                    pages = list(gen(config.seed + rnd, config.pages, config.file_pages))
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                    timed_run(pages, fetchers["local"], pb, samples["local_cold"])
                    client.drop_caches([KEY])
                    timed_run(pages, fetchers["remote"], pb, samples["remote_cold"])
                    # Warm: the pages were just read; a second pass finds them cached.
                    timed_run(pages, fetchers["local"], pb, samples["local"])
                    timed_run(pages, fetchers["remote"], pb, samples["remote_warm"])
                    # A node-cache miss over a page-cache hit: the node's block cache
                    # emptied (no key given: the OS page cache is kept), the same pages
                    # again; the file's pages are still in the kernel's page cache.
                    client.drop_caches([])
                    timed_run(pages, fetchers["remote"], pb, samples["remote_miss"])
                    if resp is not None:
                        timed_run(pages, fetchers["redis"], pb, samples["redis"])
                    if tls_client is not None:
                        # Warm it the same way: a first pass over the pages, untimed.
                        for page in pages:
                            fetchers["remote_tls"](page)
                        timed_run(pages, fetchers["remote_tls"], pb, samples["remote_warm_tls"])
                    if resp_tls is not None:
                        timed_run(pages, fetchers["redis_tls"], pb, samples["redis_tls"])
                for n, rerun in ((n, r) for n in config.clients for r in range(config.repeat)):
                    progress(f"{n} concurrent clients, run {rerun + 1}/{config.repeat}")
                    runs = concurrent_runs.setdefault(n, [])
                    runs.append(
                        run_clients(
                            n,
                            client=client,
                            redis_port=redis.port if redis is not None else None,
                            key=KEY,
                            file_pages=config.file_pages,
                            pages=config.pages,
                            page_bytes=pb,
                            seed=config.seed,
                            drop_caches=lambda: client.drop_caches([KEY]),
                            warm_page_cache=lambda: _warm_page_cache(
                                client, PAGED_KEY, 0, paged_bytes
                            ),
                            node_counters=lambda: _inline_counters(client),
                            paged_key=PAGED_KEY,
                            paged_bytes=paged_bytes,
                            block_bytes=cache["block_size_bytes"],
                            hot=hot,
                            pass_seconds=config.pass_seconds,
                            slices=config.slices,
                            server_sched=lambda: {
                                name: sched_use(pid) for name, pid in server_pids.items()
                            },
                        )
                    )
            for n, runs in concurrent_runs.items():
                # The first run in full; with --repeat, every run's figures and how far
                # they moved between runs (the repeatability the issue asks for).
                concurrent[str(n)] = runs[0]
                if len(runs) > 1:
                    concurrent[str(n)]["reruns"] = rerun_spread(runs)
            node_stats = client.node_stats(client.nodes[0])
        finally:
            os.close(fd)
            if resp is not None:
                resp.close()
            if resp_tls is not None:
                resp_tls.close()
            if redis is not None:
                redis.stop()
    report: dict[str, Any] = {"config": asdict(config), "placement": placement}
    # Which hot modules ran: mypyc-compiled, or pure Python (and why).
    report["compiled"] = compiled.active().reason
    for mode, s in samples.items():
        report[mode] = s.summary()
    report["remote_over_local_p50"] = report["remote_warm"]["p50_us"] / report["local"]["p50_us"]
    report["remote_miss_over_remote_warm_p50"] = (
        report["remote_miss"]["p50_us"] / report["remote_warm"]["p50_us"]
    )
    report["remote_cold_over_local_cold_p50"] = (
        report["remote_cold"]["p50_us"] / report["local_cold"]["p50_us"]
    )
    report["remote_cold_over_local_cold_run"] = (
        report["remote_cold"]["run_s_mean"] / report["local_cold"]["run_s_mean"]
    )
    if config.redis:
        report["remote_over_redis_p50"] = (
            report["remote_warm"]["p50_us"] / report["redis"]["p50_us"]
        )
    if config.tls:
        tls_p50 = report["remote_warm_tls"]["p50_us"]
        report["remote_tls_over_remote_p50"] = tls_p50 / report["remote_warm"]["p50_us"]
        if config.redis:
            report["remote_tls_over_redis_tls_p50"] = tls_p50 / report["redis_tls"]["p50_us"]
            report["redis_tls_over_redis_p50"] = (
                report["redis_tls"]["p50_us"] / report["redis"]["p50_us"]
            )
    if concurrent:
        report["clients"] = concurrent
    report["node_cache"] = node_stats.get("store", {}).get("cache", {})
    report["paper"] = PAPER
    return report


def _server_pids(scratch: Path, redis: RedisServer | None, *, started_node: bool) -> dict[str, int]:
    """The process ids of the node started here (found through its cluster file) and of
    Redis, by name ("node", "redis"); those not started here are left out."""
    pids: dict[str, int] = {}
    cluster_path = scratch / "cluster" / "cluster.toml"
    if started_node and cluster_path.exists():
        for entry in ClusterFile.load(cluster_path).nodes:
            if entry.pid:
                pids["node"] = entry.pid
    if redis is not None:
        pids["redis"] = redis.proc.pid
    return pids


def _pin_servers(
    cpu: int, scratch: Path, redis: RedisServer | None, *, started_node: bool
) -> dict[str, Any]:
    """Pin the node started here (found through its cluster file) and Redis to ``cpu``,
    beside the client; returns what was pinned, for the report."""
    placement: dict[str, Any] = {"pinned_cpu": cpu, "client": True, "node": False}
    cluster_path = scratch / "cluster" / "cluster.toml"
    if started_node and cluster_path.exists():
        for entry in ClusterFile.load(cluster_path).nodes:
            if entry.pid:
                pin_process(entry.pid, cpu)
                placement["node"] = True
    if redis is not None:
        pin_process(redis.proc.pid, cpu)
        placement["redis"] = True
    return placement


def _inline_counters(client: Client) -> dict[str, int]:
    """The node's requests answered on its event loop, the reads it sent to its pool,
    and the blocks its block cache missed (one ``node.stats`` call)."""
    stats = client.node_stats(client.nodes[0])
    server = stats.get("server", {})
    return {
        "inline": int(server.get("inline", 0)),
        "declined": int(server.get("inline_declined", {}).get("read", 0)),
        "cache_misses": int(stats.get("store", {}).get("cache", {}).get("misses", 0)),
    }


def _node_cache(client: Client) -> dict[str, int]:
    """The node's block cache: its capacity and block size (a node that does not say,
    e.g. one of another store, is taken to have the defaults)."""
    cache = client.node_stats(client.nodes[0]).get("store", {}).get("cache", {})
    return {
        "capacity_bytes": int(cache.get("capacity_bytes", CACHE_BYTES_DEFAULT)),
        "block_size_bytes": int(cache.get("block_size_bytes", 0)) or DEFAULT_BLOCK_SIZE_BYTES,
    }


#: Reads of this size pass the node's block cache by (over ``cache_read_bytes_max``).
_UNCACHED_READ_BYTES = 1 << 20


def _warm_page_cache(client: Client, key: str, start: int, stop: int) -> None:
    """Bring bytes ``[start, stop)`` of ``key`` into the node's OS page cache and not
    into its block cache: reads larger than the node caches go straight to the file."""
    for offset in range(start, stop, _UNCACHED_READ_BYTES):
        client.read(key, offset, min(_UNCACHED_READ_BYTES, stop - offset))


def _remote_fetch(client: Client, pb: int) -> Fetch:
    read = client.read

    def fetch(page: int) -> bytes:
        return read(KEY, page * pb, pb)

    return fetch


#: The paper's figures (HP9000/350 client, 10 Mbit Ethernet, NFS), for the report.
PAPER = {
    "pages": 400,
    "local_s": [10.68, 10.24, 9.74],
    "remote_same_server_s": [15.42, 15.02, 13.32],
    "remote_over_local": 1.5,
    "remote_ms_per_page_cold": 39.0,
    "fast_server_sun4_s_per_100_pages": 2.11,
    "slow_server_vax_s_per_100_pages": 4.3,
}
