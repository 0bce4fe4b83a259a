"""Lookaside against a real node process: the indexer chunks a file exactly as the node
does, and ``shuttle lookaside add|index|ls|rm`` with ``$SHUTTLE_LOOKASIDE=1`` makes
clients read through the stores."""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

import shuttle
from shuttle import cli
from shuttle.client.connect import connect
from shuttle.client.lookaside import LOOKASIDE_ENV, StoreSet
from shuttle.client.lookaside import cli as lookaside_cli
from shuttle.client.lookaside.index import chunk_one_file
from shuttle.client.lookaside.stores import HOME_ENV
from tests.integration.nodeproc import NodeProcess

MAX = 256 * 1024


def sparse(path: Path, parts: list[tuple[int, bytes]], size: int) -> None:
    with open(path, "wb") as f:
        for offset, data in parts:
            f.seek(offset)
            f.write(data)
        f.truncate(size)


def test_the_indexer_chunks_a_file_exactly_as_the_node_does(
    tmp_path: Path, client: shuttle.Client
) -> None:
    rng = random.Random(7)
    files = {
        "random": rng.randbytes(3_000_000),
        "small": rng.randbytes(100),
        "text": b"".join(b"line %d of a source file\n" % i for i in range(100_000)),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    # Long runs of zeros, as holes: both sides skip hashing them, and must still agree.
    sparse(
        tmp_path / "holes", [(0, rng.randbytes(70_000)), (40 * MAX, rng.randbytes(5000))], 90 * MAX
    )
    for name in [*files, "holes"]:
        path = tmp_path / name
        client.put(f"k/{name}", path)
        size, _, refs = chunk_one_file(path)
        assert size == path.stat().st_size
        theirs = [(c.offset, c.length, c.hash) for c in client.chunks(f"k/{name}")]
        assert [(r.offset, r.length, r.hash) for r in refs] == theirs, name


@pytest.fixture
def run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    # Wide consoles, so paths print whole (the module's consoles read COLUMNS once, at
    # import, which may come before this fixture in a worker that ran other tests).
    monkeypatch.setattr(lookaside_cli, "console", Console(markup=False, width=250))
    monkeypatch.setattr(lookaside_cli, "err", Console(stderr=True, width=250))
    command = cli.build_command()

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = command.main(args=list(args), prog_name="shuttle", standalone_mode=False)
        except Exception as exc:  # what `shuttle` would report, with its exit code
            code = getattr(exc, "exit_code", 1)
            print(getattr(exc, "message", exc), file=sys.stderr)
        out = capsys.readouterr()
        return code or 0, out.out, out.err

    return run


def test_the_commands_manage_stores_that_clients_then_read_through(
    tmp_path: Path,
    node: NodeProcess,
    run: Callable[..., tuple[int, str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = tmp_path / "release-1.0"
    (release / "src").mkdir(parents=True)
    data = random.Random(3).randbytes(2_000_000)
    (release / "src" / "big.c").write_bytes(data)
    (release / "README").write_bytes(b"hello\n")

    code, _, err = run("lookaside", "add", str(release))
    assert code == 0 and "2 files indexed" in err, err
    code, out, _ = run("lookaside", "ls")
    assert code == 0 and str(release) in out and " 2 " in out and "ok" in out, out

    code, _, err = run("lookaside", "index")
    assert code == 0 and "0 files indexed" in err and "2 unchanged" in err, err
    (release / "README").write_bytes(b"hello again\n")
    code, _, err = run("lookaside", "index", str(release))
    assert code == 0 and "1 files indexed" in err, err

    with connect(node=node.address) as plain:
        plain.put("src/big.c", data)
    monkeypatch.setenv(LOOKASIDE_ENV, "1")
    with connect(node=node.address) as client:
        assert client.get("src/big.c") == data
        with client.open("src/big.c") as f:
            assert f.read() == data
        counters = client.counters()["lookaside"]
    assert counters["bytes_from_stores"] == 2 * len(data) and counters["bytes_from_node"] == 0
    assert counters["stores"] == [str(release)]
    monkeypatch.delenv(LOOKASIDE_ENV)
    with connect(node=node.address) as client:
        assert client.lookaside is None

    code, _, err = run("lookaside", "rm", str(release))
    assert code == 0 and StoreSet().entries() == []
    assert release.is_dir()  # the directory itself is left alone
    assert not list((tmp_path / "home" / "lookaside").glob("*.sqlite"))


def test_the_commands_say_what_is_wrong(
    tmp_path: Path, run: Callable[..., tuple[int, str, str]]
) -> None:
    code, _, err = run("lookaside", "add", str(tmp_path / "absent"))
    assert code == 2 and "does not exist" in err
    (tmp_path / "file").write_bytes(b"x")
    code, _, err = run("lookaside", "add", str(tmp_path / "file"))
    assert code == 2 and "not a directory" in err
    code, _, err = run("lookaside", "rm", str(tmp_path))
    assert code == 2 and "not a lookaside store" in err
    code, _, err = run("lookaside", "index", str(tmp_path))
    assert code == 2 and "not a lookaside store" in err
    os.mkdir(tmp_path / "gone")
    run("lookaside", "add", str(tmp_path / "gone"))
    os.rmdir(tmp_path / "gone")
    code, out, err = run("lookaside", "index")
    assert code == 0 and "is not there; skipped" in err
    code, out, _ = run("lookaside", "ls")
    assert "missing" in out
