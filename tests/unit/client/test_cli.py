"""The client commands' output, against an in-memory node."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer

from shuttle import cli
from shuttle.client import Client
from shuttle.client import cli as client_cli
from shuttle.errors import InvalidArgumentError
from shuttle.testing import MemoryNode


@pytest.fixture
def run(
    node: MemoryNode, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., str]:
    monkeypatch.setattr(client_cli, "connect", lambda **_: MemoryNode.client([node]))
    monkeypatch.setenv("COLUMNS", "200")
    command = cli.build_command()

    def run(*args: str) -> str:
        code = command.main(args=list(args), prog_name="shuttle", standalone_mode=False)
        assert code in (0, None)
        return capsys.readouterr().out

    return run


def test_stat_shows_the_mtime_as_a_date_too(run: Callable[..., str], client: Client) -> None:
    info = client.put("logs/[2026]/a.txt", b"hello")
    out = run("stat", "logs/[2026]/a.txt", "--node", "memory:0")
    when = datetime.fromtimestamp(info.mtime_ns // 10**9, UTC).strftime("%Y-%m-%d %H:%M:%S")
    nanos = f"{info.mtime_ns % 10**9:09d}"
    assert re.search(rf"mtime: {when}\.{nanos} UTC\n", out), out
    assert f"mtime_ns: {info.mtime_ns}\n" in out
    assert "key: logs/[2026]/a.txt" in out  # a key is data, not markup
    assert "chunks: 1 " in out
    record = json.loads(run("stat", "--json", "logs/[2026]/a.txt", "--node", "memory:0"))
    assert record["mtime"] == f"{when}.{nanos} UTC" and record["mtime_ns"] == info.mtime_ns


def test_ls_prints_keys_as_written(run: Callable[..., str], client: Client) -> None:
    client.put("a/[b]", b"x")
    assert run("ls", "-r", "a/", "--node", "memory:0").split() == ["a/[b]"]


def test_put_into_a_directory_key_uses_the_file_name_as_cp_does(
    run: Callable[..., str], client: Client, tmp_path: Path
) -> None:
    local = tmp_path / "notes.txt"
    local.write_bytes(b"notes\n")
    out = run("put", str(local), "docs/", "--node", "memory:0")
    assert "docs/notes.txt: 6 bytes" in out
    assert client.get("docs/notes.txt") == b"notes\n"
    run("put", str(local), "docs/copy.txt", "--node", "memory:0")  # a full key is kept
    assert client.get("docs/copy.txt") == b"notes\n"


def test_put_of_standard_input_into_a_directory_key_says_to_name_the_object() -> None:
    with pytest.raises(InvalidArgumentError, match=r"'docs/' names a directory.*docs/data.bin"):
        client_cli.put_key(Path("-"), "docs/")


def test_put_of_a_missing_file_says_so_before_asking_any_node(tmp_path: Path) -> None:
    """A typo in the file name is reported as that, even with no node to reach."""
    command = cli.build_command()
    args = ["put", str(tmp_path / "missing.txt"), "k", "--node", "127.0.0.1:1"]
    with pytest.raises(typer.BadParameter, match=r"missing.txt is not a readable file"):
        command.main(args=args, prog_name="shuttle", standalone_mode=False)
