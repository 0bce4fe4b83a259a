"""What a node's in-memory decision log costs every full garbage collection, as dicts
(as before) and as JSON lines (``RuntimeConfig.log_as_text``, the default).

    .venv/bin/python benchmarks/decision_log_gc.py LOG.jsonl --records 100,300,1000
    .venv/bin/python benchmarks/decision_log_gc.py LOG.jsonl --json out.json

``LOG.jsonl`` is a node's decision log (``bench abacus mix --logs DIR`` copies them:
64 clients make records of about 7,000 objects). For each count N the first N records
(repeated if the file has fewer) are held the node's way in a ``deque`` as a planner
keeps them, and ``gc.collect()`` is timed on this thread's CPU clock (median of
``--repeat``), each form in its own child process so that neither's heap is in the
other's figure. On a node of ``--cpu-factor`` 0.05 a collection that lands inside a
call's section is burned twenty-fold (``shuttle.net.cpu``): the figure × 20 is what one
full collection may add to one call, in node CPU seconds.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any


def _child(log: Path, records: int, form: str, repeat: int) -> dict[str, Any]:
    lines = log.read_text().splitlines()
    kept: deque[Any] = deque(maxlen=2000)
    for i in range(records):
        line = lines[i % len(lines)]
        record = json.loads(line)
        kept.append((record["seq"], json.dumps(record)) if form == "text" else record)
    gc.collect()
    times = []
    for _ in range(repeat):
        t = time.thread_time()
        gc.collect()
        times.append(time.thread_time() - t)
    return {
        "form": form,
        "records": records,
        "full_collection_ms": round(statistics.median(times) * 1e3, 2),
        "tracked_objects": len(gc.get_objects()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", type=Path, help="a node's decision log (JSON lines)")
    ap.add_argument("--records", default="100,300,1000", help="counts of records held")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("--child", nargs=2, metavar=("RECORDS", "FORM"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.log, int(args.child[0]), args.child[1], args.repeat)))
        return
    if not args.log.exists():
        sys.exit(f"no decision log at {args.log}: give one that bench abacus mix --logs wrote")
    rows = []
    for n in (int(x) for x in args.records.split(",")):
        for form in ("dicts", "text"):
            child = ["--repeat", str(args.repeat), "--child", str(n), form]
            out = subprocess.run(
                [sys.executable, __file__, str(args.log), *child],
                check=True,
                capture_output=True,
                text=True,
            )
            row = json.loads(out.stdout)
            rows.append(row)
            print(
                f"{n:5d} records as {form:5s}: a full collection {row['full_collection_ms']:8.2f}"
                f" ms ({row['tracked_objects']:,} objects tracked); x 20 on a node of speed "
                f"0.05: {row['full_collection_ms'] * 20 / 1e3:.2f} s",
                flush=True,
            )
    if args.json is not None:
        args.json.write_text(json.dumps({"log": str(args.log), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
