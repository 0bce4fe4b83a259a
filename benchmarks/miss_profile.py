"""Where a node's block-cache miss goes when the page cache holds the file (issue 26).

    taskset -c 1 .venv/bin/python benchmarks/miss_profile.py   # as netrand pins
    .venv/bin/python benchmarks/miss_profile.py                 # both cores

An ``ObjectStore`` in a scratch directory, a 32 MiB object read once whole (so the
kernel's page cache holds it), then the p50 of 3,000 random 4 KiB pages for each
piece of a miss: the ``pread`` of a page and of the 64 KiB block the cache fetches,
the same with ``RWF_NOWAIT`` and its copy into ``bytes``, the object file's ``open`` +
``close``, a block-cache hit, the store's whole locked miss (``read`` with the cache
emptied first), the same on the event loop (``read_nowait``, through the file the
store keeps open, and with it opened for the read as before), and the hop to a pool
thread and back (``run_in_executor``, of nothing and of the locked miss) with its
context switches. Prints one line per piece, in µs (p50).
"""

from __future__ import annotations

import asyncio
import os
import random
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from shuttle.store import ObjectStore

PAGE = 4096
BLOCK = 64 << 10
OBJECT_BYTES = 32 << 20
SAMPLES = 3000


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


def main() -> None:
    rng = random.Random(1)
    pages = [rng.randrange(OBJECT_BYTES // PAGE) for _ in range(SAMPLES)]
    with tempfile.TemporaryDirectory() as scratch, ObjectStore(scratch) as store:
        store.put("f", os.urandom(OBJECT_BYTES))
        store.read("f", 0, OBJECT_BYTES, use_cache=False)  # into the page cache
        fd = store.paths.open_file("f", os.O_RDONLY)
        buf = bytearray(BLOCK)

        def block(p: int) -> int:
            return p * PAGE // BLOCK * BLOCK

        def open_close(p: int) -> None:
            os.close(store.paths.open_file("f", os.O_RDONLY))

        def miss(p: int) -> None:
            store.cache.clear()
            store.read("f", p * PAGE, PAGE)

        def miss_nowait(p: int) -> None:
            store.cache.clear()
            assert store.read_nowait("f", p * PAGE, PAGE) is not None

        def miss_nowait_reopened(p: int) -> None:
            store.cache.clear()
            store.open_files.clear()  # as before the files were kept open
            assert store.read_nowait("f", p * PAGE, PAGE) is not None

        rows = {
            "pread 4 KiB": lambda p: os.pread(fd, PAGE, p * PAGE),
            "pread 64 KiB block": lambda p: os.pread(fd, BLOCK, block(p)),
            "preadv RWF_NOWAIT 64 KiB": lambda p: os.preadv(fd, [buf], block(p), os.RWF_NOWAIT),
            "  + copy into bytes": lambda p: (
                os.preadv(fd, [buf], block(p), os.RWF_NOWAIT) and bytes(buf)
            ),
            "open + close of the object file": open_close,
            "store.read, block-cache hit": lambda p: store.read("f", p * PAGE, PAGE),
            "store.read, miss (locked, as in a pool thread)": miss,
            "store.read_nowait, miss (on the loop)": miss_nowait,
            "  the same, its file opened for the read": miss_nowait_reopened,
        }
        for name, fn in rows.items():
            print(f"{name:48s} {p50_us(pages, fn):8.1f}")
        os.close(fd)

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
                    print(
                        f"{'run_in_executor of ' + name:48s} "
                        f"{statistics.median(times) / 1e3:8.1f}   ({per:.1f} context switches)"
                    )

        asyncio.run(hops())


if __name__ == "__main__":
    main()
