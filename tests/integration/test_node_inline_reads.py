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
from shuttle.errors import NotFoundError
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


def test_a_miss_never_reads_an_old_file_after_a_change_or_a_restart(tmp_path: Path) -> None:
    """The node keeps the files its misses read open (store/openfiles.py): after a put
    that renames a new file into place (over 1 MiB: staged), a range write, a truncate,
    a remove and a restart, a miss the page cache answers reads the object as it is.
    Each read is of a 64 KiB block not read since the change (a block-cache miss)."""
    proc = NodeProcess(tmp_path / "node").start()
    block = 64 << 10
    try:
        big = os.urandom(2 << 20)
        newer = os.urandom(2 << 20)
        with shuttle.connect(node=proc.address, cache_bytes=0, request_timeout_s=30) as c:

            def served() -> int:
                return int(c.node_stats(c.nodes[0])["store"]["nowait"]["served"])

            c.put("k", big)
            before = served()
            assert c.read("k", block, 4096) == big[block : block + 4096]  # file kept open
            c.put("k", newer)  # a new file renamed over the old one
            assert c.read("k", 2 * block, 4096) == newer[2 * block : 2 * block + 4096]
            c.write("k", 3 * block, b"x" * 100)
            assert (
                c.read("k", 3 * block, 200) == b"x" * 100 + newer[3 * block + 100 : 3 * block + 200]
            )
            c.truncate("k", 10_000)
            assert c.read("k", 8192, 4096) == newer[8192:10_000]
            stats = c.node_stats(c.nodes[0])["store"]
            assert stats["nowait"]["served"] - before == 4  # every one a miss on the loop
            assert stats["open_files"]["forgotten"] >= 3
            c.remove("k")
            with pytest.raises(NotFoundError):
                c.read("k", 0, 4096)
            c.put("k", big)
            assert c.read("k", 4 * block, 4096) == big[4 * block : 4 * block + 4096]
        proc.restart()
        with shuttle.connect(node=proc.address, cache_bytes=0, request_timeout_s=30) as c:
            assert c.read("k", 4096, 4096) == big[4096:8192]
            assert c.read("k", 5 * block, 4096) == big[5 * block : 5 * block + 4096]
    finally:
        proc.terminate()
