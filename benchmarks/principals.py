"""What checking a principal's caps costs: warm 4 KiB reads and a listing, as the
cluster key's holder (the anchor, unchecked) and as principals, in the same run.

    .venv/bin/python benchmarks/principals.py --json benchmarks/results/principals.json

One keyed node (``shuttle serve --key-file``) and the client pinned to one CPU (as
``shuttle bench netrand`` pins). Three identities read the same warm 4 KiB pages,
round by round, interleaved, so drift hits each alike:

* **cluster key**: unrestricted, no check (what every client was before principals);
* **principal, 1 prefix**: ``--read pages/``;
* **principal, 16 prefixes**: fifteen other prefixes before ``pages/`` (the check scans
  them: a principal is a handful of directories).

and each lists a prefix of 1,000 keys (one page): unrestricted, and as a principal that
may read only a sub-prefix holding half of them (the restricted listing asks the store
once per prefix the principal may read there). Ratios are to the cluster key's figure
of the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shuttle.bench.placement import default_cpu, pin_process, pinned
from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.net import auth
from shuttle.net.blocking import BlockingConnection
from shuttle.net.principals import Caps, PrincipalTable, derive_key, new_principal

PAGE = 4096
PAGES = 256
ROUNDS = 15
LIST_KEYS = 1000


def start_node(root: Path, key_file: Path, cpu: int) -> tuple[subprocess.Popen[bytes], int]:
    ready = root / "ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shuttle",
            "serve",
            "--data",
            str(root / "data"),
            "--listen",
            "127.0.0.1:0",
            "--key-file",
            str(key_file),
            "--ready-file",
            str(ready),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the node did not start")
        time.sleep(0.01)
    pin_process(proc.pid, cpu)
    return proc, int(json.loads(ready.read_text())["port"])


def read_p50_us(client: Client, keys: list[str]) -> float:
    times = []
    for key in keys:
        t0 = time.perf_counter_ns()
        client.read(key, 0, PAGE)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def list_ms(client: Client, prefix: str) -> float:
    t0 = time.perf_counter_ns()
    count = sum(1 for _ in client.list(prefix))
    assert count > 0
    return (time.perf_counter_ns() - t0) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    cpu = default_cpu()
    root = Path(tempfile.mkdtemp(prefix="shuttle-principals-"))
    key_file = root / "cluster.key"
    cluster_key = auth.write_key_file(key_file)
    proc, port = start_node(root, key_file, cpu)
    address = [NodeAddress("n", "127.0.0.1", port)]
    narrow = new_principal("narrow", Caps.of(read=["pages/", "list/half/"]))
    wide = new_principal("wide", Caps.of(read=[f"other{i:02d}/" for i in range(15)] + ["pages/"]))
    table = PrincipalTable(1, {"narrow": narrow, "wide": wide})
    try:
        with BlockingConnection("127.0.0.1", port, key=cluster_key) as conn:
            conn.call("principals.put", {"table": table.to_wire(), "expected_epoch": 0})
        keys = [f"pages/p{i:04d}" for i in range(PAGES)]
        clients = {
            "cluster key": Client(address, key=cluster_key, cache_bytes=0),
            "principal, 1 prefix": Client(
                address, key=derive_key(cluster_key, narrow), principal="narrow", cache_bytes=0
            ),
            "principal, 16 prefixes": Client(
                address, key=derive_key(cluster_key, wide), principal="wide", cache_bytes=0
            ),
        }
        admin = clients["cluster key"]
        for key in keys:
            admin.put(key, os.urandom(PAGE))
        for i in range(LIST_KEYS):
            admin.put(f"list/{'half' if i % 2 else 'rest'}/k{i:04d}", b"x")
        reads: dict[str, list[float]] = {name: [] for name in clients}
        lists: dict[str, list[float]] = {"cluster key": [], "principal, 1 prefix": []}
        with pinned(cpu):
            for c in clients.values():
                read_p50_us(c, keys)  # warm the node's cache and the connections
            for _ in range(args.rounds):
                for name, c in clients.items():
                    reads[name].append(read_p50_us(c, keys))
                for name in lists:
                    lists[name].append(list_ms(clients[name], "list/"))
        for c in clients.values():
            c.close()
    finally:
        proc.terminate()
        proc.wait(15)
    anchor = reads["cluster key"]
    out: dict[str, Any] = {"rounds": args.rounds, "pages": PAGES, "cpu": cpu, "read": {}}
    print(f"warm 4 KiB read p50, µs (median of {args.rounds} rounds; ratio to the cluster key)")
    for name, values in reads.items():
        ratios = [v / a for v, a in zip(values, anchor, strict=True)]
        out["read"][name] = {
            "p50_us": statistics.median(values),
            "ratio": statistics.median(ratios),
            "ratio_range": [min(ratios), max(ratios)],
        }
        print(
            f"  {name:24s} {statistics.median(values):7.1f}  ×{statistics.median(ratios):.3f} "
            f"({min(ratios):.2f}–{max(ratios):.2f})"
        )
    unrestricted, restricted = lists["cluster key"], lists["principal, 1 prefix"]
    ratios = [r / u for r, u in zip(restricted, unrestricted, strict=True)]
    out["list"] = {
        "unrestricted_ms": statistics.median(unrestricted),
        "restricted_ms": statistics.median(restricted),
        "ratio": statistics.median(ratios),
    }
    print(
        f"list of {LIST_KEYS} keys, ms: unrestricted {statistics.median(unrestricted):.2f}, "
        f"a principal seeing half {statistics.median(restricted):.2f} "
        f"(×{statistics.median(ratios):.2f})"
    )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
