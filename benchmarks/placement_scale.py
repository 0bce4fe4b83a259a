"""How long one placement evaluation takes as clients multiply (issue 26, item 5).

Builds the stacks a node sees in ``shuttle bench abacus mix``: per client a cheap and
a heavy filter (console -> filter -> storage), and times ``placement.choose`` over
them, best of ``--repeat``. It uses the public placement API only, so the same script
runs against an older checkout (``PYTHONPATH=OLD/src``) for the before-and-after in
benchmarks/README.md ("Placement for aggregate throughput").

    python benchmarks/placement_scale.py --clients 4,16,64 --repeat 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from shuttle.runtime.placement import (
    EdgeView,
    NodeView,
    ObjectView,
    PlacementConfig,
    StackView,
    choose,
)

LAN = 1.25e6  # 10 Mbit/s in bytes per second
BLOCK = 262_144


def stacks(clients: int) -> tuple[list[StackView], dict[str, NodeView]]:
    nodes = {"n1": NodeView("n1", 0.05, 8.0)}
    out = []
    for i in range(clients):
        c = f"app{i}"
        nodes[c] = NodeView(c, 1.0, 30.0)
        for kind, cpu_s, up in (("cheap", 0.0002, 0.05), ("heavy", 0.004, 1.0)):
            out.append(
                StackView(
                    f"{c}/console-{kind}",
                    c,
                    "n1",
                    (
                        ObjectView(f"{c}/console-{kind}", migratable=False),
                        ObjectView(f"{c}/filter-{kind}", cpu_s, memory_bytes=1 << 20),
                        ObjectView("n1/storage", 0.001, migratable=False),
                    ),
                    (EdgeView(2 * BLOCK * up, 2), EdgeView(2 * BLOCK, 2)),
                    1,
                    LAN,
                    0.0005,
                )
            )
    return out, nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="4,16,64")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    report: dict[str, dict[str, float]] = {}
    for n in (int(x) for x in args.clients.split(",")):
        s, nodes = stacks(n)
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            plan = choose(s, nodes, PlacementConfig())
            times.append(time.perf_counter() - t)
        report[str(n)] = {
            "stacks": len(s),
            "best_ms": round(min(times) * 1e3, 2),
            "median_ms": round(sorted(times)[len(times) // 2] * 1e3, 2),
            "moves": len(plan.executed),
        }
        print(
            f"{n:3d} clients, {len(s):3d} stacks: best {min(times) * 1e3:8.1f} ms, "
            f"median {report[str(n)]['median_ms']:8.1f} ms, {len(plan.executed)} moves"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
