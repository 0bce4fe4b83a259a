"""Where a RADOS gateway's block-cache miss spends its time (issue 26, item 2): the RADOS
read itself against the hand-offs around it, in one process, interleaved.

    .venv/bin/python benchmarks/rados_miss.py [--rounds 10] [--reads 200] [--osds 3]
        [--ways librados_4k,aio_4k,caio_4k] [--compare-aiodone SO [--drain-batch 64]]
        [--json-out FILE]

Starts a local Ceph, writes an 8 MiB object, and times random reads of it, one at a
time, in these ways, round by round (each round runs every way once, in turn, so
drift on a shared machine hits them alike):

* ``librados_4k``: a blocking 4 KiB read through the Python binding, in the calling
  thread (``shuttle bench ceph netrand``'s anchor, ``librados``);
* ``librados_64k``: the same, 64 KiB: what a node with 64 KiB cache blocks
  (``--cache-block-bytes 65536``, the library's
  :data:`shuttle.blockcache.DEFAULT_BLOCK_SIZE_BYTES`) reads for a 4 KiB miss; a
  node's default block is 4 KiB (``shuttle serve``'s ``CACHE_BLOCK_BYTES_DEFAULT``);
* ``pool_64k``: from an event loop (uvloop, as a node's), the blocking 64 KiB read and
  its version run in a thread pool (``run_in_executor``): a node's miss before this
  branch, without the client's hop;
* ``aio_64k`` / ``aio_4k``: from the event loop, an asynchronous read through
  :class:`shuttle.store.rados_aio.AioClient` with its reference completion (a Python
  callback through ``ctypes``, ``call_soon_threadsafe``): a node's miss before the C
  completions;
* ``caio_4k``: the same with the C completions (``completion="c"``: a C callback, an
  eventfd the loop drains; needs the compiled modules): a node's miss now;
* ``caio_4k_cmp`` (with ``--compare-aiodone SO``): the same through another build of
  ``_aiodone.c`` (``SO``, e.g. main's, built as ``scripts/build_compiled.py`` builds
  it), in the same rounds, so the two builds are compared interleaved (their paired
  ratio is printed). With ``--drain-batch N``, each round also times ``drain()``
  alone in both builds, taking turns: N reads started at once, librados waited for,
  then one ``drain()`` of the N answers (ns per read; its median over the rounds).

For the asynchronous ways it also splits each read's time (medians, µs): ``submit``
(starting it, until ``read`` returns), ``librados`` (from there to librados's
callback on its finisher thread), ``wake`` (from the callback until the loop runs the
read's ``done``) and ``resume`` (from ``done`` until the awaiting coroutine runs).
``--ways`` picks the ways (the anchor ``librados_4k`` always runs).

Prints each way's p50 and p90 (µs) and its p50 over ``librados_4k``'s, pooled and
paired by round (the median of the round-by-round ratios), with the spread of the
paired ratios, and this process's CPU per read (every thread's, librados's included);
writes them as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.machinery
import importlib.util
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import uvloop

from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import connect
from shuttle.store import rados_aio
from shuttle.store.rados_aio import AioClient, native_completions
from shuttle.store.rados_conn import CephOptions

OID = "bench-rados-miss"
OBJECT_BYTES = 8 << 20
BLOCK_BYTES = 64 << 10
PAGE_BYTES = 4 << 10
#: The phases of an asynchronous read (module docstring).
PHASES = ("submit", "librados", "wake", "resume")
WAYS = (
    "librados_4k",
    "librados_16k",
    "librados_64k",
    "pool_64k",
    "aio_64k",
    "pool_4k",
    "aio_4k",
    "caio_4k",
)
#: A node's I/O pool for a RADOS store has this many threads (EXECUTOR_THREADS_RADOS);
#: one read at a time uses one of them, but which one wakes is the pool's choice.
POOL_THREADS = 32


def _other_completions(path: Path) -> Any:
    """``Completions`` of another build of ``_aiodone.c`` (its init is ``PyInit__aiodone``,
    so it loads under the name ``_aiodone``, beside the package's own)."""
    loader = importlib.machinery.ExtensionFileLoader("_aiodone", str(path))
    spec = importlib.util.spec_from_file_location("_aiodone", path, loader=loader)
    assert spec is not None, f"{path} is not an extension module"
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module.Completions


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _timed(n: int, offsets: list[int], read: Callable[[int], Awaitable[Any]]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        await read(offsets[i])
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


def _sync_timed(n: int, offsets: list[int], read: Callable[[int], Any]) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        read(offsets[i])
        out.append((time.perf_counter_ns() - t0) / 1e3)
    return out


async def _run(args: argparse.Namespace, conf: Path, keyring: Path, pool: str) -> dict[str, Any]:
    cluster = connect(conf, keyring, op_timeout_s=60)
    io = cluster.open_ioctx(pool)
    with open("/dev/urandom", "rb") as f:
        data = f.read(OBJECT_BYTES)
    io.write_full(OID, data)
    aio = AioClient(pool, "", CephOptions(conf, keyring), completion="ctypes")
    caio = AioClient(pool, "", CephOptions(conf, keyring), completion="c") if args.c else None
    caio_cmp = None
    if args.compare_aiodone is not None:
        # A client like caio whose C completions are the other build's (made with the
        # same librados functions; its own, unused, go): rados_aio is compiled, so its
        # choice of completions cannot be patched from here.
        other = _other_completions(args.compare_aiodone)
        caio_cmp = AioClient(pool, "", CephOptions(conf, keyring), completion="c")
        names = ("create_completion2", "read", "get_return_value", "get_version", "release")
        lib = caio_cmp.lib
        caio_cmp._ring = other(*(rados_aio._address(getattr(lib, f"rados_aio_{n}")) for n in names))
    loop = asyncio.get_running_loop()
    #: way -> phase -> µs per read (the asynchronous ways).
    phases: dict[str, dict[str, list[float]]] = {}
    pool_ex = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="pool")

    def blocking_64k(off: int) -> tuple[bytes, int]:
        got = io.read(OID, BLOCK_BYTES, off)
        return got, io.get_last_version()

    async def aio_timed(client: AioClient, way: str, length: int, offs: list[int]) -> list[float]:
        """Reads one at a time, each split into its phases (module docstring)."""
        split = phases.setdefault(way, {p: [] for p in PHASES})
        out = []
        for off in offs:
            fut: asyncio.Future[int] = loop.create_future()

            def done(rv: int, version: int, got: bytes, fut: asyncio.Future[int] = fut) -> None:
                assert rv == length and version > 0, (rv, version)
                fut.set_result(time.monotonic_ns())

            t0 = time.monotonic_ns()
            assert client.read(OID, off, length, done, loop)
            t1 = time.monotonic_ns()
            t_done = await fut
            t_end = time.monotonic_ns()
            cb = client.callback_ns
            for phase, us in zip(
                PHASES, (t1 - t0, cb - t1, t_done - cb, t_end - t_done), strict=True
            ):
                split[phase].append(us / 1e3)
            out.append((t_end - t0) / 1e3)
        return out

    blocks = OBJECT_BYTES // BLOCK_BYTES

    async def lib4(offs: list[int]) -> list[float]:
        return _sync_timed(len(offs), offs, lambda o: io.read(OID, PAGE_BYTES, o))

    async def lib16(offs: list[int]) -> list[float]:
        return _sync_timed(len(offs), offs, lambda o: io.read(OID, 16 << 10, o))

    async def lib64(offs: list[int]) -> list[float]:
        return _sync_timed(len(offs), offs, blocking_64k)

    async def pool64(offs: list[int]) -> list[float]:
        return await _timed(
            len(offs), offs, lambda o: loop.run_in_executor(pool_ex, blocking_64k, o)
        )

    async def aio64(offs: list[int]) -> list[float]:
        return await aio_timed(aio, "aio_64k", BLOCK_BYTES, offs)

    async def pool4(offs: list[int]) -> list[float]:
        return await _timed(
            len(offs),
            offs,
            lambda o: loop.run_in_executor(pool_ex, lambda: io.read(OID, PAGE_BYTES, o)),
        )

    async def aio4(offs: list[int]) -> list[float]:
        return await aio_timed(aio, "aio_4k", PAGE_BYTES, offs)

    async def caio4(offs: list[int]) -> list[float]:
        assert caio is not None
        return await aio_timed(caio, "caio_4k", PAGE_BYTES, offs)

    async def caio4_cmp(offs: list[int]) -> list[float]:
        assert caio_cmp is not None
        return await aio_timed(caio_cmp, "caio_4k_cmp", PAGE_BYTES, offs)

    every: dict[str, Callable[[list[int]], Awaitable[list[float]]]] = {
        "librados_4k": lib4,
        "librados_16k": lib16,
        "librados_64k": lib64,
        "pool_64k": pool64,
        "aio_64k": aio64,
        "pool_4k": pool4,
        "aio_4k": aio4,
        "caio_4k": caio4,
        "caio_4k_cmp": caio4_cmp,
    }
    ways = {w: f for w, f in every.items() if w == "librados_4k" or w in args.ways}
    if caio_cmp is None:
        ways.pop("caio_4k_cmp", None)
    rng = random.Random(1)
    samples: dict[str, list[float]] = {w: [] for w in ways}
    by_round: dict[str, list[float]] = {w: [] for w in ways}
    #: ns per read of one drain() of --drain-batch answers, by build, one per round.
    drain_ns: dict[str, list[float]] = {"caio_4k": [], "caio_4k_cmp": []}

    def drain_once(client: AioClient, offs: list[int]) -> float:
        """Start len(offs) reads on ``client``'s C completions, wait for librados, and
        time one drain() of their answers (ns per read)."""
        ring = client._ring  # the C completions themselves: drain() alone is timed
        assert ring is not None
        for tag, off in enumerate(offs):
            assert ring.read(client._io_address, OID.encode(), off, PAGE_BYTES, tag) == 0
        assert ring.wait_idle(60.0), "librados did not call back"
        t0 = time.perf_counter_ns()
        got = ring.drain()
        took = time.perf_counter_ns() - t0
        assert len(got) == len(offs) and all(rv == PAGE_BYTES for _t, rv, *_ in got)
        return took / len(offs)

    # This process's CPU (every thread: librados's, both clients') per read, by way.
    cpu_s: dict[str, float] = {w: 0.0 for w in ways}
    try:
        for rnd in range(args.rounds + 1):
            offs = [rng.randrange(blocks) * BLOCK_BYTES for _ in range(args.reads)]
            order = list(ways.items())
            if rnd % 2 and "caio_4k_cmp" in ways:  # the two builds take turns going first
                i, j = list(ways).index("caio_4k"), list(ways).index("caio_4k_cmp")
                order[i], order[j] = order[j], order[i]
            for name, way in order:
                cpu0 = time.process_time()
                lat = await way(offs)
                if rnd:  # round 0 warms every path (and the OSDs' caches)
                    cpu_s[name] += time.process_time() - cpu0
                    samples[name] += lat
                    by_round[name].append(statistics.median(lat))
            if args.drain_batch and caio is not None and caio_cmp is not None:
                batch = offs[: args.drain_batch]
                pair = [("caio_4k", caio), ("caio_4k_cmp", caio_cmp)]
                for name, client in pair[::-1] if rnd % 2 else pair:
                    ns = drain_once(client, batch)
                    if rnd:
                        drain_ns[name].append(ns)
            print(
                f"round {rnd}: "
                + ", ".join(f"{w} {by_round[w][-1]:.0f}" for w in ways if rnd and by_round[w]),
                flush=True,
            )
    finally:
        aio.close()
        if caio is not None:
            caio.close()
        if caio_cmp is not None:
            caio_cmp.close()
        pool_ex.shutdown()
        io.close()
        cluster.shutdown()
    anchor = "librados_4k"
    out: dict[str, Any] = {}
    for w in ways:
        paired = [a / b for a, b in zip(by_round[w], by_round[anchor], strict=True)]
        out[w] = {
            "p50_us": round(_pct(samples[w], 0.5), 1),
            "p90_us": round(_pct(samples[w], 0.9), 1),
            "p50_over_librados_4k": round(_pct(samples[w], 0.5) / _pct(samples[anchor], 0.5), 3),
            "paired_median": round(statistics.median(paired), 3),
            "paired_range": [round(min(paired), 3), round(max(paired), 3)],
            "cpu_us_per_read": round(cpu_s[w] / len(samples[w]) * 1e6, 1),
            "p50_us_by_round": [round(x, 1) for x in by_round[w]],
        }
        if w in phases:  # round 0's reads included: they are few, and warm the path
            out[w]["phases_p50_us"] = {
                p: round(statistics.median(xs), 1) for p, xs in phases[w].items()
            }
    if drain_ns["caio_4k"]:
        paired = [a / b for a, b in zip(drain_ns["caio_4k"], drain_ns["caio_4k_cmp"], strict=True)]
        out["drain_ns_per_read"] = {
            "batch": args.drain_batch,
            **{w: round(statistics.median(xs), 1) for w, xs in drain_ns.items()},
            "paired_median": round(statistics.median(paired), 3),
            "paired_range": [round(min(paired), 3), round(max(paired), 3)],
        }
    if "caio_4k" in ways and "caio_4k_cmp" in ways:
        paired = [a / b for a, b in zip(by_round["caio_4k"], by_round["caio_4k_cmp"], strict=True)]
        out["caio_4k_over_cmp"] = {
            "p50": round(_pct(samples["caio_4k"], 0.5) / _pct(samples["caio_4k_cmp"], 0.5), 3),
            "paired_median": round(statistics.median(paired), 3),
            "paired_range": [round(min(paired), 3), round(max(paired), 3)],
            "cpu": round(cpu_s["caio_4k"] / cpu_s["caio_4k_cmp"], 3),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--reads", type=int, default=200, help="reads per way per round")
    parser.add_argument("--osds", type=int, default=3)
    parser.add_argument(
        "--ways",
        default=",".join(WAYS),
        help=f"comma-separated, of {', '.join(WAYS)} (default: all; librados_4k always)",
    )
    parser.add_argument(
        "--compare-aiodone",
        type=Path,
        metavar="SO",
        help="another build of _aiodone.c (an extension module file) to time as caio_4k_cmp, "
        "interleaved with caio_4k",
    )
    parser.add_argument(
        "--drain-batch",
        type=int,
        default=0,
        metavar="N",
        help="with --compare-aiodone: also time one drain() of N finished reads per round "
        "in each build",
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    if args.rounds < 1 or args.reads < 1 or args.osds < 1:
        parser.error("--rounds, --reads and --osds must be ≥ 1")
    args.ways = [w.strip() for w in args.ways.split(",") if w.strip()]
    unknown = sorted(set(args.ways) - set(WAYS))
    if unknown:
        parser.error(f"--ways: unknown {', '.join(unknown)}; choose from {', '.join(WAYS)}")
    if args.drain_batch and (args.compare_aiodone is None or args.drain_batch > args.reads):
        parser.error("--drain-batch needs --compare-aiodone, and at most --reads reads")
    if args.compare_aiodone is not None:
        if not args.compare_aiodone.is_file():
            parser.error(f"--compare-aiodone: no file {args.compare_aiodone}")
        args.ways += ["caio_4k", "caio_4k_cmp"]
    args.c = "caio_4k" in args.ways
    if args.c and native_completions() is None:
        parser.error(
            "--ways caio_4k needs the compiled modules (scripts/setup.sh); "
            "leave caio_4k out to run without them"
        )
    scratch = Path(tempfile.mkdtemp(prefix="shuttle-rados-miss-"))
    ceph = LocalCeph(scratch / "ceph", osds=args.osds, die_with_parent=True)
    load_before = os.getloadavg()
    try:
        info = ceph.start()
        ways = uvloop.run(_run(args, info.conf_path, info.keyring_path, info.pool))
    finally:
        ceph.down()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"{'way':<14}{'p50 µs':>9}{'p90 µs':>9}{'/ lib 4k':>10}{'paired':>8}{'CPU µs':>8}  range")
    for w, r in ways.items():
        if "p50_us" not in r:
            continue
        print(
            f"{w:<14}{r['p50_us']:>9}{r['p90_us']:>9}{r['p50_over_librados_4k']:>10}"
            f"{r['paired_median']:>8}{r['cpu_us_per_read']:>8}  {r['paired_range']}"
        )
    for w, r in ways.items():
        if w == "drain_ns_per_read":
            print(
                f"drain() of {r['batch']} answers, ns per read: caio_4k {r['caio_4k']}, "
                f"caio_4k_cmp {r['caio_4k_cmp']}, paired {r['paired_median']} "
                f"(rounds {r['paired_range'][0]}-{r['paired_range'][1]})"
            )
        elif w == "caio_4k_over_cmp":
            print(
                f"caio_4k / caio_4k_cmp: p50 {r['p50']}, paired {r['paired_median']} "
                f"(rounds {r['paired_range'][0]}-{r['paired_range'][1]}), CPU {r['cpu']}"
            )
        elif "phases_p50_us" in r:
            split = ", ".join(f"{p} {us}" for p, us in r["phases_p50_us"].items())
            print(f"{w}: phases p50 µs: {split}")
    report = {
        "experiment": "rados-miss",
        "config": vars(args)
        | {
            "json_out": str(args.json_out) if args.json_out else None,
            "compare_aiodone": str(args.compare_aiodone) if args.compare_aiodone else None,
        },
        "ways": ways,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {args.json_out}")


if __name__ == "__main__":
    main()
