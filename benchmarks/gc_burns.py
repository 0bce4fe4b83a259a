"""Which of a slow node's burns are garbage collections multiplied (issue 26, item 5:
the swing; docs/runtime.md, "The node profiled").

    SHUTTLE_CPU_TRACE=/tmp/trace .venv/bin/shuttle bench abacus mix --clients 64 ...
    .venv/bin/python benchmarks/gc_burns.py /tmp/trace [--json FILE]

A node of ``--cpu-factor`` below 1 burns ``1/f - 1`` times the thread CPU of each
section of work (``shuttle.net.cpu``), and a collection that runs inside a section is
CPU the section measured. With ``SHUTTLE_CPU_TRACE`` every process that inherits it
appends its burns and its collections (``gc.callbacks``) to one file; the node's is the
process that burned. Per node process: its collections by generation (count, CPU), and
every collection of ``--min-ms`` or more with the first burn after it on the same
thread: a burn of about ``(1/f - 1)`` times the collection's CPU is the collection
multiplied. The clients' lines (they collect but never burn) are left out.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from shuttle.net.cpu import read_cpu_trace


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a SHUTTLE_CPU_TRACE file")
    ap.add_argument("--min-ms", type=float, default=10.0, help="collections listed")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    burns, collections = read_cpu_trace(args.trace)
    burning = {b.pid for b in burns}
    by_thread: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for b in burns:
        by_thread[(b.pid, b.thread)].append(b)
    out: dict[str, Any] = {}
    for pid in sorted(burning):
        mine = [c for c in collections if c.pid == pid]
        t0 = min([b.start for b in burns if b.pid == pid] + [c.start for c in mine])
        gens: dict[int, list[float]] = defaultdict(list)
        for c in mine:
            gens[c.generation].append(c.cpu_s)
        burned = sum(b.burned_s for b in burns if b.pid == pid)
        print(f"node process {pid}: {burned:.1f} s burned in all")
        for g, cpu in sorted(gens.items()):
            print(
                f"  generation {g}: {len(cpu)} collections, {sum(cpu) * 1e3:.0f} ms CPU, "
                f"the longest {max(cpu) * 1e3:.1f} ms"
            )
        rows = []
        for c in sorted(mine, key=lambda c: c.start):
            if c.cpu_s * 1e3 < args.min_ms:
                continue
            after = [b for b in by_thread[(pid, c.thread)] if b.start >= c.start]
            nxt = min(after, key=lambda b: b.start, default=None)
            row = {
                "t_s": round(c.start - t0, 2),
                "generation": c.generation,
                "cpu_ms": round(c.cpu_s * 1e3, 1),
                "next_burn_s": None if nxt is None else round(nxt.asked_s, 3),
                "next_burn_after_s": None if nxt is None else round(nxt.start - c.start, 3),
            }
            rows.append(row)
            print(
                f"  at {row['t_s']:7.2f} s a generation-{c.generation} collection of "
                f"{row['cpu_ms']:.1f} ms; the next burn on its thread "
                + (
                    "none"
                    if nxt is None
                    else f"{nxt.asked_s:.3f} s, {nxt.start - c.start:.3f} s after it began"
                )
            )
        out[str(pid)] = {
            "burned_s": round(burned, 3),
            "generations": {
                str(g): {"count": len(v), "cpu_s": round(sum(v), 4), "max_ms": max(v) * 1e3}
                for g, v in gens.items()
            },
            "long_collections": rows,
        }
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
