"""Where a slow node's live run times spread (issue 24): live ``shuttle grep
--placement server`` runs on one loopback node, each set beside the node's burns.

    .venv/bin/python benchmarks/slow_node_spread.py --speeds 0.25,0.999 --runs 12 \\
        --json benchmarks/results/sim/slow-node-spread.json

For each node speed a one-node cluster is started on loopback at that CPU factor with
``SHUTTLE_CPU_TRACE`` set (``net/cpu.py``: every burn of the ``--cpu-factor``
emulation appends when it started, the CPU it was asked to burn, the CPU it burned
and its wall time), and loaded with the validation corpus (``bench/corpus.py``, as
``shuttle bench sim-predict``). Then ``--runs`` live greps of ``q[a-e]x`` at the
server placement, one after another, each a process of its own as in the benchmark.
Per run, inside its timer (the report's ``started_monotonic_s`` and ``elapsed_s``, on
the node's clock): the node's work that the emulation multiplies (what the burns were
asked for, over ``1/f - 1``), the CPU burned, the burns' wall time beyond their CPU
(the burn waiting for a core), the client's own CPU over the timer (``process_cpu_s``)
and what is left of the timer; per console call the same split; and the node's
process CPU over the whole command. Speed 1 burns nothing, so a factor just under 1
(0.999: a burn of 0.1 % of the work) gives its work through the same trace.

Printed: each run's row, and per speed each figure's median, its spread (max - min)
/ median and its Spearman correlation with the run time across the runs (which of
them the run time follows).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from shuttle.bench.calibrate.fresh import fresh_reads
from shuttle.bench.calibrate.timing import node_cpu_clock
from shuttle.bench.corpus import CorpusSpec, generate_corpus
from shuttle.bench.liveruns import live_grep_report
from shuttle.bench.placement import threads_of
from shuttle.client.connect import connect
from shuttle.cluster import local
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.net.cpu import CPU_TRACE_ENV, Burn, Collection, read_cpu_trace

PATTERN = "q[a-e]x"


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sched_s(pid: int) -> tuple[float, float]:
    """Every thread of ``pid``: CPU seconds run and seconds waited on a run queue (a
    core busy with something else), from ``/proc/PID/task/*/schedstat``."""
    ran = waited = 0
    for tid in threads_of(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
            ran += int(fields[0])
            waited += int(fields[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that just ended
    return ran / 1e9, waited / 1e9


Trace = tuple[list[Burn], list[Collection]]


def read_trace(path: Path) -> Trace:
    return read_cpu_trace(path) if path.exists() else ([], [])


def burn_figures(trace: Trace, start: float, end: float, ratio: float) -> dict[str, float]:
    """The burns and collections that started in ``[start, end)``."""
    burns = [b for b in trace[0] if start <= b.start < end]
    collections = [c for c in trace[1] if start <= c.start < end]
    asked = sum(b.asked_s for b in burns)
    burned = sum(b.burned_s for b in burns)
    wall = sum(b.wall_s for b in burns)
    return {
        "burns": float(len(burns)),
        "work_s": asked / ratio if ratio else 0.0,
        "burned_s": burned,
        "burn_wall_s": wall,
        "burn_waited_s": max(0.0, wall - burned),
        "burn_max_s": max((b.burned_s for b in burns), default=0.0),
        "gcs": float(len(collections)),
        "gc_full": float(sum(c.generation == 2 for c in collections)),
        "gc_cpu_s": sum(c.cpu_s for c in collections),
    }


def one_run(
    cluster: Path, keys: list[str], pid: int, node_cpu: Any, trace: Path, ratio: float
) -> dict[str, Any]:
    load = os.getloadavg()[0]
    n0, c0, (_, w0) = node_cpu(), children_cpu_s(), sched_s(pid)
    report = live_grep_report(cluster, PATTERN, keys, "server", link="loopback")
    node_s, client_process_s = node_cpu() - n0, children_cpu_s() - c0
    node_waited_s = sched_s(pid)[1] - w0
    start = float(report["started_monotonic_s"])
    elapsed = float(report["elapsed_s"])
    burns = read_trace(trace)
    (phases,) = report["phases"].values()
    figures = burn_figures(burns, start, start + elapsed, ratio)
    # Each console call: from the object made, back to back (the drain's loop does
    # nothing else between calls with --count).
    calls = []
    t = start + float(phases["made_s"])
    for wall in phases["calls_s"]:
        calls.append({"wall_s": wall, **burn_figures(burns, t, t + wall, ratio)})
        t += wall
    made = burn_figures(burns, start, start + float(phases["made_s"]), ratio)
    return {
        "load": load,
        "elapsed_s": elapsed,
        "made_s": float(phases["made_s"]),
        "calls_total_s": sum(phases["calls_s"]),
        "client_cpu_s": float(report["process_cpu_s"]),
        "client_process_cpu_s": client_process_s,
        "node_process_cpu_s": node_s,
        "node_process_waited_s": node_waited_s,
        **figures,
        "left_s": elapsed - figures["work_s"] - figures["burn_wall_s"] - report["process_cpu_s"],
        "made": made,
        "calls": calls,
    }


def one_drain(
    cluster: Path, keys: list[str], node: str, pid: int, trace: Path, ratio: float
) -> dict[str, Any]:
    """One calibration process as ``shuttle sim predict`` starts it (``bench/calibrate/
    fresh.py``): the program's grep made at the node and drained, ``next`` until done
    and ``progress``; its reads cut short (a 0.1 s budget: only the drain is looked at)."""
    load = os.getloadavg()[0]
    spots = [(k, 0, 65536) for k in keys]
    (run,) = fresh_reads(
        cluster, "loopback", node, pid, spots, processes=1, budget_s=0.1,
        program={"pattern": PATTERN},
    )  # fmt: skip
    burns = read_trace(trace)
    start = run.call_starts[0]
    end = run.call_starts[-1] + run.call_walls[-1]
    calls = [
        {"wall_s": w, **burn_figures(burns, t, t + w, ratio)}
        for t, w in zip(run.call_starts, run.call_walls, strict=True)
    ]
    return {
        "load": load,
        "calls_total_s": sum(run.call_walls),
        "made_s": run.made_s,
        "create_s": run.server_setup_s,
        "drain_node_cpu_s": run.call_node_cpu_s,
        **burn_figures(burns, start, end, ratio),
        "calls": calls,
    }


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        out = [0.0] * len(v)
        for rank, i in enumerate(order):
            out[i] = float(rank)
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else 0.0


FIGURES = (
    "elapsed_s", "made_s", "calls_total_s", "work_s", "burned_s", "burn_waited_s",
    "client_cpu_s", "left_s", "node_process_cpu_s", "node_process_waited_s", "gcs",
    "gc_full", "gc_cpu_s", "burn_max_s", "load",
)  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    elapsed = [r["elapsed_s"] for r in runs]
    out: dict[str, Any] = {}
    for name in FIGURES:
        values = [float(r[name]) for r in runs]
        middle = statistics.median(values)
        out[name] = {
            "median": middle,
            "min": min(values),
            "max": max(values),
            "spread": (max(values) - min(values)) / middle if middle else 0.0,
            "spearman_with_elapsed": spearman(values, elapsed),
        }
    # Per call, over every run's calls after its first: how a call's wall follows its
    # work (the burn's input) and its waiting.
    calls = [c for r in runs for c in r["calls"][1:-1]]
    if calls:
        walls = [c["wall_s"] for c in calls]
        out["per_call"] = {
            name: {
                "median": statistics.median(c[name] for c in calls),
                "spread_p10_p90": _p(calls, name, 0.9) - _p(calls, name, 0.1),
                "spearman_with_wall": spearman([c[name] for c in calls], walls),
            }
            for name in ("wall_s", "work_s", "burned_s", "burn_waited_s")
        }
        firsts = [r["calls"][0] for r in runs]
        out["first_call"] = {
            name: statistics.median(c[name] for c in firsts)
            for name in ("wall_s", "work_s", "burned_s")
        }
    return out


def summarise_drains(drains: list[dict[str, Any]], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The drains' calls against the live runs' calls (after each one's first, before
    its ``progress``): median wall, work and burn per call; and per drain and run the
    calls' total and the node's work over them."""
    out: dict[str, Any] = {}
    for label, rows in (("drain", drains), ("live", runs)):
        calls = [c for r in rows for c in r["calls"][1:-1]]
        out[label] = {
            name: statistics.median(c[name] for c in calls)
            for name in ("wall_s", "work_s", "burned_s", "burn_waited_s")
        }
        for name in ("calls_total_s", "work_s", "burned_s"):
            values = [r[name] for r in rows]
            middle = statistics.median(values)
            out[label][f"{name}_median"] = middle
            out[label][f"{name}_spread"] = (max(values) - min(values)) / middle if middle else 0.0
    return out


def _p(rows: list[dict[str, Any]], name: str, q: float) -> float:
    values = sorted(r[name] for r in rows)
    return values[min(len(values) - 1, int(q * len(values)))]


def print_speed(speed: float, runs: list[dict[str, Any]], drains: list[dict[str, Any]]) -> None:
    summary = summarise(runs)
    for name in FIGURES:
        s = summary[name]
        print(
            f"speed {speed:g} {name:>21}: median {s['median']:.4f} "
            f"({s['min']:.4f}-{s['max']:.4f}, spread {s['spread']:.0%}), "
            f"Spearman with the run time {s['spearman_with_elapsed']:+.2f}"
        )
    for name, s in summary.get("per_call", {}).items():
        print(
            f"speed {speed:g} per call {name:>14}: median {s['median'] * 1e3:.3f} ms, "
            f"p10-p90 {s['spread_p10_p90'] * 1e3:.3f} ms, Spearman with its wall "
            f"{s['spearman_with_wall']:+.2f}"
        )
    for label, d in (summarise_drains(drains, runs) if drains else {}).items():
        print(
            f"speed {speed:g} {label:>5}: per call wall {d['wall_s'] * 1e3:.3f} ms, "
            f"work {d['work_s'] * 1e3:.3f}, burned {d['burned_s'] * 1e3:.3f}, waited "
            f"{d['burn_waited_s'] * 1e3:.3f}; calls total {d['calls_total_s_median']:.3f} s "
            f"(spread {d['calls_total_s_spread']:.0%}), work {d['work_s_median']:.3f} s "
            f"(spread {d['work_s_spread']:.0%})"
        )


def row_line(speed: float, i: int, row: dict[str, Any]) -> str:
    if "elapsed_s" not in row:  # a drain
        return (
            f"speed {speed:g} drain {i:2d}: calls {row['calls_total_s']:.3f} s "
            f"({len(row['calls'])}); node CPU {row['drain_node_cpu_s']:.3f}, work "
            f"{row['work_s']:.3f} burned {row['burned_s']:.3f} waited "
            f"{row['burn_waited_s']:.3f}; gc {row['gcs']:.0f} ({row['gc_full']:.0f} full, "
            f"{row['gc_cpu_s'] * 1e3:.1f} ms); load {row['load']:.1f}"
        )
    return (
        f"speed {speed:g} run {i:2d}: {row['elapsed_s']:.3f} s "
        f"(made {row['made_s']:.3f}, calls {row['calls_total_s']:.3f}); "
        f"node work {row['work_s']:.3f} burned {row['burned_s']:.3f} "
        f"waited {row['burn_waited_s']:.3f}; client CPU {row['client_cpu_s']:.3f}; left "
        f"{row['left_s']:.3f}; node waited {row['node_process_waited_s']:.3f}; gc "
        f"{row['gcs']:.0f} ({row['gc_full']:.0f} full, {row['gc_cpu_s'] * 1e3:.1f} ms); "
        f"load {row['load']:.1f}"
    )


def one_speed(
    speed: float, corpus: list[tuple[str, bytes]], rounds: int, drains_too: bool, scratch: Path
) -> dict[str, Any]:
    """A node at ``speed`` with the trace on, ``rounds`` live runs (and drains)."""
    keys = [k for k, _ in corpus]
    trace = scratch / f"burns-{speed:g}.txt"
    os.environ[CPU_TRACE_ENV] = str(trace)
    try:
        cluster = local.up(scratch / f"speed-{speed:g}", nodes=1, cpu_factors=[speed])
    finally:
        del os.environ[CPU_TRACE_ENV]
    assert cluster.path is not None
    try:
        with connect(cluster=cluster.path, link="loopback") as client:
            for key, data in corpus:
                client.put(key, data)
        entry = ClusterFile.load(cluster.path).nodes[0]
        assert entry.pid is not None
        node_cpu = node_cpu_clock(entry.pid, entry.id)
        ratio = max(0.0, 1.0 / speed - 1.0)
        runs: list[dict[str, Any]] = []
        drains: list[dict[str, Any]] = []
        for i in range(1, rounds + 1):
            runs.append(one_run(cluster.path, keys, entry.pid, node_cpu, trace, ratio))
            print(row_line(speed, i, runs[-1]), flush=True)
            if drains_too:
                drains.append(one_drain(cluster.path, keys, entry.id, entry.pid, trace, ratio))
                print(row_line(speed, i, drains[-1]), flush=True)
        print_speed(speed, runs, drains)
        return {
            "runs": runs,
            "summary": summarise(runs),
            "drains": drains,
            "drain_summary": summarise_drains(drains, runs) if drains else {},
        }
    finally:
        local.down(cluster)


#: The per-call figures the JSON keeps (as one list per figure and run).
CALL_FIGURES = ("wall_s", "work_s", "burned_s", "burn_waited_s")


def compact(value: Any) -> Any:
    """The JSON to write: floats to the µs, and each run's calls as lists per figure."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, dict):
        out = {k: compact(v) for k, v in value.items() if k != "calls"}
        if isinstance(value.get("calls"), list):
            calls = value["calls"]
            out["calls"] = {n: [round(c[n], 6) for c in calls] for n in CALL_FIGURES}
        return out
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--speeds", default="0.25,0.999")
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument(
        "--drains", action="store_true",
        help="after each live run, one calibration process's drain of the same grep",
    )  # fmt: skip
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    corpus = list(generate_corpus(CorpusSpec()))
    scratch = Path(tempfile.mkdtemp(prefix="shuttle-slownode-"))
    result: dict[str, Any] = {"pattern": PATTERN, "runs": args.runs, "speeds": {}}
    try:
        for speed in (float(s) for s in args.speeds.split(",")):
            result["speeds"][f"{speed:g}"] = one_speed(
                speed, corpus, args.runs, args.drains, scratch
            )
            if args.json:
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(compact(result), separators=(",", ":")))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"done at {time.strftime('%H:%M:%S', time.gmtime())} UTC")


if __name__ == "__main__":
    main()
