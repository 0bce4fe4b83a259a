"""``shuttle sim sweep cache-size|cpu-speed``: run one of the paper's experiments.

Configuration comes from a TOML file (``--config``) with the tables ``[server]``
(:class:`~shuttle.sim.config.ServerConfig`), ``[experiment]``
(:class:`~shuttle.sim.config.ExperimentConfig`), ``[background]`` (the generator's
``BackgroundConfig``) and ``[sweep]`` (``points``, ``placements``), then from
``--set table.key=value`` flags and the named flags, each overriding the one before.
The command states the configuration, shows progress, prints a table, and writes
the results JSON, a timing JSON and the PNG figures.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from shuttle.errors import ConfigError

if TYPE_CHECKING:
    from rich.progress import Progress

    from shuttle.sim.config import ExperimentConfig, ServerConfig
    from shuttle.sim.sweep import Sweep, SweepPerf

# The command tree is built whenever ``shuttle`` starts: the simulator (numpy, the
# sweep's processes) comes in when the command runs (tests/unit/test_cli_start.py).

console = Console()
if not console.is_terminal:
    # Piped or captured output (logs, CI): rich would fold the tables to 80 columns.
    console = Console(width=140)

_TABLES = ("server", "experiment", "background", "sweep")


def sweep_command(
    which: Annotated[str, typer.Argument(help="The experiment: cache-size or cpu-speed.")],
    config: Annotated[
        Path | None,
        typer.Option(help="TOML file with [server], [experiment], [background], [sweep]."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override one parameter, TOML value syntax: server.cache_blocks=2048, "
            "experiment.warmup_s=600, server.server_speed=inf. Repeatable.",
        ),
    ] = None,
    points: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated points: cache sizes in MB (inf: infinite) or server/client "
            "CPU speed ratios. Default: the paper's range."
        ),
    ] = None,
    placements: Annotated[
        str | None,
        typer.Option(help="Where the mobile app runs: client,server[,none] (default both)."),
    ] = None,
    background: Annotated[
        Path | None,
        typer.Option(help="Background trace file (any format shuttle trace reads)."),
    ] = None,
    background_format: Annotated[str, typer.Option(help="Format of --background.")] = "auto",
    mobile: Annotated[
        Path | None,
        typer.Option(help="Mobile application trace file (default: the recorded agrep)."),
    ] = None,
    mobile_format: Annotated[str, typer.Option(help="Format of --mobile.")] = "auto",
    mobile_trace_speed: Annotated[
        float | None,
        typer.Option(
            help="Speed of the CPU the mobile trace's think times were measured on, over the "
            "reference CPU's (server.mobile_trace_speed; a clock ratio such as 2596/133). "
            "Default: from the trace's sidecar JSON (host.cpu_mhz)."
        ),
    ] = None,
    mobile_name: Annotated[
        str | None,
        typer.Option(help="The mobile program's name in tables and plots (default: its trace's)."),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="The one seed (experiment.seed; default 0).")
    ] = None,
    intervals: Annotated[
        int | None, typer.Option(help="K busiest intervals (experiment.intervals; default 6).")
    ] = None,
    jobs: Annotated[
        int | None, typer.Option(help="Worker processes (default: one per CPU).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Directory for JSON and PNGs (default results/sim/NAME).")
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Results JSON (default OUT/NAME.json).")
    ] = None,
    plots: Annotated[bool, typer.Option(help="Write the PNG figures.")] = True,
    prep_cache: Annotated[
        Path | None,
        typer.Option(
            help="Directory keeping prepared intervals between sweeps "
            "(default results/sim/prepared)."
        ),
    ] = None,
    use_prep_cache: Annotated[
        bool,
        typer.Option(
            "--use-prep-cache/--no-prep-cache",
            help="Reuse (and keep) the prepared intervals of an earlier run with the same "
            "background, intervals and code.",
        ),
    ] = True,
) -> None:
    """Run the paper's cache-size or CPU-speed sweep, the mobile app at the client and server.

    For each point and placement, each of the K busiest intervals of the background
    trace is simulated after its warm-up, with the mobile application started at
    the interval's start. Reports its run time, the hit rates of both traffics,
    mean response times, and the background's response time by part.
    """
    from shuttle.sim import prepcache
    from shuttle.sim.config import ExperimentConfig, ServerConfig, from_mapping, load_tables
    from shuttle.sim.prepcache import cache_key
    from shuttle.sim.sources import describe_background, load_background, load_mobile
    from shuttle.sim.sweep import SWEEP_NAMES, Prepared, default_jobs, prepare, run_sweep

    if which not in SWEEP_NAMES:
        raise ConfigError(f"unknown sweep {which!r}; expected one of {', '.join(SWEEP_NAMES)}")
    tables = load_tables(config, set_ or [])
    unknown = set(tables) - set(_TABLES)
    if unknown:
        raise ConfigError(
            f"unknown config table(s) {sorted(unknown)}; expected some of {list(_TABLES)}"
        )
    experiment_table = dict(tables.get("experiment", {}))
    if seed is not None:
        experiment_table["seed"] = seed
    if intervals is not None:
        experiment_table["intervals"] = intervals
    server_table = dict(tables.get("server", {}))
    if mobile_trace_speed is not None:
        server_table["mobile_trace_speed"] = mobile_trace_speed
    server = from_mapping(ServerConfig, server_table, "[server]")
    mobile_columns, mobile_source = load_mobile(mobile, mobile_format)
    if mobile_name is not None:
        mobile_source["name"] = mobile_name
    server = _mobile_speed(server, server_table, mobile_source, mobile)
    experiment = from_mapping(ExperimentConfig, experiment_table, "[experiment]")
    sweep = _sweep(which, tables.get("sweep", {}), points, placements)
    jobs = jobs or default_jobs()
    out = out or Path("results") / "sim" / which
    json_path = json_path or out / f"{which}.json"

    _state(sweep, server, experiment, background, mobile, jobs, out)
    began = time.perf_counter()
    with _progress() as bar:
        task = bar.add_task("background trace: loading", total=None)

        def loaded(n: int) -> None:
            bar.update(task, completed=n, description=f"background trace: {n:,} records read")

        def passed(n: int, phase: str) -> None:
            bar.update(task, completed=n, description=f"background: {phase}, {n:,} records")

        table = tables.get("background", {})
        bg_source = describe_background(background, table, experiment.seed, background_format)
        sources = {"background": bg_source, "mobile": mobile_source}
        key = cache_key(bg_source, experiment, server.block_size_bytes)
        cached_path = (prep_cache or Path("results") / "sim" / "prepared") / f"{key}.npz"
        cached = prepcache.load(cached_path) if use_prep_cache else None
        if cached is not None:
            intervals_data, records = cached
            bg_source["records"] = records
            prepared = Prepared(intervals_data, mobile_columns, sources)
            console.print(f"prepared intervals from {cached_path}")
        else:
            bg_chunks, _ = load_background(
                background, table, experiment.seed, background_format, loaded
            )
            prepared = prepare(
                bg_chunks, mobile_columns, experiment, server.block_size_bytes, sources, passed
            )
            if use_prep_cache:
                prepcache.save(
                    cached_path,
                    prepared.intervals,
                    int(prepared.sources["background"]["records"]),
                )
        bar.remove_task(task)
        prep_s = time.perf_counter() - began
        runs = bar.add_task(f"{which}: runs", total=None)

        def advanced(done: int, total: int) -> None:
            bar.update(runs, completed=done, total=total)

        document, perf = run_sweep(sweep, server, experiment, prepared, jobs, advanced)

    out.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    perf_path = json_path.with_name(json_path.stem + "-perf.json")
    total_s = time.perf_counter() - began
    perf_doc = {"prepare_s": prep_s, "total_s": total_s, **perf.to_json()}
    perf_path.write_text(json.dumps(perf_doc, indent=1) + "\n")
    _intervals_table(document)
    _results_table(document)
    _perf_line(perf, prep_s, total_s, document["config"]["background"]["records"], mobile_source)
    console.print(f"wrote {json_path} and {perf_path}")
    if plots:
        from shuttle.sim.plots import plot_sweep

        for path in plot_sweep(document, out, mobile_source.get("name", "mobile")):
            console.print(f"wrote {path}")


def _mobile_speed(
    server: ServerConfig,
    server_table: dict[str, Any],
    mobile_source: dict[str, Any],
    mobile: Path | None,
) -> ServerConfig:
    """``server`` with the mobile trace's speed: the flag or the config, else the sidecar.

    A trace without a sidecar naming its recording CPU keeps 1.0 (think times taken
    as measured at the reference CPU), with a warning: a modern machine's think
    times would starve no server.
    """
    from shuttle.sim.config import replace
    from shuttle.sim.sources import recording_speed

    if "mobile_trace_speed" in server_table:
        mobile_source["trace_speed_from"] = "configuration"
        return server
    recorded_speed = recording_speed(mobile_source, server.cpu_reference_hz)
    if recorded_speed is not None:
        # Think times were measured on the recording machine: express them at the
        # reference CPU the request costs are given for (see docs/simulator.md).
        mobile_source["trace_speed_from"] = "sidecar"
        return replace(server, mobile_trace_speed=recorded_speed)
    mobile_source["trace_speed_from"] = "default (no sidecar)"
    console.print(
        f"[yellow]warning:[/] the mobile trace {escape(str(mobile))} has no sidecar JSON naming "
        "the CPU it was recorded on (host.cpu_mhz), so its think times are taken as "
        f"measured at the {server.cpu_reference_hz / 1e6:g} MHz reference CPU (speed 1.0). "
        "Pass --mobile-trace-speed RATIO (recording clock / reference clock) if they were not."
    )
    return server


def _sweep(which: str, table: dict[str, Any], points: str | None, placements: str | None) -> Sweep:
    from shuttle.sim.sweep import CACHE_SIZES_MB, CPU_SPEEDS, DEFAULT_PLACEMENTS, Sweep

    unknown = set(table) - {"points", "placements"}
    if unknown:
        raise ConfigError(f"unknown [sweep] key(s) {sorted(unknown)}; known: points, placements")
    values: list[float]
    if points is not None:
        try:
            values = [float(p) for p in points.split(",") if p.strip()]
        except ValueError as exc:
            raise ConfigError(f"--points must be numbers separated by commas: {exc}") from exc
    elif "points" in table:
        values = [float(p) for p in table["points"]]
    else:
        values = list(CACHE_SIZES_MB if which == "cache-size" else CPU_SPEEDS)
    # Named flags override the file (docs/simulator.md, "Running the experiments").
    where: list[str]
    if placements is not None:
        where = [p.strip() for p in placements.split(",") if p.strip()]
    elif "placements" in table:
        where = [str(p) for p in table["placements"]]
    else:
        where = list(DEFAULT_PLACEMENTS)
    if which == "cache-size":
        return Sweep(which, "server cache (MB)", tuple(values), tuple(where))
    if any(not v > 0 or math.isinf(v) for v in values):
        raise ConfigError("CPU speed ratios must be finite and > 0")
    return Sweep(which, "server CPU speed / client CPU speed", tuple(values), tuple(where))


def _progress() -> Progress:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def _state(
    sweep: Sweep,
    server: ServerConfig,
    experiment: ExperimentConfig,
    background: Path | None,
    mobile: Path | None,
    jobs: int,
    out: Path,
) -> None:
    console.rule(f"shuttle sim sweep {sweep.name}")
    points = ", ".join(sweep.label(x) for x in sweep.points)
    varied = "cache_blocks" if sweep.name == "cache-size" else "server_speed"
    console.print(f"points ({sweep.x_label}): {points}; placements: {', '.join(sweep.placements)}")
    cache = "infinite" if server.cache_infinite else f"{server.cache_blocks} blocks"
    console.print(
        f"server: cache {cache} of {server.block_size_bytes} B"
        f"{' (varied)' if varied == 'cache_blocks' else ''}, "
        f"CPU speed {server.server_speed:g}{' (varied)' if varied == 'server_speed' else ''}"
        f" x {server.cpu_reference_hz / 1e6:g} MHz, client speed {server.client_speed:g}; "
        f"disk {server.disk_seek_s * 1e3:g} ms + size/{server.disk_bandwidth_bytes_per_s / 1e6:g}"
        f" MB/s; network {server.network_latency_s * 1e6:g} us + size/"
        f"{server.network_bandwidth_bits_per_s / 1e6:g} Mb/s; mobile program "
        f"{server.mobile_blocks} blocks, client cache {server.client_cache_blocks} blocks, "
        f"think times recorded at speed {server.mobile_trace_speed:.3g}"
    )
    console.print(
        f"experiment: {experiment.intervals} busiest intervals of {experiment.interval_s:g} s, "
        f"warm-up {experiment.warmup_s:g} s (last {experiment.warmup_timed_s:g} s timed), "
        f"overrun limit {experiment.overrun_s_max:g} s, seed {experiment.seed}"
    )
    console.print(
        f"traces: background {background or 'generated'}, mobile {mobile or 'recorded agrep'};"
        f" {jobs} worker(s); output {out}/"
    )


def _intervals_table(doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="Measured intervals: the busiest, in time order")
    for column in ("#", "start s", "requests", "warm-up records", "warm blocks"):
        table.add_column(column, justify="right")
    for i in doc["intervals"]:
        table.add_row(
            str(i["index"]),
            f"{i['start_s']:.0f}",
            f"{i['requests']:,}",
            f"{i['warmup_records']:,}",
            f"{i['warm_blocks']:,}",
        )
    console.print(table)


def _results_table(doc: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(
        title=f"{doc['sweep']}: pooled over {len(doc['intervals'])} intervals "
        "(app = mobile application; hit% of block requests at the server cache; "
        "ms = mean response; CPU/disk = offered load)",
        padding=(0, 1),
    )
    columns = (
        "MB" if doc["sweep"] == "cache-size" else "speed",
        "app at",
        "app run s",
        "app hit%",
        "bg hit%",
        "app ms",
        "bg ms",
        "bg blk ms",
        "CPU",
        "disk",
    )
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    for point in doc["points"]:
        for placement, s in point["placements"].items():
            run = f"{s['mobile_run_time_s']:.1f}"
            if s["mobile_unfinished_runs"]:
                run = f">={run} ({s['mobile_unfinished_runs']} cut)"
            table.add_row(
                point["x"],
                placement,
                run if placement != "none" else "-",
                f"{100 * s['mobile_server_hit_rate']:.1f}",
                f"{100 * s['background_hit_rate']:.1f}",
                f"{1000 * s['mobile_mean_response_s']:.2f}",
                f"{1000 * s['background_mean_response_s']:.2f}",
                f"{1000 * s['background_mean_block_response_s']:.2f}",
                f"{s['cpu_load']:.2f}",
                f"{s['disk_load']:.2f}",
            )
    console.print(table)


def _perf_line(
    perf: SweepPerf,
    prep_s: float,
    total_s: float,
    background_records: int,
    mobile_source: dict[str, Any],
) -> None:
    console.print(
        f"{perf.runs} runs on {perf.jobs} worker(s) in {perf.wall_s:.1f} s "
        f"({perf.records:,} records, {perf.records_per_s:,.0f} records/s and "
        f"{perf.events_per_s:,.0f} events/s per worker CPU second); "
        f"traces and warm-up {prep_s:.1f} s "
        f"({background_records:,} background, {mobile_source['records']:,} mobile records); "
        f"total {total_s:.1f} s"
    )
