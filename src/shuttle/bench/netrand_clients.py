"""``shuttle bench netrand --clients N``: the same page fetches from N clients at once.

One client at a time measures latency; a server's worth shows when clients compete.
For each N, N client processes (forked from the benchmark, each with its own Shuttle
connection and its own Redis connection) read their own random pages (from the first
half of the file) in four passes, every client starting each pass together (a
barrier):

* **cold**: the node's block cache and the file's OS page cache dropped just before;
* **warm**: the same pages again;
* **mixed** (N ≥ 2): half the clients read their warm pages again while the other half
  read pages of the file's third quarter, which nobody has read since the drop: the
  case where a cold read on the node's event loop would stall the warm readers
  (``mixed_warm`` and ``mixed_cold`` are reported apart);
* **mixed_paged** (N ≥ 2): the same, the other half reading pages of the fourth
  quarter, which the benchmark has just read into the node's OS page cache but not its
  block cache: node-cache misses over page-cache hits, the path most reads take when
  the working set is larger than the block cache (``mixed_paged_warm`` and
  ``mixed_paged_cold``; ``mixed_paged_over_warm`` is the pass's throughput, both
  halves, over the warm pass's);
* **redis**: the same pages from Redis, the anchor, with the same number of clients.

The warm and Redis passes are **timed** and **interleaved**: each lasts
``pass_seconds`` in all, run as :data:`SLICES` slices that alternate (warm, Redis,
warm, Redis, ...), every client reading its pages over and over (they are all
cached) until the slice's time is up. So a pass holds tens of thousands of requests
(at 400 pages a client, a 64-client pass lasted well under a second on a quiet
machine and its p99 moved by a third between runs), and drift on a shared machine
falls on Shuttle and Redis alike; the pass's figures pool its slices, and the
Shuttle/Redis throughput ratio of each pair of slices (``slices``) shows how much the
machine moved under the run. The cold and mixed passes read their page lists once: a
page read twice is no longer cold, and the file holds only so many (their
``--pages``). ``pass_seconds=0`` makes every pass one slice that reads its list once.

Each pass reports throughput (pages per second over the pass, first start to last
finish) and the p50 and p99 of every request's latency; ``node`` says, per Shuttle
pass, how many requests the node answered on its event loop and how many it sent to
its thread pool (``node.stats``: ``inline`` and ``inline_declined``).

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
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from shuttle.bench.redis_anchor import RespClient
from shuttle.client.client import Client
from shuttle.errors import ConfigError

#: The timed passes' slices, alternating (see the module): four pairs of 0.75 s at the
#: default length, enough to see the machine move and each long enough to hold
#: thousands of requests at 64 clients.
SLICES = 4
#: What the passes report: a mixed pass reports its warm and its cold readers apart,
#: and both together.
RESULTS = (
    "remote_cold",
    "remote_warm",
    "mixed_warm",
    "mixed_cold",
    "mixed",
    "mixed_paged_warm",
    "mixed_paged_cold",
    "mixed_paged",
    "redis",
)
#: How long a pass may take before the benchmark gives up on its clients.
PASS_TIMEOUT_S = 600.0
#: How long each client reads in a timed pass (warm, Redis), its four slices
#: together: 3 s held 17,000-31,000 requests a pass on this 2-vCPU machine under
#: other sessions' load, about 120,000 when it is quiet (42,000 pages/s at 8
#: clients), against 3,200-25,600 for 400 pages a client (benchmarks/README.md).
PASS_SECONDS_DEFAULT = 3.0
#: The passes that are timed (every page in them is cached; see the module).
TIMED_PASSES = frozenset({"remote_warm", "redis"})
#: More clients than this would measure the machine's process table, not the servers.
CLIENTS_MAX = 256


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


def _percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e3


def summarize(
    latencies_ns: list[int], started: list[float], finished: list[float]
) -> dict[str, Any]:
    """One pass of all clients: throughput over the pass and the latency percentiles."""
    return summarize_slices([(latencies_ns, started, finished)])


def summarize_slices(slices: list[tuple[list[int], list[float], list[float]]]) -> dict[str, Any]:
    """A pass made of slices (each: every client's latencies, starts and finishes):
    throughput over the slices' time (each from its first start to its last finish)
    and the latency percentiles of all their requests."""
    lat = sorted(x for latencies, _, _ in slices for x in latencies)
    if not lat:
        return {}
    elapsed_s = sum(max(finished) - min(started) for _, started, finished in slices)
    return {
        "requests": len(lat),
        "elapsed_s": elapsed_s,
        "pages_per_s": len(lat) / elapsed_s if elapsed_s > 0 else 0.0,
        "p50_us": _percentile(lat, 0.50),
        "p99_us": _percentile(lat, 0.99),
        "max_us": lat[-1] / 1e3,
    }


def pass_sequence(pass_seconds: float) -> list[str]:
    """The passes in the order the clients make them: the timed ones as alternating
    slices (warm, Redis, warm, Redis, ...) after the cold pass, then the mixed ones."""
    slices = SLICES if pass_seconds > 0 else 1
    return ["remote_cold", *(["remote_warm", "redis"] * slices), "mixed", "mixed_paged"]


def _client_process(
    client: Client,
    redis_port: int | None,
    key: str,
    plan: list[tuple[str | None, list[int]]],
    page_bytes: int,
    barrier: Any,
    results: multiprocessing.connection.Connection,
    pass_seconds: float = 0.0,
) -> None:
    """One forked client: in each pass (when every client is ready) it reads ``plan``'s
    pages for that pass (a timed pass: over and over for ``pass_seconds``) and files
    their latencies under its result name (None: it sits the pass out); sends its
    samples back."""
    client.after_fork_in_child()
    out: dict[str, list[tuple[list[int], float, float]]] = {}
    try:
        resp = RespClient(redis_port) if redis_port is not None else None

        def remote(p: int) -> bytes:
            return client.read(key, p * page_bytes, page_bytes)

        def redis(p: int) -> bytes:
            assert resp is not None
            return resp.get(b"p:%d" % p) or b""

        clock = time.perf_counter_ns
        for name, pages in plan:
            barrier.wait(PASS_TIMEOUT_S)  # the parent dropped caches before this pass
            if name is not None and (name != "redis" or resp is not None):
                fetch: Callable[[int], bytes] = redis if name == "redis" else remote
                lat: list[int] = []
                start = time.time()
                timed = pass_seconds > 0 and name in TIMED_PASSES
                deadline = clock() + int(pass_seconds / SLICES * 1e9)
                count = len(pages)
                i = 0
                while (clock() < deadline) if timed else i < count:
                    page = pages[i % count]
                    t = clock()
                    data = fetch(page)
                    lat.append(clock() - t)
                    if len(data) != page_bytes:
                        raise AssertionError(f"{name}: page {page}: got {len(data)} bytes")
                    i += 1
                out.setdefault(name, []).append((lat, start, time.time()))
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
    warm_page_cache: Callable[[int, int], None],
    node_counters: Callable[[], dict[str, Any]],
    pass_seconds: float = PASS_SECONDS_DEFAULT,
) -> dict[str, Any]:
    """The passes with ``n`` concurrent client processes (the warm and Redis ones
    ``pass_seconds`` long, 0: ``pages`` each); returns their summaries."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n + 1)
    sequence = pass_sequence(pass_seconds)
    pipes: list[multiprocessing.connection.Connection] = []
    procs = []
    half = max(1, file_pages // 2)
    three_quarters = max(half, file_pages * 3 // 4)
    for i in range(n):
        rng = random.Random(seed * 1000 + i)
        # The first half of the file for the cold, warm and Redis passes; the mixed
        # pass's cold readers read the third quarter, which nobody has read since the
        # drop, and the paged pass's the fourth, read into the page cache just before.
        mine = [rng.randrange(half) for _ in range(pages)]
        fresh = [half + rng.randrange(max(1, three_quarters - half)) for _ in range(pages)]
        paged = [
            three_quarters + rng.randrange(max(1, file_pages - three_quarters))
            for _ in range(pages)
        ]
        mixed: tuple[str | None, list[int]] = (None, [])
        mixed_paged: tuple[str | None, list[int]] = (None, [])
        if n >= 2:
            mixed = ("mixed_warm", mine) if i % 2 == 0 else ("mixed_cold", fresh)
            mixed_paged = ("mixed_paged_warm", mine) if i % 2 == 0 else ("mixed_paged_cold", paged)
        by_pass = {
            "remote_cold": ("remote_cold", mine),
            "remote_warm": ("remote_warm", mine),
            "mixed": mixed,
            "mixed_paged": mixed_paged,
            "redis": ("redis", mine),
        }
        plan = [by_pass[name] for name in sequence]
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_client_process,
            args=(client, redis_port, key, plan, page_bytes, barrier, send, pass_seconds),
            daemon=True,
        )
        proc.start()
        send.close()
        pipes.append(receive)
        procs.append(proc)
    report: dict[str, Any] = {"clients": n, "pages_per_client": pages, "pass_seconds": pass_seconds}
    # What the node did in each pass (its slices summed); each node.stats call is
    # itself answered inline (and counted once it has answered).
    done: dict[str, dict[str, int]] = {}
    broken = False
    try:
        for name in sequence:
            if name == "remote_cold":
                drop_caches()
            elif name == "mixed_paged" and n >= 2:
                warm_page_cache(three_quarters * page_bytes, file_pages * page_bytes)
            before = node_counters()
            barrier.wait(PASS_TIMEOUT_S)  # go
            barrier.wait(PASS_TIMEOUT_S)  # all done
            after = node_counters()
            if name != "redis":
                total = done.setdefault(name, {"inline": 0, "pooled": 0})
                total["inline"] += after["inline"] - before["inline"] - 1
                total["pooled"] += after["declined"] - before["declined"]
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
    slice_figures: dict[str, list[dict[str, Any]]] = {}
    for name in RESULTS:
        # A mixed pass as a whole: its warm and its cold readers' samples together.
        parts = (name + "_warm", name + "_cold") if name in ("mixed", "mixed_paged") else (name,)
        got = [o[part] for o in outputs for part in parts if part in o]
        if not got:
            continue
        slices = [
            (
                [x for runs in got for x in runs[i][0]],
                [runs[i][1] for runs in got],
                [runs[i][2] for runs in got],
            )
            for i in range(min(len(runs) for runs in got))
        ]
        report[name] = summarize_slices(slices)
        if len(slices) > 1:
            slice_figures[name] = [summarize_slices([one]) for one in slices]
    report["node"] = done
    warm_slices, redis_slices = slice_figures.get("remote_warm"), slice_figures.get("redis")
    if warm_slices and redis_slices:
        # How much the machine moved under the run: each pair of slices' ratios.
        report["slices"] = [
            {
                "throughput": w["pages_per_s"] / r["pages_per_s"],
                "p99": w["p99_us"] / r["p99_us"],
                "requests": w["requests"] + r["requests"],
            }
            for w, r in zip(warm_slices, redis_slices, strict=False)
        ]
    warm_s = report.get("remote_warm")
    for name in ("mixed", "mixed_paged"):
        mixed_s = report.get(name)
        if warm_s and mixed_s:  # the target: ≥ 0.8 at 8 and 64 clients
            report[f"{name}_over_warm"] = mixed_s["pages_per_s"] / warm_s["pages_per_s"]
    redis_s = report.get("redis")
    for name in (
        "remote_cold",
        "remote_warm",
        "mixed_warm",
        "mixed_cold",
        "mixed_paged_warm",
        "mixed_paged_cold",
    ):
        mine_s = report.get(name)
        if redis_s and mine_s:
            report[f"{name}_over_redis"] = {
                "p50": mine_s["p50_us"] / redis_s["p50_us"],
                "p99": mine_s["p99_us"] / redis_s["p99_us"],
                "throughput": mine_s["pages_per_s"] / redis_s["pages_per_s"],
            }
    return report
