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
        Path | None, typer.Option("--json", help="Also write the result here.")
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
