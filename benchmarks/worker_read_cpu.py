"""CPU per read a worker answers itself (``shuttle.node.worker_reads.WorkerReads.read``:
the generation check, the descriptor, a ``preadv2(RWF_NOWAIT)`` of 4 KiB from the page
cache, the check again), in one process over a real store, against an anchor:
another checkout's ``src`` (the code before a change), in the same run, interleaved.

    git archive main src | tar -x -C /tmp/anchor
    .venv/bin/python benchmarks/worker_read_cpu.py --anchor /tmp/anchor/src \\
        --pairs 6 --json benchmarks/results/workers/read-cpu.json

Written for issue 26, item 4's change of a worker's descriptors from its own file per
learnt object to the store's descriptor cache (``OpenFiles``): a borrow and a give-back
per read cost 0.7 µs (1.33× the anchor), so a known object holds its lease instead.
Each measurement is a fresh interpreter (``--child``) with the tree first on its path
and ``SHUTTLE_PURE=1`` (the worker's read path is not compiled in either), reporting
CPU seconds (``time.process_time``), best of 5 batches. A pair runs the anchor and
this tree back to back, alternating which goes first. Printed and written: µs per read
for each, and this tree's over the anchor's per pair, with the spread of the ratios
(the noise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent / "src"
PAGE = 4096
OBJECT_BYTES = 1 << 20
KEYS = 16
READS = 20_000


def child() -> dict[str, float]:
    """One tree's figure (runs in the child interpreter)."""
    from shuttle.node.worker_pool import GenerationHook
    from shuttle.node.worker_reads import WorkerReads
    from shuttle.store import ObjectStore, StoreConfig
    from shuttle.store.generations import ChangeGenerations

    with tempfile.TemporaryDirectory() as tmp:
        gens = ChangeGenerations.create()
        store = ObjectStore(Path(tmp) / "data", StoreConfig(cache_capacity_bytes=1 << 20))
        store.change_hook = GenerationHook(store.change_hook, gens)
        view = ChangeGenerations(os.dup(gens.fd), writer=False)

        async def stat(key: str, *chunks_max: int) -> dict[str, Any]:
            a = store.stat(key)  # this tree asks for a chunk list length, the anchor not
            return {**a.as_dict(), "chunks_total": len(a.chunks), "chunks": []}

        reads = WorkerReads(str(store.layout.root), view, stat)
        keys = [f"k{i}" for i in range(KEYS)]
        for key in keys:
            store.put(key, os.urandom(OBJECT_BYTES))

        async def learn() -> None:
            for key in keys:
                await reads.learn(key)

        asyncio.run(learn())
        pages = OBJECT_BYTES // PAGE
        for key in keys:  # resident, and every read answered
            for p in range(pages):
                assert reads.read(key, p * PAGE, PAGE, None) is not None

        def per_read() -> float:
            read = reads.read
            t = time.process_time()
            for i in range(READS):
                read(keys[i % KEYS], (i % pages) * PAGE, PAGE, None)
            return (time.process_time() - t) / READS

        best = min(per_read() for _ in range(5))
        served = reads.served
        reads.close()
        store.close()
        gens.close()
        view.close()
    assert served == KEYS * pages + 5 * READS, served  # all of them answered here
    return {"read_us": best * 1e6}


def measure(src: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src), "SHUTTLE_PURE": "1"}
    out = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True
    )
    figures: dict[str, float] = json.loads(out.stdout)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchor", type=Path, help="another checkout's src (the code before)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child()))
        return
    if args.anchor is None or not (args.anchor / "shuttle").is_dir():
        ap.error("--anchor must be a directory holding the shuttle package (a checkout's src)")
    pairs = []
    for n in range(args.pairs):
        order = [("anchor", args.anchor), ("this", HERE)]
        got = dict((name, measure(src)) for name, src in (order if n % 2 == 0 else order[::-1]))
        pairs.append(got)
        print(
            f"pair {n + 1}: worker read {got['anchor']['read_us']:.2f} -> "
            f"{got['this']['read_us']:.2f} µs"
        )
    ratios = [p["this"]["read_us"] / p["anchor"]["read_us"] for p in pairs]
    report: dict[str, Any] = {
        "pairs": pairs,
        "load_avg": os.getloadavg(),
        "read_us_ratio": {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        },
    }
    print(
        f"read_us: this / anchor median {statistics.median(ratios):.3f} "
        f"(pairs {min(ratios):.3f}..{max(ratios):.3f})"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
