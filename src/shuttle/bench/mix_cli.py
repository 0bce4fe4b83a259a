"""``shuttle bench abacus mix``: placement for aggregate throughput under many
clients (after Bhardwaj et al., ATC 2020).

One concept: many client processes, each calling a cheap filter and a CPU-heavy one,
with every filter at the client, at the node, split by an oracle and adaptive; the
command parses its options and prints the aggregate rates and where each kind of
filter ended. The measuring is in :mod:`shuttle.bench.mix`.
``shuttle.bench.abacus_cli`` registers it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from shuttle.bench.abacus_options import (
    BlockOpt,
    CpuOpt,
    JsonOpt,
    NodeCpuOpt,
    RunsOpt,
    ThresholdOpt,
    WindowOpt,
    console,
    write_json,
)
from shuttle.bench.node_profile import RATE_DEFAULT
from shuttle.bench.session import benchmark
from shuttle.bench.session import status as bench_status


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
    pin: Annotated[
        bool,
        typer.Option(
            "--pin/--no-pin",
            help="The node on one CPU (--node-cpu) and every client on another "
            "(--client-cpu), so that neither can take the other's CPU, as on separate "
            "machines (checked in every pass: JSON partition, cpu_busy). --no-pin leaves "
            "both to the scheduler.",
        ),
    ] = True,
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
    partial_heavy: Annotated[
        str,
        typer.Option(
            help="Partial splits with heavy filters at the node too, e.g. 32:2,32:4: for "
            "each K:J the first K clients' cheap filters and the first J clients' heavy "
            "ones at the node (split-K+hJ; whether any placement beats the cheap-only "
            "splits when the clients' core is the bound).",
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
    arrivals_max_saturated: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="The same limit while the clients report their CPUs saturated "
            "(shuttle serve --arrivals-max-saturated; default: the node's, 32; the "
            "--arrivals-max value: as before).",
        ),
    ] = None,
    cpu_budget: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            max=1.0,
            help="The share of its CPU the node lets arriving stacks fill "
            "(shuttle serve --cpu-budget; default: the node's, 0.7).",
        ),
    ] = None,
    cpu_budget_saturated: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            max=1.0,
            help="The share of its CPU the node lets arriving stacks fill while the "
            "clients report their CPUs saturated (shuttle serve --cpu-budget-saturated; "
            "default: the node's, 0.85; the --cpu-budget value: no raise, as before).",
        ),
    ] = None,
    cpu_climb: Annotated[
        bool,
        typer.Option(
            "--cpu-climb/--no-cpu-climb",
            help="The node raises the share arrivals may fill from --cpu-budget while "
            "the clients' calls a second do not fall (shuttle serve --cpu-climb).",
        ),
    ] = False,
    raise_hold: Annotated[
        bool,
        typer.Option(
            "--raise-hold/--no-raise-hold",
            help="The node keeps its raised share while it is the bound (shuttle serve "
            "--raise-hold; --no-raise-hold: the rule as it was).",
        ),
    ] = True,
    rank_by_node_cpu: Annotated[
        bool,
        typer.Option(
            "--rank-by-node-cpu/--no-rank-by-node-cpu",
            help="The node admits arrivals by what they save per second of its CPU "
            "(shuttle serve --rank-by-node-cpu; --no-rank-by-node-cpu: the paper's order).",
        ),
    ] = True,
    shed_by_freed_cpu: Annotated[
        bool,
        typer.Option(
            "--shed-by-freed-cpu/--no-shed-by-freed-cpu",
            help="The node sends back for its CPU only stacks whose leaving frees it "
            "(shuttle serve --shed-by-freed-cpu; --no-shed-by-freed-cpu: as it was).",
        ),
    ] = True,
    log_as_text: Annotated[
        bool,
        typer.Option(
            "--log-as-text/--log-as-dicts",
            help="The node keeps its decision log in memory as JSON lines (shuttle serve "
            "--log-as-text); --log-as-dicts: as dicts, as before.",
        ),
    ] = True,
    scheduled_gc: Annotated[
        float | None,
        typer.Option(
            "--scheduled-gc",
            min=0.0,
            help="The node makes its full garbage collections on a thread of their own "
            "every this many seconds (shuttle serve --scheduled-gc; 0: the interpreter's "
            "own, wherever they fall, as before; default: the node's, 10 at --cpu-factor "
            "< 1).",
        ),
    ] = None,
    profile_node: Annotated[
        Path | None,
        typer.Option(
            "--profile-node",
            help="Sample each node with py-spy during every adaptive pass into this "
            "directory: collapsed stacks per 2 s (flamegraph.pl or speedscope open them) "
            "and a summary of where the node's CPU went, per 2 s and by function.",
        ),
    ] = None,
    profile_rate: Annotated[
        int, typer.Option(min=1, max=1000, help="py-spy's samples a second (--profile-node).")
    ] = RATE_DEFAULT,
    profile_native: Annotated[
        bool,
        typer.Option(
            "--profile-native/--no-profile-native",
            help="--profile-node with the C frames too (a garbage collection shows): py-spy "
            "then stops the node for every sample, which slows it (not for the figures).",
        ),
    ] = False,
    profile_gil: Annotated[
        bool,
        typer.Option(
            "--profile-gil/--no-profile-gil",
            help="--profile-node samples only the thread holding the GIL (the Python code "
            "running); without it, threads woken and waiting for the GIL or the CPU count.",
        ),
    ] = False,
    json_path: JsonOpt = None,
) -> None:
    """Many clients, each calling a cheap filter (selective, little CPU: best at the
    node) and a CPU-heavy one (best at the client, so the node does not saturate) in a
    closed loop: aggregate calls per second with every filter at the client, every
    filter at the node, and adaptive, and where each kind ended."""
    from shuttle.bench.mix import run_mix_benchmark
    from shuttle.bench.mix_settings import MixSettings, parse_partial, parse_partial_heavy

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
        pin=pin,
        logs_dir=logs,
        split=split,
        partial=parse_partial(partial),
        partial_heavy=parse_partial_heavy(partial_heavy),
        arrivals_max=arrivals_max,
        arrivals_max_saturated=arrivals_max_saturated,
        cpu_budget=cpu_budget,
        cpu_budget_saturated=cpu_budget_saturated,
        cpu_climb=cpu_climb,
        raise_hold=raise_hold,
        rank_by_node_cpu=rank_by_node_cpu,
        shed_by_freed_cpu=shed_by_freed_cpu,
        log_as_text=log_as_text,
        scheduled_gc_s=scheduled_gc,
        profile_dir=profile_node,
        profile_rate=profile_rate,
        profile_native=profile_native,
        profile_gil=profile_gil,
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
    if ceiling is not None and (settings.partial or settings.partial_heavy):
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
    for name, ratio in report["spread"].items():
        console.print(
            f"{name.replace('_', ' ')} over {settings.runs} runs: {ratio['mean']:.3f} "
            f"± {ratio['ci90']:.3f} (90 % CI), min {ratio['min']:.3f}, max {ratio['max']:.3f}",
            highlight=False,
        )
    console.print(partition_line(report), highlight=False)
    console.print(
        f"adaptive / all at client {report['adaptive_over_client']:.2f}, / all at server "
        f"{report['adaptive_over_server']:.2f} (ATC 2020: 1.10 and 1.85)",
        highlight=False,
    )
    write_json(report, json_path)


def partition_line(report: dict[str, Any]) -> str:
    """One line on where the processes ran: whether the node and the clients kept to
    their own CPUs in every pass, and each CPU's busy share over the passes (min-max)."""
    passes = [x for runs in report["passes"].values() for x in runs]
    checks = [x["partition"] for x in passes if x.get("partition")]
    mode = checks[0]["mode"] if checks else "unknown"
    if mode == "partitioned":
        held = sum(1 for c in checks if c["held"])
        first = checks[0]
        text = (
            f"partition (node on CPU {first['node']['cpus']}, clients on CPU "
            f"{first['clients']['cpus']}): held in {held} of {len(passes)} passes"
        )
        if held < len(passes):
            text += " [the figures are not of separate machines: see JSON partition]"
    else:
        text = f"no partition ({mode}): the scheduler placed the node and the clients"
    busy: dict[str, list[float]] = {}
    for x in passes:
        for cpu, use in x.get("cpu_busy", {}).items():
            busy.setdefault(cpu, []).append(use["busy"] + use["irq"])
    if busy:
        text += "; CPU busy over the passes: " + ", ".join(
            f"{cpu} {min(v):.2f}-{max(v):.2f}" for cpu, v in sorted(busy.items())
        )
    own = [
        (x["clients_cpu_busy"], x["node_cpu_busy"])
        for x in passes
        if x.get("clients_cpu_busy") is not None and x.get("node_cpu_busy") is not None
    ]
    if own:
        clients, node = zip(*own, strict=True)
        text += (
            f"; of that the clients' own {min(clients):.2f}-{max(clients):.2f}, "
            f"the node's own {min(node):.2f}-{max(node):.2f}"
        )
    return text
