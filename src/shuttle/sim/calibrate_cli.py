"""``shuttle trace calibrate-background``: how loaded a background trace keeps the
simulated server.

The command belongs with the trace commands for its users, but it applies the
simulator's cost model (:mod:`shuttle.sim.calibration`), and ``traces`` sits below
``sim``; so it lives here and the top-level CLI adds it to ``shuttle trace``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

# The command tree is built whenever ``shuttle`` starts: the simulator comes in when the
# command runs (tests/unit/test_cli_start.py).

console = Console()


def calibrate_background_command(
    hours: Annotated[
        float, typer.Option("--hours", min=3.1, help="Length of the trace in hours.")
    ] = 12.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the background.")] = 0,
    rate: Annotated[
        float | None, typer.Option("--rate", min=0.0, help="Mean requests/s (default 820).")
    ] = None,
    cache_blocks: Annotated[
        int | None, typer.Option("--cache-blocks", min=1, help="Server cache (default 4096).")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json-out", help="Also write the estimates here.")
    ] = None,
) -> None:
    """Estimate the server load of the background's busiest intervals.

    CPU and disk utilisation from the simulator's default server costs, block and
    metadata hit ratios after a 3-hour warm-up: a check that the defaults make the
    paper's regime reachable (CPU busy at speed 1.0, saturated at half speed).
    """
    from rich.table import Table

    from shuttle.sim.calibration import background_load
    from shuttle.sim.config import ServerConfig
    from shuttle.traces.background import BackgroundConfig

    config = replace(BackgroundConfig(), duration_s=hours * 3600.0)
    if rate is not None:
        config = replace(config, request_rate_per_s=rate)
    server = ServerConfig() if cache_blocks is None else ServerConfig(cache_blocks=cache_blocks)
    with console.status("generating the background and replaying its busiest intervals"):
        loads = background_load(config, seed, server)
    table = Table(title=f"busiest intervals, {server.cache_blocks:,}-block server cache")
    heads = ("start h", "req/s", "meta", "CPU @1.0", "CPU @0.5", "disk", "block hit", "meta hit")
    for head in heads:
        table.add_column(head, justify="right")
    for load in loads:
        table.add_row(
            f"{load.start_s / 3600:.2f}",
            f"{load.rate_per_s:,.0f}",
            f"{load.metadata_fraction:.1%}",
            f"{load.cpu_utilisation:.2f}",
            f"{load.cpu_utilisation_half_speed:.2f}",
            f"{load.disk_utilisation:.2f}",
            f"{load.block_hit_ratio:.1%}",
            f"{load.metadata_hit_ratio:.2%}",
        )
    Console().print(table)
    if json_out is not None:
        data = {
            "seed": seed,
            "config": config.to_dict(),
            "cache_blocks": server.cache_blocks,
            "intervals": [load.to_dict() for load in loads],
        }
        json_out.write_text(json.dumps(data, indent=2) + "\n")
