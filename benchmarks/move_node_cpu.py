"""What one move of a mix filter costs the node's CPU, beside one of its calls there
(issue 26, item 5: the swing at 64 clients; benchmarks/README.md, "The swing's CPU").

    .venv/bin/python benchmarks/move_node_cpu.py [--moves 20] [--calls 40] [--json FILE]

One node at the mix benchmark's speed (0.05, its own CPU) and link, one cheap filter
of the mix (its 1 MiB of state, 256 KiB blocks): the filter is made at this client,
called a few times, then moved to the node and back ``--moves`` times in a row, and
called ``--calls`` times while at the node and as many at the client (the node then
serves its reads), ``--repeat`` times each. Each batch is
timed in the node process's CPU (/proc, user + system, emulated slowness included;
a batch, as a single move is under /proc's 10 ms tick), less the idle node's CPU over
as long (measured for a second before each batch), and divided by its count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from shuttle.bench.abacus import DATA_KEY, bench_node
from shuttle.bench.mix_clients import FILTER_MEMORY_BYTES
from shuttle.bench.mix_settings import LINK_DEFAULT, MixSettings
from shuttle.bench.stream import process_cpu_s
from shuttle.net.profiles import parse_link_profile
from shuttle.runtime.config import RuntimeConfig


def node_cpu_over(pid: int, fn: Any) -> tuple[float, float]:
    """(node CPU seconds, wall seconds) around ``fn()``."""
    c0, t0 = process_cpu_s(pid), time.monotonic()
    fn()
    return process_cpu_s(pid) - c0, time.monotonic() - t0


def summary(xs: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(xs), 5),
        "min": round(min(xs), 5),
        "max": round(max(xs), 5),
        "n": len(xs),
    }


def run(moves: int, calls: int, repeat: int) -> dict[str, Any]:
    s = MixSettings()
    with bench_node(
        parse_link_profile(LINK_DEFAULT),
        size_bytes=s.object_bytes,
        cpu_factor=s.node_cpu_factor,
        # No adaptive moves of its own: only the ones timed here.
        node_args=["--window", str(s.window_s), "--no-adapt"],
    ) as bench:
        pid = bench.cluster.nodes[0].pid
        if pid is None:
            raise SystemExit("move_node_cpu: the node's pid is unknown (not a local cluster)")
        rt = bench.runtime(RuntimeConfig(window_s=s.window_s), monitor=False)
        with rt:
            f = rt.create(
                "filter",
                placement="static",
                storage=rt.storage(bench.node_id),
                key=DATA_KEY,
                pass_fraction=s.cheap_pass,
                cpu_s_per_mb=s.cheap_cpu_s_per_mb,
                block_bytes=s.block_bytes,
                memory_bytes=FILTER_MEMORY_BYTES,
                wrap=True,
            )
            for _ in range(3):
                f.next()  # its state and connections made before anything is timed

            def round_trips() -> None:
                for _ in range(moves):
                    rt.migrate(f, bench.node_id)
                    rt.migrate(f, "client")

            def calls_at_node() -> None:
                for _ in range(calls):
                    f.next()

            idle, trips, at_node, at_client = [], [], [], []
            for _ in range(repeat):
                cpu, wall = node_cpu_over(pid, lambda: time.sleep(1.0))
                idle.append(cpu / wall)
                cpu, wall = node_cpu_over(pid, round_trips)
                trips.append((cpu, wall))
                rt.migrate(f, bench.node_id)
                cpu, wall = node_cpu_over(pid, calls_at_node)
                at_node.append((cpu, wall))
                rt.migrate(f, "client")
                cpu, wall = node_cpu_over(pid, calls_at_node)  # the same calls, here
                at_client.append((cpu, wall))
            rt.destroy(f)
    idle_rate = statistics.median(idle)

    def per(xs: list[tuple[float, float]], n: int) -> dict[str, float]:
        # The node's idle CPU over the same wall time taken off: what the move did.
        net = [(cpu - idle_rate * wall) / n for cpu, wall in xs]
        return {**summary(net), "wall_s": round(statistics.median(w / n for _, w in xs), 5)}

    return {
        "node_speed": s.node_cpu_factor,
        "state_bytes": FILTER_MEMORY_BYTES,
        "idle_node_cpu_per_s": round(idle_rate, 4),
        "round_trip_cpu_s": per(trips, moves),
        "cheap_call_at_node_cpu_s": per(at_node, calls),
        # The node's part of a call of the filter at its client: serving its read.
        "cheap_call_at_client_cpu_s": per(at_client, calls),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--moves", type=int, default=100)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if min(args.moves, args.calls, args.repeat) < 1:
        raise SystemExit("move_node_cpu: --moves, --calls and --repeat must be at least 1")
    result = run(args.moves, args.calls, args.repeat)
    for key, value in result.items():
        print(f"{key}: {value}")
    call = result["cheap_call_at_node_cpu_s"]["median"]
    trip = result["round_trip_cpu_s"]["median"]
    print(
        f"a round trip (to the node and back): {trip:.4f} s of the node's CPU, "
        f"{trip / call:.1f} cheap calls' worth at the node ({call:.4f} s each)"
    )
    here = result["cheap_call_at_client_cpu_s"]["median"]
    print(
        f"a cheap call at its client costs the node {here:.4f} s (serving its read): "
        f"{here / call:.2f} of the same call at the node"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
