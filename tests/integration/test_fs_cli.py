"""``shuttle fs`` as a user runs it against a local cluster of real nodes: mkdir, put
(plain and RAID 5), ls, stat, cat, rm, and clear errors; the data survives a restart
of the cluster."""

from __future__ import annotations

import os
from pathlib import Path

from tests.integration.nodeproc import shuttle_cli


def ok(result: object) -> str:
    assert result.returncode == 0, result.stderr.decode()  # type: ignore[attr-defined]
    return result.stdout.decode()  # type: ignore[attr-defined]


def test_mkdir_put_ls_stat_cat_rm_over_a_cluster_and_a_restart(tmp_path: Path) -> None:
    root = tmp_path / "c"
    ok(shuttle_cli("cluster", "up", "--nodes", "3", "--root", str(root)))
    env = {"SHUTTLE_CLUSTER": str(root / "cluster.toml")}
    plain, striped = os.urandom(50_000), os.urandom(300_000)
    (tmp_path / "plain").write_bytes(plain)
    (tmp_path / "striped").write_bytes(striped)
    try:
        ok(shuttle_cli("fs", "mkdir", "/logs", env=env))
        ok(shuttle_cli("fs", "put", str(tmp_path / "plain"), "/logs/a", env=env))
        out = ok(shuttle_cli("fs", "put", str(tmp_path / "striped"), "/logs/b", "--raid", env=env))
        assert "raid5" in out
        listing = ok(shuttle_cli("fs", "ls", "/logs", env=env))
        assert "a" in listing and "raid5" in listing and "plain" in listing
        assert "300000 bytes" in ok(shuttle_cli("fs", "stat", "/logs/b", env=env))
        ok(shuttle_cli("cluster", "down", env=env))
        ok(shuttle_cli("cluster", "up", "--root", str(root)))
        assert shuttle_cli("fs", "cat", "/logs/a", env=env).stdout == plain
        assert shuttle_cli("fs", "cat", "/logs/b", env=env).stdout == striped
        again = shuttle_cli("fs", "put", str(tmp_path / "plain"), "/logs/a", env=env)
        assert again.returncode != 0 and b"exists; remove it first" in again.stderr
        missing = shuttle_cli("fs", "cat", "/logs/nope", env=env)
        assert missing.returncode != 0 and b"no such file" in missing.stderr
        nonempty = shuttle_cli("fs", "rm", "/logs", env=env)
        assert nonempty.returncode != 0 and b"not empty" in nonempty.stderr
        ok(shuttle_cli("fs", "rm", "/logs/a", env=env))
        ok(shuttle_cli("fs", "rm", "/logs/b", env=env))
        ok(shuttle_cli("fs", "rm", "/logs", env=env))
        assert "logs" not in ok(shuttle_cli("fs", "ls", "/", env=env))
        # The data went with the names: no file objects are left on any node.
        assert ".files/" not in ok(shuttle_cli("ls", "-r", "default/", env=env))
    finally:
        ok(shuttle_cli("cluster", "down", env=env))
