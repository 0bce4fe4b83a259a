"""An extending truncate of a large object, its first stat, and its recovery after a
crash (``close(checkpoint=False)`` leaves the journal as ``kill -9`` would).

    .venv/bin/python benchmarks/sparse_truncate.py /tmp/sparse-bench --gib 8
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from shuttle.bench.session import BenchSession
from shuttle.store import ObjectStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", help="scratch data directory (deleted afterwards)")
    parser.add_argument("--gib", type=int, default=8, help="size to extend to, GiB")
    args = parser.parse_args()
    size = args.gib << 30
    shutil.rmtree(args.data_dir, ignore_errors=True)
    store = ObjectStore(args.data_dir)
    try:
        store.put("big", b"x" * 1000)
        t0 = time.perf_counter()
        store.truncate("big", size)
        truncate_s = time.perf_counter() - t0
        rechunked = store.stats()["bytes_rechunked"]
        t0 = time.perf_counter()
        chunks = len(store.stat("big").chunks)
        stat_s = time.perf_counter() - t0
        store.truncate("big", size + 4096)  # a fresh version for recovery to redo
        store.close(checkpoint=False)
        t0 = time.perf_counter()
        store = ObjectStore(args.data_dir)
        recovery_s = time.perf_counter() - t0
        print(
            f"truncate to {args.gib} GiB: {truncate_s:.2f} s ({rechunked} bytes re-chunked, "
            f"{chunks} chunks); first stat: {stat_s:.2f} s; recovery after a crash: "
            f"{recovery_s:.2f} s"
        )
    finally:
        store.close()
        shutil.rmtree(args.data_dir, ignore_errors=True)


if __name__ == "__main__":
    # Stops what the run started on any exit (SIGTERM too) and prints how long it took.
    with BenchSession(f"benchmarks/{Path(__file__).name}", {"argv": sys.argv[1:]}):
        main()
