"""``shuttle bench abacus filter|competition|swing``: ABACUS's synthetic filter
experiments.

Concepts: one filter over one object and where it should run (``filter``, ABACUS 6.3,
Figure 7: selectivity and CPU cost), two filters competing for a node with room for
one (``competition``, 6.7, Figure 12), and a filter near its break-even point while a
competing load swings on and off (``swing``: does adaptation thrash?). The commands
only parse their options and print; the measuring is in :mod:`shuttle.bench.abacus`,
:mod:`shuttle.bench.competition` and :mod:`shuttle.bench.swing`.
``shuttle.bench.abacus_cli`` registers them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from shuttle.bench.abacus_options import (
    BlockOpt,
    CpuOpt,
    JsonOpt,
    LinkOpt,
    NodeCpuOpt,
    PlotOpt,
    RunsOpt,
    SizeOpt,
    ThresholdOpt,
    WindowOpt,
    comma_list,
    console,
    placement_cells,
    right_aligned_table,
    write_report,
)
from shuttle.bench.session import benchmark
from shuttle.bench.session import status as bench_status


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
        cases=comma_list(cases),
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
    table = right_aligned_table(
        "ABACUS 6.3 filter: elapsed seconds (mean ± 90% CI)",
        (
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
        ),
    )
    for c in report["cases"]:
        p = c["placements"]
        table.add_row(
            f"{c['case']}: {c['label']}",
            f"{c['selectivity']:.0%}",
            f"{c['cpu_s_per_mb']:.3f}",
            f"×{c['server_cpu_factor']:g}",
            *placement_cells(p),
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
    write_report(report, json_path, plot_path, plot_filter)


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
    table = right_aligned_table(
        "ABACUS 6.7 competition: seconds until both filters are done",
        (
            "at client",
            "adaptive",
            "at server (first come)",
            "filter 2 ends at server",
            "adaptive beats both",
        ),
    )
    p = report["placements"]
    table.add_row(
        *placement_cells(p),
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
    write_report(report, json_path, plot_path, plot_competition)


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
    table = right_aligned_table(
        f"swing: load switched every {period:g} s (mean ± 90% CI, seconds)",
        (
            "at client",
            "adaptive",
            "at server",
            "adaptive/best",
            "migrations per 5 H",
            "lag after switch (H)",
        ),
    )
    p = report["placements"]
    table.add_row(
        *placement_cells(p),
        f"{report['adaptive_over_best_static']:.2f}",
        ", ".join(f"{x:.2f}" for x in report["migrations_per_5h"]),
        ", ".join(f"{x:.2f}" for x in report["lag_after_switch_in_h"]) or "-",
    )
    console.print(table)
    write_report(report, json_path, plot_path, plot_swing)
