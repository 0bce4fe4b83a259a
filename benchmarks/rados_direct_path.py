"""What a client's own path costs over a bare librados read when it reads a RADOS node's
miss from the OSD itself (issue 26, item 2; docs/ceph.md, "A client that reads a miss
from the OSD itself"), in one process, interleaved.

    .venv/bin/python benchmarks/rados_direct_path.py [--rounds 12] [--reads 300]
        [--osds 1] [--json-out FILE]

Starts a local Ceph, writes an 8 MiB object, and times random 4 KiB reads of it, one
at a time, in five ways, each round running every way once in a shuffled order
(drift on a shared machine hits them alike):

* ``librados``: ``ioctx.read`` through the Python binding (``shuttle bench ceph
  netrand``'s anchor);
* ``librados_own``: ``ioctx.read`` on the client's own librados connection (the one
  ``read_at`` uses; two librados clients in one process need not read alike);
* ``read_at``: :meth:`DirectReads.read_at <shuttle.client.rados_direct.DirectReads.
  read_at>`, the client's read of a named object with its version check, on the
  client's own librados connection;
* ``client_remembered``: ``Client.read`` of a key the node named before (remembered,
  so no node is asked): the whole client path of a remembered read;
* ``gateway_remembered``: the same through a
  :class:`~shuttle.client.gateways.GatewayClient`, the client ``shuttle.connect`` gives
  for a cluster of RADOS nodes (and so ``shuttle bench ceph netrand``'s direct client),
  sharing ``client_remembered``'s direct reads.

Prints each way's p50 (the median over the timed rounds of each round's median, µs),
its paired ratio to ``librados`` (the median of the rounds' ratios, with their range:
the noise) and this process's CPU per read (all threads, librados's too), and writes
them as JSON with ``--json-out``. Round 0 is a warm-up and is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shuttle.client.client import Client
from shuttle.client.gateways import GatewayClient
from shuttle.client.model import NodeAddress
from shuttle.client.rados_direct import CephOptions, Location
from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import connect

PAGE = 4096
OBJECT_BYTES = 8 << 20
OID = "bench-direct-path"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--reads", type=int, default=300)
    ap.add_argument("--osds", type=int, default=1)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shuttle-direct-path-") as tmp:
        ceph = LocalCeph(Path(tmp) / "ceph", osds=a.osds, die_with_parent=True)
        info = ceph.start()
        try:
            report = run(info, a.rounds, a.reads)
        finally:
            ceph.down()
    for way, s in report["ways"].items():
        print(
            f"{way:18} p50 {s['p50_us']:7.1f} µs  / librados paired {s['paired']:.3f} "
            f"({s['paired_min']:.3f}–{s['paired_max']:.3f})  CPU {s['cpu_us_per_read']:.1f} µs/read"
        )
    if a.json_out is not None:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {a.json_out}")


def run(info: Any, rounds: int, reads: int) -> dict[str, Any]:
    cluster = connect(info.conf_path, info.keyring_path, op_timeout_s=60)
    io = cluster.open_ioctx(info.pool)
    data = random.randbytes(OBJECT_BYTES)
    for off in range(0, OBJECT_BYTES, 4 << 20):
        io.write(OID, data[off : off + (4 << 20)], off)
    version = int(io.get_last_version())
    where = Location(info.pool, "", OID, version)
    options = CephOptions(info.conf_path, info.keyring_path, info.user, remember_s=1e9)
    # No node is ever asked: every range is remembered (the address is never dialled).
    client = Client([NodeAddress("unused", "127.0.0.1", 9)], rados_direct=options)
    direct = client.rados_direct
    assert direct is not None
    pages = OBJECT_BYTES // PAGE
    direct._remember(OID, where)
    gateway = GatewayClient([NodeAddress("unused", "127.0.0.1", 9)])
    gateway.rados_direct = direct  # the same remembered key and librados connection
    own = direct._connected().open_ioctx(info.pool)
    ways: dict[str, Callable[[int], Any]] = {
        "librados": lambda p: io.read(OID, PAGE, p * PAGE),
        "librados_own": lambda p: own.read(OID, PAGE, p * PAGE),
        "read_at": lambda p: direct.read_at(where, OID, p * PAGE, PAGE, None),
        "client_remembered": lambda p: client.read(OID, p * PAGE, PAGE),
        "gateway_remembered": lambda p: gateway.read(OID, p * PAGE, PAGE),
    }
    for p in range(8):  # each way's connections made before anything is timed
        for fetch in ways.values():
            fetch(p)
    medians: dict[str, list[float]] = {w: [] for w in ways}
    cpu: dict[str, float] = dict.fromkeys(ways, 0.0)
    load0 = os.getloadavg()[0]
    t0 = time.time()
    for rnd in range(rounds + 1):
        chosen = [random.randrange(pages) for _ in range(reads)]
        order = list(ways)
        random.shuffle(order)
        for way in order:
            fetch = ways[way]
            c0 = time.process_time()
            lat = []
            for p in chosen:
                t = time.perf_counter_ns()
                fetch(p)
                lat.append(time.perf_counter_ns() - t)
            if rnd:
                cpu[way] += time.process_time() - c0
                medians[way].append(statistics.median(lat) / 1e3)
    own.close()
    gateway.rados_direct = None  # closed once, by client
    gateway.close()
    client.close()
    cluster.shutdown()
    out: dict[str, Any] = {}
    for way, ms in medians.items():
        pairs = [x / y for x, y in zip(ms, medians["librados"], strict=True)]
        out[way] = {
            "p50_us": round(statistics.median(ms), 1),
            "paired": round(statistics.median(pairs), 3),
            "paired_min": round(min(pairs), 3),
            "paired_max": round(max(pairs), 3),
            "cpu_us_per_read": round(cpu[way] / (rounds * reads) * 1e6, 1),
            "p50_us_by_round": [round(m, 1) for m in ms],
        }
    return {
        "experiment": "rados-direct-path",
        "rounds": rounds,
        "reads": reads,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "load_at_start": round(load0, 2),
        "load_at_end": round(os.getloadavg()[0], 2),
        "ways": out,
    }


if __name__ == "__main__":
    main()
