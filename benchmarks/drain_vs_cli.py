"""A live ``shuttle grep --placement server`` against a calibration process's drain of
the same grep, on one node, interleaved (issue 24: the loopback server rows' calls).

    .venv/bin/python benchmarks/drain_vs_cli.py --cluster C.toml --rounds 12

The calibration's console-call figures come from fresh processes that make the
program's grep at the node and drain it (``bench/calibrate/fresh.py``); the model's
calls then take what those drains took. This times both on the cluster's first node
(the validation corpus, ``bench/corpus.py``, is put on it first unless it is there),
one after the other, the order swapped every round: the live command's calls (its
report's ``phases``, ``progress`` left out) and the drain's (``next`` until done).
Printed: each one's median per-call wall over the rounds, its calls' total, and the
paired difference of the totals round by round (the load moves both alike within a
round).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from shuttle.bench.calibrate.fresh import fresh_reads
from shuttle.bench.corpus import CorpusSpec, generate_corpus
from shuttle.bench.liveruns import live_grep_report
from shuttle.client.connect import connect
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import NotFoundError

PATTERN = "q[a-e]x"


def live_calls(cluster: Path, keys: list[str]) -> list[float]:
    report = live_grep_report(cluster, PATTERN, keys, "server", link="loopback")
    (phases,) = report["phases"].values()
    return [float(w) for w in phases["calls_s"][:-1]]


def drain_calls(cluster: Path, keys: list[str]) -> list[float]:
    entry = ClusterFile.load(cluster).nodes[0]
    (run,) = fresh_reads(
        cluster, "loopback", entry.id, entry.pid, [(k, 0, 65536) for k in keys],
        processes=1, budget_s=0.0, program={"pattern": PATTERN},
    )  # fmt: skip
    return list(run.call_walls[:-1])


def load_corpus(cluster: Path, corpus: list[tuple[str, bytes]]) -> int:
    """Put the validation corpus on the cluster unless its first key is there already
    (a fresh cluster from ``shuttle cluster up``); returns how many objects were put."""
    with connect(cluster=cluster, link="loopback") as client:
        try:
            client.stat(corpus[0][0])
            return 0
        except NotFoundError:
            pass
        for key, data in corpus:
            client.put(key, data)
    return len(corpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cluster", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    corpus = list(generate_corpus(CorpusSpec()))
    keys = [k for k, _ in corpus]
    put = load_corpus(args.cluster, corpus)
    if put:
        print(f"put the validation corpus ({put} objects) on the cluster", flush=True)
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        load = os.getloadavg()[0]
        order = ("live", "drain") if i % 2 == 0 else ("drain", "live")
        got = {
            name: (live_calls if name == "live" else drain_calls)(args.cluster, keys)
            for name in order
        }
        rounds.append({"order": list(order), "load": load, **got})
        print(
            f"round {i + 1:2d} ({' then '.join(order)}, load {load:.1f}): calls total live "
            f"{sum(got['live']):.3f} s, drain {sum(got['drain']):.3f} s",
            flush=True,
        )
    for name in ("live", "drain"):
        per_call = [statistics.median(r[name]) for r in rounds]
        totals = [sum(r[name]) for r in rounds]
        print(
            f"{name:>5}: per-call median {statistics.median(per_call) * 1e3:.3f} ms (rounds "
            f"{min(per_call) * 1e3:.3f}-{max(per_call) * 1e3:.3f}), calls total median "
            f"{statistics.median(totals):.3f} s"
        )
    ratios = [sum(r["live"]) / sum(r["drain"]) for r in rounds]
    print(
        f"live / drain, calls total, round by round: median {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "ratios": ratios}))


if __name__ == "__main__":
    main()
