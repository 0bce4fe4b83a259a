"""Every command's ``--help`` prints its help as written, square brackets and all
(Typer renders help as Rich markup, where ``[server]`` is a tag and vanished), and so
do error messages."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from shuttle import cli

#: Box drawing that Rich puts around help panels, and runs of white space.
_FRAME = re.compile(r"[│╭╮╰╯─]+")
_SPACE = re.compile(r"\s+")


def _plain(text: str) -> str:
    return _SPACE.sub(" ", _FRAME.sub(" ", text)).strip()


def _walk(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, command)]
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        found += _walk(sub, (*path, name))
    return found


#: The commands as written (help not escaped): what ``--help`` must show.
RAW = _walk(typer.main.get_command(cli.app))
#: The command as ``shuttle`` runs it.
COMMAND = cli.build_command()


def _help_of(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = COMMAND.main(args=args, prog_name="shuttle", standalone_mode=False)
    assert code == 0
    return _plain(capsys.readouterr().out)


def test_the_walk_sees_the_whole_tree() -> None:
    names = {" ".join(path) for path, _ in RAW}
    assert {"serve", "cluster up", "sim sweep", "trace calibrate-background", "stat"} <= names
    assert len(names) > 40


@pytest.mark.parametrize(("path", "raw"), RAW, ids=[" ".join(p) or "shuttle" for p, _ in RAW])
def test_help_shows_every_help_text_as_written(
    path: tuple[str, ...],
    raw: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    out = _help_of([*path, "--help"], capsys)
    texts = [p.help for p in raw.params if getattr(p, "help", None)]
    if raw.help:
        texts.append(raw.help.split("\n\n")[0])  # the first paragraph, as one line
    for text in texts:
        assert _plain(text) in out


def test_help_with_brackets_keeps_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    out = _help_of(["sim", "sweep", "--help"], capsys)
    assert "TOML file with [server], [experiment], [background], [sweep]." in out


def test_error_messages_print_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    missing = tmp_path / "[odd]" / "cluster.toml"
    monkeypatch.setattr(sys, "argv", ["shuttle", "cluster", "status", "--cluster", str(missing)])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 2
    err = _plain(capsys.readouterr().err)
    assert f"error (config): cluster file {missing} does not exist" in err


def test_help_paragraphs_are_reflowed_not_broken_where_the_source_wrapped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    args = ["cluster", "up", "--help"]
    code = COMMAND.main(args=args, prog_name="shuttle", standalone_mode=False)
    assert code == 0
    lines = [_plain(line) for line in capsys.readouterr().out.splitlines()]
    # The docstring breaks this sentence after "Run it again"; a wide terminal shows it
    # on one line with the rest of its paragraph.
    assert any("Run it again on the same cluster to restart nodes" in line for line in lines)


def test_reflow_keeps_list_items_examples_and_indented_lines() -> None:
    text = (
        "First line.\n\n    A paragraph wrapped\n    by the source.\n\n"
        "    * an item\n      continued\n    * another\n\n"
        "    Example: shuttle ls\n        indented code\n        more code\n\n"
        "    \b\n    kept\n    as written"
    )
    assert cli.reflow(text).split("\n\n") == [
        "First line.",
        "A paragraph wrapped by the source.",
        "* an item continued\n* another",
        "Example: shuttle ls\n    indented code\n    more code",
        "\b\nkept\nas written",
    ]
