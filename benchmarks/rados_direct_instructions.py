"""Instructions a remembered direct read costs the calling thread, counted by callgrind
(issue 26, item 2; docs/ceph.md, "A client that reads a miss from the OSD itself").

    .venv/bin/python benchmarks/rados_direct_instructions.py [--json-out FILE]
        [--ways librados_own,read_at,client_remembered,gateway_remembered]

``benchmarks/rados_direct_path.py`` times the same ways by the clock; on a shared
machine their p50s swing by more than the client's own path costs (1–2 µs of a
130–230 µs read). Instruction counts do not: this starts a local Ceph (1 OSD), writes
an 8 MiB object, and for each way runs a child process under ``valgrind
--tool=callgrind --separate-threads=yes`` twice, reading ``--low`` and then
``--high`` random 4 KiB pages after 20 untimed ones; the difference of the main
thread's totals over ``high - low`` is the way's instructions per read on the thread
that calls it (librados's own threads, and the start-up both runs share, drop out):

* ``librados_own``: ``ioctx.read`` on the client's own librados connection;
* ``read_at``: :meth:`DirectReads.read_at` (the read and its version check);
* ``client_remembered``: ``Client.read`` of a key the node named before;
* ``gateway_remembered``: the same by a :class:`~shuttle.client.gateways.GatewayClient`
  of one node (what ``shuttle.connect`` gives for a cluster of RADOS nodes, and
  ``shuttle bench ceph netrand``'s direct client).

``client_remembered - librados_own`` is Shuttle's own cost of a remembered read.
Prints each way's count and writes them as JSON with ``--json-out``. About 35 s a
way, after the Ceph's start (2.5 min in all).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAGE = 4096
OBJECT_BYTES = 8 << 20
OID = "bench-direct-instructions"
WAYS = ("librados_own", "read_at", "client_remembered", "gateway_remembered")
WARM_READS = 20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ways", default=",".join(WAYS), help=f"some of {', '.join(WAYS)}")
    ap.add_argument("--low", type=int, default=100)
    ap.add_argument("--high", type=int, default=1100)
    ap.add_argument("--json-out", type=Path)
    a = ap.parse_args()
    ways = [w for w in a.ways.split(",") if w]
    unknown = sorted(set(ways) - set(WAYS))
    if unknown or not 0 < a.low < a.high:
        ap.error(f"--ways takes {', '.join(WAYS)} (got {unknown}); and 0 < --low < --high")
    from shuttle.cluster.ceph import LocalCeph
    from shuttle.cluster.cephclient import connect

    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="shuttle-direct-instr-") as tmp:
        ceph = LocalCeph(Path(tmp) / "ceph", osds=1, die_with_parent=True)
        info = ceph.start()
        try:
            cluster = connect(info.conf_path, info.keyring_path, op_timeout_s=60)
            io = cluster.open_ioctx(info.pool)
            data = random.randbytes(OBJECT_BYTES)
            for off in range(0, OBJECT_BYTES, 4 << 20):
                io.write(OID, data[off : off + (4 << 20)], off)
            version = int(io.get_last_version())
            io.close()
            cluster.shutdown()
            where = [str(info.conf_path), str(info.keyring_path), info.user, info.pool]
            counts: dict[str, float] = {}
            for way in ways:
                totals = [
                    _count(Path(tmp), way, n, [*where, str(version)]) for n in (a.low, a.high)
                ]
                counts[way] = round((totals[1] - totals[0]) / (a.high - a.low))
                print(f"{way:18} {counts[way]:9,.0f} instructions/read (the calling thread)")
        finally:
            ceph.down()
    report: dict[str, Any] = {
        "experiment": "rados-direct-instructions",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)),
        "reads": [a.low, a.high],
        "instructions_per_read": counts,
    }
    if "librados_own" in counts and "client_remembered" in counts:
        report["shuttle_own"] = counts["client_remembered"] - counts["librados_own"]
        print(f"Shuttle's own on a remembered read: {report['shuttle_own']:,.0f}")
    if a.json_out is not None:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {a.json_out}")


def _count(tmp: Path, way: str, reads: int, where: list[str]) -> int:
    """The main thread's instructions over a child's whole run of ``reads`` reads."""
    out = tmp / f"cg.{way}.{reads}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "-q",
            "--separate-threads=yes",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            way,
            str(reads),
            *where,
        ],
        check=True,
    )
    text = Path(f"{out}-01").read_text(errors="replace")  # thread 1: the main thread
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("summary:"))


def child(
    way: str, reads: int, conf: str, keyring: str, user: str, pool: str, version: int
) -> None:
    """The counted process: ``reads`` reads of one way, after untimed ones."""
    from shuttle.client.client import Client
    from shuttle.client.gateways import GatewayClient
    from shuttle.client.model import NodeAddress
    from shuttle.client.rados_direct import CephOptions, Location

    where = Location(pool, "", OID, version)
    options = CephOptions(Path(conf), Path(keyring), user, remember_s=1e9)
    # No node is ever asked: the key is remembered (the address is never dialled).
    kind = GatewayClient if way == "gateway_remembered" else Client
    client = kind([NodeAddress("unused", "127.0.0.1", 9)], rados_direct=options)
    direct = client.rados_direct
    assert direct is not None
    direct._remember(OID, where)
    own = direct._connected().open_ioctx(pool)
    fetch: Callable[[int], Any] = {
        "librados_own": lambda p: own.read(OID, PAGE, p),
        "read_at": lambda p: direct.read_at(where, OID, p, PAGE, None),
        "client_remembered": lambda p: client.read(OID, p, PAGE),
        "gateway_remembered": lambda p: client.read(OID, p, PAGE),
    }[way]
    rng = random.Random(7)
    for _ in range(WARM_READS + reads):
        fetch(rng.randrange(OBJECT_BYTES // PAGE) * PAGE)
    own.close()
    client.close()


if __name__ == "__main__":
    if len(sys.argv) == 9 and sys.argv[1] == "--child":
        way, reads, conf, keyring, user, pool, version = sys.argv[2:]
        child(way, int(reads), conf, keyring, user, pool, int(version))
    else:
        main()
