"""How long a node of two processes serves on one after its worker dies: SIGKILL the
worker (an OOM kill, a crash) again and again, and time each kill until the primary's
``workers`` stats show a new worker serving (issue 26, item 4).

    .venv/bin/python benchmarks/worker_restart.py --kills 8 \\
        --json benchmarks/results/workers/restart.json

Kills in a row are each within a minute of the worker's start, so the primary's delay
before each restart doubles (``shuttle.node.worker_restarts``: 0.25 s, then 0.5, 1, 2,
... up to 30 s); the first figure is what a lone crash costs, the rest show the backoff.
Also printed and written: the worker's resident size before each kill.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from shuttle.bench.nodes import bench_client
from shuttle.net.blocking import BlockingConnection

#: New connections tried before one lands on the primary.
TRIES_MAX = 200
#: How often the stats are asked while a worker is being started again.
POLL_S = 0.005


def _on_primary(port: int, key: bytes | None) -> BlockingConnection:
    for _ in range(TRIES_MAX):
        conn = BlockingConnection("127.0.0.1", port, key=key)
        if not conn.call("ping").result.get("worker"):
            return conn
        conn.close()
    raise SystemExit(f"no connection landed on the primary in {TRIES_MAX} tries")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(kills: int) -> dict[str, Any]:
    with bench_client(None, node_args=["--workers", "2"]) as (client, _scratch):
        conn = _on_primary(client.nodes[0].port, client.key)
        rows = []
        for _ in range(kills):
            workers = conn.call("node.stats").result["workers"]
            pid = int(workers["processes"][0]["pid"])
            rss = _rss_mib(pid)
            restarts = workers["restarts"]
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            while True:
                workers = conn.call("node.stats").result["workers"]
                if workers["restarts"] > restarts and workers["alive"] == 2:
                    break
                time.sleep(POLL_S)
            rows.append(
                {
                    "serving_again_s": time.monotonic() - t0,
                    "delay_s": workers["processes"][0]["restart_delay_s"],
                    "rss_mib": rss,
                }
            )
        conn.close()
    return {"kills": rows, "loadavg": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--json", type=Path, help="write the report here")
    ns = parser.parse_args()
    report = run(ns.kills)
    for i, row in enumerate(report["kills"], start=1):
        print(
            f"kill {i}: serving again after {row['serving_again_s']:.2f} s "
            f"(delay {row['delay_s']:g} s); worker RSS {row['rss_mib']:.1f} MiB"
        )
    print(f"load average at the end: {report['loadavg']}")
    if ns.json is not None:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
