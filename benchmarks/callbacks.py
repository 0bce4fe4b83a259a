"""Callback promises against check-on-open: what an open of a cached object costs, and
what a write costs when clients hold promises on the object.

    .venv/bin/python benchmarks/callbacks.py --link lan --json benchmarks/results/callbacks.json

Starts one node on loopback (or uses ``--node``). Two measurements:

* **opens**: ``--opens`` open-and-read cycles of a cached ``--size``-byte object, in
  ``check`` (one stat per open) and in ``callback`` (no round trip while the promise
  holds); time per open and round trips per open.
* **writes**: puts of the object while H other clients (H = 0, 1, 4, 16) each hold a
  promise on it (each re-opens after every put, so it holds one again). A put waits
  for every holder's ack: about one round trip to each, in parallel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from shuttle.bench.nodes import bench_client
from shuttle.bench.session import BenchSession
from shuttle.client import Client

HOLDERS = (0, 1, 4, 16)


def _peer(base: Client, validation: str) -> Client:
    """Another client of the same node(s), link and key, in mode ``validation``."""
    return Client(base.nodes, key=base.key, validation=validation)


def measure_opens(base: Client, mode: str, opens: int) -> dict[str, Any]:
    with _peer(base, mode) as client:
        with client.open("bench/obj") as f:
            f.read()  # cached (and, in callback, promised)
        trips0 = client.counters()["round_trips"]
        times = []
        for _ in range(opens):
            t0 = time.perf_counter()
            with client.open("bench/obj") as f:
                f.read()
            times.append(time.perf_counter() - t0)
        trips = client.counters()["round_trips"] - trips0
    return {
        "mode": mode,
        "opens": opens,
        "open_read_ms_mean": 1e3 * statistics.fmean(times),
        "open_read_ms_median": 1e3 * statistics.median(times),
        "round_trips_per_open": trips / opens,
    }


def measure_writes(base: Client, holders: int, writes: int, size: int) -> dict[str, Any]:
    peers = [_peer(base, "callback") for _ in range(holders)]
    try:
        for p in peers:
            with p.open("bench/obj") as f:
                f.read()
        times = []
        for i in range(writes):
            t0 = time.perf_counter()
            base.put("bench/obj", bytes([i % 256]) * size)
            times.append(time.perf_counter() - t0)
            for p in peers:  # hold a promise again before the next put
                with p.open("bench/obj") as f:
                    f.read()
        broken = sum(p.counters()["validation"]["callback"]["promises_broken"] for p in peers)
    finally:
        for p in peers:
            p.close()
    return {
        "holders": holders,
        "writes": writes,
        "put_ms_mean": 1e3 * statistics.fmean(times),
        "put_ms_median": 1e3 * statistics.median(times),
        "promises_broken": broken,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--node", help="use this node (HOST:PORT) instead of starting one")
    parser.add_argument("--link", default="lan", help="link profile (default: lan)")
    parser.add_argument("--size", type=int, default=10_000, help="object bytes (10 KB)")
    parser.add_argument("--opens", type=int, default=300)
    parser.add_argument("--writes", type=int, default=50)
    parser.add_argument("--json", type=Path)
    a = parser.parse_args()
    with bench_client(a.node, link=a.link) as (base, _):
        base.put("bench/obj", b"x" * a.size)
        opens = [measure_opens(base, mode, a.opens) for mode in ("check", "callback")]
        for row in opens:
            print(
                f"open+read {row['mode']:>8}: {row['open_read_ms_mean']:.3f} ms mean, "
                f"{row['open_read_ms_median']:.3f} ms median, "
                f"{row['round_trips_per_open']:.2f} round trips per open"
            )
        writes = [measure_writes(base, h, a.writes, a.size) for h in HOLDERS]
        for row in writes:
            print(
                f"put with {row['holders']:>2} holders: {row['put_ms_mean']:.3f} ms mean, "
                f"{row['put_ms_median']:.3f} ms median ({row['promises_broken']} broken)"
            )
        node_stats = base.node_stats(base.nodes[0])["callbacks"]
    report = {
        "link": a.link,
        "size_bytes": a.size,
        "opens": opens,
        "writes": writes,
        "node_callbacks": node_stats,
    }
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    # Stops what the run started on any exit (SIGTERM too) and prints how long it took.
    with BenchSession(f"benchmarks/{Path(__file__).name}", {"argv": sys.argv[1:]}):
        main()
