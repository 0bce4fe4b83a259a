"""How soon a RADOS node just started answers warm reads without asking RADOS (issue 26,
item 2): reads through the node, one after another, from its first seconds (its
watch's probation, when each read is confirmed with a ``stat``) until a read needs no
``stat``; counts the reads still confirmed after the probation ended.

    .venv/bin/python benchmarks/rados_trust.py [--runs 3] [--compare SRC] [--json-out FILE]

``--compare SRC`` also measures a node running another checkout's ``src`` folder
(``git archive main src | tar -x -C /tmp/main``, then ``--compare /tmp/main/src``; copy
the compiled ``*.so`` files and ``shuttle/compiled.json`` beside it when the compiled
modules did not change, else that node runs pure Python), run by run alternately with
this checkout's: before and after under the same load. Each run starts its own local
Ceph (one OSD) and a node on it, puts a 1 MiB object, and reads one 4 KiB page of it
through the node again and again, asking the node's counters
(``stats()["store"]["rados"]``) after each read: a read whose ``validations`` grew was
confirmed with a ``stat``. Prints, per run, the probation left at the first read, the
reads begun after the probation ended (as the node said before each) that were still
confirmed, and the seconds from its end to the first read that asked RADOS nothing;
writes them as JSON. (The node rounds ``probation_s_left`` up to the millisecond: 0
means over. The code before this branch rounds it to the nearest.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from shuttle.bench.ceph_netrand import PAGE_BYTES
from shuttle.bench.ceph_stand import KEY, check_compare_src, load, stand
from shuttle.bench.netrand import make_file
from shuttle.client.client import Client

#: Give up on a run after this long (a node whose reads never stop being confirmed).
RUN_LIMIT_S = 30.0
OBJECT_BYTES = 1 << 20


def _rados(client: Client) -> dict[str, Any]:
    stats: dict[str, Any] = client.node_stats(client.nodes[0])["store"]["rados"]
    return stats


def one_run(src: Path | None) -> dict[str, Any]:
    """Start Ceph and a node (running ``src`` if given), read until trusted."""
    saved = os.environ.get("PYTHONPATH")
    if src is not None:  # the node inherits it; this process keeps its own modules
        os.environ["PYTHONPATH"] = str(src.resolve())
    try:
        with stand(1, lambda _msg: None, cache_bytes=0) as bench:
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "object.dat"
                make_file(path, OBJECT_BYTES)
                load(bench, path, lambda _msg: None)
            client = bench.clients["rados_node"]
            now = _rados(client)
            left_at_start = now["coherence"]["probation_s_left"]
            validations = now["validations"]
            ended_s: float | None = None
            after = 0
            free_s: float | None = None
            reads = 0
            t0 = time.monotonic()
            while time.monotonic() - t0 < RUN_LIMIT_S:
                # Over before this read began (the node's last answer said so): it
                # counts. ``probation_s_left`` is 0 only once the probation is over.
                over = now["coherence"]["probation_s_left"] == 0 and now["coherence"]["trusted"]
                if over and ended_s is None:
                    ended_s = time.monotonic()
                client.read(KEY, PAGE_BYTES, PAGE_BYTES)
                reads += 1
                now = _rados(client)
                confirmed = now["validations"] > validations
                validations = now["validations"]
                if ended_s is not None:
                    if not confirmed:
                        free_s = time.monotonic() - ended_s
                        break
                    after += 1
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    return {
        "probation_s_left_at_first_read": left_at_start,
        "reads": reads,
        "confirmed_reads_after_probation": after,
        "s_from_probation_end_to_first_stat_free_read": None
        if free_s is None
        else round(free_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per code (default 3)")
    parser.add_argument("--compare", type=Path, help="another checkout's src folder")
    parser.add_argument("--json-out", type=Path, help="write the report here")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be ≥ 1")
    if args.compare is not None:
        check_compare_src(args.compare)
    codes: dict[str, Path | None] = {"this": None}
    if args.compare is not None:
        codes = {"compare": args.compare, "this": None}
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
    for i in range(args.runs):
        for name, src in codes.items():
            result = one_run(src)
            runs[name].append(result)
            print(f"run {i + 1} {name}: {json.dumps(result)}", flush=True)
    summary = {
        name: {
            "confirmed_reads_after_probation_median": statistics.median(
                r["confirmed_reads_after_probation"] for r in rs
            ),
            "s_to_first_stat_free_read": [
                r["s_from_probation_end_to_first_stat_free_read"] for r in rs
            ],
        }
        for name, rs in runs.items()
    }
    for name, s in summary.items():
        print(f"{name}: {json.dumps(s)}")
    report = {
        "experiment": "rados-trust",
        "compare": str(args.compare) if args.compare else None,
        "runs": runs,
        "summary": summary,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
    }
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {args.json_out}")


if __name__ == "__main__":
    main()
