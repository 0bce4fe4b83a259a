"""``shuttle grep`` with the OSD as a third site: on a node over a RADOS pool a fixed
string can run in the OSD that holds the bytes (``--placement osd``), and ``auto``
sends it there when the three-site model predicts the OSD best (docs/ceph.md)."""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.client import Client
from shuttle.client.model import NodeAddress
from shuttle.cluster.ceph import LocalCeph
from tests.integration.nodeproc import NodeProcess, shuttle_cli

KEY = "logs/app.log"
NEEDLE = "ERROR 4242"


def _text() -> bytes:
    lines = []
    for i in range(6000):
        tag = NEEDLE if i % 97 == 0 else "INFO ok"
        lines.append(f"{i:05d} {tag} request served in {i % 13} ms".encode())
    return b"\n".join(lines) + b"\n"


@pytest.fixture(scope="module")
def rados_node(ceph: LocalCeph, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node over a fresh namespace of the session's pool, holding KEY."""
    extra = ceph.info().store_args(f"grep{secrets.token_hex(4)}")
    proc = NodeProcess(tmp_path_factory.mktemp("grep-osd") / "g1", extra=extra).start()
    try:
        with Client([NodeAddress("g1", "127.0.0.1", proc.port)]) as client:
            client.put(KEY, _text())
        yield proc
    finally:
        proc.terminate()


@pytest.fixture(scope="module")
def file_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    proc = NodeProcess(tmp_path_factory.mktemp("grep-files") / "f1").start()
    try:
        with Client([NodeAddress("f1", "127.0.0.1", proc.port)]) as client:
            client.put(KEY, _text())
        yield proc
    finally:
        proc.terminate()


def _expected(pattern: str) -> list[bytes]:
    regex = re.compile(pattern.encode())
    return [
        b"%s:%d:%s" % (KEY.encode(), n, line)
        for n, line in enumerate(_text().split(b"\n")[:-1], start=1)
        if regex.search(line)
    ]


def test_the_osd_finds_what_python_finds(rados_node: NodeProcess, tmp_path: Path) -> None:
    report = tmp_path / "grep.json"
    out = shuttle_cli(
        "grep", NEEDLE, KEY, "--node", rados_node.address, "--placement", "osd",
        "--json-out", str(report), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    assert sorted(out.stdout.splitlines()) == sorted(_expected(NEEDLE))
    placed = json.loads(report.read_text())
    node = next(iter(placed["initial_placement"]))
    assert placed["initial_placement"][node].startswith("osd")
    assert placed["scanned_bytes"] == len(_text())


def test_auto_over_a_slow_link_runs_a_fixed_string_at_the_osd(
    rados_node: NodeProcess, tmp_path: Path
) -> None:
    report = tmp_path / "grep.json"
    out = shuttle_cli(
        "grep", NEEDLE, KEY, "--node", rados_node.address, "--placement", "auto",
        "--link", "bw=1Mbit,lat=5ms", "--json-out", str(report), timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    assert sorted(out.stdout.splitlines()) == sorted(_expected(NEEDLE))
    placed = json.loads(report.read_text())
    [plan] = placed["site_plans"].values()
    # Over 1 Mbit/s the client would move the whole text; the node and the OSD read it
    # beside the data, and the OSD's Lua costs less CPU than Python's re.
    assert plan["best"] == "osd", plan
    assert plan["response_s"]["client"] > plan["response_s"]["osd"]
    assert next(iter(placed["initial_placement"].values())).startswith("osd")


def test_auto_with_a_regular_expression_stays_with_the_run_time(
    rados_node: NodeProcess, tmp_path: Path
) -> None:
    report = tmp_path / "grep.json"
    pattern = r"ERROR 42\d2"
    out = shuttle_cli(
        "grep", pattern, KEY, "--node", rados_node.address, "--json-out", str(report),
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    assert sorted(out.stdout.splitlines()) == sorted(_expected(pattern))
    placed = json.loads(report.read_text())
    assert placed["site_plans"] == {}  # no OSD implementation: nothing to ask the model
    assert not next(iter(placed["initial_placement"].values())).startswith("osd")


def test_the_osd_is_refused_where_it_cannot_run(
    rados_node: NodeProcess, file_node: NodeProcess
) -> None:
    files = shuttle_cli("grep", NEEDLE, KEY, "--node", file_node.address, "--placement", "osd")
    assert files.returncode != 0 and b"--store rados:POOL" in files.stderr, files.stderr
    regex = shuttle_cli(
        "grep", r"ERROR \d+", KEY, "--node", rados_node.address, "--placement", "osd"
    )
    assert regex.returncode != 0 and b"fixed strings only" in regex.stderr, regex.stderr
