"""The surface of the ``shuttle`` command (issue 25, item 9): commands grouped in help
panels, ``-h`` and ``--version``, one ``--json`` convention, defaults shown."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shuttle
from shuttle import cli
from shuttle.runtime.config import THRESHOLD_FRACTION_DEFAULT, WINDOW_S_DEFAULT

from .traces.conftest import NFS_LAIR

ROOT = cli.build_command()


def shuttle_cli(*args: str, columns: int = 100) -> subprocess.CompletedProcess[str]:
    """The real command in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "shuttle", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": str(columns), "HOME": str(Path.home())},
    )


def _leaves(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    if hasattr(command, "list_commands"):
        for name in command.list_commands(None):
            yield from _leaves(command.get_command(None, name), (*path, name))
    else:
        yield " ".join(path), command


LEAVES = dict(_leaves(ROOT))


def test_the_help_groups_the_commands_in_panels() -> None:
    out = shuttle_cli("--help").stdout
    panels = list(cli.COMMANDS)
    for panel in ("Data", "Cluster", "Run-time", "File system", "Mount", "Bench", "Sim", "Trace"):
        assert panel in panels
        assert f"─ {panel} ─" in out
    # In the order of COMMANDS, each command under its own panel; none left in a
    # catch-all "Commands" panel.
    positions = [out.index(f"─ {panel} ─") for panel in panels]
    assert positions == sorted(positions)
    assert "─ Commands ─" not in out
    for panel, entries in cli.COMMANDS.items():
        start = out.index(f"─ {panel} ─")
        end = out.index("╰", start)
        for name, _, _ in entries:
            assert f"│ {name} " in out[start:end], (panel, name)
    assert set(ROOT.list_commands(None)) == {n for e in cli.COMMANDS.values() for n, _, _ in e}


def test_dash_h_is_help_and_version_prints_the_version() -> None:
    assert shuttle_cli("-h").stdout == shuttle_cli("--help").stdout
    assert "Usage: shuttle cluster up" in shuttle_cli("cluster", "up", "-h").stdout
    done = shuttle_cli("--version")
    assert (done.returncode, done.stdout.strip()) == (0, shuttle.__version__)
    assert shuttle_cli("version").stdout.strip() == shuttle.__version__


def test_json_is_a_flag_everywhere_and_files_are_json_out() -> None:
    """``--json`` prints JSON to standard output (a flag); a JSON file is ``--json-out
    FILE``; no command has both meanings."""
    flags, files = [], []
    for name, command in LEAVES.items():
        for param in command.params:
            if "--json" in param.opts:
                assert param.is_flag, f"{name}: --json takes a value; make it --json-out FILE"
                flags.append(name)
            if "--json-out" in param.opts:
                assert not param.is_flag
                files.append(name)
    assert {"stat", "stats", "objects", "placement log", "cluster user list"} <= set(flags)
    assert {
        "grep",
        "bench netrand",
        "bench abacus filter",
        "bench sim-predict",
        "sim sweep",
        "sim predict",
        "trace info",
    } <= set(files)


def test_the_old_json_file_spelling_still_works_and_says_so(tmp_path: Path) -> None:
    summary = tmp_path / "info.json"
    done = shuttle_cli("trace", "info", str(NFS_LAIR), "--json", str(summary))
    assert done.returncode == 0, done.stderr
    assert summary.is_file()
    assert "deprecated" in done.stderr and "--json-out FILE" in done.stderr
    equals = tmp_path / "equals.json"
    assert shuttle_cli("trace", "info", str(NFS_LAIR), f"--json={equals}").returncode == 0
    assert equals.read_text() == summary.read_text()
    # A command whose --json is a flag keeps it a flag: nothing is rewritten.
    assert cli.json_out_compat(ROOT, None, ["stats", "--json"]) == ["stats", "--json"]
    # After "--", "--json" is an argument (a pattern to grep for), not the old option.
    assert cli.json_out_compat(ROOT, None, ["grep", "--", "--json", "k"]) == [
        "grep",
        "--",
        "--json",
        "k",
    ]


@pytest.mark.parametrize(
    ("command", "option", "default"),
    [
        ("cluster up", "--window", f"{WINDOW_S_DEFAULT:g}"),
        ("cluster up", "--threshold", f"{THRESHOLD_FRACTION_DEFAULT:g}"),
        ("cluster up", "--object-memory", "no limit"),
        ("cluster up", "--cache-bytes", "64 MiB"),
        ("serve", "--window", f"{WINDOW_S_DEFAULT:g}"),
        ("serve", "--threshold", f"{THRESHOLD_FRACTION_DEFAULT:g}"),
        ("serve", "--object-memory", "no limit"),
        ("serve", "--sandbox-memory", "512 MiB"),
        ("grep", "--window", f"{WINDOW_S_DEFAULT:g}"),
        ("sim sweep", "--seed", "0"),
        # TLS (issue 22): on or off is decided by the cluster file or the address.
        ("cluster up", "--tls", "as the cluster file says"),
        ("serve", "--tls", "on beyond loopback"),
        ("serve", "--handshake-timeout", "10"),
        ("ls", "--tls", "as the cluster file says"),
        ("get", "--ca-file", "the cluster file's"),
    ],
)
def test_options_show_their_defaults(command: str, option: str, default: str) -> None:
    """An option whose default is decided elsewhere (None here) says what it is."""
    param = next(p for p in LEAVES[command].params if option in p.opts)
    if param.default is not None:  # typer shows it: [default: ...]
        assert param.show_default is not False and f"{param.default:g}" == default
        return
    assert "default" in (param.help or "") and default in (param.help or ""), param.help
