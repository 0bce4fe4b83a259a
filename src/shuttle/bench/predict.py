"""``shuttle sim predict``: record a grep, calibrate its nodes, simulate both placements.

One command from a question to an answer: *where should this grep run, on this
cluster, over this link, beside nodes this fast?*

1. **Record** the grep in process at the client over the real nodes
   (:mod:`shuttle.bench.objrecord`): its reads, its console's calls, the CPU between.
2. **Calibrate** every node that holds some of the keys, over the link in force
   (:mod:`shuttle.bench.calibrate`; the per-call cost timed on the recorded
   program's own reads in fresh processes), or take a calibration made before.
3. **Simulate** the recorded program alone at the client and at the server on the
   calibrated model (:mod:`shuttle.sim.forecast`), and search the link bandwidth and
   the node speed at which the answer flips.
4. Put beside it what the **run-time's own placement model** predicts from the same
   measurements (:mod:`shuttle.runtime.placement`: ABACUS's equation 4 over the
   link's nominal bandwidth and latency), so the two models can be compared.
5. With ``--live``, **run** ``shuttle grep`` at both placements under the same
   conditions (same cluster, link, keys, pattern), interleaved
   (:mod:`shuttle.bench.liveruns`), and report the errors: ``(predicted - live) /
   live``.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shuttle.bench.calibrate import CALLS, RATIO_RUNS, Calibration, calibrate, with_drains
from shuttle.bench.calibrate.fresh import ProcessReads, ProgramGrep, Spot, fresh_reads
from shuttle.bench.liveruns import run_live
from shuttle.bench.objrecord import by_node, record_object
from shuttle.client.client import Client
from shuttle.client.connect import connect
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import ConfigError, NotFoundError
from shuttle.net.profiles import BURST_BYTES_MIN, BURST_WINDOW_S
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT
from shuttle.runtime.client import Runtime
from shuttle.runtime.placement import EdgeView, NodeView, ObjectView, StackView, predict_single
from shuttle.sim.config import ServerConfig, from_mapping, load_tables
from shuttle.sim.forecast import (
    Forecast,
    Stack,
    break_even_bandwidth,
    break_even_speed,
    forecast,
    split_stacks,
)
from shuttle.sim.sources import load_trace_file
from shuttle.sim.workload import BLOCK_READ, CALL, RETURN, Columns
from shuttle.traces.io import read_csv
from shuttle.traces.record import Op

Progress = Callable[[str], None]


#: Interleaved live runs of each placement by default: enough to see the spread.
LIVE_RUNS_DEFAULT = 3


def expand_keys(client: Client, keys: Sequence[str]) -> list[str]:
    """Keys as ``shuttle grep`` takes them: ``prefix/`` means every key under it."""
    out: list[str] = []
    for key in keys:
        if key.endswith("/"):
            found = list(client.list(key))
            if not found:
                raise NotFoundError(f"no objects under {key!r}; `shuttle ls {key}` lists them")
            out += found
        else:
            client.stat(key)
            out.append(key)
    return list(dict.fromkeys(out))


def burst_for(bandwidth_bits_per_s: float) -> int:
    """A link profile's default bucket depth at ``bandwidth`` (``net.profiles``'s rule),
    for the break-even search over bandwidths."""
    return max(BURST_BYTES_MIN, int(bandwidth_bits_per_s / 8.0 * BURST_WINDOW_S))


def load_calibration(path: Path) -> ServerConfig:
    """The ``[server]`` table of a calibration file (``shuttle sim calibrate --out``)."""
    tables = load_tables(path)
    if "server" not in tables:
        raise ConfigError(f"{path} has no [server] table; make it with `shuttle sim calibrate`")
    return from_mapping(ServerConfig, tables["server"], f"{path} [server]")


def program_reads(trace: Path, length: int) -> dict[int, list[Spot]]:
    """The recorded program's reads, per stack (the records' ``client``), in its order:
    ``(key, offset, length)`` with the length the program asked for (a grep asks for
    ``block_bytes`` and gets what the object holds), for the calibration to time."""
    out: dict[int, list[Spot]] = {}
    for record in read_csv(trace):
        if record.op is Op.READ:
            out.setdefault(record.client, []).append((record.file, record.offset, length))
    return out


# --- the run-time's own model ---------------------------------------------------------


@dataclass(frozen=True)
class StackCounts:
    """What one recorded stack did, as the run-time's monitor would count it."""

    console_cpu_s: float
    object_cpu_s: float
    reads: int
    read_bytes: int
    calls: int
    call_bytes: int
    read_blocks: int


def stack_counts(trace: Columns, block_bytes: int) -> StackCounts:
    kinds = trace.kind.tolist()
    times = trace.time_s.tolist()
    sizes = trace.size.tolist()
    console = obj = 0.0
    reads = read_bytes = calls = call_bytes = blocks = 0
    previous = 0.0
    for kind, t, size in zip(kinds, times, sizes, strict=True):
        gap = t - previous
        previous = t
        if kind == CALL:
            console += gap
            calls += 1
            call_bytes += size
            continue
        obj += gap
        if kind == RETURN:
            call_bytes += size
        elif kind == BLOCK_READ:
            reads += 1
            read_bytes += size
            blocks += max(1, math.ceil(size / block_bytes))
    return StackCounts(console, obj, reads, read_bytes, calls, call_bytes, blocks)


def runtime_model(counts: StackCounts, config: ServerConfig, node_speed: float) -> dict[str, Any]:
    """The run-time's placement model (ABACUS eq. 4, ``runtime/placement*.py``) on the
    recorded stack console -> grep -> storage: each split's ``T_app`` over the link's
    nominal bandwidth and latency, the objects' CPU as its monitor would measure it
    (the grep's hosted at the client, the storage object's at speed 1)."""
    hz = config.cpu_reference_hz
    storage_cpu = (
        counts.reads * config.request_cycles + counts.read_blocks * config.block_read_cycles
    ) / hz
    bw = config.network_bandwidth_bits_per_s
    stack = StackView(
        "grep",
        "client",
        "node",
        objects=(
            ObjectView("console", cpu_s=counts.console_cpu_s, migratable=False),
            ObjectView("grep", cpu_s=counts.object_cpu_s * config.mobile_client_cpu_ratio),
            ObjectView("storage", cpu_s=storage_cpu, migratable=False),
        ),
        edges=(
            EdgeView(bytes=counts.call_bytes, calls=counts.calls),
            EdgeView(bytes=counts.read_bytes, calls=counts.reads),
        ),
        split=1,
        bandwidth_bytes_per_s=None if math.isinf(bw) else bw / 8.0,
        latency_s=config.network_latency_s,
    )
    nodes = {"client": NodeView("client"), "node": NodeView("node", speed=node_speed)}
    client_s = predict_single(stack, 1, nodes, 1.0)
    server_s = predict_single(stack, 0, nodes, 1.0)
    return {
        "client_s": client_s,
        "server_s": server_s,
        "faster": "server" if server_s < client_s else "client",
    }


# --- the command's work ---------------------------------------------------------------


@dataclass
class PredictRequest:
    cluster: Path
    pattern: str
    keys: Sequence[str]
    link: str | None = None
    cpu_factor: float | None = None
    ignore_case: bool = False
    block_bytes: int | None = None
    batch_bytes: int | None = None
    calibration: Path | None = None
    live: bool = False
    live_runs: int = LIVE_RUNS_DEFAULT
    #: The most live runs of a placement whose median is not yet stable (None:
    #: ``LIVE_RUNS_MAX_FACTOR`` x ``live_runs``; ``live_runs`` itself: no more).
    live_runs_max: int | None = None
    #: With ``live``: a drain of the program's grep at each node after each live server
    #: run, its console-call figures taken over these and the calibration's own.
    drains_between: bool = True
    cold: bool = False
    trace_out: Path | None = None
    break_even: bool = True
    #: Repetitions of each timed call in the calibration.
    calls: int = CALLS


def predict(req: PredictRequest, progress: Progress = lambda _m: None) -> dict[str, Any]:
    """Everything ``shuttle sim predict`` prints, as a JSON-ready dict."""
    from shuttle.bench.objrecord import grep_run

    with connect(cluster=req.cluster, link=req.link) as client:
        names = expand_keys(client, req.keys)
        node_links = {n.node_id: n.link for n in client.nodes}
        node_factors: dict[str, float] = {}
        for n in client.nodes:
            node_factors[n.node_id] = float(client.node_stats(n).get("cpu", {}).get("factor", 1.0))
    options: dict[str, Any] = {"ignore_case": req.ignore_case}
    grep_options: list[str] = ["-i"] if req.ignore_case else []
    if req.block_bytes is not None:
        options["block_bytes"] = req.block_bytes
        grep_options += ["--block-bytes", str(req.block_bytes)]
    if req.batch_bytes is not None:
        options["batch_bytes"] = req.batch_bytes
        grep_options += ["--batch-bytes", str(req.batch_bytes)]
    run = grep_run(req.pattern, names, **options)
    if req.live and req.cpu_factor is not None:
        wrong = {n: f for n, f in node_factors.items() if f != req.cpu_factor}
        if wrong:
            node, f = next(iter(wrong.items()))
            raise ConfigError(
                f"--live runs on the nodes as they are: node {node} runs at CPU factor {f:g}, "
                f"not {req.cpu_factor:g}; start the nodes with --cpu-factor "
                f"{req.cpu_factor:g} (`shuttle cluster up --cpu-factor`), or drop --live"
            )
    with tempfile.TemporaryDirectory(prefix="shuttle-predict-") as tmp:
        trace_path = req.trace_out or Path(tmp) / "grep.csv.gz"
        progress(f"recording grep {req.pattern!r} over {len(names):,} keys (in process)")
        with Runtime.connect(req.cluster, link="loopback") as rt:
            groups = by_node(rt, names)
            sidecar = record_object(rt, run, trace_path, extra={"cluster": str(req.cluster)})
        trace = load_trace_file(trace_path)
        length = int(run.params.get("block_bytes", BLOCK_BYTES_DEFAULT))
        program = program_reads(trace_path, length)
    stacks_trace = split_stacks(trace)
    configs: dict[str, ServerConfig] = {}
    calibrations: dict[str, Any] = {}
    cals: dict[str, Calibration] = {}
    programs: dict[str, ProgramGrep] = {}
    spots: dict[str, list[Spot]] = {}
    counts = [stack_counts(t, BLOCK_BYTES_DEFAULT) for t in stacks_trace]
    for index, node in enumerate(groups):
        if req.calibration is not None:
            configs[node] = load_calibration(req.calibration)
            calibrations[node] = {"file": str(req.calibration)}
            continue
        progress(f"calibrating node {node}")
        programs[node] = ProgramGrep(
            {k: v for k, v in run.params.items() if k != "keys"},
            counts[index].object_cpu_s,
            counts[index].calls - 1,  # after the making
        )
        cal: Calibration = calibrate(
            req.cluster,
            node=node,
            link=req.link,
            cpu_factor=req.cpu_factor,
            calls=req.calls,
            ratio_runs=1 if req.calls < 50 else RATIO_RUNS,
            reads=program.get(index),
            program=programs[node],
            progress=lambda m, node=node: progress(f"calibrating {node}: {m}"),  # type: ignore[misc]
        )
        cals[node] = cal
        spots[node] = program.get(index, [])
        configs[node] = cal.server_config()
        calibrations[node] = cal.to_json()
    if req.calibration is not None and req.cpu_factor is not None:
        from shuttle.sim.config import replace

        configs = {n: replace(c, server_speed=req.cpu_factor) for n, c in configs.items()}
    warm = not req.cold
    progress("simulating both placements")
    predicted, stacks, result = _simulate(
        configs, list(groups), stacks_trace, warm, req.break_even, progress
    )
    out: dict[str, Any] = {
        "pattern": req.pattern,
        "keys": len(names),
        "bytes": int(sidecar["bytes_read"]),
        "link": {
            n: (link.spec() if link is not None else "loopback") for n, link in node_links.items()
        },
        "node_cpu_factor": node_factors,
        "warm": warm,
        "predicted": predicted,
        "runtime_model": _runtime_model(stacks),
        "trace": {k: v for k, v in sidecar.items() if k not in ("params",)},
        "calibration": calibrations,
        "simulation": result.to_json(),
    }
    if req.live:
        # One more drain of the program's grep at each calibrated node after each live
        # server run: the console-call figures are then of the node as the live runs
        # found it, not only as it was minutes before (benchmarks/README.md).
        between: dict[str, list[ProcessReads]] = {node: [] for node in cals}
        pids = {e.id: e.pid for e in ClusterFile.load(req.cluster).nodes}

        def drain_between() -> None:
            for node in cals:
                between[node] += fresh_reads(
                    req.cluster, req.link, node, pids.get(node), spots[node],
                    processes=1, budget_s=0.0, program=programs[node].options,
                )  # fmt: skip

        interleave = req.drains_between and bool(cals) and all(c.drains for c in cals.values())
        live = run_live(
            req.cluster,
            req.pattern,
            names,
            link=req.link,
            runs=req.live_runs,
            runs_max=req.live_runs_max,
            grep_options=grep_options,
            after_server=drain_between if interleave else None,
            progress=progress,
        )
        lj = live.to_json()
        out["live"] = lj
        if any(between.values()):
            progress("simulating both placements again, with the drains between live runs")
            out["predicted_before_live"] = out["predicted"]
            out["error_before_live"] = _errors(out["predicted"], lj)
            for node, more in between.items():
                cals[node] = with_drains(cals[node], more, programs[node])
                configs[node] = cals[node].server_config()
                calibrations[node] = cals[node].to_json()
            predicted, stacks, result = _simulate(
                configs, list(groups), stacks_trace, warm, req.break_even, progress
            )
            out["predicted"] = predicted
            out["runtime_model"] = _runtime_model(stacks)
            out["simulation"] = result.to_json()
        out["error"] = _errors(out["predicted"], lj)
        out["runtime_model_error"] = _errors(out["runtime_model"], lj)
        out["load_average"] = list(os.getloadavg())
    return out


def _simulate(
    configs: dict[str, ServerConfig],
    groups: Sequence[str],
    stacks_trace: Sequence[Columns],
    warm: bool,
    break_even: bool,
    progress: Progress,
) -> tuple[dict[str, Any], list[Stack], Forecast]:
    """Both placements on the model, and with ``break_even`` the link bandwidth and
    the node speed at which they take the same time: ``predicted`` of the JSON."""
    stacks: list[Stack] = [
        (configs[node], stack) for node, stack in zip(groups, stacks_trace, strict=True)
    ]
    result: Forecast = forecast(stacks, warm=warm)
    predicted: dict[str, Any] = {
        "client_s": result.client_s,
        "server_s": result.server_s,
        "faster": result.faster,
        "phases": {
            "client": model_phases(result.client),
            "server": model_phases(result.server),
        },
    }
    if break_even:
        progress("searching the break-even link bandwidth and node speed")
        bw = break_even_bandwidth(stacks, warm=warm, burst_for=burst_for)
        speed = break_even_speed(stacks, warm=warm)
        predicted["break_even"] = {
            "bandwidth_bits_per_s": bw.to_json(),
            "node_speed": speed.to_json(),
        }
    return predicted, stacks, result


def _runtime_model(stacks: Sequence[Stack]) -> dict[str, Any]:
    """The run-time's own model on the same measurements (the slowest stack)."""
    model = [
        runtime_model(stack_counts(t, c.block_size_bytes), c, c.server_speed) for c, t in stacks
    ]
    client_s = max(m["client_s"] for m in model)
    server_s = max(m["server_s"] for m in model)
    return {
        "client_s": client_s,
        "server_s": server_s,
        "faster": "server" if server_s < client_s else "client",
    }


def model_phases(runs: Sequence[Any]) -> dict[str, Any]:
    """What the model's run holds, as :func:`phase_summary` gives a live run's (the
    slowest stack): the object made and located (its first answer: the dial, the
    making and its call), each console call after (the time between answers)."""
    answers = max(runs, key=lambda r: r.run_time_s).mobile.extra.get("answers_s", [])
    if len(answers) < 2:
        return {}
    calls = [b - a for a, b in itertools.pairwise(answers)]
    return {
        "made_s": answers[0],
        "call_s": statistics.median(calls),
        "calls": len(calls),
        "calls_total_s": answers[-1] - answers[0],
    }


def _errors(predicted: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """``(predicted - live) / live`` per placement, and whether the faster side agrees."""
    return {
        "client": (predicted["client_s"] - live["client_s"]) / live["client_s"],
        "server": (predicted["server_s"] - live["server_s"]) / live["server_s"],
        "faster_right": predicted["faster"] == live["faster"],
    }
