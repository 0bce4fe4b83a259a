"""Nodes that are gateways: two Shuttle nodes over one RADOS pool (``--store rados``)
serve any key; a node or an OSD killed in the middle of a stream loses nothing, and
the client finishes on another node (docs/ceph.md)."""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator

import pytest

from shuttle.client.gateways import GatewayClient
from shuttle.client.model import NodeAddress
from shuttle.cluster.ceph import LocalCeph
from shuttle.errors import ShuttleError
from tests.integration.nodeproc import NodeProcess

PIECE_BYTES = 256 << 10


@pytest.fixture(scope="module")
def nodes(ceph: LocalCeph, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    """Two nodes over one fresh namespace of the session's pool."""
    extra = ceph.info().store_args(f"gw{secrets.token_hex(4)}")
    root = tmp_path_factory.mktemp("gateways")
    procs = [NodeProcess(root / f"gw{i}", extra=extra).start() for i in range(2)]
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()


def _client(nodes: list[NodeProcess]) -> GatewayClient:
    addrs = [NodeAddress(p.data_dir.name, "127.0.0.1", p.port) for p in nodes]
    return GatewayClient(addrs, piece_bytes=PIECE_BYTES, window=2, request_timeout_s=30)


def _by_id(nodes: list[NodeProcess], node_id: str) -> NodeProcess:
    return next(p for p in nodes if p.data_dir.name == node_id)


def test_any_node_serves_any_key(nodes: list[NodeProcess]) -> None:
    with _client(nodes) as c:
        c.put("any/k", b"shared")
        for node in c.nodes:  # ask each node directly, whichever the key routes to
            assert c.call(node, "read", {"key": "any/k", "offset": 0, "length": 6}).payload == (
                b"shared"
            )
        lists = [c.node_stats(n)["store"]["ops"].get("list", 0) for n in c.nodes]
        assert list(c.list("any/")) == ["any/k"]
        after = [c.node_stats(n)["store"]["ops"].get("list", 0) for n in c.nodes]
        assert sum(after) - sum(lists) == 1  # one node lists the pool, not every node


def test_a_node_killed_mid_stream_and_the_client_finishes_on_another(
    nodes: list[NodeProcess],
) -> None:
    data = os.urandom(24 << 20)
    with _client(nodes) as c:
        c.put("stream/big", data)
        serving = _by_id(nodes, c.node_for("stream/big").node_id)
        try:
            got = bytearray()
            for piece in c.iter_read("stream/big"):
                got += piece
                if serving.alive() and len(got) >= 2 * PIECE_BYTES:
                    serving.kill()  # SIGKILL in the middle of the stream
            assert bytes(got) == data
            assert c.failovers >= 1
            assert c.node_for("stream/big").node_id != serving.data_dir.name
            assert c.get("stream/big") == data  # later requests go to the live node
        finally:
            if not serving.alive():  # the module's next tests get both nodes
                serving.start()


def test_killing_a_node_during_writes_loses_no_acknowledged_write(
    nodes: list[NodeProcess],
) -> None:
    acked: dict[str, bytes] = {}
    victim = nodes[0]
    try:
        with _client(nodes) as c:
            for i in range(60):
                key = f"writes/{i:03d}"
                value = f"value {i} ".encode() * 50
                if i == 20:
                    victim.kill()
                try:
                    c.put(key, value)
                except ShuttleError:
                    continue  # not acknowledged: may or may not be there
                acked[key] = value
            assert len(acked) >= 55
    finally:
        if not victim.alive():  # the module's next tests get both nodes
            victim.start()
    with _client(nodes) as c:
        for key, value in acked.items():
            assert c.get(key) == value, key


def test_an_osd_killed_under_a_stream_of_writes_loses_nothing(
    nodes: list[NodeProcess], ceph: LocalCeph
) -> None:
    """Pool size 3, min_size 2: with one OSD of three down, writes go on."""
    acked: dict[str, bytes] = {}
    stop = threading.Event()
    errors: list[str] = []

    def writer() -> None:
        with _client(nodes) as c:
            i = 0
            while not stop.is_set() or i < 40:
                key, value = f"osd/{i:04d}", os.urandom(64 << 10)
                try:
                    c.put(key, value)
                    acked[key] = value
                except ShuttleError as exc:
                    errors.append(f"{key}: {exc}")
                i += 1

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 60
        while len(acked) < n and t.is_alive() and time.monotonic() < deadline:
            stop.wait(0.01)

    t = threading.Thread(target=writer)
    t.start()
    try:
        wait_for(10)
        ceph.stop_osd(1)
        wait_for(len(acked) + 20)  # writes acknowledged with the OSD down
    finally:
        stop.set()
        t.join(120)
        ceph.start_osd(1)
    assert errors == []
    assert len(acked) >= 30
    with _client(nodes) as c:
        for key, value in acked.items():
            assert c.get(key) == value, key
