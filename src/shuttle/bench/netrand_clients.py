"""``shuttle bench netrand --clients N``: the same page fetches from N clients at once.

One client at a time measures latency; a server's worth shows when clients compete.
For each N, N client processes (forked from the benchmark, each with its own Shuttle
connection and its own Redis connection) read their own random pages in these passes,
every client starting each pass together (a barrier):

* **cold**: the node's block cache and the file's OS page cache dropped just before,
  pages from the first half of the file;
* **warm**: pages of the file's *hot region* (its first sixteenth of the node's block
  cache, :func:`hot_pages`), read once untimed first so that all of it is cached;
* **mixed** (N ≥ 2): half the clients read their warm pages again while the other half
  read pages of the file's third quarter, which nobody has read since the drop: the
  case where a cold read on the node's event loop would stall the warm readers
  (``mixed_warm`` and ``mixed_cold`` are reported apart);
* **mixed_paged** (N ≥ 2): half the clients read their warm pages, the other half read
  a second object, twice the node's block cache, that the benchmark has just read
  into the node's OS page cache but not its block cache: node-cache misses over
  page-cache hits, the path most reads take when the working set is larger than the
  block cache (``mixed_paged_warm`` and ``mixed_paged_cold``; ``mixed_paged_over_warm``
  is the pass's throughput, both halves, over the warm pass's). Each missing reader
  cycles over its own share of that object's blocks, one page per block
  (:func:`miss_cycle`): between two reads of a block all the missing readers have read
  about the whole object, twice what the cache holds, so under LRU every read misses,
  however long the pass (``node.mixed_paged.cache_misses`` counts them:
  ``mixed_paged_missed`` is the share of the missing readers' reads that missed);
* **redis**: the warm pages from Redis, the anchor, with the same number of clients.

The warm, Redis and mixed_paged passes are **timed** and **interleaved**: each lasts
``pass_seconds`` in all, run as ``slices`` slices (:data:`SLICES_DEFAULT`) that
alternate (warm, Redis, mixed_paged, warm, Redis, ...), every client reading its pages
over and over until the slice's time is up. So a pass holds tens of thousands of
requests (at 400 pages a client, a 64-client pass lasted well under a second on a quiet
machine and its p99 moved by a third between runs), and drift on a shared machine falls
on all three alike; the pass's figures pool its slices, and the ratio of each trio's
slices (``slices``: warm ÷ Redis; ``mixed_paged_slices``: mixed_paged ÷ warm) shows how
much the machine moved under the run; ``spread`` gives each pass's slices' throughput
range, Redis against Redis included: the machine's own noise. The cold and mixed passes
read their page lists once: a page read twice is no longer cold, and the file holds only
so many (their ``--pages``). ``pass_seconds=0`` makes every pass one slice that reads
its list once.

Each pass reports throughput (pages per second over the pass, first start to last
finish) and the p50 and p99 of every request's latency; ``node`` says, per Shuttle
pass, how many requests the node answered on its event loop and how many it sent to
its thread pool (``node.stats``: ``inline`` and ``inline_declined``), and how many
blocks its block cache missed; and where the CPU went, per request: the clients'
(``client_cpu_us_per_req``, each process's own CPU time over the pass) and the
server's (``server_cpu_us_per_req``: the node's for a Shuttle pass, Redis's for a
Redis pass, when the benchmark started them). Pinned to one CPU, the pass's
throughput is about one over their sum.

Why processes and not threads: the clients are Python, and threads of one process
share the GIL, so 8 or 64 of them would measure the client's interpreter lock rather
than the servers. Forked processes (``fork``: no re-import, a few ms each) keep their
own interpreter; they inherit the benchmark's CPU placement, so the node, Redis and
all the clients share the same CPUs for both servers. Redis is driven by the same
RESP client and timing loop as in the one-client passes, so the comparison stays
between servers, not client libraries.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from shuttle.bench import netrand_machine
from shuttle.bench.netrand_summary import summaries
from shuttle.bench.placement import cpu_ticks, cpu_use, sched_use
from shuttle.bench.redis_anchor import RespClient
from shuttle.client.client import Client
from shuttle.errors import ConfigError

#: How long a pass may take before the benchmark gives up on its clients.
PASS_TIMEOUT_S = 600.0
#: How long each client reads in a timed pass (warm, Redis, mixed_paged), its slices
#: together (:data:`SLICES_DEFAULT`). What a rerun repeats is set by how much the
#: machine moves under a pass, not by how many requests it holds (3 s held
#: 17,000-120,000): on this shared 2-vCPU machine a slice pair's warm ÷ Redis ratio
#: moves 13-29 % (sd) under other sessions' load, and three runs' figures moved by
#: about what that predicts for a run's four slices (``reruns.noise``). 12 s (then four
#: 3-s slices) brought the 64-client ratio's range over three runs from 16.7 % to 2.2 %
#: pinned and from 29.2 % to 9.5 % unpinned under that load (benchmarks/README.md,
#: "Tail latency", sixth session); a ``--clients 8,64 --repeat 3`` invocation then
#: takes about 5 minutes.
PASS_SECONDS_DEFAULT = 12.0
#: The timed passes' slices, alternating (see the module), ``--slices``: each slice of
#: the warm pass is paired with the Redis slice after it, and a pass's figure pools
#: them. What moves a slice pair's ratio is the machine over seconds, not the slice's
#: length: under other sessions' load a pair moved 24-31 % (sd) with 1-s slices and
#: 25-29 % with 3-s ones, so more, shorter slices average more of it in the same pass:
#: 12 (1-s slices of the 12-s pass) brought the 64-client ratio's range over three
#: pinned runs from 31 and 39 % (4 slices) to 6.5 and 16 %, in the same sitting,
#: interleaved (benchmarks/README.md, "Tail latency", eighth sitting). A slice of 1 s
#: still holds 10,000-30,000 requests at 64 clients.
SLICES_DEFAULT = 12
#: Most slices a pass may be cut into: a slice under about 0.1 s at 64 clients would
#: be mostly the barrier's start and finish, not reading.
SLICES_MAX = 64
#: The passes that are timed (see the module): the warm ones read cached pages, and
#: mixed_paged's missing readers cycle over more blocks than the cache holds.
TIMED_PASSES = frozenset({"remote_warm", "redis", "mixed_paged_warm", "mixed_paged_cold"})
#: The untimed pass that caches the hot region before the warm slices (not reported).
WARM_UP = "warm_up"
#: More clients than this would measure the machine's process table, not the servers.
CLIENTS_MAX = 256
#: The hot region (the warm readers' pages) is at most this share of the block cache,
#: so that the missing readers of mixed_paged, filling the rest, do not evict it. The
#: warm readers pick hot blocks at random, as many reads as the missing readers make:
#: a hot block is evicted if it goes unread while the rest of the cache fills, about
#: (1 - 1/16) of it, and with 1/16 of the cache hot, that gap is 15 times its mean
#: (e^-15); with a quarter (3 times the mean), about 5 % of the warm reads would miss.
HOT_SHARE_OF_CACHE = 16
#: mixed_paged's object is this many times the block cache: each missing reader's
#: block comes round again only after about this many caches' worth of other blocks,
#: so a reader up to twice as fast as the others still finds it evicted.
PAGED_CACHES = 2


def parse_clients(values: Iterable[str]) -> list[int]:
    """``["1,8", "64"]`` → ``[1, 8, 64]``: the option may be a list, repeated, or both."""
    out: list[int] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                n = int(part)
            except ValueError:
                raise ConfigError(
                    f"--clients takes client counts like 1,8,64; {part!r} is not a number"
                ) from None
            if not 1 <= n <= CLIENTS_MAX:
                raise ConfigError(f"--clients: {n} is out of range; use 1 to {CLIENTS_MAX}")
            out.append(n)
    return out


def hot_pages(file_pages: int, cache_bytes: int, page_bytes: int) -> int:
    """How many pages, from the file's start, the warm readers draw theirs from: the
    first half of the file, or 1/:data:`HOT_SHARE_OF_CACHE` of the node's block cache
    if that is less."""
    return max(1, min(file_pages // 2, cache_bytes // HOT_SHARE_OF_CACHE // page_bytes))


def paged_object_bytes(cache_bytes: int, block_bytes: int) -> int:
    """The size of mixed_paged's object for a node whose block cache holds
    ``cache_bytes`` in blocks of ``block_bytes``: :data:`PAGED_CACHES` caches' worth,
    in whole blocks."""
    blocks = max(1, PAGED_CACHES * cache_bytes // block_bytes)
    return blocks * block_bytes


def miss_cycle(
    reader: int, readers: int, object_bytes: int, block_bytes: int, page_bytes: int, seed: int
) -> list[int]:
    """Missing reader ``reader`` of ``readers``: one page (at a seeded offset) in each of
    its blocks of the paged object (blocks ``reader``, ``reader + readers``, ...), in
    order; read over and over, each read is of a block last read a whole cycle of all
    the readers ago."""
    blocks = object_bytes // block_bytes
    if not 0 <= reader < readers <= blocks:
        raise ConfigError(
            f"the mixed pass's {readers} missing readers need at least as many blocks of "
            f"{block_bytes} bytes; its object has {blocks}: use fewer --clients"
        )
    per_block = max(1, block_bytes // page_bytes)
    rng = random.Random(seed)
    return [b * per_block + rng.randrange(per_block) for b in range(reader, blocks, readers)]


def pass_sequence(pass_seconds: float, slices: int = SLICES_DEFAULT) -> list[str]:
    """The passes in the order the clients make them: cold, the untimed warm-up and the
    disk-cold mixed pass, then the timed ones as alternating slices (warm, Redis,
    mixed_paged, warm, Redis, mixed_paged, ...)."""
    slices = slices if pass_seconds > 0 else 1
    return [
        "remote_cold",
        WARM_UP,
        "mixed",
        *(["remote_warm", "redis", "mixed_paged"] * slices),
    ]


def _client_process(
    client: Client,
    redis_port: int | None,
    plan: list[tuple[str | None, str, list[int]]],
    page_bytes: int,
    barrier: Any,
    results: multiprocessing.connection.Connection,
    pass_seconds: float = 0.0,
    slices: int = SLICES_DEFAULT,
) -> None:
    """One forked client: in each pass (when every client is ready) it reads ``plan``'s
    pages of its key for that pass (a timed pass: over and over for a slice of
    ``pass_seconds`` ÷ ``slices``) and files their latencies under its result name (None: it sits
    the pass out); sends its samples back."""
    client.after_fork_in_child()
    out: dict[str, list[tuple[list[int], float, float, float, float, int]]] = {}
    try:
        resp = RespClient(redis_port) if redis_port is not None else None
        read = client.read

        def redis(key: str, p: int) -> bytes:
            assert resp is not None
            return resp.get(b"p:%d" % p) or b""

        def remote(key: str, p: int) -> bytes:
            return read(key, p * page_bytes, page_bytes)

        clock = time.perf_counter_ns
        # Where each pass's list stands: a timed pass's next slice goes on from there
        # (mixed_paged's missing readers would otherwise re-read blocks still cached).
        positions: dict[str, int] = {}
        for name, key, pages in plan:
            barrier.wait(PASS_TIMEOUT_S)  # the parent dropped caches before this pass
            if name is not None and (name != "redis" or resp is not None):
                fetch: Callable[[str, int], bytes] = redis if name == "redis" else remote
                lat: list[int] = []
                cpu = time.process_time()
                _, waited, runs = sched_use()
                start = time.time()
                timed = pass_seconds > 0 and name in TIMED_PASSES
                deadline = clock() + int(pass_seconds / slices * 1e9)
                count = len(pages)
                i = positions.get(name, 0)
                stop = i + count
                while (clock() < deadline) if timed else i < stop:
                    page = pages[i % count]
                    t = clock()
                    data = fetch(key, page)
                    lat.append(clock() - t)
                    if len(data) != page_bytes:
                        raise AssertionError(f"{name}: page {page}: got {len(data)} bytes")
                    i += 1
                end = time.time()
                positions[name] = i
                # Per slice: latencies, start, finish, CPU seconds, and from the
                # scheduler the seconds runnable but waiting and the times put on a CPU.
                _, waited_after, runs_after = sched_use()
                out.setdefault(name, []).append(
                    (
                        lat,
                        start,
                        end,
                        time.process_time() - cpu,
                        waited_after - waited,
                        runs_after - runs,
                    )
                )
            barrier.wait(PASS_TIMEOUT_S)  # every client finished the pass
        if resp is not None:
            resp.close()
        client.close()
        results.send(out)
    except BaseException as exc:  # the parent reports it; a child has no console
        results.send({"error": f"{type(exc).__name__}: {exc}"})
        barrier.abort()
    finally:
        results.close()


def run_clients(
    n: int,
    *,
    client: Client,
    redis_port: int | None,
    key: str,
    file_pages: int,
    pages: int,
    page_bytes: int,
    seed: int,
    drop_caches: Callable[[], None],
    warm_page_cache: Callable[[], None],
    node_counters: Callable[[], dict[str, Any]],
    paged_key: str,
    paged_bytes: int,
    block_bytes: int,
    hot: int,
    pass_seconds: float = PASS_SECONDS_DEFAULT,
    slices: int = SLICES_DEFAULT,
    server_sched: Callable[[], dict[str, tuple[float, float, int]]] = dict,
) -> dict[str, Any]:
    """The passes with ``n`` concurrent client processes (the warm, Redis and
    mixed_paged ones ``pass_seconds`` long, 0: ``pages`` each); returns their
    summaries. ``paged_key``: mixed_paged's object (``paged_bytes``, the node's block
    cache in blocks of ``block_bytes`` twice over), brought into the node's page cache
    by ``warm_page_cache``; ``hot``: the warm readers draw their pages from the file's
    first ``hot`` pages (:func:`hot_pages`). ``server_sched``: what the scheduler did so
    far for the node (``"node"``) and Redis (``"redis"``), those the benchmark knows
    (:func:`~shuttle.bench.placement.sched_use`: CPU seconds, seconds waiting for a CPU,
    times put on one)."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n + 1)
    sequence = pass_sequence(pass_seconds, slices)
    pipes: list[multiprocessing.connection.Connection] = []
    procs = []
    half = max(1, file_pages // 2)
    three_quarters = max(half, file_pages * 3 // 4)
    missing_readers = n // 2  # the odd-numbered clients
    for i in range(n):
        rng = random.Random(seed * 1000 + i)
        # The cold pass reads the first half of the file; the warm, Redis and mixed
        # passes' warm readers the hot region; the mixed pass's cold readers the third
        # quarter, which nobody has read since the drop.
        mine = [rng.randrange(half) for _ in range(pages)]
        hot_list = [rng.randrange(hot) for _ in range(pages)]
        fresh = [half + rng.randrange(max(1, three_quarters - half)) for _ in range(pages)]
        mixed: tuple[str | None, str, list[int]] = (None, key, [])
        mixed_paged: tuple[str | None, str, list[int]] = (None, key, [])
        if n >= 2:
            mixed = ("mixed_warm", key, hot_list) if i % 2 == 0 else ("mixed_cold", key, fresh)
            if i % 2 == 0:
                mixed_paged = ("mixed_paged_warm", key, hot_list)
            else:
                cycle = miss_cycle(
                    i // 2, missing_readers, paged_bytes, block_bytes, page_bytes, seed + i
                )
                if pass_seconds == 0:  # read once: --pages of them, as the other passes
                    cycle = [cycle[k % len(cycle)] for k in range(pages)]
                mixed_paged = ("mixed_paged_cold", paged_key, cycle)
        by_pass: dict[str, tuple[str | None, str, list[int]]] = {
            "remote_cold": ("remote_cold", key, mine),
            WARM_UP: (WARM_UP, key, hot_list),
            "remote_warm": ("remote_warm", key, hot_list),
            "mixed": mixed,
            "mixed_paged": mixed_paged,
            "redis": ("redis", key, hot_list),
        }
        plan = [by_pass[name] for name in sequence]
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_client_process,
            args=(client, redis_port, plan, page_bytes, barrier, send, pass_seconds, slices),
            daemon=True,
        )
        proc.start()
        send.close()
        pipes.append(receive)
        procs.append(proc)
    report: dict[str, Any] = {
        "clients": n,
        "pages_per_client": pages,
        "pass_seconds": pass_seconds,
        "slice_count": slices if pass_seconds > 0 else 1,
        "hot_pages": hot,
        "paged_object_bytes": paged_bytes,
    }
    # What the node did in each pass (its slices summed); each node.stats call is
    # itself answered inline (and counted once it has answered).
    done: dict[str, dict[str, int]] = {}
    server_cpu_s: dict[str, float] = {}
    # What the machine did under each warm and Redis slice (netrand_machine).
    machine: dict[str, list[dict[str, Any]]] = {}
    broken = False
    paged_warmed = False
    try:
        for name in sequence:
            if name == "remote_cold":
                drop_caches()
            elif name == "mixed_paged" and n >= 2 and not paged_warmed:
                warm_page_cache()
                paged_warmed = True
            before = node_counters()
            sched_before = server_sched()
            ticks_before = cpu_ticks()
            barrier.wait(PASS_TIMEOUT_S)  # go
            barrier.wait(PASS_TIMEOUT_S)  # all done
            ticks_after = cpu_ticks()
            sched_after = server_sched()
            after = node_counters()
            server = "redis" if name == "redis" else "node"
            used: float | None = None
            waited: float | None = None
            runs: int | None = None
            if server in sched_after and server in sched_before:
                (ran0, waited0, runs0), (ran1, waited1, runs1) = (
                    sched_before[server],
                    sched_after[server],
                )
                used, waited, runs = ran1 - ran0, waited1 - waited0, runs1 - runs0
                server_cpu_s[name] = server_cpu_s.get(name, 0.0) + used
            if name in netrand_machine.PAIRED:
                slice_use = {
                    "cpus": cpu_use(ticks_before, ticks_after),
                    "server_cpu_s": used,
                    "server_wait_s": waited,
                    "server_runs": runs,
                }
                machine.setdefault(name, []).append(slice_use)
            if name not in ("redis", WARM_UP):
                total = done.setdefault(name, {"inline": 0, "pooled": 0, "cache_misses": 0})
                total["inline"] += after["inline"] - before["inline"] - 1
                total["pooled"] += after["declined"] - before["declined"]
                total["cache_misses"] += after["cache_misses"] - before["cache_misses"]
    except threading.BrokenBarrierError:
        broken = True  # a client failed: its message comes through its pipe
    finally:
        outputs = [p.recv() if p.poll(PASS_TIMEOUT_S if not broken else 5.0) else {} for p in pipes]
        for proc in procs:
            proc.join(PASS_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
    # A client's own failure first: the others then only saw the barrier break.
    errors = sorted(
        (o["error"] for o in outputs if "error" in o),
        key=lambda e: e.startswith("BrokenBarrierError"),
    )
    if errors or broken:
        first = errors[0] if errors else "a client stopped without saying why"
        raise RuntimeError(f"{len(errors)} of {n} benchmark clients failed; first: {first}")
    summaries(report, outputs)
    # The CPUs this process (and so its forked clients) may run on: one when pinned.
    ours = [f"cpu{cpu}" for cpu in sorted(os.sched_getaffinity(0))]
    netrand_machine.attach(report, machine, outputs, ours)
    for name, used in server_cpu_s.items():
        if report.get(name):
            report[name]["server_cpu_us_per_req"] = used * 1e6 / report[name]["requests"]
    report["node"] = done
    paged_node, missing = done.get("mixed_paged"), report.get("mixed_paged_cold")
    if paged_node and missing:
        # Did the missing readers miss? Blocks the cache missed in the pass ÷ their reads
        # (a warm reader's miss would count too: over 1 says the hot region was evicted).
        report["mixed_paged_missed"] = paged_node["cache_misses"] / missing["requests"]
    return report
