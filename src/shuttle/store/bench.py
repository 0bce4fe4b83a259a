"""Benchmarks of the object store, each against an anchor measured in the same run.

    python -m shuttle.store.bench [--size-mib 256] [--dir DIR] [--json FILE]

* chunking: FastCDC cuts + blake3 of every chunk, against blake3 of the whole buffer
  (the least any hashing of the data costs);
* upload: a large object streamed in 16 MiB ranges and committed, against writing the
  same bytes to a plain file and fsyncing it;
* range write: 4 KiB written into the large object (journal + incremental re-chunk),
  against re-chunking the whole object (what a naive store would do on every write)
  and against one write + fdatasync (the floor of any durable write); then the first
  stat after it, which pays the deferred whole-object hash;
* small put: 4 KiB objects, against write + fdatasync of 4 KiB to a plain file; then
  8 threads putting at once, to show group commit (puts per fdatasync);
* random read: 4 KiB pages through the store (block cache warm), against os.pread.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shuttle.store.chunking import chunk_buffer, hash_file, object_hash
from shuttle.store.objects import ObjectStore, StoreConfig

PIECE_BYTES = 16 * 1024 * 1024
PAGE_BYTES = 4096


def _timed(fn: Callable[[], object], repeat: int = 1) -> float:
    """Best wall time of ``repeat`` runs (the least disturbed by other load)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _per_op_us(fn: Callable[[int], object], count: int) -> dict[str, float]:
    samples = []
    for i in range(count):
        t0 = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - t0) * 1e6)
    samples.sort()
    return {
        "p50_us": samples[len(samples) // 2],
        "p99_us": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "mean_us": statistics.fmean(samples),
    }


def _paired(
    fn: Callable[[int], object], anchor: Callable[[int], object], count: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Per-op stats of ``fn`` and ``anchor``, interleaved op by op, so both see the same
    disk (fsync latency on a shared VM swings by 10x within seconds)."""
    a: list[float] = []
    b: list[float] = []
    for i in range(count):
        t0 = time.perf_counter()
        fn(i)
        t1 = time.perf_counter()
        anchor(i)
        t2 = time.perf_counter()
        a.append((t1 - t0) * 1e6)
        b.append((t2 - t1) * 1e6)
    return _summary(a), _summary(b)


def _summary(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        "p50_us": samples[len(samples) // 2],
        "p99_us": samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "mean_us": statistics.fmean(samples),
    }


def run(size_mib: int, workdir: str) -> dict[str, Any]:
    size = size_mib * 1024 * 1024
    data = np.random.default_rng(1).bytes(size)
    out: dict[str, Any] = {"config": {"size_mib": size_mib, "dir": workdir}}

    t_chunk = _timed(lambda: (object_hash(data), chunk_buffer(data)), repeat=3)
    t_anchor = _timed(lambda: object_hash(data), repeat=3)
    out["chunking"] = {
        "seconds": t_chunk,
        "mib_per_s": size_mib / t_chunk,
        "chunks": len(chunk_buffer(data)),
        "anchor_blake3_whole_seconds": t_anchor,
        "ratio_over_anchor": t_chunk / t_anchor,
    }

    plain = os.path.join(workdir, "plain")

    def plain_write() -> None:
        with open(plain, "wb") as f:
            for off in range(0, size, PIECE_BYTES):
                f.write(data[off : off + PIECE_BYTES])
            f.flush()
            os.fsync(f.fileno())

    root = os.path.join(workdir, "store")
    with ObjectStore(root, StoreConfig()) as store:

        def upload() -> None:
            up = store.begin_upload("big")
            view = memoryview(data)
            for off in range(0, size, PIECE_BYTES):
                store.upload_write(up, off, view[off : off + PIECE_BYTES])
            store.commit_upload(up)

        t_up = _timed(upload)
        t_plain = _timed(plain_write)
        out["upload"] = {
            "seconds": t_up,
            "mib_per_s": size_mib / t_up,
            "anchor_plain_write_fsync_seconds": t_plain,
            "ratio_over_anchor": t_up / t_plain,
        }

        rng = random.Random(2)
        small = b"s" * PAGE_BYTES
        fd = os.open(plain, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:

            def sync_write(i: int) -> None:
                os.pwrite(fd, small, (i % 1000) * PAGE_BYTES)
                os.fdatasync(fd)

            before = store.stats()["bytes_rechunked"]
            writes = 100
            rw, anchor_rw = _paired(
                lambda i: store.write("big", rng.randrange(0, size - PAGE_BYTES), small),
                sync_write,
                writes,
            )
            rechunked = (store.stats()["bytes_rechunked"] - before) / writes
            put, anchor_put = _paired(
                lambda i: store.put(f"small/{i % 100}", small), sync_write, 300
            )
        finally:
            os.close(fd)

        def full_rechunk() -> None:
            rfd = os.open(os.path.join(root, "big"), os.O_RDONLY)
            try:
                hash_file(rfd, size)
            finally:
                os.close(rfd)

        t_full = _timed(full_rechunk, repeat=2)
        t_stat = _timed(lambda: store.stat("big"))
        out["range_write"] = {
            **rw,
            "bytes_rechunked_per_write": rechunked,
            "anchor_full_rechunk_us": t_full * 1e6,
            "ratio_over_anchor_p50": rw["p50_us"] / (t_full * 1e6),
            "anchor_write_fdatasync_p50_us": anchor_rw["p50_us"],
            "ratio_over_fdatasync_p50": rw["p50_us"] / anchor_rw["p50_us"],
            "first_stat_after_writes_us": t_stat * 1e6,
        }
        out["small_put"] = {
            **put,
            "anchor_write_fdatasync_p50_us": anchor_put["p50_us"],
            "ratio_over_anchor_p50": put["p50_us"] / anchor_put["p50_us"],
        }

        # Group commit: threads putting at once share fdatasyncs.
        j0 = store.stats()["journal"]
        threads_n, per_thread = 8, 50

        def putter(t: int) -> None:
            for i in range(per_thread):
                store.put(f"conc/{t}/{i % 10}", small)

        workers = [threading.Thread(target=putter, args=(t,)) for t in range(threads_n)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - t0
        j1 = store.stats()["journal"]
        records = j1["records"] - j0["records"]
        out["concurrent_puts"] = {
            "threads": threads_n,
            "puts": records,
            "puts_per_s": records / elapsed,
            "fdatasyncs": j1["syncs"] - j0["syncs"],
            "records_per_sync": records / max(1, j1["syncs"] - j0["syncs"]),
            "anchor_sequential_put_p50_us": put["p50_us"],
        }

        pages = [rng.randrange(0, 64 * 1024 * 1024 // PAGE_BYTES) for _ in range(2000)]
        for p in pages:  # warm the block cache (64 MiB of the object, 128 MiB cache)
            store.read("big", p * PAGE_BYTES, PAGE_BYTES)
        reads = _per_op_us(lambda i: store.read("big", pages[i] * PAGE_BYTES, PAGE_BYTES), 2000)
        rfd = os.open(os.path.join(root, "big"), os.O_RDONLY)
        try:
            anchor_read = _per_op_us(
                lambda i: os.pread(rfd, PAGE_BYTES, pages[i] * PAGE_BYTES), 2000
            )
        finally:
            os.close(rfd)
        out["random_read_warm"] = {
            **reads,
            "anchor_pread_p50_us": anchor_read["p50_us"],
            "ratio_over_anchor_p50": reads["p50_us"] / anchor_read["p50_us"],
            "cache": store.stats()["cache"],
        }
    return out


def _print(results: dict[str, Any]) -> None:
    c, u, w = results["chunking"], results["upload"], results["range_write"]
    s, r = results["small_put"], results["random_read_warm"]
    size = results["config"]["size_mib"]
    print(f"object size {size} MiB")
    print(
        f"chunk+hash      {c['seconds']:.3f} s ({c['mib_per_s']:.0f} MiB/s, {c['chunks']} chunks)"
        f"  anchor blake3 {c['anchor_blake3_whole_seconds']:.3f} s"
        f"  ratio {c['ratio_over_anchor']:.2f}"
    )
    print(
        f"upload+commit   {u['seconds']:.3f} s ({u['mib_per_s']:.0f} MiB/s)"
        f"  anchor write+fsync {u['anchor_plain_write_fsync_seconds']:.3f} s"
        f"  ratio {u['ratio_over_anchor']:.2f}"
    )
    print(
        f"4 KiB range write p50 {w['p50_us']:.0f} us p99 {w['p99_us']:.0f} us, "
        f"{w['bytes_rechunked_per_write'] / 1024:.0f} KiB re-chunked per write"
        f"  anchor full re-chunk {w['anchor_full_rechunk_us'] / 1000:.0f} ms"
        f"  ratio {w['ratio_over_anchor_p50']:.4f}"
        f"  (over write+fdatasync {w['ratio_over_fdatasync_p50']:.2f})"
        f"  (first stat after: {w['first_stat_after_writes_us'] / 1000:.0f} ms)"
    )
    print(
        f"4 KiB put p50 {s['p50_us']:.0f} us p99 {s['p99_us']:.0f} us"
        f"  anchor write+fdatasync {s['anchor_write_fdatasync_p50_us']:.0f} us"
        f"  ratio {s['ratio_over_anchor_p50']:.2f}"
    )
    cp = results["concurrent_puts"]
    print(
        f"{cp['threads']} threads putting 4 KiB: {cp['puts_per_s']:.0f} puts/s, "
        f"{cp['records_per_sync']:.1f} puts per fdatasync (group commit)"
        f"  anchor one thread p50 {cp['anchor_sequential_put_p50_us']:.0f} us/put"
    )
    print(
        f"4 KiB random read (warm) p50 {r['p50_us']:.1f} us p99 {r['p99_us']:.1f} us"
        f"  anchor pread {r['anchor_pread_p50_us']:.1f} us"
        f"  ratio {r['ratio_over_anchor_p50']:.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=256, help="size of the large object")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="shuttle-store-bench-", dir=args.dir)
    try:
        results = run(args.size_mib, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    _print(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
