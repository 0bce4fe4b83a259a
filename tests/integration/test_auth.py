"""Cluster-key authentication against real node processes on 127.0.0.1: the right key
is served, a missing or wrong key and a replayed HELLO are refused with clear errors
(exit status 7 in the CLI), keyless nodes serve data as before, and ``cluster up``
gives its cluster a private key that its nodes require."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import shuttle
from shuttle.client.aio import AsyncClient
from shuttle.client.model import NodeAddress
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.errors import AuthenticationError
from shuttle.net import auth
from shuttle.net.blocking import BlockingConnection
from shuttle.wire import (
    NEED_DATA,
    Challenge,
    Connection,
    ErrorResponse,
    Hello,
    Limits,
    Request,
    Response,
    Role,
    Welcome,
)
from tests.integration.nodeproc import NodeProcess, shuttle_cli
from tests.integration.test_node_errors import RawPeer


@pytest.fixture(autouse=True)
def no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients here get a key only from what each test passes them."""
    monkeypatch.delenv(auth.KEY_FILE_ENV, raising=False)
    monkeypatch.delenv("SHUTTLE_CLUSTER", raising=False)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.key"
    auth.write_key_file(path)
    return path


@pytest.fixture
def other_key_file(tmp_path: Path) -> Path:
    path = tmp_path / "other.key"
    auth.write_key_file(path)
    return path


@pytest.fixture
def keyed_node(tmp_path: Path, key_file: Path) -> Iterator[NodeProcess]:
    """A real node started with ``--key-file``."""
    proc = NodeProcess(tmp_path / "keyed", extra=["--key-file", str(key_file)]).start()
    yield proc
    status = proc.terminate()
    assert status in (0, None, -9), f"node exited with {status}; log:\n{proc.log.read_text()}"


def auth_failures(node: NodeProcess, key_file: Path) -> int:
    with shuttle.connect(node=node.address, key_file=key_file) as c:
        return int(c.node_stats(c.nodes[0])["server"]["auth_failures"])


def one_line(text: bytes) -> str:
    """CLI output with the terminal's line wrapping undone."""
    return " ".join(text.decode().split())


# --- the right key, a missing key, a wrong key ---------------------------------------------


def test_the_right_key_reads_and_writes(
    keyed_node: NodeProcess, key_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with shuttle.connect(node=keyed_node.address, key_file=key_file) as c:
        c.put("docs/a.txt", b"hello")
        assert c.get("docs/a.txt") == b"hello"
    monkeypatch.setenv(auth.KEY_FILE_ENV, str(key_file))  # the same key, from the environment
    with shuttle.connect(node=keyed_node.address) as c:
        assert c.get("docs/a.txt") == b"hello"
    ok = shuttle_cli("cat", "docs/a.txt", "--node", keyed_node.address, "--key-file", str(key_file))
    assert ok.returncode == 0 and ok.stdout == b"hello"
    assert auth_failures(keyed_node, key_file) == 0


def test_a_client_without_the_key_is_refused_naming_the_fix(
    keyed_node: NodeProcess, key_file: Path
) -> None:
    with shuttle.connect(node=keyed_node.address) as c:
        with pytest.raises(AuthenticationError, match="requires the cluster key") as info:
            c.put("x", b"y")
        assert "shuttle cluster up" in str(info.value) and "--key-file" in str(info.value)
        assert c.connection(c.nodes[0]).counters.connects == 1  # not retried
    cli = shuttle_cli("ls", "--node", keyed_node.address)
    assert cli.returncode == 7
    assert "(unauthenticated)" in one_line(cli.stderr)
    assert "requires the cluster key" in one_line(cli.stderr)
    with shuttle.connect(node=keyed_node.address, key_file=key_file) as c:
        assert not list(c.list())  # nothing got in


def test_the_node_refuses_a_hello_without_credentials(
    keyed_node: NodeProcess, key_file: Path
) -> None:
    """A client that ignores the challenge's key_required still gets nowhere."""
    peer = RawPeer(keyed_node.address, handshake=False)
    challenge = peer.next_event()
    assert isinstance(challenge, Challenge) and challenge.key_required
    # A HELLO and a request right behind it, pipelined: the request must not run.
    peer.sock.sendall(
        peer.conn.send_bytes(Hello(2, 2, "bare")) + peer.raw_request(1, "put", {"key": "sneaky"})
    )
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and ev.code == "unauthenticated"
    assert "node keyed requires the cluster key" in ev.message
    assert "shuttle cluster up" in ev.message
    assert peer.closed_by_peer()
    with shuttle.connect(node=keyed_node.address, key_file=key_file) as c:
        assert not c.exists("sneaky")
    assert auth_failures(keyed_node, key_file) == 1


def test_a_wrong_key_is_refused_once_not_retried(
    keyed_node: NodeProcess, key_file: Path, other_key_file: Path
) -> None:
    with shuttle.connect(node=keyed_node.address, key_file=other_key_file) as c:
        with pytest.raises(AuthenticationError, match="authentication failed") as info:
            c.get("anything")
        assert "wrong cluster key" in str(info.value)
        assert c.connection(c.nodes[0]).counters.connects == 1
    assert auth_failures(keyed_node, key_file) == 1  # one attempt, one refusal
    cli = shuttle_cli("ls", "--node", keyed_node.address, "--key-file", str(other_key_file))
    assert cli.returncode == 7 and "wrong cluster key" in one_line(cli.stderr)


def test_a_replayed_hello_is_refused_and_the_node_keeps_serving(
    keyed_node: NodeProcess, key_file: Path
) -> None:
    key = auth.load_key_file(key_file)
    # An authenticated client on a raw socket; capture the exact HELLO bytes it sent.
    first = RawPeer(keyed_node.address, handshake=False)
    challenge = first.next_event()
    assert isinstance(challenge, Challenge)
    hello, _ = auth.client_hello(challenge, key, "victim", keyed_node.address)
    captured = first.conn.send_bytes(hello)
    first.sock.sendall(captured)
    assert isinstance(first.next_event(), Welcome)  # it was accepted there
    # Replayed byte for byte on a new connection, which has a new challenge.
    second = RawPeer(keyed_node.address, handshake=False)
    assert isinstance(second.next_event(), Challenge)
    second.sock.sendall(captured)
    ev = second.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and ev.code == "unauthenticated"
    assert "replayed from another connection" in ev.message
    assert second.closed_by_peer()
    # The node keeps serving: the first connection, and a fresh client.
    first.sock.sendall(first.conn.send_bytes(Request(1, "ping", {})))
    assert isinstance(first.next_event(), Response)
    with shuttle.connect(node=keyed_node.address, key_file=key_file) as c:
        c.put("after", b"replay")
        assert c.get("after") == b"replay"
    assert auth_failures(keyed_node, key_file) == 1


# --- keyless nodes --------------------------------------------------------------------------


def test_a_keyless_node_serves_data_with_or_without_a_key(
    node: NodeProcess, key_file: Path
) -> None:
    with shuttle.connect(node=node.address) as c:
        c.put("open", b"data")
    with shuttle.connect(node=node.address, key_file=key_file) as c:
        assert c.get("open") == b"data"  # a keyed client proceeds, for data
    with BlockingConnection("127.0.0.1", node.port) as conn:
        conn.connect()
        assert conn.node_id == "node"


# --- the asyncio client ---------------------------------------------------------------------


def test_the_async_client_authenticates_too(keyed_node: NodeProcess, key_file: Path) -> None:
    address = [NodeAddress("keyed", "127.0.0.1", keyed_node.port)]

    async def scenario() -> None:
        async with AsyncClient(address, key=auth.load_key_file(key_file)) as client:
            await client.put("aio", b"ok")
            assert await client.get("aio") == b"ok"
        async with AsyncClient(address) as client:
            with pytest.raises(AuthenticationError, match="requires the cluster key"):
                await client.get("aio")

    asyncio.run(scenario())


# --- a peer that claims the key but proves another -------------------------------------------


class Impostor:
    """Something listening at a node's address that requires the cluster key but holds
    another one, and accepts any HELLO: only the client's check of the node's proof
    can tell. (A real node with another key refuses the client's proof first.)"""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return  # closed by the test
            with sock:
                sock.settimeout(10)
                self._answer(sock)

    def _answer(self, sock: socket.socket) -> None:
        codec = Connection(Role.SERVER)
        nonce = os.urandom(auth.NONCE_BYTES)
        sock.sendall(codec.send_bytes(Challenge(nonce, True, auth.SCHEME)))
        while (ev := codec.next_event()) is NEED_DATA:
            codec.receive_data(sock.recv(1 << 16))
        assert isinstance(ev, Hello) and ev.credentials is not None
        proof = auth.node_proof(self.key, nonce, ev.credentials["nonce"], "n1")
        sock.sendall(codec.send_bytes(Welcome(1, "n1", Limits().to_wire(), proof)))
        while sock.recv(1 << 16):  # until the client hangs up
            pass

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        self.listener.close()
        self.thread.join(10)


def test_the_client_refuses_a_node_that_proves_another_key(
    key_file: Path, other_key_file: Path
) -> None:
    impostor = Impostor(auth.load_key_file(other_key_file))
    try:
        with shuttle.connect(node=f"127.0.0.1:{impostor.port}", key_file=key_file) as c:
            with pytest.raises(AuthenticationError, match="did not prove it holds the cluster"):
                c.put("secret", b"for the real cluster only")
            assert c.connection(c.nodes[0]).counters.requests == 0  # nothing was sent
    finally:
        impostor.close()


# --- shuttle serve and shuttle cluster up ---------------------------------------------------


def test_serve_refuses_a_bad_key_file_with_a_clear_message(tmp_path: Path) -> None:
    path = tmp_path / "cluster.key"
    auth.write_key_file(path)
    path.chmod(0o644)
    argv = ["serve", "--data", str(tmp_path / "d"), "--listen", "127.0.0.1:0"]
    loose = shuttle_cli(*argv, "--key-file", str(path))
    assert loose.returncode == 2 and f"chmod 600 {path}" in one_line(loose.stderr)
    missing = shuttle_cli(*argv, "--key-file", str(tmp_path / "nope.key"))
    assert missing.returncode == 2 and "does not exist" in one_line(missing.stderr)


def test_cluster_up_writes_a_private_key_and_its_nodes_require_it(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    up = shuttle_cli("cluster", "up", "--nodes", "2", "--root", str(root))
    assert up.returncode == 0, up.stderr.decode()
    cluster_file = root / "cluster.toml"
    env = {"SHUTTLE_CLUSTER": str(cluster_file)}
    try:
        key_path = root / "cluster.key"
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
        spec = ClusterFile.load(cluster_file)
        assert spec.key_file == key_path.resolve()
        key = spec.key()
        assert key == auth.load_key_file(key_path)

        source = tmp_path / "a.txt"
        source.write_bytes(b"cluster data")
        assert shuttle_cli("put", str(source), "docs/a.txt", env=env).returncode == 0
        listing = shuttle_cli("ls", "docs/", env=env)
        assert listing.returncode == 0 and "docs/a.txt" in listing.stdout.decode()
        assert shuttle_cli("cluster", "status", env=env).returncode == 0

        for entry in spec.nodes:  # every node refuses a client without the key
            with (
                shuttle.connect(node=entry.address) as c,
                pytest.raises(AuthenticationError, match="requires the cluster key"),
            ):
                c.ping(c.nodes[0])
            cli = shuttle_cli("ls", "--node", entry.address)
            assert cli.returncode == 7

        # A restart reuses the key: clients holding it keep working.
        assert shuttle_cli("cluster", "down", env=env).returncode == 0
        again = shuttle_cli("cluster", "up", "--root", str(root))
        assert again.returncode == 0, again.stderr.decode()
        assert ClusterFile.load(cluster_file).key() == key
        with shuttle.connect(cluster=cluster_file) as c:
            assert c.get("docs/a.txt") == b"cluster data"
    finally:
        shuttle_cli("cluster", "down", env=env)
