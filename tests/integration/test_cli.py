"""The ``shuttle`` command as a user (or a script) runs it: output and exit codes."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shuttle.cli import app
from tests.integration.nodeproc import NodeProcess, shuttle_cli


def ok(result: object) -> str:
    assert result.returncode == 0, result.stderr.decode()  # type: ignore[attr-defined]
    return result.stdout.decode()  # type: ignore[attr-defined]


def test_put_get_cat_ls_stat_rm(node: NodeProcess, tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_bytes(b"line one\nline two\n")
    n = ("--node", node.address)
    assert "version" in ok(shuttle_cli("put", str(src), "docs/a.txt", *n))
    ok(shuttle_cli("put", "-", "docs/sub/b.txt", *n, input=b"from stdin"))
    out = tmp_path / "out.txt"
    ok(shuttle_cli("get", "docs/a.txt", str(out), *n))
    assert out.read_bytes() == src.read_bytes()
    assert (
        ok(shuttle_cli("cat", "docs/a.txt", "docs/sub/b.txt", *n))
        == "line one\nline two\nfrom stdin"
    )
    assert ok(shuttle_cli("ls", "docs/", *n)).split() == ["docs/sub/", "docs/a.txt"]
    assert ok(shuttle_cli("ls", "-r", "docs/", *n)).split() == ["docs/a.txt", "docs/sub/b.txt"]
    assert "docs/a.txt" in ok(shuttle_cli("ls", "-l", "docs/", *n))
    info = json.loads(ok(shuttle_cli("stat", "--json", "docs/a.txt", *n)))
    assert info["size"] == 18 and len(info["blake3"]) == 64
    stats = json.loads(ok(shuttle_cli("stats", "--json", *n)))
    assert next(iter(stats.values()))["server"]["requests"] > 0
    ok(shuttle_cli("rm", "docs/a.txt", *n))
    gone = shuttle_cli("get", "docs/a.txt", str(out), *n)
    assert gone.returncode == 4 and b"not_found" in gone.stderr


def test_exit_codes_and_messages_scripts_can_rely_on(node: NodeProcess, tmp_path: Path) -> None:
    n = ("--node", node.address)
    bad_key = shuttle_cli("cat", "../etc/passwd", *n)
    assert bad_key.returncode == 2 and b"invalid_key" in bad_key.stderr
    missing = shuttle_cli("rm", "nope", *n)
    assert missing.returncode == 4 and b"nope" in missing.stderr
    assert shuttle_cli("rm", "-f", "nope", *n).returncode == 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    down = shuttle_cli("stat", "x", "--node", dead)
    assert down.returncode == 6 and b"cannot reach node" in down.stderr
    env = {k: v for k, v in os.environ.items() if k != "SHUTTLE_CLUSTER"}
    nowhere = shuttle_cli("ls", env={**env, "SHUTTLE_CLUSTER": ""})
    assert nowhere.returncode == 2 and b"--node HOST:PORT" in nowhere.stderr
    bad_file = tmp_path / "c.toml"
    bad_file.write_text("[[nodes]]\nid = 1\n")
    broken = shuttle_cli("ls", "--cluster", str(bad_file))
    assert broken.returncode == 2 and b"'id' is required and must be a str" in broken.stderr


def test_help_for_every_command() -> None:
    runner = CliRunner()
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert top.exit_code == 0
    for command in (
        "serve",
        "cluster",
        "put",
        "get",
        "cat",
        "ls",
        "stat",
        "rm",
        "stats",
        "bench",
        "demo",
    ):
        assert command in top.output
        sub = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert sub.exit_code == 0 and "Usage" in sub.output
    for sub_command in ("up", "down", "status"):
        assert runner.invoke(app, ["cluster", sub_command, "--help"]).exit_code == 0


def test_cluster_up_status_restart_down(tmp_path: Path) -> None:
    root = tmp_path / "c"
    ok(shuttle_cli("cluster", "up", "--nodes", "2", "--root", str(root), "--cpu-factor", "1,0.5"))
    cluster_file = root / "cluster.toml"
    env = {"SHUTTLE_CLUSTER": str(cluster_file)}
    try:
        for i in range(6):
            ok(shuttle_cli("put", "-", f"k/{i}", env=env, input=f"v{i}".encode()))
        assert len(ok(shuttle_cli("ls", "-r", "k/", env=env)).split()) == 6
        status = ok(shuttle_cli("cluster", "status", env=env))
        assert "n1" in status and "n2" in status and status.count("up") >= 2
        # Crash one node: status says so (exit 6), `up` brings it back with its data.
        text = cluster_file.read_text()
        pid = int(text.split("pid = ")[1].split()[0])
        os.kill(pid, signal.SIGKILL)
        assert shuttle_cli("cluster", "status", env=env).returncode == 6
        ok(shuttle_cli("cluster", "up", "--root", str(root)))
        assert [ok(shuttle_cli("cat", f"k/{i}", env=env)) for i in range(6)] == [
            f"v{i}" for i in range(6)
        ]
    finally:
        ok(shuttle_cli("cluster", "down", env=env))
    assert shuttle_cli("cluster", "status", env=env).returncode == 6


def test_serve_rejects_bad_flags_clearly(tmp_path: Path) -> None:
    bad = shuttle_cli("serve", "--data", str(tmp_path), "--listen", "nonsense")
    assert bad.returncode == 2 and b"HOST:PORT" in bad.stderr
    bad_cpu = shuttle_cli("serve", "--data", str(tmp_path), "--cpu-factor", "0")
    assert bad_cpu.returncode == 2 and b"factor" in bad_cpu.stderr


@pytest.mark.parametrize("link", ["lan", "bw=50Mbit,lat=1ms"])
def test_link_option_shapes_transfers(node: NodeProcess, link: str) -> None:
    body = b"z" * 200_000
    ok(shuttle_cli("put", "-", "shaped", "--node", node.address, "--link", link, input=body))
    assert ok(shuttle_cli("cat", "shaped", "--node", node.address, "--link", link)).encode() == body


def test_serve_on_a_port_in_use_fails_clearly(node: NodeProcess, tmp_path: Path) -> None:
    clash = shuttle_cli("serve", "--data", str(tmp_path / "other"), "--listen", node.address)
    assert clash.returncode == 2
    assert b"cannot listen on" in clash.stderr and b"--listen" in clash.stderr


def test_second_node_on_the_same_data_directory_is_refused(node: NodeProcess) -> None:
    second = shuttle_cli("serve", "--data", str(node.data_dir), "--listen", "127.0.0.1:0")
    assert second.returncode != 0 and b"error" in second.stderr


def test_get_into_a_directory_as_cp_does_and_clear_errors_otherwise(
    node: NodeProcess, tmp_path: Path
) -> None:
    n = ("--node", node.address)
    ok(shuttle_cli("put", "-", "data/2026/report.csv", *n, input=b"a,b\n"))
    into = tmp_path / "downloads"
    into.mkdir()
    ok(shuttle_cli("get", "data/2026/report.csv", str(into), *n))
    assert (into / "report.csv").read_bytes() == b"a,b\n"
    ok(shuttle_cli("get", "data/2026/report.csv", f"{into}/", *n))  # a trailing slash too
    missing = shuttle_cli("get", "data/2026/report.csv", str(tmp_path / "no" / "dir" / "x"), *n)
    assert missing.returncode == 2, missing.stderr
    assert b"does not exist; create it first" in missing.stderr
    assert b"Traceback" not in missing.stderr
    no_dir = shuttle_cli("get", "data/2026/report.csv", f"{tmp_path}/nowhere/", *n)
    assert no_dir.returncode == 2 and b"nowhere" in no_dir.stderr
    # A directory nobody can create a file in, not even root.
    denied = shuttle_cli("get", "data/2026/report.csv", "/proc/shuttle-get-test", *n)
    assert denied.returncode == 2 and b"local_file" in denied.stderr
    assert b"Traceback" not in denied.stderr
    assert sorted(p.name for p in into.iterdir()) == ["report.csv"]  # no partial files
