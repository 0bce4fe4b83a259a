"""Principals with capabilities against real node processes on 127.0.0.1: principals
made with ``shuttle cluster user``, each checked by every node on every operation,
directly, through the FUSE mount, through fsspec, through shipped objects and
built-in greps (the run-time acts for the object's creator), and changed or
removed while clients are connected (docs/security.md, "Principals and capabilities")."""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shuttle
from shuttle.apps.grep import run_grep
from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.cluster import principals as cluster_ops
from shuttle.cluster.clusterfile import ClusterFile, NodeEntry
from shuttle.errors import AuthenticationError, NotPermittedError, UnreachableError
from shuttle.faces.fsspec_fs import ShuttleFileSystem
from shuttle.faces.mount import MountProcess, fuse_unavailable_reason
from shuttle.net import auth
from shuttle.net.blocking import BlockingConnection
from shuttle.net.principals import Caps
from shuttle.runtime.client import Runtime
from shuttle.runtime.mobile import MobileObject
from tests.integration.nodeproc import NodeProcess, shuttle_cli

#: What the administrator stores before each test's principals look at it.
DATA = {
    "data/a.txt": b"alpha ERROR one\n",
    "data/sub/c.txt": b"gamma ERROR three\n",
    "secret/b.txt": b"the ERROR nobody may see\n",
    "secretive.txt": b"a neighbour of secret/ by name only\n",
}


class KeyedCluster:
    """Keyed node processes and the cluster file an administrator holds (with the
    cluster key): what ``shuttle cluster user`` works on."""

    def __init__(self, tmp: Path, count: int = 2, extra: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.key_file = tmp / "cluster.key"
        self.key = auth.write_key_file(self.key_file)
        self.procs = [
            NodeProcess(tmp / f"n{i + 1}", extra=["--key-file", str(self.key_file), *extra])
            for i in range(count)
        ]
        starters = [threading.Thread(target=p.start) for p in self.procs]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        assert all(p.alive() for p in self.procs), "a node did not start"
        self.path = self.write_cluster_file()

    def write_cluster_file(self) -> Path:
        nodes = tuple(
            NodeEntry(p.data_dir.name, "127.0.0.1", p.port, p.data_dir) for p in self.procs
        )
        path = self.tmp / "cluster.toml"
        ClusterFile("caps", self.tmp, nodes, key_file=self.key_file).save(path)
        return path

    def addresses(self) -> list[NodeAddress]:
        return [NodeAddress(p.data_dir.name, "127.0.0.1", p.port, None) for p in self.procs]

    def user(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        """``shuttle cluster user ARGS --cluster FILE`` as the administrator."""
        return shuttle_cli("cluster", "user", *args, "--cluster", str(self.path), env=_no_env())

    def add(self, name: str, *flags: str, key_out: Path | None = None) -> Path:
        """A new principal with the caps ``flags`` say (as the command's: ``--read P``,
        ``--ship``...), made in this process (what ``shuttle cluster user add`` runs);
        its key file."""
        key_out = key_out or self.tmp / f"{name}.key"
        outcome = cluster_ops.add(self.spec(), self.credentials(), name, caps_of(flags), key_out)
        assert not outcome.missed
        return key_out

    def set_caps(self, name: str, *flags: str) -> None:
        outcome = cluster_ops.set_caps(self.spec(), self.credentials(), name, caps_of(flags))
        assert not outcome.missed

    def spec(self) -> ClusterFile:
        return ClusterFile.load(self.path)

    def credentials(self) -> auth.Credentials:
        return auth.Credentials(self.key)

    def admin(self) -> Client:
        return Client(self.addresses(), key=self.key, request_timeout_s=30)

    def client(self, key_file: Path) -> Client:
        return shuttle.connect(cluster=self.path, key_file=key_file, request_timeout_s=30)

    def runtime(self, key_file: Path) -> Runtime:
        return Runtime.connect(cluster=self.path, key_file=key_file)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()


def caps_of(flags: tuple[str, ...]) -> Caps:
    """``("--read", "data/", "--ship")`` as :class:`Caps`."""
    read, write, rest = [], [], list(flags)
    while rest:
        flag = rest.pop(0)
        if flag in ("--read", "--write"):
            (read if flag == "--read" else write).append(rest.pop(0))
        else:
            assert flag in ("--ship", "--admin"), flag
    return Caps.of(read, write, "--ship" in flags, "--admin" in flags)


def _no_env() -> dict[str, str]:
    return {auth.KEY_FILE_ENV: "", "SHUTTLE_CLUSTER": ""}


def one_line(text: bytes) -> str:
    return " ".join(text.decode().split())


@pytest.fixture(autouse=True)
def no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.KEY_FILE_ENV, raising=False)
    monkeypatch.delenv("SHUTTLE_CLUSTER", raising=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyedCluster]:
    c = KeyedCluster(tmp_path_factory.mktemp("caps"))
    with c.admin() as admin:
        for key, data in DATA.items():
            admin.put(key, data)
    yield c
    c.stop()


_NAMES = iter(range(1000))


def fresh(prefix: str) -> str:
    """A principal name no other test of the module uses."""
    return f"{prefix}{next(_NAMES)}"


class Peek(MobileObject):
    """Shipped code that reads and lists through a node's storage object."""

    def __init__(self, storage: Any) -> None:
        self.storage = storage

    def read(self, key: str) -> bytes:
        data: bytes = self.storage.read(key)
        return data

    def keys(self, prefix: str = "") -> list[str]:
        keys: list[str] = self.storage.list(prefix)["keys"]
        return keys


# --- what a read-only principal may not do -------------------------------------------------


def test_a_read_only_principal_cannot_put_remove_truncate_or_ship(cluster: KeyedCluster) -> None:
    name = fresh("reader")
    reader = cluster.tmp / f"{name}.key"
    made = cluster.user("add", name, "--read", "data/", "--key-out", str(reader))
    assert made.returncode == 0, made.stderr
    assert f"principal {name}: read 'data/'" in one_line(made.stdout)
    assert reader.stat().st_mode & 0o777 == 0o600
    with cluster.client(reader) as c:
        assert c.get("data/a.txt") == DATA["data/a.txt"]
        attempts = {
            "put": lambda: c.put("data/a.txt", b"changed"),
            "remove": lambda: c.remove("data/a.txt"),
            "truncate": lambda: c.truncate("data/a.txt", 0),
            "write": lambda: c.write("data/a.txt", 0, b"X"),
            "create": lambda: c.create("data/new.txt"),
            "upload": lambda: c.put("data/big.bin", bytes(3 << 20)),  # streamed: upload.begin
        }
        for what, attempt in attempts.items():
            with pytest.raises(NotPermittedError, match=r"write capability") as info:
                attempt()
            assert "'data/" in str(info.value), what
        assert not c.exists("data/new.txt") and not c.exists("data/big.bin")
    with cluster.admin() as admin:
        assert admin.get("data/a.txt") == DATA["data/a.txt"]  # nothing changed
    node = cluster.procs[0].data_dir.name
    with (
        cluster.runtime(reader) as rt,
        pytest.raises(NotPermittedError, match=r"may not ship code.*ship capability"),
    ):
        rt.create(Peek, at=node, storage=rt.storage(node))
    cli = shuttle_cli(
        "rm", "data/a.txt", "--cluster", str(cluster.path), "--key-file", str(reader), env=_no_env()
    )
    assert cli.returncode == NotPermittedError.exit_code == 10
    assert "(not_permitted)" in one_line(cli.stderr) and "may not remove 'data/a.txt'" in one_line(
        cli.stderr
    )


# --- a prefix-bound principal, every way in ---------------------------------------------------


def test_a_prefix_bound_principal_neither_reads_nor_lists_outside_its_prefix(
    cluster: KeyedCluster,
) -> None:
    name = fresh("bound")
    bound = cluster.add(name, "--read", "data/", "--write", "data/")
    with cluster.client(bound) as c:
        assert sorted(c.list()) == ["data/a.txt", "data/sub/c.txt"]
        assert sorted(c.list("secret")) == []
        assert c.listdir("") == (["data/"], [])
        assert c.listdir("secret/") == ([], [])
        for key in ("secret/b.txt", "secretive.txt"):
            with pytest.raises(NotPermittedError, match=rf"{name}.*may not .* '{key}'"):
                c.get(key)
            with pytest.raises(NotPermittedError):
                c.stat(key)
        with pytest.raises(NotPermittedError):
            c.stat_many(["data/a.txt", "secret/b.txt"])
        c.put("data/mine.txt", b"mine")  # within its prefix it may write
        assert c.get("data/mine.txt") == b"mine"
        c.remove("data/mine.txt")


def test_shuttle_put_works_for_a_principal_that_cannot_read_the_parent_names(
    cluster: KeyedCluster, tmp_path: Path
) -> None:
    """``shuttle put`` first asks every node whether a parent of the key is an object
    (client/namespace.py); a principal that may write under ``scratch/`` but not read
    the name ``scratch`` (the README tour's alice) must still be able to put there,
    and a write outside its prefix is still refused by the node, naming the write
    capability."""
    name = fresh("writer")
    writer = cluster.add(name, "--read", "data/", "--write", "scratch/", "--write", "data/")
    local = tmp_path / "notes.txt"
    local.write_bytes(b"notes\n")

    def put(key: str) -> subprocess.CompletedProcess[bytes]:
        return shuttle_cli(
            "put", str(local), key, "--cluster", str(cluster.path), "--key-file", str(writer),
            env=_no_env(),
        )  # fmt: skip

    for key in ("scratch/notes.txt", "data/deeper/notes.txt"):
        done = put(key)
        assert done.returncode == 0, done.stderr
        assert f"{key}: 6 bytes" in one_line(done.stdout)
    refused = put("secret/notes.txt")
    assert refused.returncode == NotPermittedError.exit_code, refused.stderr
    assert "may not" in one_line(refused.stderr) and "write capability" in one_line(refused.stderr)
    with cluster.admin() as admin:
        assert admin.get("scratch/notes.txt") == b"notes\n"
        assert not admin.exists("secret/notes.txt")
        admin.remove("scratch/notes.txt")
        admin.remove("data/deeper/notes.txt")


def test_listings_show_the_way_down_to_a_deep_prefix_and_nothing_beside_it(
    cluster: KeyedCluster,
) -> None:
    deep = cluster.add(fresh("deep"), "--read", "data/sub/")
    with cluster.client(deep) as c:
        assert sorted(c.list()) == ["data/sub/c.txt"]
        conn = c.connection(c.node_for("data/sub/c.txt"))
        top = conn.call("list", {"prefix": "", "delimiter": "/"}).result
        assert top["keys"] == [] and top["prefixes"] in (["data/"], [])
        below = conn.call("list", {"prefix": "data/", "delimiter": "/"}).result
        assert below["keys"] == [] and below["prefixes"] in (["data/sub/"], [])
        everywhere = [
            n.call("list", {"prefix": "", "delimiter": "/"}).result["prefixes"]
            for n in (c.connection(a) for a in c.nodes)
        ]
        assert ["data/"] in everywhere  # the node holding data/sub/c.txt shows the way


def test_fsspec_shows_a_principal_only_its_prefix(cluster: KeyedCluster) -> None:
    bound = cluster.add(fresh("fsspec"), "--read", "data/")
    fs = ShuttleFileSystem(cluster=str(cluster.path), key_file=str(bound), skip_instance_cache=True)
    assert fs.ls("", detail=False) == ["data"]
    assert sorted(fs.find("")) == ["data/a.txt", "data/sub/c.txt"]
    assert fs.cat("data/a.txt") == DATA["data/a.txt"]
    with pytest.raises(PermissionError):
        fs.cat("secret/b.txt")
    with pytest.raises(PermissionError):
        fs.pipe("data/new.txt", b"no write capability")
    assert not fs.exists("secret") and not fs.exists("secret/b.txt")


def test_the_mount_shows_a_principal_only_its_prefix(cluster: KeyedCluster, tmp_path: Path) -> None:
    reason = fuse_unavailable_reason()
    if reason is not None or os.geteuid() != 0:
        pytest.skip(f"no FUSE mount here: {reason or 'needs root'}")
    bound = cluster.add(fresh("mount"), "--read", "data/")
    args = ["--cluster", str(cluster.path), "--key-file", str(bound), "--validation", "check"]
    with MountProcess(tmp_path / "m", args) as m:
        mnt = m.mountpoint
        assert os.listdir(mnt) == ["data"]
        assert sorted(os.listdir(mnt / "data")) == ["a.txt", "sub"]
        assert (mnt / "data" / "a.txt").read_bytes() == DATA["data/a.txt"]
        for path in (mnt / "secret" / "b.txt", mnt / "secretive.txt"):
            with pytest.raises(OSError) as info:
                path.read_bytes()
            assert info.value.errno in (errno.ENOENT, errno.EACCES)
        with pytest.raises(PermissionError) as denied:
            (mnt / "data" / "new.txt").write_bytes(b"no write capability")
        assert denied.value.errno == errno.EACCES
        grep = subprocess.run(
            ["grep", "-r", "ERROR", "."], cwd=mnt, capture_output=True, timeout=30, check=False
        )
        assert b"nobody may see" not in grep.stdout
        assert sorted(grep.stdout.splitlines()) == [
            b"./data/a.txt:alpha ERROR one",
            b"./data/sub/c.txt:gamma ERROR three",
        ]


def test_shipped_objects_act_for_their_principal_wherever_they_run(
    cluster: KeyedCluster,
) -> None:
    shipper = cluster.add(fresh("shipper"), "--read", "data/", "--ship")
    with cluster.admin() as admin:
        node = admin.node_for("secret/b.txt").node_id
        near = [k for k in DATA if admin.node_for(k).node_id == node]
    other = next(p.data_dir.name for p in cluster.procs if p.data_dir.name != node)
    with cluster.runtime(shipper) as rt:
        peek = rt.create(Peek, at=node, storage=rt.storage(node), placement="static")
        for where in (node, "client", other, node):  # moved by node, client and node again
            if rt.where(peek) != (rt.id if where == "client" else where):
                rt.migrate(peek, where)
            assert sorted(peek.keys()) == sorted(k for k in near if k.startswith("data/"))
            with pytest.raises(NotPermittedError, match=r"may not read 'secret/b.txt'"):
                peek.read("secret/b.txt")
            if "data/a.txt" in near:
                assert peek.read("data/a.txt") == DATA["data/a.txt"]


def test_a_principal_may_not_call_another_principal_s_object(cluster: KeyedCluster) -> None:
    owner = cluster.add(fresh("owner"), "--read", "", "--ship")
    thief = cluster.add(fresh("thief"), "--read", "data/", "--ship")
    with cluster.admin() as admin:
        node = admin.node_for("secret/b.txt").node_id
    with cluster.runtime(owner) as rt_owner, cluster.runtime(thief) as rt_thief:
        peek = rt_owner.create(Peek, at=node, storage=rt_owner.storage(node), placement="static")
        stolen = rt_thief.bm.ref(peek.rid, peek.home_address)
        # Its home (the owner's run-time) does not even say where it is to the thief...
        with pytest.raises(AuthenticationError, match=r"serves principal 'owner"):
            stolen.read("secret/b.txt")
        # ...and the node that runs it refuses the thief's call.
        rt_thief.bm.table.heard(peek.rid, node)
        with pytest.raises(NotPermittedError, match=r"belongs to principal 'owner"):
            stolen.read("secret/b.txt")
        assert peek.read("secret/b.txt") == DATA["secret/b.txt"]  # its owner still may


def test_a_built_in_grep_reads_only_what_its_principal_may(cluster: KeyedCluster) -> None:
    grepper = cluster.add(fresh("grepper"), "--read", "data/")
    with cluster.runtime(grepper) as rt:
        result = run_grep(rt, "ERROR", ["data/a.txt", "data/sub/c.txt"], placement="server")
        assert result.matches == 2
        for placement in ("server", "client"):
            with pytest.raises(NotPermittedError, match=r"may not read 'secret/b.txt'"):
                run_grep(rt, "ERROR", ["data/a.txt", "secret/b.txt"], placement=placement)
    cli = shuttle_cli(
        "grep",
        "ERROR",
        "secret/",
        "--cluster",
        str(cluster.path),
        "--key-file",
        str(grepper),
        env=_no_env(),
    )
    assert cli.returncode != 0 and b"nobody may see" not in cli.stdout
    seen = shuttle_cli(
        "grep",
        "ERROR",
        "data/",
        "--cluster",
        str(cluster.path),
        "--key-file",
        str(grepper),
        env=_no_env(),
    )
    assert seen.returncode == 0, seen.stderr
    assert b"nobody may see" not in seen.stdout and seen.stdout.count(b"ERROR") == 2


# --- changes while connected --------------------------------------------------------------------


def test_caps_changes_take_effect_on_open_connections_without_a_restart(
    cluster: KeyedCluster,
) -> None:
    name = fresh("grow")
    key_file = cluster.add(name, "--read", "data/")
    with cluster.client(key_file) as c:
        with pytest.raises(NotPermittedError):
            c.get("secret/b.txt")
        assert sorted(c.list()) == ["data/a.txt", "data/sub/c.txt"]  # connected to all
        connects = sum(c.connection(n).counters.connects for n in c.nodes)
        changed = cluster.user("caps", name, "--read", "data/", "--read", "secret/")
        assert changed.returncode == 0, changed.stderr
        assert c.get("secret/b.txt") == DATA["secret/b.txt"]
        assert sorted(c.list()) == ["data/a.txt", "data/sub/c.txt", "secret/b.txt"]
        cluster.set_caps(name, "--read", "secret/")
        with pytest.raises(NotPermittedError):
            c.get("data/a.txt")
        assert sum(c.connection(n).counters.connects for n in c.nodes) == connects  # same ones


def test_a_removed_principal_is_refused_and_its_open_connections_closed(
    cluster: KeyedCluster,
) -> None:
    name = fresh("gone")
    key_file = cluster.add(name, "--read", "data/")
    creds = auth.load_credentials(key_file)
    node = cluster.procs[0]
    conn = BlockingConnection("127.0.0.1", node.port, key=creds.key, principal=name)
    conn.connect()
    assert conn.call("ping").result["node"] == node.data_dir.name
    removed = cluster.user("remove", name)
    assert removed.returncode == 0, removed.stderr
    with pytest.raises((AuthenticationError, UnreachableError)):  # the node closed it
        conn.call("ping", idempotent=False)
    with pytest.raises(AuthenticationError, match=rf"knows no principal '{name}'"):
        conn.call("ping")  # the next connection is refused
    conn.close()
    cli = shuttle_cli(
        "cat",
        "data/a.txt",
        "--cluster",
        str(cluster.path),
        "--key-file",
        str(key_file),
        env=_no_env(),
    )
    assert cli.returncode == AuthenticationError.exit_code
    listed = cluster.user("list", "--json")
    assert name not in listed.stdout.decode()
    # Adding the name again makes a new key: the old file stays useless.
    again = cluster.add(name, "--read", "data/", key_out=cluster.tmp / f"{name}.again.key")
    assert auth.load_credentials(again).key != creds.key
    with cluster.client(key_file) as old, pytest.raises(AuthenticationError):
        old.get("data/a.txt")


def test_principals_survive_a_node_restart_and_a_node_that_missed_a_change_is_synced(
    cluster: KeyedCluster,
) -> None:
    name = fresh("lasting")
    key_file = cluster.add(name, "--read", "data/")
    for proc in cluster.procs:
        proc.restart()  # SIGKILL, then start on the same port
    with cluster.client(key_file) as c:
        assert sorted(c.list()) == ["data/a.txt", "data/sub/c.txt"]
        with pytest.raises(NotPermittedError):
            c.get("secret/b.txt")
    down = cluster.procs[1]
    down.kill()
    try:
        removed = cluster.user("remove", name)
        assert removed.returncode == 6, removed.stderr  # done, but one node not reached
        assert down.data_dir.name in one_line(removed.stderr)
        assert "user sync" in one_line(removed.stderr)
        listed = cluster.user("list")
        assert listed.returncode == 6 and f"node {down.data_dir.name}" in one_line(listed.stderr)
    finally:
        down.start()
    creds = auth.load_credentials(key_file)
    stale = BlockingConnection("127.0.0.1", down.port, key=creds.key, principal=name)
    with stale:
        stale.call("ping")  # the node that was down still has the older table
    synced = cluster.user("sync")
    assert synced.returncode == 0, synced.stderr
    with pytest.raises(AuthenticationError), stale:
        stale.call("ping")


def test_admin_principals_manage_principals_and_others_may_not(cluster: KeyedCluster) -> None:
    admin = cluster.add(fresh("admin"), "--admin")
    plain = cluster.add(fresh("plain"), "--read", "")
    target = fresh("made")
    key_out = cluster.tmp / f"{target}.key"

    def as_(key: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
        return shuttle_cli(
            "cluster",
            "user",
            *args,
            "--cluster",
            str(cluster.path),
            "--key-file",
            str(key),
            env=_no_env(),
        )

    refused = as_(plain, "add", target, "--read", "data/", "--key-out", str(key_out))
    assert refused.returncode == NotPermittedError.exit_code, refused.stderr
    assert "admin capability" in one_line(refused.stderr) and not key_out.exists()
    made = as_(admin, "add", target, "--read", "data/", "--key-out", str(key_out))
    assert made.returncode == 0, made.stderr
    with cluster.client(key_out) as c:
        assert c.get("data/a.txt") == DATA["data/a.txt"]
    stats = shuttle_cli(
        "stats", "--cluster", str(cluster.path), "--key-file", str(plain), env=_no_env()
    )
    assert stats.returncode == NotPermittedError.exit_code
    assert "admin" in one_line(stats.stderr)
