"""Are identical librados connections in one process equally fast? (issue 26, item 2;
benchmarks/README.md, "Eleventh sitting"): the anchor of ``shuttle bench ceph
netrand`` is one librados connection and the direct client reads on another, so a
difference between two connections would be mistaken for Shuttle's.

    .venv/bin/python benchmarks/rados_connections.py [--connections 3] [--rounds 12]
        [--pages 400] [--json-out FILE]

Starts a local Ceph (3 OSDs), opens ``--connections`` connections with
:func:`shuttle.cluster.cephclient.connect` and the same options, in order, writes one
8 MiB object, and each round reads the same ``--pages`` random 4 KiB pages of it on
every connection (an untimed pass, then the timed one, as netrand does), the
connections' order rotated a round. Prints each connection's p50 over the first's,
pooled and paired by round, and writes them as JSON. About 1 minute.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import connect

PAGE = 4096
OBJECT_BYTES = 8 << 20
OID = "bench-connections"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--pages", type=int, default=400)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    if a.connections < 2 or a.rounds < 1 or a.pages < 1:
        ap.error("--connections ≥ 2, --rounds ≥ 1 and --pages ≥ 1")
    report = run(a.connections, a.rounds, a.pages)
    for name, c in report["connections"].items():
        print(
            f"{name}  p50 {c['p50_us']:7.1f} µs  / c0 {c['over_first']:.3f} "
            f"(paired {c['over_first_paired']:.3f}, rounds {c['paired_range']})"
        )
    if a.json_out is not None:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {a.json_out}")


def run(n: int, rounds: int, pages_per_round: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="shuttle-connections-") as tmp:
        ceph = LocalCeph(Path(tmp) / "ceph", osds=3, die_with_parent=True)
        info = ceph.start()
        clusters: list[Any] = []
        try:
            clusters = [
                connect(info.conf_path, info.keyring_path, op_timeout_s=60) for _ in range(n)
            ]
            ios = [c.open_ioctx(info.pool) for c in clusters]
            ios[0].write_full(OID, os.urandom(OBJECT_BYTES))
            latencies: list[list[int]] = [[] for _ in range(n)]
            medians: list[list[float]] = [[] for _ in range(n)]
            clock = time.perf_counter_ns
            load0 = os.getloadavg()[0]
            for rnd in range(rounds + 1):  # round 0 warms every connection, untimed
                rng = random.Random(rnd)
                pages = [rng.randrange(OBJECT_BYTES // PAGE) for _ in range(pages_per_round)]
                for i in [*range(rnd % n, n), *range(rnd % n)]:
                    io = ios[i]
                    for p in pages:
                        io.read(OID, PAGE, p * PAGE)
                    if not rnd:
                        continue
                    got = []
                    for p in pages:
                        t = clock()
                        io.read(OID, PAGE, p * PAGE)
                        got.append(clock() - t)
                    latencies[i] += got
                    medians[i].append(statistics.median(got))
            for io in ios:
                io.close()
        finally:
            for c in clusters:
                c.shutdown()
            ceph.down()
    first = statistics.median(latencies[0])
    out: dict[str, Any] = {}
    for i in range(n):
        pairs = [x / y for x, y in zip(medians[i], medians[0], strict=True)]
        out[f"c{i}"] = {
            "p50_us": round(statistics.median(latencies[i]) / 1e3, 1),
            "over_first": round(statistics.median(latencies[i]) / first, 3),
            "over_first_paired": round(statistics.median(pairs), 3),
            "paired_range": [round(min(pairs), 3), round(max(pairs), 3)],
        }
    return {
        "experiment": "rados-connections",
        "rounds": rounds,
        "pages": pages_per_round,
        "load_at_start": round(load0, 2),
        "load_at_end": round(os.getloadavg()[0], 2),
        "connections": out,
    }


if __name__ == "__main__":
    main()
