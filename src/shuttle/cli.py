"""The ``shuttle`` command.

Each concept contributes its own typer sub-application (``shuttle sim ...`` lives in
``shuttle.sim.cli``, ``shuttle trace ...`` in ``shuttle.traces.cli``; ``shuttle trace
calibrate-background`` applies the simulator's model, so it comes from
``shuttle.sim.calibrate_cli``); this module only assembles them and turns
:class:`~shuttle.errors.ShuttleError` into a clear message and a stable exit code.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from shuttle import __version__
from shuttle.apps.cli import COMMANDS as RUNTIME_COMMANDS
from shuttle.apps.cli import placement_app
from shuttle.apps.fs_cli import app as fs_app
from shuttle.bench.cli import app as bench_app
from shuttle.bench.sim_cli import (
    calibrate_command,
    predict_command,
    record_object_command,
    sim_predict_bench_command,
)
from shuttle.client.cli import COMMANDS as CLIENT_COMMANDS
from shuttle.client.lookaside.cli import app as lookaside_app
from shuttle.cluster.cli import app as cluster_app
from shuttle.demo import demo
from shuttle.errors import ShuttleError
from shuttle.faces.cli import COMMANDS as FACE_COMMANDS
from shuttle.node.cli import serve
from shuttle.sim.calibrate_cli import calibrate_background_command
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
for face_command in FACE_COMMANDS:
    app.command()(face_command)
app.add_typer(placement_app, name="placement")
app.add_typer(fs_app, name="fs")
app.add_typer(lookaside_app, name="lookaside")
bench_app.command("sim-predict")(sim_predict_bench_command)
app.add_typer(bench_app, name="bench")
# The simulator against the live system (issue 24): these run nodes and objects, so
# they come from above the run-time (shuttle.bench.sim_cli).
sim_app.command("calibrate")(calibrate_command)
sim_app.command("predict")(predict_command)
app.add_typer(sim_app, name="sim")
trace_app.command("calibrate-background")(calibrate_background_command)
trace_app.command("record-object")(record_object_command)
app.add_typer(trace_app, name="trace")

err_console = Console(stderr=True)


def escape_help(command: Any) -> Any:
    """Make every help text of ``command`` and its subcommands print as written.

    Typer renders help as Rich markup, where ``[server]`` is a tag and vanishes
    ("TOML file with , , , ."). Our help is plain text, so it is escaped here, once,
    for every command, option and argument (``command`` is a click command or group;
    returned for chaining).
    """
    for name in ("help", "short_help", "epilog"):
        text = getattr(command, name, None)
        if isinstance(text, str):
            setattr(command, name, escape(text))
    for param in command.params:
        if isinstance(getattr(param, "help", None), str):
            param.help = escape(param.help)
    for sub in getattr(command, "commands", {}).values():
        escape_help(sub)
    return command


def build_command() -> Any:
    """The ``shuttle`` command as click runs it: :data:`app` with its help escaped."""
    return escape_help(typer.main.get_command(app))


@app.command()
def version() -> None:
    """Print Shuttle's version."""
    print(__version__)


def main() -> None:
    """Entry point: run the CLI, mapping Shuttle errors to messages and exit codes."""
    try:
        build_command()(prog_name="shuttle")
    except ShuttleError as exc:
        # The message is text, not markup: "[sim]" in it must print as written.
        # soft_wrap: one line however long, so a log or a script sees the whole message.
        err_console.print(
            f"[bold red]error[/] ({exc.code}): {escape(str(exc))}", highlight=False, soft_wrap=True
        )
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    main()
