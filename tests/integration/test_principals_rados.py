"""Principals of gateway nodes over one RADOS pool: the table lives in the pool (a new
gateway with an empty data directory knows every principal), and a change given to
one gateway reaches the others without a restart (docs/security.md)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.cluster import principals as cluster_ops
from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.clusterfile import ClusterFile, NodeEntry
from shuttle.errors import AuthenticationError, NotPermittedError, UnreachableError
from shuttle.net import auth
from shuttle.net.blocking import BlockingConnection
from shuttle.net.principals import Caps, PrincipalTable
from shuttle.node.principal_store import RADOS_REFRESH_S
from tests.integration.nodeproc import NodeProcess


class Gateways:
    def __init__(self, ceph: LocalCeph, root: Path) -> None:
        self.root = root
        self.key_file = root / "cluster.key"
        self.key = auth.write_key_file(self.key_file)
        self.extra = [
            *ceph.info().store_args(f"caps{secrets.token_hex(4)}"),
            "--key-file",
            str(self.key_file),
        ]
        self.procs = [NodeProcess(root / f"gw{i}", extra=self.extra).start() for i in range(2)]

    def cluster_file(self, procs: list[NodeProcess]) -> ClusterFile:
        nodes = tuple(NodeEntry(p.data_dir.name, "127.0.0.1", p.port, p.data_dir) for p in procs)
        path = self.root / f"cluster-{len(procs)}-{procs[0].port}.toml"
        return ClusterFile("gw", self.root, nodes, key_file=self.key_file).save(path)

    def client_of(self, proc: NodeProcess, key_file: Path) -> Client:
        creds = auth.load_credentials(key_file)
        return Client(
            [NodeAddress(proc.data_dir.name, "127.0.0.1", proc.port)],
            key=creds.key,
            principal=creds.principal,
            request_timeout_s=30,
        )


@pytest.fixture
def gateways(ceph: LocalCeph, tmp_path: Path) -> Iterator[Gateways]:
    g = Gateways(ceph, tmp_path)
    yield g
    for p in g.procs:
        p.terminate()


def test_gateways_share_principals_through_the_pool(gateways: Gateways, tmp_path: Path) -> None:
    g = gateways
    admin = auth.Credentials(g.key)
    with Client([NodeAddress("gw0", "127.0.0.1", g.procs[0].port)], key=g.key) as c:
        c.put("data/a.txt", b"shared")
        c.put("secret/b.txt", b"hidden")
    key_file = tmp_path / "alice.key"
    cluster_ops.add(g.cluster_file(g.procs), admin, "alice", Caps.of(read=["data/"]), key_file)
    for proc in g.procs:
        with g.client_of(proc, key_file) as c:
            assert c.get("data/a.txt") == b"shared"
            assert list(c.list()) == ["data/a.txt"]
            with pytest.raises(NotPermittedError):
                c.get("secret/b.txt")
    # A change given to gw0 only (the administrator could not reach gw1) reaches gw1
    # through the pool, and its open connections are closed.
    creds = auth.load_credentials(key_file)
    watcher = BlockingConnection("127.0.0.1", g.procs[1].port, key=creds.key, principal="alice")
    watcher.connect()
    only_gw0 = cluster_ops.remove(g.cluster_file(g.procs[:1]), admin, "alice")
    assert not only_gw0.missed
    deadline = time.monotonic() + 4 * RADOS_REFRESH_S
    refused = False
    while not refused:
        assert time.monotonic() < deadline, "gw1 never heard of the change in the pool"
        try:
            with BlockingConnection(
                "127.0.0.1", g.procs[1].port, key=creds.key, principal="alice"
            ) as probe:
                probe.call("ping")
            time.sleep(0.2)  # gw1 reloads the pool's table every RADOS_REFRESH_S
        except AuthenticationError:
            refused = True
    with pytest.raises((AuthenticationError, UnreachableError)):  # gw1 closed it
        watcher.call("ping", idempotent=False)
    watcher.close()
    # The table is in the pool: a new gateway with an empty data directory has it.
    key_file2 = tmp_path / "bob.key"
    cluster_ops.add(g.cluster_file(g.procs), admin, "bob", Caps.of(read=[""]), key_file2)
    fresh = NodeProcess(tmp_path / "gw-new", extra=g.extra).start()
    g.procs.append(fresh)
    assert not (fresh.data_dir / ".shuttle" / "principals.json").exists()
    with g.client_of(fresh, key_file2) as c:
        assert c.get("secret/b.txt") == b"hidden"
    with BlockingConnection("127.0.0.1", fresh.port, key=g.key) as conn:
        table = PrincipalTable.from_wire(conn.call("principals.get").result["table"], "gw-new")
    assert table.names() == ["bob"]
