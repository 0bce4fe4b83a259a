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

#: The passes every client makes together, in order (see the module docstring).
PASSES = ("remote_cold", "remote_warm", "mixed", "mixed_paged", "redis")
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
    lat = sorted(latencies_ns)
    if not lat:
        return {}
    elapsed_s = max(finished) - min(started)
    return {
        "requests": len(lat),
        "elapsed_s": elapsed_s,
        "pages_per_s": len(lat) / elapsed_s if elapsed_s > 0 else 0.0,
        "p50_us": _percentile(lat, 0.50),
        "p99_us": _percentile(lat, 0.99),
        "max_us": lat[-1] / 1e3,
    }


def _client_process(
    client: Client,
    redis_port: int | None,
    key: str,
    plan: list[tuple[str | None, list[int]]],
    page_bytes: int,
    barrier: Any,
    results: multiprocessing.connection.Connection,
) -> None:
    """One forked client: in each pass (when every client is ready) it reads ``plan``'s
    pages for that pass and files their latencies under its result name (None: it sits
    the pass out); sends its samples back."""
    client.after_fork_in_child()
    out: dict[str, Any] = {}
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
                for page in pages:
                    t = clock()
                    data = fetch(page)
                    lat.append(clock() - t)
                    if len(data) != page_bytes:
                        raise AssertionError(f"{name}: page {page}: got {len(data)} bytes")
                out[name] = (lat, start, time.time())
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
) -> dict[str, Any]:
    """The three passes with ``n`` concurrent client processes; returns their summaries."""
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(n + 1)
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
        plan = [
            ("remote_cold", mine),
            ("remote_warm", mine),
            mixed,
            mixed_paged,
            ("redis", mine),
        ]
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_client_process,
            args=(client, redis_port, key, plan, page_bytes, barrier, send),
            daemon=True,
        )
        proc.start()
        send.close()
        pipes.append(receive)
        procs.append(proc)
    report: dict[str, Any] = {"clients": n, "pages_per_client": pages}
    counters: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    broken = False
    try:
        for name in PASSES:
            if name == "remote_cold":
                drop_caches()
            elif name == "mixed_paged" and n >= 2:
                warm_page_cache(three_quarters * page_bytes, file_pages * page_bytes)
            before = node_counters()
            barrier.wait(PASS_TIMEOUT_S)  # go
            barrier.wait(PASS_TIMEOUT_S)  # all done
            counters[name] = (before, node_counters())
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
    for name in RESULTS:
        # A mixed pass as a whole: its warm and its cold readers' samples together.
        parts = (name + "_warm", name + "_cold") if name in ("mixed", "mixed_paged") else (name,)
        got = [o[part] for o in outputs for part in parts if part in o]
        if not got:
            continue
        report[name] = summarize(
            [x for lat, _, _ in got for x in lat], [s for _, s, _ in got], [e for _, _, e in got]
        )
    for name in ("remote_cold", "remote_warm", "mixed", "mixed_paged"):
        first_c, last_c = counters[name]
        # What the node did in the pass; each node.stats call is itself answered inline
        # (and counted once it has answered).
        report.setdefault("node", {})[name] = {
            "inline": last_c["inline"] - first_c["inline"] - 1,
            "pooled": last_c["declined"] - first_c["declined"],
        }
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
