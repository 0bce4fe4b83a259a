"""The commands that join the simulator to the live system (issue 24):

* ``shuttle trace record-object grep|count|filter ...`` -- an object's run as a trace;
* ``shuttle sim calibrate`` -- a node's costs, measured, as a ``[server]`` table;
* ``shuttle sim predict grep PATTERN KEYS...`` -- both placements predicted (and, with
  ``--live``, run and compared);
* ``shuttle bench sim-predict`` -- the validation over links and node speeds.

They run objects and nodes, so they sit above the run-time; the top-level CLI adds
them to the ``trace``, ``sim`` and ``bench`` groups.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shuttle.errors import UsageError

# The command tree is built whenever ``shuttle`` starts: the cluster file's reader (and
# with it the wire and TLS) comes in when a command runs (tests/unit/test_cli_start.py).

out = Console()
err = Console(stderr=True)

ClusterOpt = Annotated[
    Path | None,
    typer.Option(
        "--cluster",
        help="Cluster file of nodes running on this machine (default: $SHUTTLE_CLUSTER, "
        "else .shuttle/cluster.toml).",
    ),
]
LinkOpt = Annotated[
    str | None,
    typer.Option(
        "--link",
        help="Link to every node: loopback, san, lan, wan or bw=..,lat=.. (default: the "
        "cluster file's).",
    ),
]
CpuFactorOpt = Annotated[
    float | None,
    typer.Option(
        "--cpu-factor",
        min=0.01,
        max=100.0,
        help="Node CPU speed to model (default: each node's own --cpu-factor). With "
        "--live it must be the nodes' own.",
    ),
]


def _cluster(cluster: Path | None) -> Path:
    from shuttle.cluster.clusterfile import cluster_path

    path = cluster_path(cluster, None)
    if not path.exists():
        raise UsageError(
            f"no cluster file at {path}; start one with `shuttle cluster up` and pass "
            "--cluster ROOT/cluster.toml (or export SHUTTLE_CLUSTER)"
        )
    return path


def _say(message: str) -> None:
    err.print(f"[dim]· {escape(message)}[/]", highlight=False)


# --- shuttle trace record-object ------------------------------------------------------


def record_object_command(
    kind: Annotated[str, typer.Argument(help="The object: grep, count or filter.")],
    args: Annotated[
        list[str],
        typer.Argument(
            help="grep: PATTERN KEYS...; count: KEYS...; filter: KEY. A key ending in / "
            "means every key under it."
        ),
    ],
    trace_out: Annotated[
        Path, typer.Option("--out", "-o", help="Trace to write (.csv.gz; a .json sidecar beside).")
    ],
    pattern: Annotated[
        str | None, typer.Option("--pattern", help="count: also count lines matching this.")
    ] = None,
    ignore_case: Annotated[
        bool, typer.Option("-i", "--ignore-case", help="grep, count: match either case.")
    ] = False,
    block_bytes: Annotated[
        int | None, typer.Option(help="Bytes per storage read (the object's default: 64 KiB).")
    ] = None,
    batch_bytes: Annotated[
        int | None, typer.Option(help="grep, count: bytes per call (default 256 KiB).")
    ] = None,
    pass_fraction: Annotated[
        float, typer.Option(help="filter: share of each block passed up.")
    ] = 0.2,
    cpu_s_per_mb: Annotated[
        float, typer.Option(help="filter: CPU seconds burned per MiB read.")
    ] = 0.0,
    cluster: ClusterOpt = None,
    link: LinkOpt = None,
) -> None:
    """Run a built-in object in process over a live cluster's storage calls and write
    what it did as a mobile trace for the simulator.

    Each record is a storage call (its key, offset and the bytes it returned) or a
    call between the console and the object (call / return, with their bytes), at
    the CPU the thread had used before it; the sidecar names the host and its clock.
    Example: shuttle trace record-object grep 'err(or)?' logs/ --out grep.csv.gz
    """
    from shuttle.bench.objrecord import ObjectRun, record_object
    from shuttle.bench.predict import expand_keys
    from shuttle.client.connect import connect
    from shuttle.runtime.client import Runtime

    path = _cluster(cluster)
    params: dict[str, Any] = {}
    if kind == "grep":
        if len(args) < 2:
            raise UsageError("grep needs a PATTERN and at least one KEY")
        params["pattern"], keys = args[0], args[1:]
    else:
        keys = list(args)
    if kind in ("grep", "count"):
        params["ignore_case"] = ignore_case
        if batch_bytes is not None:
            params["batch_bytes"] = batch_bytes
    if kind == "count" and pattern is not None:
        params["pattern"] = pattern
    if kind == "filter":
        params.update(pass_fraction=pass_fraction, cpu_s_per_mb=cpu_s_per_mb)
    if block_bytes is not None:
        params["block_bytes"] = block_bytes
    with connect(cluster=path, link=link) as client:
        names = expand_keys(client, keys)
    run = ObjectRun(kind, names, params)
    _say(f"running {kind} in process over {len(names):,} keys")
    with Runtime.connect(path, link=link) as rt:
        meta = record_object(rt, run, trace_out, extra={"cluster": str(path)})
    err.print(
        f"wrote {meta['records']:,} records ({meta['storage_calls']:,} storage calls, "
        f"{meta['bytes_read']:,} bytes read, {meta['console_calls']:,} console calls, "
        f"{meta['think_s_total']:.3f} s of CPU) to {trace_out}"
    )


# --- shuttle sim calibrate -------------------------------------------------------------


def calibrate_command(
    config_out: Annotated[
        Path, typer.Option("--out", "-o", help="TOML to write (its [server] table).")
    ],
    cluster: ClusterOpt = None,
    node: Annotated[
        str | None, typer.Option("--node", help="Node id to measure (default: the first).")
    ] = None,
    link: LinkOpt = None,
    cpu_factor: CpuFactorOpt = None,
    disk: Annotated[
        bool, typer.Option("--disk/--no-disk", help="Also time cold reads (the disk).")
    ] = True,
    calls: Annotated[
        int,
        typer.Option(
            "--calls", min=5, help="Repetitions of each timed call (fewer: quicker, noisier)."
        ),
    ] = 200,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            min=0,
            help="Fresh processes that time the per-call cost, the median taken (default "
            "5, 2 with --calls under 50; 0: in this process, the way before).",
        ),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Also write every measurement here.")
    ] = None,
) -> None:
    """Measure a live node for the simulator: node CPU per read and per request, a
    console call, a local read, the hosted-object overhead, the per-message overhead
    on the link, the link's bucket and header bytes, the disk.

    The per-read cost is timed as a program's run pays it: small reads replayed in
    several fresh processes, the median taken (`shuttle sim predict` replays the
    recorded program's own reads). In the same processes, as `shuttle grep
    --placement server` does inside its timer: the dial, the object's making at the
    node, and a grep drained there (`shuttle sim predict`: the program's own).

    Writes a [server] table that `shuttle sim predict --calibration` and `shuttle sim
    sweep --config` read. The node must run on this machine (its CPU clock is read).
    Takes about half a minute (longer on a slow link).
    """
    from shuttle.bench.calibrate import calibrate

    path = _cluster(cluster)
    cal = calibrate(
        path,
        node=node,
        link=link,
        cpu_factor=cpu_factor,
        disk=disk,
        calls=calls,
        ratio_runs=1 if calls < 50 else 3,
        processes=processes,
        progress=_say,
    )
    config_out.write_text(cal.to_toml())
    m = cal.measured
    table = Table(title=f"node {cal.node} over {cal.link}", show_header=False)
    rows = [
        ("node CPU factor (modelled speed)", f"{cal.node_cpu_factor:g} ({cal.server_speed:g})"),
        ("node CPU per read request", f"{m['read_node_cpu_per_request_s'] * 1e6:.1f} µs"),
        ("node CPU per 4 KiB read", f"{m['read_node_cpu_per_block_s'] * 1e6:.2f} µs"),
        ("node CPU per console call", f"{m['call_node_cpu_s'] * 1e6:.1f} µs"),
        ("local read per request", f"{m['local_read_cpu_per_request_s'] * 1e6:.1f} µs"),
        ("local read per 4 KiB", f"{m['local_read_cpu_per_block_s'] * 1e6:.2f} µs"),
        ("hosted CPU, client / node", (
            f"{m['mobile_client_cpu_ratio']:.3f} / {m['mobile_server_cpu_ratio']:.3f}")),
        ("per-read overhead on the link", f"{m['rpc_overhead_s'] * 1e6:.1f} µs"),
        ("connecting (the dial in the timer)", f"{m['connect_s'] * 1e6:.0f} µs"),
        ("per-call overhead on the link", f"{m['call_overhead_s'] * 1e6:.1f} µs"),
        ("header bytes, request / reply", (
            f"{m['request_header_bytes']:.0f} / {m['reply_header_bytes']:.0f}")),
        ("bucket depth", f"{cal.link.effective_burst_bytes:,} B"),
    ]  # fmt: skip
    nominal = cal.link.bandwidth_bits_per_s
    if nominal is not None and "link_bandwidth_bits_per_s" in m:
        achieved = m["link_bandwidth_bits_per_s"]
        rows.append((
            "link rate achieved (profile's)",
            f"{achieved / 1e6:.3g} Mbit/s ({nominal / 1e6:.3g}, {achieved / nominal:.0%})",
        ))  # fmt: skip
    if "disk" in m:
        rows.append(
            ("disk per 64 KiB read (cold - warm)", f"{m['disk']['per_read_s'] * 1e3:.3f} ms")
        )
    for name, value in rows:
        table.add_row(name, value)
    out.print(table)
    if json_path is not None:
        json_path.write_text(json.dumps(cal.to_json(), indent=2, default=str) + "\n")
        err.print(f"wrote {json_path}")
    err.print(f"wrote {config_out}")


# --- shuttle sim predict ---------------------------------------------------------------


def _bandwidth(value: float | None) -> str:
    if value is None:
        return "-"
    from shuttle.net.profiles import format_bandwidth

    return format_bandwidth(value) + "/s"


def _break_even_text(data: dict[str, Any], kind: str) -> str:
    value = data["value"]
    lo, hi = data["range"]
    if value is None:
        side = data["faster_low"]
        span = (
            f"{_bandwidth(lo)} .. {_bandwidth(hi)}" if kind == "bandwidth" else f"{lo:g} .. {hi:g}"
        )
        return f"none: {side} is faster throughout {span}"
    shown = _bandwidth(value) if kind == "bandwidth" else f"{value:.3g}"
    return f"{shown} ({data['faster_low']} faster below, {data['faster_high']} above)"


def predict_command(
    kind: Annotated[str, typer.Argument(help="The program: grep.")],
    pattern: Annotated[str, typer.Argument(help="Regular expression, as shuttle grep takes it.")],
    keys: Annotated[
        list[str], typer.Argument(help="Object keys; a key ending in / means every key under it.")
    ],
    cluster: ClusterOpt = None,
    link: LinkOpt = None,
    cpu_factor: CpuFactorOpt = None,
    ignore_case: Annotated[bool, typer.Option("-i", "--ignore-case", help="Match either case.")] = (
        False
    ),
    block_bytes: Annotated[int | None, typer.Option(help="Bytes per storage read.")] = None,
    batch_bytes: Annotated[int | None, typer.Option(help="Bytes the grep reads per call.")] = None,
    calibration: Annotated[
        Path | None,
        typer.Option("--calibration", help="Use this calibration (shuttle sim calibrate --out)."),
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Also run shuttle grep at both placements and compare.")
    ] = False,
    runs: Annotated[
        int,
        typer.Option(
            "--runs", min=1, help="With --live: interleaved runs of each placement (at least)."
        ),
    ] = 3,
    runs_max: Annotated[
        int | None,
        typer.Option(
            "--runs-max",
            min=1,
            help="With --live: run a placement up to this many times while its median is "
            "not stable to 7.5 % (default 3 x --runs; --runs-max equal to --runs: no more).",
        ),
    ] = None,
    drains_between: Annotated[
        bool,
        typer.Option(
            help="With --live: drain the grep at the node after each live server run and "
            "take the console-call figures over these drains too (the node as the live "
            "runs found it)."
        ),
    ] = True,
    cold: Annotated[
        bool, typer.Option("--cold", help="Predict a cold start (data read from the disk).")
    ] = False,
    trace_out: Annotated[
        Path | None, typer.Option("--trace-out", help="Keep the recorded trace here.")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write everything here.")
    ] = None,
) -> None:
    """Predict where a grep should run: record it, calibrate its nodes, simulate it at
    the client and at the server, and print both run times, the faster side, and the
    link bandwidth and node speed at which the answer flips.

    With --live, also run `shuttle grep` at both placements (interleaved, --runs each,
    more while a median is not stable) under the same conditions and print the errors.
    Predictions assume the data in the nodes' memory (as after one run) unless --cold.
    Example: shuttle sim predict grep 'err(or)?' logs/ --link lan --live
    """
    from shuttle.bench.predict import PredictRequest, predict

    if kind != "grep":
        raise UsageError(f"sim predict knows grep (shuttle grep's program), not {kind!r}")
    req = PredictRequest(
        cluster=_cluster(cluster),
        pattern=pattern,
        keys=keys,
        link=link,
        cpu_factor=cpu_factor,
        ignore_case=ignore_case,
        block_bytes=block_bytes,
        batch_bytes=batch_bytes,
        calibration=calibration,
        live=live,
        live_runs=runs,
        live_runs_max=runs_max,
        drains_between=drains_between,
        cold=cold,
        trace_out=trace_out,
    )
    result = predict(req, progress=_say)
    print_prediction(result)
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
        err.print(f"wrote {json_path}")


def print_prediction(result: dict[str, Any]) -> None:
    p = result["predicted"]
    rt = result["runtime_model"]
    live = result.get("live")
    title = f"grep {result['pattern']!r}: {result['keys']:,} keys, {result['bytes'] / 1e6:.1f} MB"
    table = Table(title=escape(title))
    table.add_column("")
    table.add_column("client s", justify="right")
    table.add_column("server s", justify="right")
    table.add_column("faster")
    table.add_row("simulator", f"{p['client_s']:.3f}", f"{p['server_s']:.3f}", p["faster"])
    table.add_row(
        "run-time's model", f"{rt['client_s']:.3f}", f"{rt['server_s']:.3f}", rt["faster"]
    )
    if live is not None:
        table.add_row(
            f"live (median of {len(live['runs']['client_s'])} / {len(live['runs']['server_s'])})",
            f"{live['client_s']:.3f}",
            f"{live['server_s']:.3f}",
            live["faster"],
        )
        e, r = result["error"], result["runtime_model_error"]
        table.add_row(
            "simulator error", f"{e['client']:+.1%}", f"{e['server']:+.1%}",
            "right" if e["faster_right"] else "WRONG",
        )  # fmt: skip
        table.add_row(
            "run-time model error", f"{r['client']:+.1%}", f"{r['server']:+.1%}",
            "right" if r["faster_right"] else "WRONG",
        )  # fmt: skip
    out.print(table)
    be = p.get("break_even")
    if be is not None:
        bandwidth = _break_even_text(be["bandwidth_bits_per_s"], "bandwidth")
        out.print(f"break-even link bandwidth: {bandwidth}")
        out.print(f"break-even node speed:     {_break_even_text(be['node_speed'], 'speed')}")
    if live is not None:
        spread = live["spread"]
        load = ", ".join(f"{x:.2f}" for x in result["load_average"])
        out.print(
            f"live spread (max - min) / median: client {spread['client']:.1%}, server "
            f"{spread['server']:.1%}; load average {load}"
        )


# --- shuttle bench sim-predict ----------------------------------------------------------


def sim_predict_bench_command(
    links: Annotated[
        str, typer.Option(help="Links, comma-separated (profiles or bw=..,lat=.. specs).")
    ] = "loopback,san,lan,wan",
    speeds: Annotated[str, typer.Option(help="Node CPU factors, comma-separated.")] = (
        "1,0.5,0.25"
    ),
    pattern: Annotated[str, typer.Option(help="The grep's pattern.")] = "q[a-e]x",
    runs: Annotated[
        int,
        typer.Option(min=1, help="Live runs of each placement per row (interleaved; at least)."),
    ] = 5,
    runs_max: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Live runs of a placement at most while its median is not stable to 7.5 % "
            "(default 3 x --runs).",
        ),
    ] = None,
    drains_between: Annotated[
        bool,
        typer.Option(
            help="Drain the grep at the node after each live server run and take the "
            "console-call figures over these drains too."
        ),
    ] = True,
    files: Annotated[int, typer.Option(min=1, help="Files of the generated corpus.")] = 1200,
    wan_files: Annotated[
        int, typer.Option(min=1, help="Files read over links slower than 5 Mbit/s.")
    ] = 150,
    seed: Annotated[int, typer.Option(help="Seed of the generated corpus.")] = 24,
    calls: Annotated[
        int, typer.Option(min=5, help="Repetitions of each call the calibration times.")
    ] = 200,
    quiet_load: Annotated[
        float,
        typer.Option(
            help="Before each row, wait for the 1-minute load average to fall below this."
        ),
    ] = 2.0,
    quiet_wait: Annotated[
        float,
        typer.Option(
            help="Wait at most this many seconds per row for --quiet-load (0: do not "
            "wait); the wait is said, and the row's load average is recorded beside it.",
            show_default=True,
        ),
    ] = 120.0,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Write every row here.")
    ] = None,
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="Write the table (benchmarks/README.md's).")
    ] = None,
) -> None:
    """The simulator's predictions against live shuttle grep runs, and the run-time's
    own placement model's, over links and node speeds (issue 24's validation).

    For each node speed a one-node cluster is started and loaded with a generated
    corpus (text, fixed seed); for each link, shuttle sim predict --live runs on it.
    Prints a row as each finishes, then the table and the worst errors.
    """
    from dataclasses import replace as dc_replace

    from shuttle.bench.corpus import CorpusSpec
    from shuttle.bench.simpredict import SimPredictConfig, markdown_table, run_validation

    config = SimPredictConfig(
        links=[x.strip() for x in links.split(",") if x.strip()],
        speeds=[float(x) for x in speeds.split(",") if x.strip()],
        pattern=pattern,
        runs=runs,
        runs_max=runs_max,
        drains_between=drains_between,
        corpus=dc_replace(CorpusSpec(), files=files, seed=seed),
        wan_files=wan_files,
        calls=calls,
        quiet_load=quiet_load,
        quiet_wait_s=quiet_wait,
    )

    def keep(partial: dict[str, Any]) -> None:
        if json_path is not None:
            json_path.write_text(json.dumps(partial, indent=2, default=str) + "\n")

    result = run_validation(config, progress=_say, on_row=keep)
    table = markdown_table(result)
    out.print(table, highlight=False, markup=False)
    for name, s in result["summary"].items():
        out.print(
            f"{name}: worst error {s['worst_error']:.1%}; {s['within_15_percent']}/"
            f"{s['predictions']} predictions within 15 %; faster side right in "
            f"{s['faster_right']}/{s['rows']} rows",
            highlight=False,
        )
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2, default=str) + "\n")
        err.print(f"wrote {json_path}")
    if markdown is not None:
        markdown.write_text(table + "\n")
        err.print(f"wrote {markdown}")
