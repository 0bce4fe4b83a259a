"""TLS against real node processes: every client and the run-time speak it, the key
proof is bound to the TLS channel (a relayed HELLO is refused), and the refusals are
clear: a certificate from another CA or for another host, a plain client at a TLS node
and a TLS client at a plain one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import shuttle
from shuttle.client.aio import AsyncClient
from shuttle.client.model import NodeAddress
from shuttle.cluster import local
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import (
    AuthenticationError,
    ConfigError,
    NotPermittedError,
    TlsError,
    UnreachableError,
)
from shuttle.net import auth, certs
from shuttle.net.tls import ClientTls
from shuttle.runtime.client import Runtime
from tests.integration.nodeproc import NodeProcess, shuttle_cli
from tests.integration.test_runtime import Counter
from tests.integration.wire_helpers import Pki, Relay, keyed_tls_node


@pytest.fixture(autouse=True)
def no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (auth.KEY_FILE_ENV, "SHUTTLE_CLUSTER", "SHUTTLE_TLS", "SHUTTLE_CA_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def tls_node(tmp_path: Path) -> Iterator[tuple[NodeProcess, Pki, Path]]:
    node, pki, key_file = keyed_tls_node(tmp_path)
    yield node, pki, key_file
    node.terminate()


def test_a_tls_node_serves_the_blocking_client_over_its_read_lane(
    tls_node: tuple[NodeProcess, Pki, Path],
) -> None:
    node, pki, key_file = tls_node
    big = bytes(range(256)) * (24 << 10)  # 6 MiB: an upload, and a streamed read
    with shuttle.connect(node=node.address, key_file=key_file, tls=True, ca_file=pki.ca.cert) as c:
        c.put("small", b"x" * 4096)
        c.put("big", big)
        for _ in range(20):
            assert c.read("small", 0, 4096) == b"x" * 4096
        assert c.get("big") == big
        assert c.read("big", 1000, 3 << 20) == big[1000 : 1000 + (3 << 20)]
        conn = c.connection(c.nodes[0])
        assert conn.counters.read_lane > 0  # type: ignore[attr-defined]
        server = c.node_stats(c.nodes[0])["server"]
    assert server["tls"] is True and server["read_lane"] > 0 and server["tls_failures"] == 0


def test_a_tls_node_serves_the_async_client(tls_node: tuple[NodeProcess, Pki, Path]) -> None:
    node, pki, key_file = tls_node
    big = bytes(range(256)) * (20 << 10)

    async def go() -> None:
        async with AsyncClient(
            [NodeAddress("node", "127.0.0.1", node.port)],
            key=auth.load_key_file(key_file),
            tls=ClientTls(pki.ca.cert),
        ) as c:
            await c.put("a", b"hello")
            await c.put("big", big)
            assert await c.get("a") == b"hello"
            assert await c.get("big") == big

    asyncio.run(go())


def test_the_run_time_speaks_tls_between_client_and_nodes_and_between_nodes(
    tmp_path: Path,
) -> None:
    """Objects move client → node → node and back over TLS; a node calls an
    application's run-time (its home) over TLS too, checked by the key proof."""
    ca = certs.make_ca(tmp_path / "ca")
    key_file = tmp_path / "cluster.key"
    key = auth.write_key_file(key_file)
    procs = []
    for name in ("n1", "n2"):
        pair = certs.make_node_cert(ca, tmp_path / "certs", name, "127.0.0.1")
        procs.append(
            NodeProcess(
                tmp_path / name,
                extra=[
                    "--key-file",
                    str(key_file),
                    "--tls",
                    "--tls-cert",
                    str(pair.cert),
                    "--tls-key",
                    str(pair.key),
                    "--ca-file",
                    str(ca.cert),
                ],
            ).start()
        )
    try:
        nodes = [NodeAddress(p.data_dir.name, "127.0.0.1", p.port) for p in procs]
        tls = ClientTls(ca.cert)
        with Runtime(nodes, key=key, tls=tls) as home, Runtime(nodes, key=key, tls=tls) as other:
            counter = home.create(Counter, at="n1")
            assert counter.add(2) == 2
            home.migrate(counter, "n2")  # n1 → n2: node to node
            assert counter.add(1) == 3
            home.migrate(counter, home.id)  # back to the application
            assert counter.add(1) == 4
            home.migrate(counter, "n1")
            stranger = other.bm.ref(counter.rid, counter.home_address)
            assert stranger.add(1) == 5
            home.migrate(counter, "n2")
            # n1 no longer has it: the caller asks the home, an application run-time
            # that n1 reaches over TLS with a self-signed certificate and the key proof.
            assert stranger.add(1) == 6
    finally:
        for p in procs:
            p.terminate()


def test_cluster_up_with_tls_makes_a_ca_and_its_clients_need_no_flags(tmp_path: Path) -> None:
    root = tmp_path / "c"
    up = shuttle_cli("cluster", "up", "--nodes", "1", "--root", str(root), "--tls")
    assert up.returncode == 0, up.stderr.decode()
    path = root / "cluster.toml"
    try:
        cluster = ClusterFile.load(path)
        assert cluster.tls and cluster.ca_file == root / "tls" / "ca.pem"
        assert (root / "tls" / "ca.key").stat().st_mode & 0o077 == 0
        assert (root / "tls" / "n1.key").stat().st_mode & 0o077 == 0
        with shuttle.connect(cluster=path) as c:  # no TLS flag, no CA: the file says
            c.put("k", b"over tls")
            c.put("docs/a", b"readable")
            assert c.tls is not None and c.get("k") == b"over tls"
        assert all(s.reachable for s in local.status(cluster))
        # The run-time of `shuttle grep` dials the nodes with TLS, and listens with it.
        grep = shuttle_cli("grep", "over", "k", "--placement", "server", "--cluster", str(path))
        assert grep.returncode == 0, grep.stderr.decode()
        assert grep.stdout == b"k:1:over tls\n"
        # A principal, added over TLS, proves its own key over TLS (bound to the channel).
        alice = tmp_path / "alice.key"
        add = shuttle_cli(
            "cluster",
            "user",
            "add",
            "alice",
            "--read",
            "docs/",
            "--key-out",
            str(alice),
            "--cluster",
            str(path),
        )
        assert add.returncode == 0, add.stderr.decode()
        with shuttle.connect(cluster=path, key_file=alice) as c:
            assert c.get("docs/a") == b"readable"
            with pytest.raises(NotPermittedError):
                c.put("docs/b", b"no")
        # Restarted, the nodes keep their certificates (still valid) and TLS.
        cert = (root / "tls" / "n1.pem").read_bytes()
        local.down(cluster)
        local.up(root, cluster_path=path)
        assert (root / "tls" / "n1.pem").read_bytes() == cert
        with shuttle.connect(cluster=path) as c:
            assert c.get("k") == b"over tls"
    finally:
        local.down(ClusterFile.load(path))


def test_a_certificate_from_another_ca_is_refused(
    tls_node: tuple[NodeProcess, Pki, Path], tmp_path: Path
) -> None:
    node, _pki, key_file = tls_node
    stranger = certs.make_ca(tmp_path / "stranger")
    with (
        pytest.raises(TlsError, match=r"failed verification.*the CA of this node's cluster"),
        shuttle.connect(node=node.address, key_file=key_file, tls=True, ca_file=stranger.cert) as c,
    ):
        c.stat("anything")

    async def go() -> None:
        async with AsyncClient(
            [NodeAddress("node", "127.0.0.1", node.port)], tls=ClientTls(stranger.cert)
        ) as c:
            await c.stat("anything")

    with pytest.raises(TlsError, match="failed verification"):
        asyncio.run(go())


def test_a_certificate_for_another_host_is_refused(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    elsewhere = certs.make_node_cert(ca, tmp_path / "certs", "far", "10.9.9.9")
    node = NodeProcess(
        tmp_path / "far",
        extra=[
            "--tls",
            "--tls-cert",
            str(elsewhere.cert),
            "--tls-key",
            str(elsewhere.key),
            "--ca-file",
            str(ca.cert),
        ],
    ).start()
    try:
        with (
            pytest.raises(TlsError, match="issued for this address"),
            shuttle.connect(node=node.address, tls=True, ca_file=ca.cert) as c,
        ):
            c.stat("anything")
    finally:
        node.terminate()


def test_a_plain_client_at_a_tls_node_is_told_to_use_tls(
    tls_node: tuple[NodeProcess, Pki, Path],
) -> None:
    node, _pki, key_file = tls_node
    with (
        pytest.raises(UnreachableError, match="serves TLS waits for the client to speak first"),
        shuttle.connect(node=node.address, key_file=key_file, tls=False, connect_timeout_s=1) as c,
    ):
        c.stat("anything")


def test_a_tls_client_at_a_plain_node_is_told_it_does_not_speak_tls(tmp_path: Path) -> None:
    pki = Pki.make(tmp_path / "pki")
    node = NodeProcess(tmp_path / "plain").start()
    try:
        with (
            pytest.raises(TlsError, match=r"does not speak TLS.*started without --tls"),
            shuttle.connect(node=node.address, tls=True, ca_file=pki.ca.cert) as c,
        ):
            c.stat("anything")

        async def go() -> None:
            async with AsyncClient(
                [NodeAddress("plain", "127.0.0.1", node.port)], tls=ClientTls(pki.ca.cert)
            ) as c:
                await c.stat("anything")

        with pytest.raises(TlsError, match="does not speak TLS"):
            asyncio.run(go())
        assert "it speaks TLS, and this node serves without TLS" in node.log.read_text()
    finally:
        node.terminate()


def test_a_client_beyond_loopback_needs_the_ca() -> None:
    with pytest.raises(ConfigError, match="--ca-file FILE or \\$SHUTTLE_CA_FILE"):
        shuttle.connect(node="10.9.9.9:7400")


def test_a_key_proof_relayed_to_another_tls_channel_is_refused(
    tls_node: tuple[NodeProcess, Pki, Path], tmp_path: Path
) -> None:
    """The relay holds a valid certificate, so the client's TLS accepts it; the client's
    proof, bound to the client's channel to the relay, does not answer the node's
    channel to the relay: the node refuses it (before channel binding it was accepted,
    and the relay could then read and write everything as the key holder)."""
    node, pki, key_file = tls_node
    evil = certs.make_node_cert(pki.ca, tmp_path / "evil", "evil", "127.0.0.1")
    relay = Relay(pki, evil, node.port)
    with (
        pytest.raises(AuthenticationError, match="relayed from another TLS channel"),
        shuttle.connect(
            node=f"127.0.0.1:{relay.port}", key_file=key_file, tls=True, ca_file=pki.ca.cert
        ) as c,
    ):
        c.stat("anything")
    assert relay.finished.wait(10), "the relay did not see both ends close"
    with shuttle.connect(node=node.address, key_file=key_file, tls=True, ca_file=pki.ca.cert) as c:
        assert c.node_stats(c.nodes[0])["server"]["auth_failures"] == 1
