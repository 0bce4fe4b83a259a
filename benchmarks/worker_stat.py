"""A ``stat`` through a worker of a node (``shuttle serve --workers 2``): answered by the
worker from the attributes it learnt, against the same request sent on to the primary,
and against the primary's own answer, in the same run (issue 26, item 4).

    .venv/bin/python benchmarks/worker_stat.py --rounds 12 --stats 2000 \\
        --json benchmarks/results/workers/stat.json

One node with two processes (started here, on loopback) holds one object whose chunk
list is longer than a worker learns (``LEARNT_CHUNKS_MAX`` chunks). Three series of
``stat`` calls, each on its own connection, one request at a time:

* ``worker``: on a connection the kernel gave the worker, ``chunks_max`` =
  ``LEARNT_CHUNKS_MAX``: the worker answers it itself;
* ``forwarded``: on that same connection, ``chunks_max`` = ``LEARNT_CHUNKS_MAX`` + 1:
  one chunk (45 bytes) more than the worker learnt, so it sends the request on to the
  primary and relays the answer: the same request but for that chunk, as every stat
  through a worker was before workers answered stats;
* ``primary``: on a connection the kernel gave the primary, ``chunks_max`` =
  ``LEARNT_CHUNKS_MAX``: what a client that landed on the primary pays.

Each round runs the three series one after the other, in an order that rotates from
round to round, and the ratios are taken within each round (the machine is shared:
its load falls on the three alike). Printed and written: p50/p90/p99 µs per series
(medians over rounds), and per round ``worker ÷ forwarded`` and ``worker ÷ primary``
at p50: median (min–max), the spread being the noise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from shuttle.bench.nodes import bench_client
from shuttle.net.blocking import BlockingConnection
from shuttle.node.worker_reads import LEARNT_CHUNKS_MAX

#: New connections tried before one lands on the wanted process (the kernel picks by a
#: hash of the client's port: each try is a coin toss).
TRIES_MAX = 200
#: The object: random bytes, long enough for well over LEARNT_CHUNKS_MAX chunks.
OBJECT_BYTES = 8 << 20
SERIES = ("worker", "forwarded", "primary")


def _connect_to(port: int, process: int, key: bytes | None) -> BlockingConnection:
    for _ in range(TRIES_MAX):
        conn = BlockingConnection("127.0.0.1", port, key=key)
        if int(conn.call("ping").result.get("worker", 0)) == process:
            return conn
        conn.close()
    raise SystemExit(f"no connection landed on process {process} in {TRIES_MAX} tries")


def _times_us(conn: BlockingConnection, args: dict[str, Any], count: int) -> list[float]:
    call = conn.call
    out = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        call("stat", args)
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(rounds: int, stats: int) -> dict[str, Any]:
    with bench_client(None, node_args=["--workers", "2"]) as (client, _scratch):
        node = client.nodes[0]
        client.put("stat-target", os.urandom(OBJECT_BYTES))
        on_worker = _connect_to(node.port, 1, client.key)
        on_primary = _connect_to(node.port, 0, client.key)
        args = {
            "worker": (on_worker, {"key": "stat-target", "chunks_max": LEARNT_CHUNKS_MAX}),
            "forwarded": (
                on_worker,
                {"key": "stat-target", "chunks_max": LEARNT_CHUNKS_MAX + 1},
            ),
            "primary": (on_primary, {"key": "stat-target", "chunks_max": LEARNT_CHUNKS_MAX}),
        }
        chunks = on_primary.call("stat", {"key": "stat-target", "chunks_max": 0}).result
        if chunks["chunks_total"] <= LEARNT_CHUNKS_MAX + 1:
            raise SystemExit("the object has too few chunks for the comparison")
        # Warm up: the worker learns the object, every path runs once.
        for conn, a in args.values():
            _times_us(conn, a, 200)
        before = on_worker.call("node.stats").result["worker"]["reads"]
        per_round: list[dict[str, dict[str, float]]] = []
        for r in range(rounds):
            order = SERIES[r % 3 :] + SERIES[: r % 3]
            got: dict[str, dict[str, float]] = {}
            for name in order:
                conn, a = args[name]
                t = _times_us(conn, a, stats)
                got[name] = {"p50": _pct(t, 0.5), "p90": _pct(t, 0.9), "p99": _pct(t, 0.99)}
            per_round.append(got)
        after = on_worker.call("node.stats").result["worker"]["reads"]
        answered = after["stats_served"] - before["stats_served"]
        declined = after["stats_declined"] - before["stats_declined"]
        if answered != rounds * stats or declined != rounds * stats:
            raise SystemExit(
                f"the worker answered {answered} and sent on {declined} stats, not "
                f"{rounds * stats} each: the series are not what they claim"
            )
        on_worker.close()
        on_primary.close()
    series = {
        name: {q: statistics.median(g[name][q] for g in per_round) for q in ("p50", "p90", "p99")}
        for name in SERIES
    }
    ratios = {}
    for label, (a, b) in {
        "worker_over_forwarded": ("worker", "forwarded"),
        "worker_over_primary": ("worker", "primary"),
    }.items():
        values = [g[a]["p50"] / g[b]["p50"] for g in per_round]
        ratios[label] = {
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
            "per_round": values,
        }
    return {
        "rounds": rounds,
        "stats_per_series_per_round": stats,
        "chunks_max_learnt": LEARNT_CHUNKS_MAX,
        "chunks_total": chunks["chunks_total"],
        "loadavg": os.getloadavg(),
        "series_us": series,
        "ratios_p50": ratios,
        "per_round_us": per_round,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--stats", type=int, default=2000, help="stats per series per round")
    parser.add_argument("--json", type=Path, help="write the report here")
    ns = parser.parse_args()
    report = run(ns.rounds, ns.stats)
    for name, figures in report["series_us"].items():
        print(
            f"{name:10s} p50 {figures['p50']:7.1f} µs  p90 {figures['p90']:7.1f}  "
            f"p99 {figures['p99']:7.1f}"
        )
    for label, r in report["ratios_p50"].items():
        print(f"{label}: {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) over {ns.rounds} rounds")
    print(f"load average at the end: {report['loadavg']}")
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
