"""What ``shuttle cluster up`` starts each node with: a keyed node is told the cluster
file, so it can take principals changes it missed from the other nodes."""

from __future__ import annotations

from pathlib import Path

from shuttle.cluster.clusterfile import NodeEntry
from shuttle.cluster.local import _serve_argv


def _entry(tmp_path: Path) -> NodeEntry:
    return NodeEntry("n1", "127.0.0.1", 0, tmp_path / "n1")


def test_a_keyed_node_is_told_the_cluster_file(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    argv = _serve_argv(_entry(tmp_path), tmp_path / "r", tmp_path / "cluster.key", None, path)
    assert argv[argv.index("--cluster-file") + 1] == str(path)


def test_a_node_without_a_key_has_no_principals_to_catch_up_on(tmp_path: Path) -> None:
    argv = _serve_argv(_entry(tmp_path), tmp_path / "r", None, None, tmp_path / "cluster.toml")
    assert "--cluster-file" not in argv
