"""The ``shuttle`` command's surface against a real cluster (issue 25, item 9): at 80
columns ``cluster status`` shows every address whole and ``stats`` every header;
``cluster up --nodes N`` on a cluster of another size says so and changes nothing;
``mount`` refuses a directory that is mounted already or not empty."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.client.cli import STATS_COLUMNS
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.faces.mount import fuse_unavailable_reason, is_mounted
from tests.integration.nodeproc import shuttle_cli


def ok(result: object) -> str:
    assert result.returncode == 0, result.stderr.decode()  # type: ignore[attr-defined]
    return result.stdout.decode()  # type: ignore[attr-defined]


#: Why this machine cannot mount (None: it can), said as the skip's reason.
_NO_FUSE = fuse_unavailable_reason()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A three-node cluster made by ``shuttle cluster up``, as a user makes one."""
    root = tmp_path_factory.mktemp("surface") / "c"
    ok(shuttle_cli("cluster", "up", "--nodes", "3", "--root", str(root)))
    try:
        yield root
    finally:
        ok(shuttle_cli("cluster", "down", "--root", str(root)))


def at_80(*args: str, root: Path) -> str:
    env = {"COLUMNS": "80", "SHUTTLE_CLUSTER": str(root / "cluster.toml")}
    return ok(shuttle_cli(*args, env=env))


def test_cluster_status_at_80_columns_shows_each_address_whole(root: Path) -> None:
    out = at_80("cluster", "status", root=root)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    for node in ClusterFile.load(root / "cluster.toml").nodes:
        assert re.search(rf"│ {node.id} +│ {re.escape(node.address)} ", out), out


def test_stats_at_80_columns_shows_every_header_and_figure(root: Path) -> None:
    ok(shuttle_cli("put", "-", "k", "--cluster", str(root / "cluster.toml"), input=b"x"))
    out = at_80("stats", root=root)
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    for header in STATS_COLUMNS[1:]:
        assert re.search(rf"(?<!\w){re.escape(header)}(?!\w)", out), (header, out)
    for node in ClusterFile.load(root / "cluster.toml").nodes:
        assert node.id in out
    wide = ok(
        shuttle_cli("stats", env={"COLUMNS": "200", "SHUTTLE_CLUSTER": str(root / "cluster.toml")})
    )
    assert all(header in wide for header in STATS_COLUMNS)  # a row per node when it fits


def test_cluster_up_with_another_node_count_says_so_and_changes_nothing(root: Path) -> None:
    before = (root / "cluster.toml").read_text()
    grown = shuttle_cli("cluster", "up", "--nodes", "5", "--root", str(root))
    assert grown.returncode == 2
    message = grown.stderr.decode()
    assert "has 3 node(s); --nodes 5 cannot change it" in message
    assert "--nodes 5 --root" in message  # how to get five
    assert (root / "cluster.toml").read_text() == before
    assert len(ClusterFile.load(root / "cluster.toml").nodes) == 3
    # The same number, or none, restarts what is there.
    assert "already running" in ok(
        shuttle_cli("cluster", "up", "--nodes", "3", "--root", str(root))
    )
    assert "already running" in ok(shuttle_cli("cluster", "up", "--root", str(root)))


@pytest.mark.skipif(_NO_FUSE is not None, reason=_NO_FUSE or "")
def test_mount_refuses_a_mounted_or_non_empty_directory(root: Path, tmp_path: Path) -> None:
    cluster = ("--cluster", str(root / "cluster.toml"))
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    try:
        refused = shuttle_cli("mount", str(full), *cluster)
        assert refused.returncode == 2
        assert b"is not empty (1 entries: notes.txt)" in refused.stderr
        assert not is_mounted(full) and (full / "notes.txt").read_text() == "mine"
        refused = shuttle_cli("mount", str(full), "--foreground", *cluster, timeout=30)
        assert refused.returncode == 2 and b"is not empty" in refused.stderr  # the child's check
    finally:
        if is_mounted(full):  # the check failed: leave no mount behind
            shuttle_cli("umount", "--lazy", str(full))

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    ok(shuttle_cli("mount", str(mnt), *cluster))
    try:
        again = shuttle_cli("mount", str(mnt), *cluster)
        assert again.returncode == 2
        assert b"is already a mount point" in again.stderr
        assert f"shuttle umount {mnt}".encode() in again.stderr
        mounts = Path("/proc/self/mounts").read_text()
        assert mounts.count(f" {os.path.realpath(mnt)} ") == 1  # not stacked
    finally:
        ok(shuttle_cli("umount", str(mnt)))
