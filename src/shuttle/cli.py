"""The ``shuttle`` command.

Each concept contributes its own commands (``shuttle sim ...`` lives in
``shuttle.sim.cli``, ``shuttle trace ...`` in ``shuttle.traces.cli``; ``shuttle trace
calibrate-background`` applies the simulator's model, so it comes from
``shuttle.sim.calibrate_cli``); this module only assembles them, in the help panels of
:data:`COMMANDS`, and turns :class:`~shuttle.errors.ShuttleError` into a clear message
and a stable exit code.

It starts fast (issue 25): a command's module is imported, and its click command built,
only when that command is asked for (``shuttle ls --help`` builds ``ls`` alone; the
top-level ``--help`` builds each command, not what they run). Every command module
imports its machinery inside the function that runs it; tests/unit/test_cli_start.py
checks that help imports nothing heavy.
"""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from collections.abc import Iterator, MutableMapping
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from shuttle import __version__
from shuttle.errors import ShuttleError

#: ``-h`` works as ``--help`` everywhere (children inherit the root's context settings).
HELP_OPTIONS = ["-h", "--help"]

#: Every command of ``shuttle``: its help panel, then (name, module, attribute) in the
#: order the help lists them. The attribute is a command function or a typer
#: sub-application (a group). Keep docs/cli.md in step.
COMMANDS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "Start here": (
        ("demo", "shuttle.demo", "demo"),
        ("version", "shuttle.cli", "version"),
    ),
    "Data": (
        ("put", "shuttle.client.cli", "put"),
        ("get", "shuttle.client.cli", "get"),
        ("cat", "shuttle.client.cli", "cat"),
        ("ls", "shuttle.client.cli", "ls"),
        ("stat", "shuttle.client.cli", "stat"),
        ("rm", "shuttle.client.cli", "rm"),
        ("lookaside", "shuttle.client.lookaside.cli", "app"),
    ),
    "Cluster": (
        ("cluster", "shuttle.cluster.cli", "app"),
        ("serve", "shuttle.node.cli", "serve"),
        ("stats", "shuttle.client.cli", "stats"),
    ),
    "Run-time": (
        ("grep", "shuttle.apps.cli", "grep"),
        ("objects", "shuttle.apps.cli", "objects"),
        ("placement", "shuttle.apps.cli", "placement_app"),
        ("dashboard", "shuttle.apps.cli", "dashboard"),
    ),
    "File system": (("fs", "shuttle.apps.fs_cli", "app"),),
    "Mount": (
        ("mount", "shuttle.faces.cli", "mount"),
        ("umount", "shuttle.faces.cli", "umount"),
    ),
    "Bench": (("bench", "shuttle.bench.cli", "app"),),
    "Sim": (("sim", "shuttle.sim.cli", "app"),),
    "Trace": (("trace", "shuttle.traces.cli", "app"),),
}

#: Where each command is found, by name: (panel, module, attribute).
_WHERE: dict[str, tuple[str, str, str]] = {
    name: (panel, module, attribute)
    for panel, entries in COMMANDS.items()
    for name, module, attribute in entries
}

err_console = Console(stderr=True)


#: A line that starts a list item or an example keeps its own line in help text.
_ITEM = re.compile(r"(?:[*\-\u2022]|\d+[.)])\s|Examples?:")
#: A line indented this far (an example) keeps its own line too.
_CODE_INDENT = "    "


def reflow(text: str) -> str:
    """``text`` with each paragraph's single line breaks joined: they are where the
    source wrapped it, not where a terminal should (Typer keeps them, and a terminal
    narrower than the source's lines wraps each again, leaving fragments: "Run it" /
    "again" / "on the same cluster"). List items, examples and indented lines keep
    their own lines; a paragraph marked ``\\b`` stays as written."""
    first, _, rest = text.partition("\n")
    paragraphs = (first.strip() + "\n" + textwrap.dedent(rest)).strip("\n").split("\n\n")
    out = []
    for paragraph in paragraphs:
        if paragraph.startswith("\b"):
            out.append(paragraph)
            continue
        lines: list[str] = []
        for line in paragraph.split("\n"):
            joins = (
                lines
                and line.strip()
                and not _ITEM.match(line.lstrip())
                and not line.startswith(_CODE_INDENT)
                and not lines[-1].startswith(_CODE_INDENT)
            )
            if joins:
                lines[-1] = f"{lines[-1].rstrip()} {line.strip()}"
            else:
                lines.append(line.rstrip())
        out.append("\n".join(lines))
    return "\n\n".join(out)


def escape_help(command: Any) -> Any:
    """Make every help text of ``command`` and its subcommands print as written.

    Typer renders help as Rich markup, where ``[server]`` is a tag and vanishes
    ("TOML file with , , , ."). Our help is plain text, so it is escaped here, once,
    for every command, option and argument (``command`` is a click command or group;
    returned for chaining), and its paragraphs reflowed (:func:`reflow`). A lazily
    built group escapes its commands as it builds them.
    """
    for name in ("help", "short_help", "epilog"):
        text = getattr(command, name, None)
        if isinstance(text, str):
            setattr(command, name, escape(reflow(text)))
    for param in command.params:
        if isinstance(getattr(param, "help", None), str):
            param.help = escape(reflow(param.help))
    commands = getattr(command, "commands", {})
    if isinstance(commands, _Commands):
        commands.escape = True
    else:
        for sub in commands.values():
            escape_help(sub)
    return command


#: Commands that a group gets from a module above its own package, added here when
#: the group is built: (group, (name, module, attribute)). ``shuttle trace
#: calibrate-background`` applies the simulator's model, and traces sit below the
#: simulator; the simulator against the live system (issue 24) runs nodes and objects,
#: so it comes from above the run-time (``shuttle.bench.sim_cli``).
ADDED: dict[str, tuple[tuple[str, str, str], ...]] = {
    "bench": (("sim-predict", "shuttle.bench.sim_cli", "sim_predict_bench_command"),),
    "sim": (
        ("calibrate", "shuttle.bench.sim_cli", "calibrate_command"),
        ("predict", "shuttle.bench.sim_cli", "predict_command"),
    ),
    "trace": (
        ("calibrate-background", "shuttle.sim.calibrate_cli", "calibrate_background_command"),
        ("record-object", "shuttle.bench.sim_cli", "record_object_command"),
    ),
}


def _build(name: str) -> Any:
    """The click command ``name`` of :data:`COMMANDS`, imported and built now."""
    panel, module, attribute = _WHERE[name]
    target = getattr(importlib.import_module(module), attribute)
    # A holder without shell completion: typer adds its options to the top command.
    holder = typer.Typer(add_completion=False)
    if isinstance(target, typer.Typer):
        _add_commands(target, ADDED.get(name, ()))
        holder.add_typer(target, name=name)
        command = typer.main.get_command(holder).commands[name]  # type: ignore[attr-defined]
    else:
        holder.command(name)(target)
        command = typer.main.get_command(holder)  # one command: that command itself
    command.rich_help_panel = panel
    return command


def _add_commands(group: typer.Typer, added: tuple[tuple[str, str, str], ...]) -> None:
    """Add :data:`ADDED`'s commands to ``group`` (once: the group is a module's global)."""
    have = {c.name for c in group.registered_commands}
    for name, module, attribute in added:
        if name not in have:
            group.command(name)(getattr(importlib.import_module(module), attribute))


class _Commands(MutableMapping[str, Any]):
    """The root group's commands by name, each built on first use."""

    def __init__(self) -> None:
        self._built: dict[str, Any] = {}
        self.escape = False

    def __getitem__(self, name: str) -> Any:
        if name not in self._built:
            if name not in _WHERE:
                raise KeyError(name)
            command = _build(name)
            self._built[name] = escape_help(command) if self.escape else command
        return self._built[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        del self._built[name]

    def __iter__(self) -> Iterator[str]:
        yield from _WHERE
        yield from (name for name in self._built if name not in _WHERE)

    def __len__(self) -> int:
        return len(_WHERE) + sum(1 for name in self._built if name not in _WHERE)


class ShuttleGroup(TyperGroup):
    """The ``shuttle`` group: commands built when asked for (:class:`_Commands`), and
    the old ``--json FILE`` spelling mapped to ``--json-out FILE``."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _Commands()

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, json_out_compat(self, ctx, args))

    def get_help_option(self, ctx: Any) -> Any:
        """The group's ``--help``, coerced without pydantic.

        Typer coerces every parameter's value through a pydantic adapter that it builds
        on first use, and the group's ``--help`` is coerced on every run (its value is
        None when it is not given): that alone imports pydantic, about a quarter of
        ``shuttle ls --help``. A flag is a bool or None, and needs no adapter. (Typer's
        internals: without them, this does nothing and pydantic is imported as before.)
        """
        option = super().get_help_option(ctx)
        if option is not None and getattr(option, "_runtime_param", False) is None:
            try:
                from typer._coercion import PassThroughRuntimeParam
            except ImportError:  # another typer: coerced its own way
                return option
            option._runtime_param = PassThroughRuntimeParam(
                annotation=bool, parameter_info=option.type_descriptor.parameter_info
            )
        return option


def json_out_compat(root: Any, ctx: Any, args: list[str]) -> list[str]:
    """``args`` with the old ``--json FILE`` of a command that now takes ``--json-out
    FILE`` (grep, bench, sim, trace) rewritten to it, with a deprecation message.

    Only for commands that have ``--json-out`` and no ``--json`` flag of their own, so
    the rewrite is never ambiguous: there ``--json`` can only be the old spelling.
    """
    command, rest = root, list(args)
    for token in args:
        if token.startswith("-"):
            continue
        sub = command.get_command(ctx, token) if hasattr(command, "get_command") else None
        if sub is None:
            break
        command = sub
        if not hasattr(command, "get_command"):
            break
    opts = {opt for param in command.params for opt in param.opts}
    if "--json-out" not in opts or "--json" in opts:
        return rest
    for i, token in enumerate(rest):
        if token == "--":  # what follows is arguments, not options
            break
        if token == "--json" or token.startswith("--json="):
            rest[i] = token.replace("--json", "--json-out", 1)
            err_console.print(
                "[yellow]deprecated[/]: --json FILE is now --json-out FILE (--json prints "
                "JSON to standard output on the commands that have it); this run uses "
                "--json-out.",
                highlight=False,
                soft_wrap=True,
            )
    return rest


app = typer.Typer(
    cls=ShuttleGroup,
    name="shuttle",
    help="Shuttle: an active storage system (storage nodes, a fast client, mobile "
    "objects) and a simulator of mobile code on a file server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": HELP_OPTIONS},
)


def _print_version(value: bool) -> None:
    if value:
        print(__version__)
        raise typer.Exit()


@app.callback()
def _shuttle(
    version: bool = typer.Option(
        False,
        "--version",
        is_eager=True,
        callback=_print_version,
        help="Print Shuttle's version and exit.",
    ),
) -> None:
    """Shuttle: an active storage system (storage nodes, a fast client, mobile
    objects) and a simulator of mobile code on a file server."""


def version() -> None:
    """Print Shuttle's version."""
    print(__version__)


def build_command() -> Any:
    """The ``shuttle`` command as click runs it: :data:`app` with its help escaped."""
    return escape_help(typer.main.get_command(app))


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
