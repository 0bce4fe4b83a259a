"""``shuttle bench ...``: the benchmarks, one command each.

Each benchmark module keeps its own logic; this module only declares the commands.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    help="Run Shuttle's benchmarks on the live system; each prints its figures and "
    "writes JSON with --json FILE.",
    no_args_is_help=True,
)


@app.callback()
def _bench() -> None:
    """Run Shuttle's benchmarks on the live system."""
