"""``shuttle bench abacus filter|competition|swing|cache|phases|raid|directory|mix``:
ABACUS's experiments as commands (and ``mix``: placement for aggregate throughput
under many clients, after Bhardwaj et al., ATC 2020).

Each prints a table, writes JSON with ``--json-out FILE`` and a PNG with ``--plot FILE``
(default: beside the JSON), and records its settings in the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from shuttle.bench.session import benchmark
from shuttle.bench.session import status as bench_status

app = typer.Typer(
    help="ABACUS's experiments on the live system (6.2 RAID, 6.3 filter, 6.4 cache, "
    "6.5 directory, 6.6 phases, 6.7 competition, swinging conditions, and a mix of cheap "
    "and CPU-heavy functions from many clients), each statically at the client, adaptive, "
    "and at the server.",
    no_args_is_help=True,
)
#: Tables are wide; a pipe or a log file gets them unwrapped.
console = Console(width=None if sys.stdout.isatty() else 160)

JsonOpt = Annotated[Path | None, typer.Option("--json-out", help="Write the report here.")]
PlotOpt = Annotated[
    Path | None, typer.Option("--plot", help="Write the PNG here (default: beside --json-out).")
]
SizeOpt = Annotated[int, typer.Option("--size", help="Bytes of the object the filters read.")]
LinkOpt = Annotated[str, typer.Option(help="Client–node link profile (lan: 10 Mbit/s).")]
RunsOpt = Annotated[int, typer.Option(min=1, help="Runs per placement (mean and 90% CI).")]
WindowOpt = Annotated[float, typer.Option(help="The observation window H, seconds.")]
ThresholdOpt = Annotated[float, typer.Option(help="B_thresh as a fraction of H.")]
BlockOpt = Annotated[int, typer.Option(help="Bytes per filter call (a block).")]
CpuOpt = Annotated[
    int | None, typer.Option(help="CPU to pin the client to (default: the lowest usable).")
]
NodeCpuOpt = Annotated[
    int | None, typer.Option(help="CPU to pin the node to (default: the highest usable).")
]


def _write(
    report: dict[str, Any], json_path: Path | None, plot_path: Path | None, plot: Any
) -> None:
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")
    png = plot_path or (json_path.with_suffix(".png") if json_path is not None else None)
    if png is not None:
        plot(report, png)
        console.print(f"plot written to {png}")


def _ms(summary: dict[str, Any]) -> str:
    return f"{summary['mean_s']:.2f} ± {summary['ci90_s']:.2f}"


@app.command("filter")
@benchmark("bench abacus filter")
def filter_(
    size: SizeOpt = 16 << 20,
    link: LinkOpt = "lan",
    runs: RunsOpt = 3,
    window: WindowOpt = 1.0,
    threshold: ThresholdOpt = 0.3,
    block_bytes: BlockOpt = 64 << 10,
    cases: Annotated[str, typer.Option(help="Configurations to run (comma list of 1-4).")] = (
        "1,2,3,4"
    ),
    cpu_ratio_low: Annotated[
        float, typer.Option(help="Compute : transfer of the low-CPU filter.")
    ] = 0.02,
    cpu_ratio_high: Annotated[
        float, typer.Option(help="Compute : transfer of the high-CPU filter.")
    ] = 8.0,
    selectivity: Annotated[
        float | None,
        typer.Option(help="Override every case's selectivity (1 - fraction passed up)."),
    ] = None,
    cpu_s_per_mb: Annotated[
        float | None, typer.Option(help="Override the CPU seconds per MiB (no calibration).")
    ] = None,
    server_cpu_factor: Annotated[
        float | None, typer.Option(help="Override every case's server CPU speed factor.")
    ] = None,
    monitor_overhead: Annotated[
        bool,
        typer.Option(help="Also time config 1 at the client with the monitor on and off."),
    ] = True,
    client_cpu: CpuOpt = None,
    node_cpu: NodeCpuOpt = None,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
) -> None:
    """ABACUS 6.3 (Figure 7): a synthetic filter over a 16 MB object on the LAN, four
    configurations (high/low selectivity × low/high CPU; in config 3 the server is
    twice as slow), each at the client, adaptive and at the server."""
    from shuttle.bench.abacus import FilterSettings, run_filter_benchmark
    from shuttle.bench.abacus_plots import plot_filter

    settings = FilterSettings(
        size_bytes=size,
        link=link,
        runs=runs,
        window_s=window,
        threshold=threshold,
        block_bytes=block_bytes,
        cases=tuple(c.strip() for c in cases.split(",") if c.strip()),
        cpu_ratio_low=cpu_ratio_low,
        cpu_ratio_high=cpu_ratio_high,
        selectivity=selectivity,
        cpu_s_per_mb=cpu_s_per_mb,
        server_cpu_factor=server_cpu_factor,
        monitor_overhead=monitor_overhead,
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("filter", console) as update:
        report = run_filter_benchmark(settings, update)
    table = Table(title="ABACUS 6.3 filter: elapsed seconds (mean ± 90% CI)")
    for col in (
        "config",
        "selectivity",
        "CPU s/MiB",
        "server",
        "at client",
        "adaptive",
        "at server",
        "adaptive/best",
        "≤ 1.10",
        "adaptive ends at",
    ):
        table.add_column(col, justify="right")
    for c in report["cases"]:
        p = c["placements"]
        table.add_row(
            f"{c['case']}: {c['label']}",
            f"{c['selectivity']:.0%}",
            f"{c['cpu_s_per_mb']:.3f}",
            f"×{c['server_cpu_factor']:g}",
            _ms(p["client"]),
            _ms(p["adaptive"]),
            _ms(p["server"]),
            f"{c['adaptive_over_best_static']:.2f}",
            "yes" if c["target_met"] else "[red]no[/]",
            ", ".join(sorted(set(c["adaptive_final"]))),
        )
    console.print(table)
    for c in report["cases"]:
        console.print(f"config {c['case']} — the paper: {c['paper']}", highlight=False)
        if c["monitor_overhead"]:
            o = c["monitor_overhead"]
            console.print(
                f"monitoring cost (config {c['case']} at the client, on vs off): "
                f"{o['overhead']:+.2%} (target ≤ 2%)"
            )
    _write(report, json_path, plot_path, plot_filter)


@app.command("competition")
@benchmark("bench abacus competition")
def competition(
    size: SizeOpt = 32 << 20,
    link: LinkOpt = "lan",
    runs: RunsOpt = 3,
    window: WindowOpt = 1.0,
    threshold: ThresholdOpt = 0.3,
    block_bytes: BlockOpt = 64 << 10,
    selectivity_1: Annotated[float, typer.Option(help="Filter 1's selectivity.")] = 0.4,
    selectivity_2: Annotated[float, typer.Option(help="Filter 2's selectivity.")] = 0.7,
    cpu_ratio: Annotated[float, typer.Option(help="Compute : transfer of both filters.")] = 0.02,
    delay: Annotated[float, typer.Option(help="Seconds before filter 2 starts.")] = 6.0,
    client_cpu: CpuOpt = None,
    node_cpu: NodeCpuOpt = None,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
) -> None:
    """ABACUS 6.7 (Figure 12): two filters of different selectivity on a 32 MB object
    over the LAN, the node with room for one; the second starts later."""
    from shuttle.bench.abacus_plots import plot_competition
    from shuttle.bench.competition import CompetitionSettings, run_competition_benchmark

    settings = CompetitionSettings(
        size_bytes=size,
        link=link,
        runs=runs,
        window_s=window,
        threshold=threshold,
        block_bytes=block_bytes,
        selectivity_1=selectivity_1,
        selectivity_2=selectivity_2,
        cpu_ratio=cpu_ratio,
        delay_s=delay,
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("competition", console) as update:
        report = run_competition_benchmark(settings, update)
    table = Table(title="ABACUS 6.7 competition: seconds until both filters are done")
    for col in (
        "at client",
        "adaptive",
        "at server (first come)",
        "filter 2 ends at server",
        "adaptive beats both",
    ):
        table.add_column(col, justify="right")
    p = report["placements"]
    table.add_row(
        _ms(p["client"]),
        _ms(p["adaptive"]),
        _ms(p["server"]),
        "yes" if report["more_selective_ends_at_server"] else "[red]no[/]",
        "yes" if report["adaptive_beats_both_static"] else "[red]no[/]",
    )
    console.print(table)
    for run in report["runs"]["adaptive"][:1]:
        for name, f in run["filters"].items():
            for m in f["migrations"]:
                console.print(
                    f"filter {name} {m['direction']} at {m['t_s']:.2f} s: {m['reason']}",
                    highlight=False,
                )
    console.print(f"the paper: {report['paper']}", highlight=False)
    _write(report, json_path, plot_path, plot_competition)


@app.command("swing")
@benchmark("bench abacus swing")
def swing(
    size: SizeOpt = 16 << 20,
    link: LinkOpt = "lan",
    runs: RunsOpt = 2,
    window: WindowOpt = 1.0,
    threshold: ThresholdOpt = 0.3,
    block_bytes: BlockOpt = 64 << 10,
    pass_fraction: Annotated[float, typer.Option(help="Fraction the filter passes up.")] = 0.2,
    cpu_ratio: Annotated[
        float | None, typer.Option(help="Compute : transfer (default: the break-even).")
    ] = None,
    period: Annotated[
        float, typer.Option(help="Seconds the competing load stays on, and then off.")
    ] = 3.0,
    load_procs: Annotated[
        int, typer.Option(min=1, help="CPU-bound processes in the competing load.")
    ] = 2,
    client_cpu: CpuOpt = None,
    node_cpu: NodeCpuOpt = None,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
) -> None:
    """A filter near its break-even point while a competing load on the node's CPU is
    switched on and off every PERIOD seconds: migrations per 5 H, the lag from a
    switch to the migration it causes, and the run against the static placements."""
    from shuttle.bench.abacus_plots import plot_swing
    from shuttle.bench.swing import SwingSettings, run_swing_benchmark

    settings = SwingSettings(
        size_bytes=size,
        link=link,
        runs=runs,
        window_s=window,
        threshold=threshold,
        block_bytes=block_bytes,
        pass_fraction=pass_fraction,
        cpu_ratio=cpu_ratio,
        period_s=period,
        load_procs=load_procs,
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("swing", console) as update:
        report = run_swing_benchmark(settings, update)
    table = Table(title=f"swing: load switched every {period:g} s (mean ± 90% CI, seconds)")
    for col in (
        "at client",
        "adaptive",
        "at server",
        "adaptive/best",
        "migrations per 5 H",
        "lag after switch (H)",
    ):
        table.add_column(col, justify="right")
    p = report["placements"]
    table.add_row(
        _ms(p["client"]),
        _ms(p["adaptive"]),
        _ms(p["server"]),
        f"{report['adaptive_over_best_static']:.2f}",
        ", ".join(f"{x:.2f}" for x in report["migrations_per_5h"]),
        ", ".join(f"{x:.2f}" for x in report["lag_after_switch_in_h"]) or "-",
    )
    console.print(table)
    _write(report, json_path, plot_path, plot_swing)


LinksOpt = Annotated[str, typer.Option(help="Client–node link profiles, comma-separated.")]
FsWindowOpt = Annotated[
    float, typer.Option(help="The observation window H, seconds (scaled with the phases).")
]


@app.command("cache")
@benchmark("bench abacus cache")
def cache(
    links: LinksOpt = "lan,san",
    runs: RunsOpt = 3,
    window: FsWindowOpt = 0.25,
    threshold: ThresholdOpt = 0.3,
    records: Annotated[int, typer.Option(min=1, help="Records inserted or scanned.")] = 1500,
    client_cpu: CpuOpt = None,
    node_cpu: NodeCpuOpt = None,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
) -> None:
    """ABACUS 6.4 (Figure 8): 1,500 random 128-byte inserts into a 192 KB table, and
    1,500 random record reads, with the file's cache object at the client, adaptive
    and at the node, on each link."""
    from shuttle.bench.objectfs import TableSettings, run_cache_benchmark
    from shuttle.bench.objectfs_plots import plot_cache

    settings = TableSettings(
        links=tuple(x.strip() for x in links.split(",") if x.strip()),
        runs=runs,
        window_s=window,
        threshold=threshold,
        records=records,
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("cache", console) as update:
        report = run_cache_benchmark(settings, update)
    table = Table(title="ABACUS 6.4 cache: elapsed seconds (mean ± 90% CI)")
    for col in ("workload", "link", "at client", "adaptive", "at server", "adaptive/best", "ends"):
        table.add_column(col, justify="right")
    for w in report["workloads"]:
        for link in w["links"]:
            p = link["placements"]
            table.add_row(
                w["workload"],
                link["link"],
                _ms(p["client"]),
                _ms(p["adaptive"]),
                _ms(p["server"]),
                f"{link['adaptive_over_best_static']:.2f}",
                ", ".join(r[-1] for r in link["adaptive_where"]),
            )
    console.print(table)
    _write(report, json_path, plot_path, plot_cache)


@app.command("phases")
@benchmark("bench abacus phases")
def phases(
    links: LinksOpt = "lan",
    runs: RunsOpt = 3,
    window: FsWindowOpt = 0.25,
    threshold: ThresholdOpt = 0.3,
    records: Annotated[int, typer.Option(min=1, help="Records per phase.")] = 1500,
    sequence: Annotated[
        str, typer.Option(help="The phases, comma-separated (insert, scan).")
    ] = "insert,scan,insert,scan",
    client_cpu: CpuOpt = None,
    node_cpu: NodeCpuOpt = None,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
) -> None:
    """ABACUS 6.6 (Table 2): insert, scan, insert, scan on one table, the cache object
    at the client, adaptive and at the node; each phase's time and the per-phase
    optimum (the better static placement for each phase)."""
    from shuttle.bench.objectfs import TableSettings, phase_targets, run_table_benchmark
    from shuttle.bench.objectfs_plots import plot_phases

    settings = TableSettings(
        links=tuple(x.strip() for x in links.split(",") if x.strip()),
        runs=runs,
        window_s=window,
        threshold=threshold,
        records=records,
        phases=tuple(p.strip() for p in sequence.split(",") if p.strip()),
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("phases", console) as update:
        report = run_table_benchmark(settings, update, "abacus-6.6-phases")
    report["targets"] = phase_targets(report)
    for link in report["links"]:
        table = Table(title=f"ABACUS 6.6 phases on {link['link']}: seconds (mean ± 90% CI)")
        for col in (*link["phases"], "total"):
            table.add_column(col, justify="right")
        table.add_column("placement")
        for p in ("client", "adaptive", "server"):
            table.add_row(*[_ms(x) for x in link["per_phase"][p]], _ms(link["placements"][p]), p)
        optimal = [
            min(c["mean_s"], s["mean_s"])
            for c, s in zip(link["per_phase"]["client"], link["per_phase"]["server"], strict=True)
        ]
        table.add_row(*[f"{x:.2f}" for x in optimal], f"{link['optimal_s']:.2f}", "optimal")
        console.print(table)
        console.print(
            f"adaptive / optimal {link['adaptive_over_optimal']:.2f} (target ≤ 1.3); "
            f"adaptive / better static {link['adaptive_over_best_static']:.2f}"
        )
    _write(report, json_path, plot_path, plot_phases)


@app.command("raid")
@benchmark("bench abacus raid")
def raid(
    links: LinksOpt = "lan,san",
    runs: RunsOpt = 3,
    window: FsWindowOpt = 0.25,
    threshold: ThresholdOpt = 0.3,
    file_bytes: Annotated[int, typer.Option(help="Bytes each client writes.")] = 4 << 20,
    io_bytes: Annotated[int, typer.Option(help="Bytes per write and per read.")] = 8 << 10,
    client_cpu: CpuOpt = None,
    node_cpu: NodeCpuOpt = None,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
) -> None:
    """ABACUS 6.2 (Figure 6): two clients each write a 4 MB file through a RAID 5
    object over five nodes (4 + 1, 32 KB units), then read it back with one column
    marked failed; the RAID object at the client, adaptive and at a node."""
    from shuttle.bench.objectfs_plots import plot_raid
    from shuttle.bench.raid import RaidSettings, run_raid_benchmark

    settings = RaidSettings(
        links=tuple(x.strip() for x in links.split(",") if x.strip()),
        runs=runs,
        window_s=window,
        threshold=threshold,
        file_bytes=file_bytes,
        io_bytes=io_bytes,
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("raid", console) as update:
        report = run_raid_benchmark(settings, update)
    table = Table(title="ABACUS 6.2 RAID: seconds until both clients finish (mean ± 90% CI)")
    for col in ("workload", "link", "at client", "adaptive", "at server", "adaptive/best", "ends"):
        table.add_column(col, justify="right")
    for c in report["cases"]:
        p = c["placements"]
        table.add_row(
            c["workload"],
            c["link"],
            _ms(p["client"]),
            _ms(p["adaptive"]),
            _ms(p["server"]),
            f"{c['adaptive_over_best_static']:.2f}",
            "; ".join(",".join(r) for r in c["adaptive_where"]),
        )
    console.print(table)
    _write(report, json_path, plot_path, plot_raid)


@app.command("directory")
@benchmark("bench abacus directory")
def directory(
    links: LinksOpt = "lan,san",
    runs: RunsOpt = 3,
    window: FsWindowOpt = 0.25,
    threshold: ThresholdOpt = 0.3,
    files: Annotated[int, typer.Option(min=1, help="Files each client inserts.")] = 200,
    clients: Annotated[int, typer.Option(min=1, help="Clients inserting at once.")] = 4,
    contention: Annotated[
        str, typer.Option(help="high (one shared directory), low (private ones), or both.")
    ] = "high,low",
    client_cpu: CpuOpt = None,
    node_cpu: NodeCpuOpt = None,
    json_path: JsonOpt = None,
    plot_path: PlotOpt = None,
) -> None:
    """ABACUS 6.5 (Figure 10, Table 1): four clients insert 200 files each into one
    shared directory, or into private ones; each client's directory object at the
    client, adaptive and at the node; times, retries and the adaptive timeline."""
    from shuttle.bench.directory import CONTENTION, DirectorySettings, run_directory_benchmark
    from shuttle.bench.objectfs_plots import plot_directory
    from shuttle.errors import ConfigError

    levels = tuple(x.strip() for x in contention.split(",") if x.strip())
    if not levels or any(x not in CONTENTION for x in levels):
        raise ConfigError(f"--contention takes high, low or both, got {contention!r}")
    settings = DirectorySettings(
        links=tuple(x.strip() for x in links.split(",") if x.strip()),
        runs=runs,
        window_s=window,
        threshold=threshold,
        files=files,
        clients=clients,
        contention=levels,
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("directory", console) as update:
        report = run_directory_benchmark(settings, update)
    table = Table(title="ABACUS 6.5 directory inserts: seconds until all clients finish")
    for col in (
        "contention",
        "link",
        "at client",
        "adaptive",
        "at server",
        "adaptive/best",
        "retries c/a/s",
        "moved",
    ):
        table.add_column(col, justify="right")
    for c in report["cases"]:
        p, r = c["placements"], c["retries"]
        table.add_row(
            c["contention"],
            c["link"],
            _ms(p["client"]),
            _ms(p["adaptive"]),
            _ms(p["server"]),
            f"{c['adaptive_over_best_static']:.2f}",
            f"{r['client']:.0f}/{r['adaptive']:.0f}/{r['server']:.0f}",
            "; ".join(str(run.count("server")) for run in c["adaptive_where"]),
        )
    console.print(table)
    _write(report, json_path, plot_path, plot_directory)


@app.command("mix")
@benchmark("bench abacus mix")
def mix(
    clients: Annotated[
        int, typer.Option(min=1, help="Client processes calling filters at once.")
    ] = 16,
    cheap_share: Annotated[
        float, typer.Option(help="Fraction of each client's calls that go to its cheap filter.")
    ] = 0.5,
    nodes: Annotated[
        int, typer.Option(min=1, help="Storage nodes (1-3); client i reads node i mod N.")
    ] = 1,
    link: Annotated[
        str,
        typer.Option(
            help="Each client's link to the nodes (default: the LAN's 10 Mbit/s and 0.5 ms "
            "with a 64 KiB token bucket)."
        ),
    ] = "bw=10Mbit,lat=0.5ms,burst=64KiB",
    runs: RunsOpt = 3,
    duration: Annotated[float, typer.Option(help="Seconds each pass lasts.")] = 20.0,
    warmup: Annotated[
        float,
        typer.Option(help="Seconds at the start of a pass left out of the steady-state rate."),
    ] = 8.0,
    window: WindowOpt = 1.0,
    threshold: ThresholdOpt = 0.3,
    threshold_share: Annotated[
        bool,
        typer.Option(
            "--threshold-share/--no-threshold-share",
            help="The node scales each stack's B_thresh by its share of its client's time.",
        ),
    ] = False,
    block_bytes: BlockOpt = 256 << 10,
    object_bytes: Annotated[
        int, typer.Option(help="Bytes of each node's data object (the filters wrap around).")
    ] = 8 << 20,
    cheap_pass: Annotated[float, typer.Option(help="Fraction the cheap filter passes up.")] = 0.05,
    cheap_cpu_s_per_mb: Annotated[
        float, typer.Option(help="CPU seconds the cheap filter burns per MiB.")
    ] = 0.0002,
    heavy_pass: Annotated[
        float, typer.Option(help="Fraction the heavy filter passes up (1: it saves no transfer).")
    ] = 1.0,
    heavy_cpu_s_per_mb: Annotated[
        float, typer.Option(help="CPU seconds the heavy filter burns per MiB.")
    ] = 0.008,
    node_cpu_factor: Annotated[
        float,
        typer.Option(
            "--cpu-factor",
            help="The node's CPU speed (0.05: its objects burn 20x the CPU), so that it "
            "saturates before the clients' core does.",
        ),
    ] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of every client's sequence of calls.")] = 1,
    client_cpu: CpuOpt = None,
    node_cpu: NodeCpuOpt = None,
    logs: Annotated[
        Path | None,
        typer.Option(
            "--logs",
            help="Copy the nodes' decision logs of each adaptive pass into this directory.",
        ),
    ] = None,
    split: Annotated[
        bool,
        typer.Option(
            "--split/--no-split",
            help="Also run the oracle placement (every cheap filter at the node, every "
            "heavy one at its client) in each run: the ceiling adaptive is read against.",
        ),
    ] = True,
    partial: Annotated[
        str,
        typer.Option(
            help="Partial splits to run too, e.g. 4,8,12: for each K a placement with the "
            "first K clients' cheap filters at the node and every other filter at its "
            "client (when the node saturates, every cheap filter there is not the best "
            "placement; the best split of a run is the ceiling).",
        ),
    ] = "",
    arrivals_max: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="The node's limit on stacks on their way to it and not yet observed "
            "there (shuttle serve --arrivals-max; default: the node's, 8; 0: no limit).",
        ),
    ] = None,
    json_path: JsonOpt = None,
) -> None:
    """Many clients, each calling a cheap filter (selective, little CPU: best at the
    node) and a CPU-heavy one (best at the client, so the node does not saturate) in a
    closed loop: aggregate calls per second with every filter at the client, every
    filter at the node, and adaptive, and where each kind ended."""
    from shuttle.bench.mix import MixSettings, parse_partial, run_mix_benchmark

    settings = MixSettings(
        clients=clients,
        cheap_share=cheap_share,
        nodes=nodes,
        link=link,
        runs=runs,
        duration_s=duration,
        warmup_s=warmup,
        window_s=window,
        threshold=threshold,
        threshold_share=threshold_share,
        block_bytes=block_bytes,
        object_bytes=object_bytes,
        cheap_pass=cheap_pass,
        cheap_cpu_s_per_mb=cheap_cpu_s_per_mb,
        heavy_pass=heavy_pass,
        heavy_cpu_s_per_mb=heavy_cpu_s_per_mb,
        node_cpu_factor=node_cpu_factor,
        seed=seed,
        client_cpu=client_cpu,
        node_cpu=node_cpu,
        logs_dir=logs,
        split=split,
        partial=parse_partial(partial),
        arrivals_max=arrivals_max,
    )
    settings.check()
    with bench_status("mix", console) as update:
        report = run_mix_benchmark(settings, update)
    table = Table(
        title=f"mix: {clients} clients, cheap share {cheap_share:g}: aggregate calls/s "
        f"after {warmup:g} s (mean ± 90% CI)"
    )
    shown = [p for p in ("client", "server", "split") if p in report["throughput_runs"]]
    for col in (
        *(f"at {p}" if p != "split" else "split (oracle)" for p in shown),
        "adaptive",
        "adaptive/better static",
        "per run",
        "≥ 1.10",
        *(("split/better static", "adaptive/split") if "split" in shown else ()),
        "cheap at server",
        "heavy at server",
    ):
        table.add_column(col, justify="right")
    t = report["throughput_runs"]
    final = report["final_placement"]
    table.add_row(
        *(f"{t[p]['mean']:.1f} ± {t[p]['ci90']:.1f}" for p in (*shown, "adaptive")),
        f"{report['adaptive_over_better_static']:.2f}",
        ", ".join(f"{x:.2f}" for x in report["adaptive_over_better_static_per_run"]),
        "yes" if report["target_met"] else "[red]no[/]",
        *(
            (
                ", ".join(f"{x:.2f}" for x in report["split_over_better_static_per_run"]),
                f"{report['adaptive_over_split']:.2f}",
            )
            if "split" in shown
            else ()
        ),
        f"{final['cheap']['server']}/{clients}",
        f"{final['heavy']['server']}/{clients}",
    )
    console.print(table)
    ceiling = report.get("ceiling")
    if ceiling is not None and settings.partial:
        for i, name in enumerate(ceiling["placement_per_run"]):
            rates = ", ".join(
                f"{p} {report['throughput_runs'][p]['runs'][i]:.1f}"
                for p in report["throughput_runs"]
                if p == "split" or p.startswith("split-")
            )
            console.print(
                f"run {i + 1}: splits {rates}; the best, {name}, "
                f"{ceiling['over_better_static_per_run'][i]:.2f}× the better static, "
                f"adaptive {ceiling['adaptive_over_ceiling_per_run'][i]:.2f}× it",
                highlight=False,
            )
    console.print(
        f"adaptive / all at client {report['adaptive_over_client']:.2f}, / all at server "
        f"{report['adaptive_over_server']:.2f} (ATC 2020: 1.10 and 1.85)",
        highlight=False,
    )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"report written to {json_path}")
