"""The ``shuttle`` command.

Each concept contributes its own typer sub-application (``shuttle sim ...`` lives in
``shuttle.sim.cli``, ``shuttle trace ...`` in ``shuttle.traces.cli``); this module
only assembles them and turns :class:`~shuttle.errors.ShuttleError` into a clear
message and a stable exit code.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from shuttle import __version__
from shuttle.apps.cli import COMMANDS as RUNTIME_COMMANDS
from shuttle.apps.cli import placement_app
from shuttle.apps.fs_cli import app as fs_app
from shuttle.bench.cli import app as bench_app
from shuttle.client.cli import COMMANDS as CLIENT_COMMANDS
from shuttle.cluster.cli import app as cluster_app
from shuttle.demo import demo
from shuttle.errors import ShuttleError
from shuttle.node.cli import serve
from shuttle.sim.cli import app as sim_app
from shuttle.traces.cli import app as trace_app

app = typer.Typer(
    name="shuttle",
    help="Shuttle: an active storage system (storage nodes, a fast client, mobile "
    "objects) and a simulator of mobile code on a file server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(demo)
app.command()(serve)
app.add_typer(cluster_app, name="cluster")
for command in CLIENT_COMMANDS:
    app.command()(command)
for runtime_command in RUNTIME_COMMANDS:
    app.command()(runtime_command)
app.add_typer(placement_app, name="placement")
app.add_typer(fs_app, name="fs")
app.add_typer(bench_app, name="bench")
app.add_typer(sim_app, name="sim")
app.add_typer(trace_app, name="trace")

err_console = Console(stderr=True)


@app.command()
def version() -> None:
    """Print Shuttle's version."""
    print(__version__)


def main() -> None:
    """Entry point: run the CLI, mapping Shuttle errors to messages and exit codes."""
    try:
        app()
    except ShuttleError as exc:
        err_console.print(f"[bold red]error[/] ({exc.code}): {exc}", highlight=False)
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
