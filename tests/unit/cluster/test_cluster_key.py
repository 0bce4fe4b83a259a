"""The cluster file records the cluster's key file; ``cluster up`` writes the key once
and reuses it on every restart."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from shuttle.cluster import local
from shuttle.cluster.clusterfile import ClusterFile, NodeEntry
from shuttle.errors import ConfigError
from shuttle.net import auth


def cluster(tmp_path: Path, key_file: Path | None = None) -> ClusterFile:
    node = NodeEntry("n1", "127.0.0.1", 7401, tmp_path / "n1")
    return ClusterFile("local", tmp_path, (node,), {"default": "loopback"}, key_file=key_file)


def test_key_file_round_trips_through_toml(tmp_path: Path) -> None:
    key_file = tmp_path / "cluster.key"
    key = auth.write_key_file(key_file)
    saved = cluster(tmp_path, key_file).save(tmp_path / "cluster.toml")
    assert f'key_file = "{key_file}"' in (tmp_path / "cluster.toml").read_text()
    loaded = ClusterFile.load(tmp_path / "cluster.toml")
    assert loaded.key_file == key_file == saved.key_file
    assert loaded.key() == key


def test_a_cluster_without_a_key_file_has_no_key(tmp_path: Path) -> None:
    cluster(tmp_path).save(tmp_path / "cluster.toml")
    text = (tmp_path / "cluster.toml").read_text()
    assert "key_file" not in text
    assert ClusterFile.load(tmp_path / "cluster.toml").key() is None


def test_a_relative_key_file_is_relative_to_the_cluster_file(tmp_path: Path) -> None:
    doc = {
        "cluster": {"name": "c", "root": str(tmp_path), "key_file": "keys/cluster.key"},
        "nodes": [{"id": "n1", "host": "127.0.0.1", "port": 7401}],
    }
    spec = ClusterFile.from_dict(doc, tmp_path / "conf" / "cluster.toml")
    assert spec.key_file == tmp_path / "conf" / "keys" / "cluster.key"


def test_a_key_file_that_is_not_a_path_is_a_config_error(tmp_path: Path) -> None:
    doc = {
        "cluster": {"key_file": 42},
        "nodes": [{"id": "n1", "host": "127.0.0.1", "port": 7401}],
    }
    with pytest.raises(ConfigError, match="key_file must be a path"):
        ClusterFile.from_dict(doc, tmp_path / "cluster.toml")


def test_up_writes_the_key_once_and_reuses_it(tmp_path: Path) -> None:
    lines: list[str] = []
    first = local._ensure_key(cluster(tmp_path), lines.append)
    assert first.key_file == tmp_path / local.KEY_FILE_NAME
    assert stat.S_IMODE(first.key_file.stat().st_mode) == 0o600
    assert any("wrote" in line for line in lines)
    key = first.key()
    lines.clear()
    again = local._ensure_key(first, lines.append)
    assert again.key() == key and not lines  # nothing new written


def test_up_refuses_a_cluster_whose_key_file_is_open_to_others(tmp_path: Path) -> None:
    spec = local._ensure_key(cluster(tmp_path), lambda _: None)
    assert spec.key_file is not None
    spec.key_file.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        local._ensure_key(spec, lambda _: None)
