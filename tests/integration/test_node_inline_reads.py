"""A node answers a small read on its event loop only when the block cache holds it: a
miss goes to the thread pool, so a cold read never stalls the node's other connections
with disk I/O. Checked on a real node over 127.0.0.1 through its counters."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shuttle
from shuttle.net.blocking import BlockingConnection
from tests.integration.nodeproc import NodeProcess

KEY = "inline/reads.dat"
DATA = os.urandom(1 << 20)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    proc = NodeProcess(Path(tmp_path_factory.mktemp("inline")) / "node").start()
    with shuttle.connect(node=proc.address, request_timeout_s=30) as c:
        c.put(KEY, DATA)
    yield proc
    proc.terminate()


@pytest.fixture
def conn(node: NodeProcess) -> Iterator[BlockingConnection]:
    with BlockingConnection("127.0.0.1", node.port) as c:
        yield c


def stats(conn: BlockingConnection) -> dict[str, Any]:
    result: dict[str, Any] = conn.call("node.stats").result
    return result


def read(conn: BlockingConnection, offset: int, length: int) -> bytes:
    data = bytes(conn.call("read", {"key": KEY, "offset": offset, "length": length}).payload)
    assert data == DATA[offset : offset + length]
    return data


@pytest.mark.parametrize(
    ("offset", "length"),
    [(4096 * 37, 4096), ((64 << 10) - 100, 8192), (0, 64 << 10)],  # one block, two, a whole one
)
def test_a_cold_read_goes_to_the_pool_and_a_warm_one_is_answered_inline(
    conn: BlockingConnection, offset: int, length: int
) -> None:
    conn.call("cache.drop", {"keys": [KEY]})
    # node.stats itself runs inline and is counted after it answers: each call shows
    # up as one inline request in the next snapshot. inline_declined counts the
    # requests of an operation that can run inline which went to the thread pool.
    before = stats(conn)["server"]
    read(conn, offset, length)  # cold: the block cache is empty
    cold = stats(conn)
    assert cold["server"]["inline_declined"].get("read", 0) == (
        before["inline_declined"].get("read", 0) + 1
    )
    assert cold["server"]["inline"] == before["inline"] + 1  # the stats call, not the read
    assert cold["store"]["cache"]["misses"] >= 1
    read(conn, offset, length)  # warm: the cold read left its blocks in the cache
    warm = stats(conn)["server"]
    assert warm["inline"] == cold["server"]["inline"] + 2  # the read and the stats call
    assert warm["inline_declined"] == cold["server"]["inline_declined"]


def test_a_large_read_always_takes_the_pool(conn: BlockingConnection) -> None:
    read(conn, 0, 256 << 10)  # in the cache now, but over the inline size
    before = stats(conn)["server"]
    read(conn, 0, 256 << 10)
    after = stats(conn)["server"]
    assert after["inline"] == before["inline"] + 1  # only the stats call
    assert after["inline_declined"]["read"] == before["inline_declined"]["read"] + 1


@pytest.mark.parametrize(
    ("offset", "length"),
    [(4096 * 53, 4096), ((192 << 10) - 100, 8192), (512 << 10, 64 << 10)],
)
def test_a_block_cache_miss_the_page_cache_holds_is_answered_inline(
    conn: BlockingConnection, offset: int, length: int
) -> None:
    """The issue-26 miss path: the node's block cache emptied but not the OS page cache
    (``cache.drop`` naming no key), the read is answered on the event loop with the
    same bytes, the block cache filled as the pool would have filled it."""
    read(conn, offset, length)  # its blocks in the page cache (and the block cache)
    conn.call("cache.drop", {"keys": []})
    before = stats(conn)
    read(conn, offset, length)
    after = stats(conn)
    nowait = after["store"]["nowait"]
    assert nowait["unsupported"] is None, nowait  # ext4, xfs, tmpfs... all have it
    assert nowait["served"] == before["store"]["nowait"]["served"] + 1
    assert after["server"]["inline_declined"] == before["server"]["inline_declined"]
    assert after["server"]["inline"] == before["server"]["inline"] + 2  # read and stats
    assert after["store"]["cache"]["misses"] > before["store"]["cache"]["misses"]
    read(conn, offset, length)  # and now a block-cache hit
    assert stats(conn)["store"]["nowait"]["served"] == nowait["served"]
