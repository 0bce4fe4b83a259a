"""Where a node's block-cache miss goes when the page cache holds the file (issue 26).

    taskset -c 1 .venv/bin/python benchmarks/miss_profile.py   # as netrand pins
    .venv/bin/python benchmarks/miss_profile.py                 # both cores
    git archive main src | tar -x -C /tmp/anchor                # the code before, then
    taskset -c 1 .venv/bin/python benchmarks/miss_profile.py --anchor /tmp/anchor/src \\
        --pairs 3 --json benchmarks/results/misspath/profile.json

An ``ObjectStore`` in a scratch directory, a 32 MiB object read once whole (so the
kernel's page cache holds it), then the p50 of 3,000 random 4 KiB pages for each
piece of a miss: the ``pread`` of a page and of the 64 KiB block the cache fetches,
the same with ``RWF_NOWAIT`` and its copy into ``bytes``, the object file's ``open`` +
``close``, a block-cache hit, the store's whole locked miss (``read`` with the cache
emptied first), the same on the event loop (``read_nowait``, through the file the
store keeps open, and with it opened for the read as before), the steps of that miss
one by one (the key's lock, the attributes, the open file's lease, the ``RWF_NOWAIT``
read, the block cache's fill, the counters), and the hop to a pool thread and back
(``run_in_executor``, of nothing and of the locked miss) with its context switches.
Prints one line per piece, in µs (p50). The rows marked "(+ clear)" empty the block
cache first, timed with them: the "cache.clear alone" row is that part.

``--anchor SRC`` runs the rows in fresh interpreters, this tree's and the anchor's
(another checkout's ``src``, with its compiled modules if built), ``--pairs`` times
alternating which goes first, and prints each row's figures and this tree's over the
anchor's per pair (median and range: the noise). ``--instructions`` adds, where
``perf stat`` can count them, the instructions per call of the hit and the miss rows
(two runs of 2,000 and 12,000 calls, the difference over 10,000: start-up and set-up
cancel): far steadier than times on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent / "src"
PAGE = 4096
BLOCK = 64 << 10
OBJECT_BYTES = 32 << 20
SAMPLES = 3000
#: The rows counted in instructions (``--instructions``): a hit, the miss and its base.
COUNTED = (
    "store.read, block-cache hit",
    "store.read_nowait, miss (on the loop) (+ clear)",
    "cache.clear alone",
)
#: Calls of a row in the two counted runs; their difference is what is divided.
COUNT_CALLS = (2000, 12000)


def p50_us(pages: list[int], fn: Callable[[int], object]) -> float:
    times = []
    for page in pages:
        start = time.perf_counter_ns()
        fn(page)
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1e3


def switches() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


@contextmanager
def scratch_store() -> Iterator[Any]:
    from shuttle.store import ObjectStore

    with tempfile.TemporaryDirectory() as scratch, ObjectStore(scratch) as store:
        store.put("f", os.urandom(OBJECT_BYTES))
        store.read("f", 0, OBJECT_BYTES, use_cache=False)  # into the page cache
        yield store


def rows_of(store: Any, fd: int) -> dict[str, Callable[[int], object]]:
    """The measured calls, by name; a row this tree's store lacks is left out."""
    buf = bytearray(BLOCK)
    cache, files, locks = store.cache, store.open_files, store._locks
    blocks = {p: os.pread(fd, BLOCK, p * BLOCK) for p in range(OBJECT_BYTES // BLOCK)}

    def block(p: int) -> int:
        return p * PAGE // BLOCK * BLOCK

    def open_close(p: int) -> None:
        os.close(store.paths.open_file("f", os.O_RDONLY))

    def miss(p: int) -> None:
        cache.clear()
        store.read("f", p * PAGE, PAGE)

    def miss_nowait(p: int) -> None:
        cache.clear()
        assert store.read_nowait("f", p * PAGE, PAGE) is not None

    def miss_nowait_reopened(p: int) -> None:
        cache.clear()
        files.clear()  # as before the files were kept open
        assert store.read_nowait("f", p * PAGE, PAGE) is not None

    version = store.stat("f").version

    def lock_shared(p: int) -> None:
        lock = locks.lock_for("f")
        assert lock.try_acquire_read()
        lock.release_read()

    def lease(p: int) -> None:
        files.give_back(files.borrow("f", version, store._open_for_read))

    def nowait_read(p: int) -> None:
        start = block(p)
        assert store.nowait.read(fd, start, start + BLOCK) is not None

    def fill_by_read(p: int) -> None:
        cache.clear()
        start = block(p)
        data = blocks[start // BLOCK]
        cache.read("f", p * PAGE, PAGE, OBJECT_BYTES, lambda lo, hi: data[lo - start : hi - start])

    def fill(p: int) -> None:
        cache.clear()
        cache.fill("f", p * PAGE, p * PAGE + PAGE, blocks[block(p) // BLOCK])

    rows: dict[str, Callable[[int], object]] = {
        "pread 4 KiB": lambda p: os.pread(fd, PAGE, p * PAGE),
        "pread 64 KiB block": lambda p: os.pread(fd, BLOCK, block(p)),
        "preadv RWF_NOWAIT 64 KiB": lambda p: os.preadv(fd, [buf], block(p), os.RWF_NOWAIT),
        "  + copy into bytes": lambda p: (
            os.preadv(fd, [buf], block(p), os.RWF_NOWAIT) and bytes(buf)
        ),
        "open + close of the object file": open_close,
        "store.read, block-cache hit": lambda p: store.read("f", p * PAGE, PAGE),
        "store.read, miss (locked, as in a pool thread) (+ clear)": miss,
        "store.read_nowait, miss (on the loop) (+ clear)": miss_nowait,
        "  the same, its file opened for the read (+ clear)": miss_nowait_reopened,
        "cache.clear alone": lambda p: cache.clear(),
        "  step: key lock shared, taken and given back": lock_shared,
        "  step: attributes in memory (AttrTable.peek)": lambda p: store.attrs.peek("f"),
        "  step: open file borrowed and given back": lease,
        "  step: NowaitReads.read of the block": nowait_read,
        "  step: BlockCache.read, fetch done (+ clear)": fill_by_read,
        "  step: BlockCache.fill (+ clear)": fill,
        "  step: counters.read_done": lambda p: store.counters.read_done(PAGE),
    }
    if not hasattr(cache, "fill"):
        del rows["  step: BlockCache.fill (+ clear)"]
    return rows


def run_rows(pages: list[int]) -> dict[str, float]:
    """Every row's p50 in µs, then the pool hops (this interpreter)."""
    out: dict[str, float] = {}
    with scratch_store() as store:
        fd = store.paths.open_file("f", os.O_RDONLY)
        for name, fn in rows_of(store, fd).items():
            out[name] = p50_us(pages, fn)
        os.close(fd)

        def miss(p: int) -> None:
            store.cache.clear()
            store.read("f", p * PAGE, PAGE)

        async def hops() -> None:
            loop = asyncio.get_running_loop()
            with ThreadPoolExecutor(16) as pool:
                for name, call in (("nothing", lambda p: None), ("the locked miss", miss)):
                    times = []
                    before = switches()
                    for page in pages:
                        start = time.perf_counter_ns()
                        await loop.run_in_executor(pool, call, page)
                        times.append(time.perf_counter_ns() - start)
                    per = (switches() - before) / len(pages)
                    out[f"run_in_executor of {name}"] = statistics.median(times) / 1e3
                    out[f"run_in_executor of {name}: context switches"] = per

        asyncio.run(hops())
    return out


def count_row(name: str, calls: int, pages: list[int]) -> None:
    """``calls`` calls of one row and nothing else measured (under ``perf stat``)."""
    with scratch_store() as store:
        fd = store.paths.open_file("f", os.O_RDONLY)
        fn = rows_of(store, fd)[name]
        for i in range(calls):
            fn(pages[i % len(pages)])
        os.close(fd)


def instructions_per_call(src: Path, name: str) -> float | None:
    """Instructions (user and kernel) per call of row ``name`` with ``src``'s code, or
    None where ``perf stat`` cannot count them here."""
    if shutil.which("perf") is None:
        return None
    counts = []
    for calls in COUNT_CALLS:
        with tempfile.NamedTemporaryFile("r", suffix=".csv") as out:
            subprocess.run(
                [
                    *("perf", "stat", "-x,", "-e", "instructions", "-o", out.name, "--"),
                    *(sys.executable, __file__, "--count-row", name, "--calls", str(calls)),
                ],
                env={**os.environ, "PYTHONPATH": str(src)},
                check=True,
                capture_output=True,
            )
            fields = [
                line.split(",") for line in out.read().splitlines() if ",instructions" in line
            ]
        if not fields or not fields[0][0].strip().isdigit():
            return None  # "<not supported>": no counters in this VM
        counts.append(int(fields[0][0]))
    return (counts[1] - counts[0]) / (COUNT_CALLS[1] - COUNT_CALLS[0])


def child(src: Path, instructions: bool) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True
    )
    figures: dict[str, Any] = {"us": json.loads(out.stdout)}
    if instructions:
        figures["instructions"] = {name: instructions_per_call(src, name) for name in COUNTED}
    return figures


def compiled_status(src: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-c", "import shuttle.compiled as c; print(c.active().reason)"],
        env={**os.environ, "PYTHONPATH": str(src)},
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def compare(args: argparse.Namespace) -> None:
    anchor: Path = args.anchor
    print(f"anchor {anchor}: {compiled_status(anchor)}; this tree: {compiled_status(HERE)}")
    pairs = []
    for n in range(args.pairs):
        order = [("anchor", anchor), ("this", HERE)]
        got = {name: child(src, args.instructions) for name, src in order[:: 1 - 2 * (n % 2)]}
        got["load_avg"] = os.getloadavg()[0]
        pairs.append(got)
        print(f"pair {n + 1} (load average {got['load_avg']:.1f})")
    names = list(pairs[0]["this"]["us"])
    ratios: dict[str, dict[str, float]] = {}
    print(f"{'µs, p50 (anchor -> this, per pair)':58s} this / anchor: median (range)")
    for name in names:
        cells = [
            (p["anchor"]["us"].get(name), p["this"]["us"][name])
            for p in pairs
            if p["anchor"]["us"].get(name) is not None
        ]
        shown = "  ".join(
            f"{a:.1f}->{b:.1f}" if a is not None else f"-->{b:.1f}"
            for a, b in ((p["anchor"]["us"].get(name), p["this"]["us"][name]) for p in pairs)
        )
        line = f"{name:58s} {shown}"
        if cells and all(a for a, _ in cells):
            r = [b / a for a, b in cells]
            ratios[name] = {"median": statistics.median(r), "min": min(r), "max": max(r)}
            line += f"   {statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"
        print(line)
    if args.instructions:
        print("instructions per call (anchor -> this, per pair)")
        for name in COUNTED:
            cells2 = [
                (p["anchor"]["instructions"][name], p["this"]["instructions"][name]) for p in pairs
            ]
            print(f"  {name:56s} " + "  ".join(f"{a}->{b}" for a, b in cells2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {"anchor": str(anchor), "pairs": pairs, "ratio_this_over_anchor": ratios}
        args.json.write_text(json.dumps(report, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--anchor", type=Path, help="another checkout's src (the code before)")
    ap.add_argument("--pairs", type=int, default=3, help="with --anchor: interleaved pairs")
    ap.add_argument("--instructions", action="store_true", help="count with perf stat too")
    ap.add_argument("--json", type=Path, help="with --anchor: write the figures here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--count-row", help=argparse.SUPPRESS)
    ap.add_argument("--calls", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    rng = random.Random(1)
    pages = [rng.randrange(OBJECT_BYTES // PAGE) for _ in range(SAMPLES)]
    if args.count_row:
        count_row(args.count_row, args.calls, pages)
    elif args.child:
        print(json.dumps(run_rows(pages)))
    elif args.anchor is not None:
        if not (args.anchor / "shuttle").is_dir():
            ap.error("--anchor must be a directory holding the shuttle package (a checkout's src)")
        compare(args)
    else:
        for name, value in run_rows(pages).items():
            print(f"{name:58s} {value:8.1f}")
        if args.instructions:
            for name in COUNTED:
                print(f"instructions per call: {name:40s} {instructions_per_call(HERE, name)}")


if __name__ == "__main__":
    main()
