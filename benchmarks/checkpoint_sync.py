"""What a checkpoint's sync costs: one syncfs(2) against an fsync of every changed file
and directory (``StoreConfig.sync_mode``), on the file system holding ``--dir``.

    .venv/bin/python benchmarks/checkpoint_sync.py --dir build/ckpt [--json FILE]

For each workload (N objects changed since the last checkpoint, S bytes each) and each
mode, a fresh store takes N puts, then one ``checkpoint()`` is timed; the puts' own
rate (each waits for its journal fdatasync) is reported beside it, so the checkpoint's
share of a run of changes can be read off. Best of ``--repeat`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from shuttle.bench.session import BenchSession
from shuttle.store import ObjectStore, StoreConfig, durability
from shuttle.store.durability import SyncMode

#: (objects changed, bytes each): a full journal of small puts (its 4,096-record bound),
#: and a mid-sized batch.
WORKLOADS = ((4096, 4096), (512, 65536), (64, 262144))
#: (mode, fsync threads): syncfs, per-file fsync as shipped, and one fsync at a time.
MODES: tuple[tuple[SyncMode, int], ...] = (
    ("syncfs", 0),
    ("fsync", durability.SYNC_THREADS),
    ("fsync", 1),
)


def one_run(base: Path, mode: SyncMode, threads: int, count: int, size: int) -> tuple[float, float]:
    """Returns (seconds for the puts, seconds for the checkpoint)."""
    durability.SYNC_THREADS = max(threads, 1)
    durability.SYNC_THREADS_MIN_PATHS = 8 if threads > 1 else 1 << 62
    root = base / f"{mode}-{count}-{size}"
    shutil.rmtree(root, ignore_errors=True)
    # No automatic checkpoint during the puts: the timed one covers all of them.
    config = StoreConfig(sync_mode=mode, journal_records_max=1 << 30, journal_bytes_max=1 << 40)
    body = os.urandom(size)
    with ObjectStore(root, config) as store:
        assert store.durability.mode == mode
        t0 = time.perf_counter()
        for i in range(count):
            store.put(f"d{i % 16}/o{i}", body)
        t1 = time.perf_counter()
        store.checkpoint()
        t2 = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    return t1 - t0, t2 - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for count, size in WORKLOADS:
        for mode, threads in MODES:
            runs = [one_run(args.dir, mode, threads, count, size) for _ in range(args.repeat)]
            puts_s = min(r[0] for r in runs)
            ckpt_s = min(r[1] for r in runs)
            rows.append(
                {
                    "objects": count,
                    "bytes_each": size,
                    "mode": mode,
                    "threads": threads,
                    "puts_s": round(puts_s, 3),
                    "checkpoint_s": round(ckpt_s, 4),
                    "checkpoint_share": round(ckpt_s / (puts_s + ckpt_s), 3),
                }
            )
            print(
                f"{count:5d} x {size:6d} B  {mode:6s} {threads:2d} threads  puts {puts_s:7.2f} s  "
                f"checkpoint {ckpt_s * 1000:8.1f} ms  share {ckpt_s / (puts_s + ckpt_s):.1%}",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    # Stops what the run started on any exit (SIGTERM too) and prints how long it took.
    with BenchSession(f"benchmarks/{Path(__file__).name}", {"argv": sys.argv[1:]}):
        main()
