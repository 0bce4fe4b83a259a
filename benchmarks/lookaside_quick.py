"""Lookaside, quickly: one object read with no store, a store holding an identical copy,
an older copy (scattered edits and insertions) and unrelated data, over given links,
whole (``client.get``) and through the client cache (``open`` + 128 KiB reads, as the
FUSE mount reads). Prints one JSON line per run and writes them all to ``--json``.

    .venv/bin/python benchmarks/lookaside_quick.py /tmp/lookaside-quick \\
        --mb 50 --link bw=10Mbit,lat=1ms --link loopback

The full experiment (a real build over the FUSE mount at five bandwidths, stores one
or more releases back) is ``shuttle bench lookaside``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shuttle.bench.session import BenchSession
from shuttle.client import Client
from shuttle.client.connect import connect
from shuttle.client.lookaside import LookasideStore

#: Edits that make the "older" copy: half overwrite 2,000 bytes, half insert 3,000.
EDITS = 40
#: Reads through the cache are this big (a FUSE read-ahead's size).
READ_BYTES = 128 << 10
SERVE = [sys.executable, "-m", "shuttle", "serve"]
RESULTS = Path("benchmarks/results/lookaside-quick.json")
#: Counters printed with each run.
SHOWN = (
    "chunks_from_stores",
    "bytes_from_stores",
    "chunks_from_node",
    "bytes_from_node",
    "node_batches",
    "verify_failures",
    "reads_skipped",
    "probes",
    "time_saved_s",
    "store_rate_bytes_per_s",
    "link_rate_bytes_per_s",
)


def start_node(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    ready = data.with_suffix(".ready")
    proc = subprocess.Popen(
        [*SERVE, "--data", str(data), "--listen", "127.0.0.1:0", "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the node did not start")
        time.sleep(0.02)
    return proc, f"127.0.0.1:{json.loads(ready.read_text())['port']}"


def read_in_pieces(client: Client, key: str) -> bytes:
    parts = []
    with client.open(key) as f:
        while piece := f.read(READ_BYTES):
            parts.append(piece)
    return b"".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scratch", type=Path, help="scratch directory (deleted first)")
    parser.add_argument("--mb", type=int, default=50, help="object size, MB")
    parser.add_argument("--link", action="append", help="link profile(s) (default loopback)")
    parser.add_argument(
        "--json", type=Path, default=Path("benchmarks/results/lookaside-quick.json")
    )
    args = parser.parse_args()
    links = args.link or ["loopback"]
    shutil.rmtree(args.scratch, ignore_errors=True)
    args.scratch.mkdir(parents=True)
    size = args.mb * 1_000_000
    rng = random.Random(1)
    current = rng.randbytes(size)
    older = bytearray(current)
    for i in range(EDITS):
        at = rng.randrange(size - 10_000)
        if i % 2:
            older[at : at + 2000] = rng.randbytes(2000)
        else:
            older[at:at] = rng.randbytes(3000)
    stores: dict[str, LookasideStore] = {}
    for name, data in (
        ("identical", current),
        ("older", older),
        ("unrelated", rng.randbytes(size)),
    ):
        (args.scratch / name).mkdir()
        (args.scratch / name / "data.bin").write_bytes(data)
        store = LookasideStore.open(args.scratch / name, args.scratch / f"{name}.sqlite")
        t0 = time.perf_counter()
        report = store.refresh()
        print(f"indexed {name}: {report.chunks_indexed} chunks in {time.perf_counter() - t0:.2f} s")
        stores[name] = store
    proc, address = start_node(args.scratch / "node")
    rows: list[dict[str, Any]] = []
    try:
        with connect(node=address) as client:
            client.put("obj", current)
        for link in links:
            for name in ("none", *stores):
                for how in ("get", "open"):
                    lookaside = [stores[name]] if name != "none" else None
                    with connect(node=address, link=link, lookaside=lookaside) as client:
                        client.stat("obj")  # connected, so the timing is the read's
                        t0 = time.perf_counter()
                        whole = how == "get"
                        data = client.get("obj") if whole else read_in_pieces(client, "obj")
                        seconds = time.perf_counter() - t0
                        counters = client.counters().get("lookaside", {})
                    assert data == current, "wrong bytes"
                    row = {"link": link, "store": name, "read": how, "seconds": round(seconds, 3)}
                    row.update({k: counters[k] for k in SHOWN if k in counters})
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        proc.wait()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    config = {"mb": args.mb, "edits": EDITS, "read_bytes": READ_BYTES, "links": links}
    args.json.write_text(json.dumps({"config": config, "runs": rows}, indent=2) + "\n")
    print(f"wrote {args.json} ({os.cpu_count()} CPUs)")


if __name__ == "__main__":
    # Stops what the run started on any exit (SIGTERM too) and prints how long it took.
    with BenchSession(f"benchmarks/{Path(__file__).name}", {"argv": sys.argv[1:]}):
        main()
