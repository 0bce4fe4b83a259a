"""How still the simulator's calibration holds: several calibrations of one loopback
node, each way of timing the per-call cost interleaved, against live greps in the same
run (issue 24).

    .venv/bin/python benchmarks/calibration_spread.py --speeds 1,0.25 --rounds 5 \\
        --json benchmarks/results/sim/calibration-spread.json

For each node speed a one-node cluster is started on loopback at that CPU factor and
loaded with the validation corpus (``bench/corpus.py``, as ``shuttle bench
sim-predict``); the grep ``q[a-e]x`` is recorded in process once. Then each round
runs, in an order that rotates from round to round:

* ``in-process``: ``shuttle sim calibrate`` timing the per-call cost in its own
  process, on small reads of its own objects (``processes=0``: the way before);
* ``fresh-small``: the same small reads, each set in 5 fresh processes, the median;
* ``fresh-program``: the recorded grep's own reads in 5 fresh processes (what
  ``shuttle sim predict`` does now);

each a whole calibration (``--no-disk``), and the simulator's prediction of the grep
at both placements from it; and one live ``shuttle grep`` at each placement. Printed
and written, per speed and way: every calibration's node CPU per read, per-message
residual, their sum (the model's time per remote read on loopback), the hosted
ratios, the console call's figures, and the predictions' errors against the median of
the live runs; with each figure's spread over the rounds, (max - min) / median. The
load average at each round's start is kept (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from shuttle.bench.calibrate import calibrate
from shuttle.bench.corpus import CorpusSpec, generate_corpus
from shuttle.bench.liveruns import live_grep
from shuttle.bench.objrecord import grep_run, record_object
from shuttle.bench.predict import program_reads
from shuttle.client.connect import connect
from shuttle.cluster import local
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT
from shuttle.runtime.client import Runtime
from shuttle.sim.forecast import forecast, split_stacks
from shuttle.sim.sources import load_trace_file

PATTERN = "q[a-e]x"
#: The ways of timing the per-call cost: (name, fresh processes, the program's reads?).
WAYS = (("in-process", 0, False), ("fresh-small", 5, False), ("fresh-program", 5, True))
#: The figures kept per calibration: (name, key in ``measured``, scale, unit).
FIGURES = (
    ("node CPU / read", "read_node_cpu_per_request_s", 1e6, "µs"),
    ("residual / read", "rpc_overhead_s", 1e6, "µs"),
    ("per read (sum)", "per_read_s", 1e6, "µs"),
    ("connect", "connect_s", 1e6, "µs"),
    ("node ratio", "mobile_server_cpu_ratio", 1.0, ""),
    ("client ratio", "mobile_client_cpu_ratio", 1.0, ""),
    ("call node CPU", "call_node_cpu_s", 1e6, "µs"),
    ("call residual", "call_overhead_s", 1e6, "µs"),
)


def spread(values: list[float]) -> float:
    middle = statistics.median(values)
    return (max(values) - min(values)) / abs(middle) if middle else float("inf")


def one_speed(
    speed: float, rounds: int, scratch: Path, corpus: list[tuple[str, bytes]]
) -> dict[str, Any]:
    cluster = local.up(scratch / f"speed-{speed:g}", nodes=1, cpu_factors=[speed])
    assert cluster.path is not None
    try:
        with connect(cluster=cluster.path, link="loopback") as client:
            for key, data in corpus:
                client.put(key, data)
        keys = [k for k, _ in corpus]
        trace_path = scratch / f"grep-{speed:g}.csv.gz"
        with Runtime.connect(cluster.path, link="loopback") as rt:
            record_object(rt, grep_run(PATTERN, keys), trace_path)
        trace = load_trace_file(trace_path)
        (stack,) = split_stacks(trace)
        (reads,) = program_reads(trace_path, BLOCK_BYTES_DEFAULT).values()
        cals: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in WAYS}
        live: dict[str, list[float]] = {"client": [], "server": []}
        loads = []
        for r in range(rounds):
            loads.append(os.getloadavg()[0])
            order = WAYS[r % len(WAYS) :] + WAYS[: r % len(WAYS)]
            for name, processes, program in order:
                t0 = time.perf_counter()
                cal = calibrate(
                    cluster.path,
                    link="loopback",
                    disk=False,
                    processes=processes,
                    reads=reads if program else None,
                )
                config = cal.server_config()
                f = forecast([(config, stack)], warm=True)
                m = cal.measured
                row = {key: float(m[key]) for _, key, _, _ in FIGURES if key in m}
                row["per_read_s"] = m["read_node_cpu_per_request_s"] + m["rpc_overhead_s"]
                row.update(
                    predicted_client_s=f.client_s,
                    predicted_server_s=f.server_s,
                    calibration_s=time.perf_counter() - t0,
                    # The per-process figures, and the in-process phases' reads.
                    fresh_reads=m.get("fresh_reads"),
                    fresh_calls=m.get("fresh_calls"),
                    reads_loopback=m.get("reads_loopback"),
                    reads_link=m.get("reads_link"),
                    load_average=os.getloadavg()[0],
                )
                cals[name].append(row)
                node_us = row["read_node_cpu_per_request_s"] * 1e6
                print(f"speed {speed:g} round {r + 1} {name}: per read "
                      f"{row['per_read_s'] * 1e6:.0f} µs (node {node_us:.0f}"
                      f" + {row['rpc_overhead_s'] * 1e6:.0f}), predicted {f.client_s:.3f} / "
                      f"{f.server_s:.3f} s ({row['calibration_s']:.0f} s)", flush=True)  # fmt: skip
            for placement in ("client", "server"):
                live[placement].append(
                    live_grep(cluster.path, PATTERN, keys, placement, link="loopback")
                )
            print(f"speed {speed:g} round {r + 1} live: {live['client'][-1]:.3f} / "
                  f"{live['server'][-1]:.3f} s (load {loads[-1]:.2f})", flush=True)  # fmt: skip
    finally:
        local.down(cluster)
    live_median = {p: statistics.median(v) for p, v in live.items()}
    summary: dict[str, Any] = {}
    for name, rows in cals.items():
        out: dict[str, Any] = {}
        for _, key, _, _ in (*FIGURES, ("", "per_read_s", 0, "")):
            values = [row[key] for row in rows if key in row]
            if values:
                out[key] = {"median": statistics.median(values), "spread": spread(values),
                            "min": min(values), "max": max(values)}  # fmt: skip
        for p in ("client", "server"):
            errors = [row[f"predicted_{p}_s"] / live_median[p] - 1 for row in rows]
            out[f"error_{p}"] = {"median": statistics.median(errors), "min": min(errors),
                                 "max": max(errors)}  # fmt: skip
        summary[name] = out
    return {
        "speed": speed,
        "reads": len(reads),
        "live": {
            "runs": live,
            "median": live_median,
            "spread": {p: spread(v) for p, v in live.items()},
        },
        "load_average_at_rounds": loads,
        "calibrations": cals,
        "summary": summary,
    }


def report(result: dict[str, Any]) -> None:
    speed = result["speed"]
    live = result["live"]
    loads = result["load_average_at_rounds"]
    med, spr = live["median"], live["spread"]
    print(f"\nspeed {speed:g}: live client {med['client']:.3f} s (spread {spr['client']:.0%}), "
          f"server {med['server']:.3f} s (spread {spr['server']:.0%}); "
          f"load {min(loads):.1f}-{max(loads):.1f}")  # fmt: skip
    print(f"{'figure':<18}" + "".join(f"{name:>28}" for name, _, _ in WAYS))
    for label, key, scale, unit in (*FIGURES[:3], *FIGURES[3:]):
        cells = []
        for name, _, _ in WAYS:
            s = result["summary"][name].get(key)
            cells.append("-" if s is None else
                         f"{s['median'] * scale:.3g}{unit} ({s['spread']:.0%})")  # fmt: skip
        print(f"{label:<18}" + "".join(f"{c:>28}" for c in cells))
    for p in ("client", "server"):
        cells = []
        for name, _, _ in WAYS:
            e = result["summary"][name][f"error_{p}"]
            cells.append(f"{e['median']:+.1%} ({e['min']:+.0%}..{e['max']:+.0%})")
        print(f"{'error ' + p:<18}" + "".join(f"{c:>28}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speeds", default="1,0.25")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=None, help="first N corpus files only")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    corpus = list(generate_corpus(CorpusSpec()))[: args.files]
    scratch = Path(tempfile.mkdtemp(prefix="shuttle-calspread-"))
    started = time.time()
    results = []
    try:
        for speed in (float(s) for s in args.speeds.split(",")):
            results.append(one_speed(speed, args.rounds, scratch, corpus))
            report(results[-1])
            if args.json is not None:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps({
                    "command": "benchmarks/calibration_spread.py " + " ".join(
                        f"--{k} {v}" for k, v in vars(args).items() if v is not None),
                    "started": started, "wall_s": time.time() - started,
                    "pattern": PATTERN, "speeds": results,
                }, indent=1) + "\n")  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
