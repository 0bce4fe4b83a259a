"""The local Ceph (shuttle.cluster.ceph): it starts, serves reads and writes through
rados, survives a killed OSD with a size-3 pool, and every wait on it is bounded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from shuttle.cli import app
from shuttle.cluster import cli as cluster_cli
from shuttle.cluster.ceph import LocalCeph, connect, mon_command
from shuttle.cluster.cephconf import run_dir
from shuttle.errors import ConfigError, ExternalToolError, RequestTimeoutError


def test_started_ceph_serves_reads_and_writes(ceph: LocalCeph) -> None:
    info = ceph.info()
    assert info.conf_path.is_file() and info.keyring_path.is_file()
    conf = info.conf_path.read_text()
    assert "osd class load list = *" in conf and "osd class default list = *" in conf
    r = ceph.rados(timeout_s=5, op_timeout_s=10)
    try:
        with r.open_ioctx(info.pool) as io:
            io.write_full("hello", b"world")
            assert io.read("hello") == b"world"
            io.remove_object("hello")
            # cls_lua loads (it is not in Ceph's default class lists; the conf allows all).
            script = 'function f(input, output) output:append("hi " .. input:str()) end'
            call = {"script": script + " objclass.register(f)", "handler": "f", "input": "ceph"}
            io.write_full("cls", b"")
            assert io.execute("cls", "lua", "eval_json", json.dumps(call).encode())[1] == b"hi ceph"
            io.remove_object("cls")
        detail = json.loads(mon_command(r, prefix="osd pool get", pool=info.pool, var="size"))
        assert detail["size"] == 3
        detail = json.loads(mon_command(r, prefix="osd pool get", pool=info.pool, var="min_size"))
        assert detail["min_size"] == 2
    finally:
        r.shutdown()
    assert all(ceph.running().values())
    assert 0 < ceph.memory_bytes() < 2 << 30


def test_pool_survives_a_killed_osd_and_the_osd_comes_back(ceph: LocalCeph) -> None:
    r = ceph.rados(timeout_s=5, op_timeout_s=15)
    try:
        with r.open_ioctx(ceph.pool) as io:
            before = {f"before-{k}": b"%d" % k for k in range(16)}
            for name, data in before.items():
                io.write_full(name, data)
            ceph.stop_osd(1)
            try:
                assert not ceph.running()["osd.1"]
                # Every PG still has two replicas (min_size 2): reads and writes go on.
                assert all(io.read(name) == data for name, data in before.items())
                during = {f"during-{k}": b"x%d" % k for k in range(16)}
                for name, data in during.items():
                    io.write_full(name, data)
            finally:
                ceph.start_osd(1, timeout_s=60)
            assert ceph.running()["osd.1"]
            dump = json.loads(mon_command(r, prefix="osd dump"))
            assert all(o["up"] for o in dump["osds"])
            for name, data in {**before, **during}.items():
                assert io.read(name) == data
                io.remove_object(name)
    finally:
        r.shutdown()


def test_pool_that_cannot_go_active_fails_within_the_bound(ceph: LocalCeph) -> None:
    # One host, and a rule that puts each replica on its own host: each PG gets one
    # OSD, below min_size 2, so it never goes active and I/O to it would hang.
    admin = ceph.admin()
    mon_command(
        admin, prefix="osd crush rule create-replicated", name="by-host", root="default",
        type="host",
    )  # fmt: skip
    ceph.create_pool("stuck", size=3, min_size=2, pg_num=4, rule="by-host")
    try:
        t0 = time.monotonic()
        with pytest.raises(
            RequestTimeoutError, match=r"pool stuck: placement groups .* not active"
        ):
            ceph.wait_active("stuck", timeout_s=3)
        assert time.monotonic() - t0 < 15
    finally:
        ceph.delete_pool("stuck")
        mon_command(admin, prefix="osd crush rule rm", name="by-host")


def test_connecting_to_no_mon_fails_within_the_bound(tmp_path: Path) -> None:
    conf = tmp_path / "ceph.conf"
    conf.write_text("[global]\nmon host = v1:127.0.0.1:9\nauth client required = none\n")
    t0 = time.monotonic()
    with pytest.raises(RequestTimeoutError, match="could not connect to Ceph"):
        connect(conf, timeout_s=2)
    assert time.monotonic() - t0 < 10


def test_bad_settings_are_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="osds must be in"):
        LocalCeph(tmp_path / "a", osds=0)
    with pytest.raises(ConfigError, match=r"size 4 .* <= osds"):
        LocalCeph(tmp_path / "b", osds=3, size=4)
    with pytest.raises(ConfigError, match="min_size <= size"):
        LocalCeph(tmp_path / "c", osds=3, size=2, min_size=3)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "precious").write_text("not Ceph's")
    with pytest.raises(ConfigError, match="not empty"):
        LocalCeph(tmp_path / "full").start()
    assert (tmp_path / "full" / "precious").read_text() == "not Ceph's"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_cluster_up_ceph_restart_keeps_the_data_and_down_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # In-process CLI (the node and Ceph processes are real): a `shuttle` subprocess
    # costs seconds of imports each on a loaded machine. A wide console prints paths whole.
    monkeypatch.setattr(cluster_cli, "console", Console(width=300))
    root, cli = tmp_path / "c", CliRunner()
    up_args = ["cluster", "up", "--ceph", "--ceph-osds", "1", "--nodes", "1", "--root", str(root)]
    up = cli.invoke(app, up_args)
    assert up.exit_code == 0, up.output
    ceph = LocalCeph(root / "ceph")
    env = {"SHUTTLE_CLUSTER": str(root / "cluster.toml")}
    try:
        assert "ceph pool:    shuttle" in up.output and str(ceph.conf_path) in up.output
        assert (ceph.osds, ceph.size) == (1, 1) and all(ceph.running().values())
        # The node keeps its objects in the pool, not in its data directory.
        put = cli.invoke(app, ["put", "-", "k"], input=b"in rados", env=env)
        assert put.exit_code == 0, put.output
        r = ceph.rados(op_timeout_s=10)
        with r.open_ioctx("shuttle") as io:
            assert sum(1 for _ in io.list_objects()) > 0
            io.write_full("kept", b"across a restart")
        r.shutdown()
        # Every Ceph daemon crashes; `cluster up` (no --ceph needed) brings the Ceph
        # back from ROOT/ceph with its data (bluestore keeps it), and the node goes on.
        ceph.kill_all()
        assert not any(ceph.running().values())
        again = cli.invoke(app, ["cluster", "up", "--root", str(root)])
        assert again.exit_code == 0, again.output
        ceph = LocalCeph(root / "ceph")
        assert all(ceph.running().values())
        r = ceph.rados(op_timeout_s=10)
        with r.open_ioctx("shuttle") as io:
            assert io.read("kept") == b"across a restart"
        r.shutdown()
        cat = cli.invoke(app, ["cat", "k"], env=env)
        assert cat.exit_code == 0 and cat.output == "in rados", cat.output
        status = cli.invoke(app, ["cluster", "status"], env=env)
        assert "ceph: mon.a running, osd.0 running" in status.output
    finally:
        down = cli.invoke(app, ["cluster", "down", "--root", str(root)])
    assert down.exit_code == 0, down.output
    assert "ceph: stopped" in down.output
    assert not (root / "ceph").exists()
    assert not any(_alive(pid) for pid in ceph.pids.values())


def test_a_daemon_that_fails_to_start_is_named_with_its_log(tmp_path: Path) -> None:
    # A bluestore file far too small for bluestore: the OSD's mkfs fails.
    broken = LocalCeph(tmp_path / "b", osds=1, osd_size_bytes=1 << 20, start_timeout_s=30)
    t0 = time.monotonic()
    try:
        with pytest.raises(ExternalToolError, match=r"osd\.0 failed .* see .*osd\.0\.mkfs\.out"):
            broken.start()
        assert time.monotonic() - t0 < 30
        assert not any(broken.running().values())  # the mon it started is gone
        with pytest.raises(ConfigError, match="not empty"):  # half made: not reused
            LocalCeph(tmp_path / "b", osds=1).start()
    finally:
        broken.down()  # its admin-socket folder too (under /tmp for a long root)


def test_a_long_root_keeps_its_admin_sockets_in_a_short_folder(tmp_path: Path) -> None:
    short, long = Path("/tmp/c"), tmp_path / ("x" * 80)
    assert run_dir(short) == short / "run"
    assert run_dir(long) == run_dir(long) and not run_dir(long).is_relative_to(long)
    # The longest socket name a daemon or a client makes fits a Unix socket path.
    worst = run_dir(long) / "client.admin.4194304.140737488355327.asok"
    assert len(str(worst).encode()) < 108
