"""The read lane end to end (``wire/readlane.py``): on a real node over 127.0.0.1, a
small warm read is taken and answered by the lane on both ends, and everything the
lane does not take (a miss, a version mismatch, a bad argument, pipelined requests)
gets the same answer or the same error as the general path gives it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shuttle
from shuttle.client.client import Client
from shuttle.errors import InvalidArgumentError, NotFoundError, VersionMismatchError
from shuttle.net.blocking import BlockingConnection, Call
from tests.integration.nodeproc import NodeProcess

KEY = "lane/page.dat"
DATA = os.urandom(256 << 10)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    proc = NodeProcess(Path(tmp_path_factory.mktemp("lane")) / "node").start()
    with shuttle.connect(node=proc.address, request_timeout_s=30) as c:
        c.put(KEY, DATA)
    yield proc
    proc.terminate()


@pytest.fixture
def client(node: NodeProcess) -> Iterator[Client]:
    with shuttle.connect(node=node.address, cache_bytes=0, request_timeout_s=30) as c:
        yield c


def server_stats(client: Client) -> dict[str, Any]:
    result: dict[str, Any] = client.call(client.nodes[0], "node.stats").result["server"]
    return result


def lane_conn(client: Client) -> BlockingConnection:
    conn = client.connection(client.nodes[0])
    assert isinstance(conn, BlockingConnection)
    return conn


def test_a_warm_read_goes_by_the_lane_on_both_ends(client: Client) -> None:
    client.read(KEY, 8192, 4096)  # warm the node's block cache
    before, conn = server_stats(client), lane_conn(client)
    taken, sent = conn.counters.read_lane, dict(conn.counters.by_op)
    received = conn.counters.bytes_received
    for offset in (8192, 8192 + 100, 12288 - 7):
        assert client.read(KEY, offset, 4096 - 200) == DATA[offset : offset + 4096 - 200]
    # Whole frames counted: the prefix, the header [rid, nil] (ids under 128 here, one
    # byte) and the payload.
    assert conn.counters.bytes_received - received == 3 * (12 + 3 + 4096 - 200)
    # The client counts each in its by_op as it sends it, and every request once.
    assert conn.counters.by_op["read"] - sent["read"] == 3
    assert sum(conn.counters.by_op.values()) == conn.counters.requests
    after = server_stats(client)
    assert after["read_lane"] - before["read_lane"] >= 1  # the first one at least
    assert after["inline"] - before["inline"] >= after["read_lane"] - before["read_lane"]
    assert conn.counters.read_lane - taken == 3
    # Each read is in by_op once, whichever way the node answered it.
    assert after["by_op"]["read"] - before["by_op"]["read"] == 3


def test_a_cold_read_is_answered_by_the_pool_with_the_same_bytes(client: Client) -> None:
    client.call(client.nodes[0], "cache.drop", {"keys": [KEY]})
    before = server_stats(client)
    assert client.read(KEY, 65536, 4096) == DATA[65536 : 65536 + 4096]
    after = server_stats(client)
    assert after["read_lane"] == before["read_lane"]
    assert after["inline_declined"].get("read", 0) == before["inline_declined"].get("read", 0) + 1
    # Now cached: the next one goes by the lane.
    assert client.read(KEY, 65536, 4096) == DATA[65536 : 65536 + 4096]
    assert server_stats(client)["read_lane"] == after["read_lane"] + 1


def test_what_the_lane_does_not_answer_gets_the_general_answer(client: Client) -> None:
    conn = lane_conn(client)
    version = client.stat(KEY).version
    client.read(KEY, 0, 4096)
    assert conn.read(KEY, 0, 4096, version) == DATA[:4096]
    with pytest.raises(VersionMismatchError):
        conn.read(KEY, 0, 4096, version + 1)
    with pytest.raises(NotFoundError, match="lane/missing"):
        client.read("lane/missing", 0, 4096)
    with pytest.raises(InvalidArgumentError):
        conn.read(KEY, -1, 4096)
    with pytest.raises(InvalidArgumentError):
        conn.read(KEY, 0, -5)
    assert client.read(KEY, len(DATA) - 10, 4096) == DATA[-10:]
    assert client.read(KEY, len(DATA) + 10, 4096) == b""
    # An answer longer than the reply a read expects (an error to a 1-byte read): the
    # first receive takes only part of it, and the general loop the rest.
    with pytest.raises(NotFoundError, match="lane/missing"):
        client.read("lane/missing", 0, 1)
    with pytest.raises(VersionMismatchError):
        conn.read(KEY, 0, 1, version + 1)
    assert client.read(KEY, 5, 1) == DATA[5:6]
    # The connection is still in step after every refusal.
    assert client.read(KEY, 4096, 4096) == DATA[4096:8192]


def test_pipelined_reads_go_the_general_way_and_come_back_in_order(client: Client) -> None:
    conn = lane_conn(client)
    calls = [Call("read", {"key": KEY, "offset": 4096 * i, "length": 4096}) for i in range(20)]
    got = [bytes(r.payload) for r in conn.call_many(calls, window=8)]
    assert got == [DATA[4096 * i : 4096 * (i + 1)] for i in range(20)]
    assert client.read(KEY, 0, 100) == DATA[:100]  # and the lane after them


def test_a_read_after_the_node_closed_the_connection_is_retried(
    node: NodeProcess, client: Client
) -> None:
    conn = lane_conn(client)
    client.read(KEY, 0, 4096)
    # The node ends idle connections with GOODBYE; the next read must reconnect.
    assert conn._sock is not None
    conn._sock.shutdown(2)  # the socket fails under the lane's send or receive
    assert client.read(KEY, 0, 4096) == DATA[:4096]
    assert conn.counters.connects >= 2
