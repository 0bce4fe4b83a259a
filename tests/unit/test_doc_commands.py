"""Every ``shuttle ...`` command the docs show names commands and options that exist:
the fenced blocks and the inline code of docs/*.md, README.md and benchmarks/README.md.
Commands are split and renamed (``bench/abacus_cli``, ``bench/ceph``, ...); a page
whose example no longer parses is what a new user trips on first.

Only names are checked (the subcommand path, each ``--option``), not values: pages
write synopses with placeholders (``--workers N``, ``[--repeat 3]``, ``COMMAND``), and
parsing needs nothing but the click commands, so the check is quick and deterministic.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from shuttle import cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted(ROOT.glob("docs/*.md")), ROOT / "README.md", ROOT / "benchmarks" / "README.md"]

_FENCE = re.compile(r"^```[\w-]*\n(.*?)^```", re.M | re.S)
_SPAN = re.compile(r"`(shuttle [^`\n]+)`")
#: Where one command of a shell line ends.
_SEPARATOR = re.compile(r"&&|\|\||;|\||\$\(|\)")
#: A command at the start of a piece: ``shuttle``, after ``VAR=value`` assignments.
_COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\.venv/bin/)?shuttle\s+(.*)$")
#: A placeholder for a subcommand (``shuttle COMMAND -h``, ``shuttle fs ...``).
_PLACEHOLDER = re.compile(r"[A-Z][A-Z_-]*|\.\.\.|…")

COMMAND = cli.build_command()


def _commands(text: str) -> list[str]:
    """The argument strings of every ``shuttle`` command in ``text``."""
    lines = []
    for block in _FENCE.findall(text):
        block = re.sub(r"\\\n\s*", " ", block)  # continued lines are one command
        lines += [line.split(" #")[0] for line in block.splitlines()]
    lines += _SPAN.findall(text)
    found = []
    for line in lines:
        for piece in _SEPARATOR.split(line):
            match = _COMMAND.match(piece.strip())
            if match:
                found.append(match.group(1))
    return found


def problems(args: str) -> list[str]:
    """What in ``shuttle ARGS`` names no command or option ([] when all do)."""
    try:
        tokens = shlex.split(args.replace("[", " ").replace("]", " "))
    except ValueError:
        return []  # a fragment (an unclosed quote across a line): nothing to check
    command: Any = COMMAND
    path = ["shuttle"]
    while tokens and getattr(command, "commands", None) and not tokens[0].startswith("-"):
        name = tokens.pop(0)
        if _PLACEHOLDER.fullmatch(name):
            return []
        names = name.split("/")  # ``cluster up/down/status``: each must exist
        missing = [n for n in names if n not in command.commands]
        if missing:
            return [f"{' '.join(path)} has no command {missing[0]!r}"]
        command = command.commands[names[0]]
        path.append(names[0])
    options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    options |= {"-h", "--help"}
    out = []
    for token in tokens:
        if token == "--":
            break  # the rest is another program's (``trace record -- grep ...``)
        option = token.split("=")[0]
        if option.startswith("--") and option != "--" and option not in options:
            out.append(f"{' '.join(path)} has no option {option}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_a_page_shows_names_commands_and_options_that_exist(page: Path) -> None:
    found = _commands(page.read_text())
    bad = {f"shuttle {args}: {p}" for args in found for p in problems(args)}
    assert not bad, "\n".join(sorted(bad))


def test_the_check_sees_a_renamed_command_and_a_removed_option() -> None:
    text = (
        "```sh\nshuttle cluster up --nodes 3 --root /tmp/s   # fine\n"
        "SHUTTLE_KEY_FILE=k shuttle put a b && shuttle bench abacus filtr\n"
        "shuttle serve --data d --no-such-option 1\n```\n"
        "and `shuttle trace record --out x -- grep --anything`, `shuttle COMMAND -h`.\n"
    )
    found = _commands(text)
    assert found[0] == "cluster up --nodes 3 --root /tmp/s"
    assert [problems(a) for a in found] == [
        [],
        [],
        ["shuttle bench abacus has no command 'filtr'"],
        ["shuttle serve has no option --no-such-option"],
        [],
        [],
    ]
