"""``shuttle sim ...``: the simulator's commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from shuttle.sim.sweep_cli import sweep_command

app = typer.Typer(
    help="Simulate a file server that hosts mobile code (kernel benchmark, cache "
    "replay, the paper's sweeps).",
    no_args_is_help=True,
)

console = Console()

# The paper's experiments live in their own module (they are the larger part).
app.command("sweep")(sweep_command)


@app.command("bench-kernel")
def bench_kernel(
    events: Annotated[
        int, typer.Option("--events", "-n", help="Model events (an arrival and a departure each).")
    ] = 1_000_000,
    utilisation: Annotated[
        float, typer.Option(help="Server utilisation of the M/M/1 queue.")
    ] = 0.8,
    seed: Annotated[int, typer.Option(help="Seed of the shared random draws.")] = 0,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Also write the result here.")
    ] = None,
) -> None:
    """Time an M/M/1 queue on Shuttle's event kernel and on SimPy, same random draws.

    Both kernels must report the same mean delay to the last bit; the ratio of
    events per second is the kernel's speed-up over SimPy in this run.
    """
    from shuttle.sim.mm1 import bench

    console.print(
        f"M/M/1 at utilisation {utilisation}, {events:,} events "
        f"({events // 2:,} customers), seed {seed}: our kernel, then SimPy ..."
    )
    result = bench(events, utilisation, seed)
    table = Table(title="Event kernel against SimPy (same draws)")
    table.add_column("kernel")
    table.add_column("events/s", justify="right")
    table.add_column("wall s", justify="right")
    table.add_column("mean delay s", justify="right")
    table.add_row(
        "shuttle", f"{result.events_per_s:,.0f}", f"{result.wall_s:.2f}", repr(result.mean_delay_s)
    )
    table.add_row(
        "simpy",
        f"{result.simpy_events_per_s:,.0f}",
        f"{result.simpy_wall_s:.2f}",
        repr(result.simpy_mean_delay_s),
    )
    console.print(table)
    console.print(
        f"ratio_vs_simpy {result.ratio_vs_simpy:.2f}x; mean delays "
        f"{'bit-identical' if result.identical else '[bold red]DIFFER[/]'}; "
        f"M/M/1 theory {result.mean_delay_theory_s:.4f} s"
    )
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        console.print(f"wrote {json_path}")


@app.command("cache")
def cache(
    trace: Annotated[Path, typer.Argument(help="Trace to replay (any format shuttle reads).")],
    size: Annotated[
        list[int],
        typer.Option("--size", "-s", min=1, help="Cache size in blocks (repeat for several)."),
    ],
    policy: Annotated[str, typer.Option("--policy", "-p", help="lru, fifo or clock.")] = "lru",
    block_size: Annotated[
        int, typer.Option("--block-size", "-b", min=1, help="Block size in bytes.")
    ] = 8192,
    format: Annotated[
        str, typer.Option("--format", "-f", help="Trace format (auto to detect).")
    ] = "auto",
    sort: Annotated[bool, typer.Option("--sort", help="Sort the trace by time first.")] = False,
    libcachesim: Annotated[
        bool,
        typer.Option(
            "--libcachesim",
            help="Also run libCacheSim (dev dependency) on the same block accesses; "
            "compare hit counts and accesses/s.",
        ),
    ] = False,
    repeat: Annotated[
        int, typer.Option("--repeat", min=1, help="Time each replay this often; keep the best.")
    ] = 1,
    json_path: Annotated[
        Path | None, typer.Option("--json-out", help="Also write the results here.")
    ] = None,
) -> None:
    """Replay a block or file trace through a cache policy alone and print hit ratios.

    Each read or write is split into the blocks it covers; a write leaves its blocks
    cached (write-through with allocation); metadata requests are only counted.
    """
    from shuttle.sim.replay import compare_sizes, make_policy, split_accesses
    from shuttle.traces.cli import with_progress
    from shuttle.traces.formats import read_trace

    make_policy(policy, 1)  # a bad policy name fails before the trace is read
    records = with_progress(read_trace(trace, format, sort=sort), f"reading {trace.name}")
    accesses = split_accesses(records, block_size)
    console.print(
        f"{trace}: {accesses.requests:,} block requests ({accesses.read_requests:,} reads, "
        f"{accesses.write_requests:,} writes) -> {len(accesses.keys):,} accesses of "
        f"{block_size:,}-byte blocks; {accesses.metadata_requests:,} metadata requests"
    )
    rows = compare_sizes(accesses, policy, size, block_size, libcachesim=libcachesim, repeat=repeat)
    table = Table(title=f"{policy} cache replay")
    for name in ("blocks", "hit ratio", "read hit ratio", "hits", "misses", "accesses/s"):
        table.add_column(name, justify="right")
    for row in rows:
        ours = row["shuttle"]
        table.add_row(
            f"{ours['size_blocks']:,}",
            f"{ours['hit_ratio']:.6f}",
            f"{ours['read_hit_ratio']:.6f}",
            f"{ours['hits']:,}",
            f"{ours['misses']:,}",
            f"{ours['accesses_per_s']:,.0f}",
        )
    console.print(table)
    if libcachesim:
        versus = Table(title="libCacheSim on the same block accesses")
        for name in ("blocks", "hit ratio", "same hits", "accesses/s", "shuttle / libCacheSim"):
            versus.add_column(name, justify="right")
        for row in rows:
            theirs = row["libcachesim"]
            versus.add_row(
                f"{theirs['size_blocks']:,}",
                f"{theirs['hit_ratio']:.6f}",
                "yes" if row["same_hits"] else "[bold red]NO[/]",
                f"{theirs['accesses_per_s']:,.0f}",
                f"{row['ratio_vs_libcachesim']:.2f}x",
            )
        console.print(versus)
    if json_path is not None:
        data = {
            "trace": str(trace),
            "policy": policy,
            "block_size_bytes": block_size,
            "sizes": rows,
        }
        json_path.write_text(json.dumps(data, indent=2) + "\n")
        console.print(f"wrote {json_path}")
