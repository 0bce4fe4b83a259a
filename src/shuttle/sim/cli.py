"""``shuttle sim ...``: the simulator's commands."""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Simulate a file server that hosts mobile code (kernel benchmark, cache "
    "replay, the paper's sweeps).",
    no_args_is_help=True,
)
