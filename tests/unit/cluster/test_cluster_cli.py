"""Every cluster command names its cluster the same ways: ``--cluster FILE``, or
``--root DIR`` (its ``cluster.toml``), else ``$SHUTTLE_CLUSTER``, else .shuttle."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shuttle.cluster import local
from shuttle.cluster.cli import app
from shuttle.cluster.clusterfile import CLUSTER_ENV, ClusterFile, NodeEntry, cluster_path


def test_how_a_cluster_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    f, root = tmp_path / "c.toml", tmp_path / "root"
    assert cluster_path(f, root) == f  # the file wins
    assert cluster_path(None, root) == root / "cluster.toml"
    assert cluster_path(None, None) == Path(".shuttle/cluster.toml")
    monkeypatch.setenv(CLUSTER_ENV, str(f))
    assert cluster_path(None, None) == f
    assert cluster_path(None, root) == root / "cluster.toml"  # a flag beats the environment


@pytest.fixture
def stopped_cluster(tmp_path: Path) -> Path:
    """A cluster file under ROOT whose one node is not running (its port is closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = NodeEntry("n1", "127.0.0.1", port, tmp_path / "root" / "n1")
    ClusterFile("local", tmp_path / "root", (node,), {"default": "loopback"}).save(
        tmp_path / "root" / "cluster.toml"
    )
    return tmp_path / "root"


@pytest.mark.parametrize("command", ["status", "down"])
@pytest.mark.parametrize("naming", ["--root", "--cluster", "env"])
def test_status_and_down_take_root_cluster_or_the_environment(
    stopped_cluster: Path, command: str, naming: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    args = [command]
    if naming == "--root":
        args += ["--root", str(stopped_cluster)]
    elif naming == "--cluster":
        args += ["--cluster", str(stopped_cluster / "cluster.toml")]
    else:
        monkeypatch.setenv(CLUSTER_ENV, str(stopped_cluster / "cluster.toml"))
    result = CliRunner().invoke(app, args)
    if command == "status":
        assert result.exit_code == 6, result.output  # its node does not answer
        assert "n1" in result.output and "down" in result.output
    else:
        assert result.exit_code == 0, result.output
        assert "n1: not running" in result.output


@pytest.mark.parametrize("naming", ["--root", "--cluster", "env"])
def test_up_takes_the_same_names(
    tmp_path: Path, naming: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new cluster named by its file keeps its data beside the file."""
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    calls: list[tuple[Path, Path | None]] = []

    def fake_up(root: Path, *, cluster_path: Path | None = None, **_: object) -> ClusterFile:
        calls.append((root, cluster_path))
        return ClusterFile("local", root, (), {}, cluster_path)

    monkeypatch.setattr(local, "up", fake_up)
    where = tmp_path / "here"
    args = ["up"]
    if naming == "--root":
        args += ["--root", str(where)]
    elif naming == "--cluster":
        args += ["--cluster", str(where / "cluster.toml")]
    else:
        monkeypatch.setenv(CLUSTER_ENV, str(where / "cluster.toml"))
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert calls == [(where.resolve(), (where / "cluster.toml").resolve())]
