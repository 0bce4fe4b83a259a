"""Where ``shuttle bench ceph netrand``'s direct client loses against ``librados_key``
(issue 26, item 2; benchmarks/README.md, "Warm reads on a RADOS gateway"): the netrand
stand and passes, with the ways that split the direct client's read into its parts.

    .venv/bin/python benchmarks/rados_direct_gap.py [--rounds 10] [--pages 400]
        [--order netrand|shuffle|reverse] [--ways W,W,...] [--remember-s 1.0]
        [--json-out FILE]

The stand is netrand's (:func:`shuttle.bench.ceph_stand.stand`: 3 OSDs, a file node, a
RADOS node, a second RADOS node whose client reads its misses from RADOS; an 8 MiB
object, every node's cache 1 MiB). Each round reads the round's pages twice per way and
times the second pass, as netrand does. The ways:

* ``file_node``, ``rados_node``: netrand's node ways (read, not analysed: they make the
  round what it is in netrand);
* ``direct``: ``Client.read`` by the direct client (netrand's ``rados_node_direct``: a
  :class:`~shuttle.client.gateways.GatewayClient`, which ``connect`` gives for a
  cluster of RADOS nodes);
* ``client_piece``: the remembered read, else ``Client._read_piece`` of the same
  client, past the ``GatewayClient``'s layer (its ranking of the nodes and its
  failover; since the eleventh sitting ``Client.read`` alone checks the remembered key);
* ``remembered``: ``DirectReads.read_remembered`` alone (the remembered key's look-up
  and ``read_at``);
* ``read_at``: the direct client's ``DirectReads.read_at`` of the location its node
  named (the librados read and the version check, no ``Client.read``);
* ``own_key``: ``ioctx.read`` of the key's object on the direct client's own librados
  connection (the read ``read_at`` makes, alone);
* ``librados_key``: ``ioctx.read`` of the key's object on the benchmark's librados
  connection (netrand's anchor); ``librados``: of the benchmark's copy ``OID``;
* ``late_key`` (not by default): the same read on a third librados connection, made
  after the direct client's: a later connection in the process against the first.

Per way: the p50 of the timed passes pooled and paired by round with ``librados_key``;
this process's CPU per read, the calling thread's alone (``time.thread_time``), and that
of the direct client's librados threads (from /proc, 10 ms ticks: coarse) against the
rest; the garbage collector's runs; how many timed reads asked the direct client's node
(its counters). ``--remember-s 1000`` keeps the key remembered throughout (netrand's
client forgets it after 1 s, and then asks the node once).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shuttle.bench.ceph_node_stats import wait_for_trust
from shuttle.bench.ceph_stand import DIRECT_MODE, KEY, OID, load, stand
from shuttle.bench.netrand import GENERATORS, Samples, make_file, timed_run
from shuttle.client.client import Client
from shuttle.cluster.cephclient import connect as rados_connect

PAGE = 4096
FILE_BYTES = 8 << 20
NODE_CACHE_BYTES = 1 << 20
WAYS_DEFAULT = "file_node,rados_node,direct,read_at,own_key,librados,librados_key"
#: /proc's clock ticks a second (utime and stime are counted in them).
TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Each of this process's threads: its name and CPU seconds so far."""
    out: dict[int, tuple[str, float]] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / TICKS)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--pages", type=int, default=400)
    ap.add_argument("--osds", type=int, default=3)
    ap.add_argument("--order", choices=("netrand", "shuffle", "reverse"), default="netrand")
    ap.add_argument("--ways", default=WAYS_DEFAULT)
    ap.add_argument("--remember-s", type=float, default=1.0)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    ways = a.ways.split(",")
    report = run(a.rounds, a.pages, a.osds, a.order, ways, a.remember_s)
    for way, s in report["ways"].items():
        print(
            f"{way:13} p50 {s['p50_us']:7.1f} µs  / librados_key {s['over_key']:.3f} "
            f"(paired {s['over_key_paired']:.3f})  CPU {s['cpu_us_per_read']:.1f} µs/read "
            f"(calling thread {s['main_thread_cpu_us_per_read']:.1f})  "
            f"threads {s['thread_cpu_us_per_read']} gc {s['gc_collections']}"
        )
    print("direct client:", report["direct_client"])
    if a.json_out is not None:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {a.json_out}")


def run(
    rounds: int, pages_per_round: int, osds: int, order: str, ways: list[str], remember_s: float
) -> dict[str, Any]:
    def say(msg: str) -> None:
        print(msg, flush=True)

    with stand(
        osds, say, node_cache_bytes=NODE_CACHE_BYTES, direct_remember_s=remember_s, cache_bytes=0
    ) as bench:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="shuttle-direct-gap-") as tmp:
            path = Path(tmp) / "gap.dat"
            make_file(path, FILE_BYTES)
            load(bench, path, say)
        before_direct = set(thread_cpu())
        client = bench.clients[DIRECT_MODE]
        direct = client.rados_direct
        assert direct is not None
        for mode in ("rados_node", DIRECT_MODE):  # as netrand: after the probation
            wait_for_trust(bench.clients[mode], say, probation=True)
        for p in range(FILE_BYTES // PAGE):  # until the node names the key (its cache full)
            client.read(KEY, p * PAGE, PAGE)
            if KEY in direct._remembered:
                break
        where = direct._remembered[KEY][0]
        own = direct._by_thread[threading.get_ident()][where.pool][where.namespace]
        direct_tids = set(thread_cpu()) - before_direct
        io = bench.ioctx
        # A third librados connection, made after the direct client's (way late_key):
        # is a later connection in this process slower than the benchmark's first one?
        late = None
        if "late_key" in ways:
            late = rados_connect(bench.info.conf_path, bench.info.keyring_path, op_timeout_s=60)
            late_io = late.open_ioctx(bench.info.pool)
        fetchers: dict[str, Callable[[int], Any]] = {
            "direct": lambda p: client.read(KEY, p * PAGE, PAGE),
            "read_at": lambda p: direct.read_at(where, KEY, p * PAGE, PAGE, None),
            # (a key forgotten after --remember-s: asked of the node, as direct does)
            "remembered": lambda p: (
                direct.read_remembered(KEY, p * PAGE, PAGE) or client.read(KEY, p * PAGE, PAGE)
            ),
            "client_piece": lambda p: (
                direct.read_remembered(KEY, p * PAGE, PAGE)
                or Client._read_piece(client, KEY, p * PAGE, PAGE)
            ),
            "own_key": lambda p: own.read(where.object, PAGE, p * PAGE),
            "librados_key": lambda p: io.read(KEY, PAGE, p * PAGE),
            "late_key": lambda p: late_io.read(KEY, PAGE, p * PAGE),
            "librados": lambda p: io.read(OID, PAGE, p * PAGE),
        }
        for mode in ("file_node", "rados_node"):
            c = bench.clients[mode]
            fetchers[mode] = lambda p, c=c: c.read(KEY, p * PAGE, PAGE)  # type: ignore[misc]
        unknown = [w for w in ways if w not in fetchers]
        if unknown or "librados_key" not in ways:
            raise SystemExit(f"--ways: unknown {unknown} (and librados_key is the anchor)")
        samples = {w: Samples() for w in ways}
        by_round: dict[str, list[float]] = {w: [] for w in ways}
        cpu = dict.fromkeys(ways, 0.0)
        main_cpu = dict.fromkeys(ways, 0.0)  # the calling thread's alone
        gcs = {w: [0, 0, 0] for w in ways}  # the garbage collector's runs, by generation
        groups = ("direct_rados", "other")
        tcpu: dict[str, dict[str, float]] = {w: dict.fromkeys(groups, 0.0) for w in ways}
        asks: dict[str, int] = dict.fromkeys(ways, 0)
        pages_in_file = FILE_BYTES // PAGE
        gen = GENERATORS["lcg"]
        load0 = os.getloadavg()[0]
        t0 = time.time()
        for rnd in range(rounds + 1):
            pages = list(gen(1 + rnd, pages_per_round, pages_in_file))
            now = list(ways)
            if order == "shuffle":
                random.shuffle(now)
            elif order == "reverse":
                now.reverse()
            for way in now:
                fetch = fetchers[way]
                timed_run(pages, fetch, PAGE, Samples())
                if not rnd:
                    continue
                asked0 = direct.node_bytes + direct.direct - direct.remembered
                th0 = thread_cpu()
                c0 = time.process_time()
                m0 = time.thread_time()
                g0 = [g["collections"] for g in gc.get_stats()]
                timed_run(pages, fetch, PAGE, samples[way])
                main_cpu[way] += time.thread_time() - m0
                for i, g in enumerate(gc.get_stats()):
                    gcs[way][i] += g["collections"] - g0[i]
                cpu[way] += time.process_time() - c0
                th1 = thread_cpu()
                asks[way] += direct.node_bytes + direct.direct - direct.remembered - asked0
                for tid, (_, s1) in th1.items():
                    s0 = th0.get(tid, ("", 0.0))[1]
                    tcpu[way]["direct_rados" if tid in direct_tids else "other"] += s1 - s0
                this_pass = samples[way].latencies_ns[-len(pages) :]
                by_round[way].append(statistics.median(this_pass) / 1e3)
        names = sorted({thread_cpu().get(t, ("?", 0))[0] for t in direct_tids})
        if late is not None:
            late_io.close()
            late.shutdown()
    reads = rounds * pages_per_round
    key = statistics.median(samples["librados_key"].latencies_ns) / 1e3
    out: dict[str, Any] = {}
    for way in ways:
        p50 = statistics.median(samples[way].latencies_ns) / 1e3
        pairs = [x / y for x, y in zip(by_round[way], by_round["librados_key"], strict=True)]
        out[way] = {
            "p50_us": round(p50, 1),
            "over_key": round(p50 / key, 3),
            "over_key_paired": round(statistics.median(pairs), 3),
            "cpu_us_per_read": round(cpu[way] / reads * 1e6, 1),
            "main_thread_cpu_us_per_read": round(main_cpu[way] / reads * 1e6, 2),
            "thread_cpu_us_per_read": {g: round(v / reads * 1e6, 1) for g, v in tcpu[way].items()},
            "node_asks": asks[way],
            "gc_collections": gcs[way],
            "p50_us_by_round": [round(m, 1) for m in by_round[way]],
        }
    return {
        "experiment": "rados-direct-gap",
        "order": order,
        "remember_s": remember_s,
        "rounds": rounds,
        "pages": pages_per_round,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "load_at_start": round(load0, 2),
        "load_at_end": round(os.getloadavg()[0], 2),
        "direct_rados_threads": names,
        "direct_client": direct.stats(),
        "ways": out,
    }


if __name__ == "__main__":
    main()
