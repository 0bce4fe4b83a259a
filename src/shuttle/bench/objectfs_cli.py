"""``shuttle bench abacus raid|cache|directory|phases``: ABACUS's experiments on the
object-based file system.

Concepts: the RAID 5 object adapting to the network's topology (``raid``, ABACUS 6.2,
Figure 6), the file's cache object on inserts and scans (``cache``, 6.4, Figure 8), the
directory object under contention (``directory``, 6.5, Figure 10 and Table 1) and a
table's cache object through phases that want opposite placements (``phases``, 6.6,
Table 2). The commands only parse their options and print; the measuring is in
:mod:`shuttle.bench.raid`, :mod:`shuttle.bench.objectfs` and
:mod:`shuttle.bench.directory`. ``shuttle.bench.abacus_cli`` registers them.
"""

from __future__ import annotations

from typing import Annotated

import typer

from shuttle.bench.abacus_options import (
    CpuOpt,
    JsonOpt,
    NodeCpuOpt,
    PlotOpt,
    RunsOpt,
    ThresholdOpt,
    comma_list,
    console,
    mean_ci,
    placement_cells,
    right_aligned_table,
    write_report,
)
from shuttle.bench.session import benchmark
from shuttle.bench.session import status as bench_status

LinksOpt = Annotated[str, typer.Option(help="Client–node link profiles, comma-separated.")]
FsWindowOpt = Annotated[
    float, typer.Option(help="The observation window H, seconds (scaled with the phases).")
]


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
        links=comma_list(links),
        runs=runs,
        window_s=window,
        threshold=threshold,
        records=records,
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("cache", console) as update:
        report = run_cache_benchmark(settings, update)
    table = right_aligned_table(
        "ABACUS 6.4 cache: elapsed seconds (mean ± 90% CI)",
        ("workload", "link", "at client", "adaptive", "at server", "adaptive/best", "ends"),
    )
    for w in report["workloads"]:
        for link in w["links"]:
            p = link["placements"]
            table.add_row(
                w["workload"],
                link["link"],
                *placement_cells(p),
                f"{link['adaptive_over_best_static']:.2f}",
                ", ".join(r[-1] for r in link["adaptive_where"]),
            )
    console.print(table)
    write_report(report, json_path, plot_path, plot_cache)


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
        links=comma_list(links),
        runs=runs,
        window_s=window,
        threshold=threshold,
        records=records,
        phases=comma_list(sequence),
        client_cpu=client_cpu,
        node_cpu=node_cpu,
    )
    with bench_status("phases", console) as update:
        report = run_table_benchmark(settings, update, "abacus-6.6-phases")
    report["targets"] = phase_targets(report)
    for link in report["links"]:
        table = right_aligned_table(
            f"ABACUS 6.6 phases on {link['link']}: seconds (mean ± 90% CI)",
            (*link["phases"], "total"),
        )
        table.add_column("placement")
        for p in ("client", "adaptive", "server"):
            table.add_row(
                *[mean_ci(x) for x in link["per_phase"][p]], mean_ci(link["placements"][p]), p
            )
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
    write_report(report, json_path, plot_path, plot_phases)


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
        links=comma_list(links),
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
    table = right_aligned_table(
        "ABACUS 6.2 RAID: seconds until both clients finish (mean ± 90% CI)",
        ("workload", "link", "at client", "adaptive", "at server", "adaptive/best", "ends"),
    )
    for c in report["cases"]:
        p = c["placements"]
        table.add_row(
            c["workload"],
            c["link"],
            *placement_cells(p),
            f"{c['adaptive_over_best_static']:.2f}",
            "; ".join(",".join(r) for r in c["adaptive_where"]),
        )
    console.print(table)
    write_report(report, json_path, plot_path, plot_raid)


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

    levels = comma_list(contention)
    if not levels or any(x not in CONTENTION for x in levels):
        raise ConfigError(f"--contention takes high, low or both, got {contention!r}")
    settings = DirectorySettings(
        links=comma_list(links),
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
    table = right_aligned_table(
        "ABACUS 6.5 directory inserts: seconds until all clients finish",
        (
            "contention",
            "link",
            "at client",
            "adaptive",
            "at server",
            "adaptive/best",
            "retries c/a/s",
            "moved",
        ),
    )
    for c in report["cases"]:
        p, r = c["placements"], c["retries"]
        table.add_row(
            c["contention"],
            c["link"],
            *placement_cells(p),
            f"{c['adaptive_over_best_static']:.2f}",
            f"{r['client']:.0f}/{r['adaptive']:.0f}/{r['server']:.0f}",
            "; ".join(str(run.count("server")) for run in c["adaptive_where"]),
        )
    console.print(table)
    write_report(report, json_path, plot_path, plot_directory)
