"""A node's block-cache misses over its socket: one the page cache holds is answered on
the event loop, one that would wait for the disk goes to the thread pool, and while that
one waits the loop keeps answering another client. The node's server runs in this
process (its loop in a thread) so that the file system can be played: the ``pread``
with RWF_NOWAIT says "would block" for the file's second half, and the thread path's
disk read of it waits on a gate the test opens."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuttle.net.blocking import BlockingConnection
from shuttle.net.registry import OperationRegistry
from shuttle.net.server import RpcServer
from shuttle.node import handlers
from shuttle.store import ObjectStore
from shuttle.store.nowait import platform_pread
from shuttle.store.paths import pread_exact

KEY = "miss/path.dat"
DATA = os.urandom(1 << 20)
SLOW_FROM = len(DATA) // 2  # the "disk" half: not in the page cache, as played here
WAIT_S = 30.0  # a bound for a hang, never reached when the code is right


class Node:
    """An in-process node over ``store`` on 127.0.0.1 (its loop in a thread)."""

    def __init__(self, store: ObjectStore) -> None:
        registry = OperationRegistry()
        handlers.register_storage_ops(registry, store)
        self.server = RpcServer(registry, "miss-node")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        _, self.port = asyncio.run_coroutine_threadsafe(
            self.server.start("127.0.0.1", 0), self.loop
        ).result(WAIT_S)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(0.5), self.loop).result(WAIT_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)
        self.loop.close()


@pytest.fixture
def gate() -> threading.Event:
    return threading.Event()


@pytest.fixture
def entered() -> threading.Event:
    return threading.Event()


@pytest.fixture
def node(
    tmp_path: Path, gate: threading.Event, entered: threading.Event
) -> Iterator[tuple[Node, ObjectStore]]:
    store = ObjectStore(tmp_path / "data")
    store.put(KEY, DATA)
    store.read(KEY, 0, len(DATA), use_cache=False)  # the page cache holds it all
    store.cache.clear()
    real = platform_pread()
    assert real is not None, "this test needs os.preadv with RWF_NOWAIT (Linux)"

    def nowait(fd: int, length: int, offset: int) -> bytes:
        if offset >= SLOW_FROM:
            raise BlockingIOError(errno.EAGAIN, "would block")
        return real(fd, length, offset)

    store.nowait._pread = nowait

    def slow_fetcher(key: str, version: int) -> Any:
        def fetch(start: int, stop: int) -> bytes:
            if start >= SLOW_FROM:  # the disk, as slow as the test wants
                entered.set()
                assert gate.wait(WAIT_S)
            fd = store.paths.open_file(key, os.O_RDONLY)
            try:
                return pread_exact(fd, stop - start, start)
            finally:
                os.close(fd)

        return fetch

    store._fetcher = slow_fetcher  # type: ignore[method-assign]
    n = Node(store)
    try:
        yield n, store
    finally:
        gate.set()
        n.close()
        store.close()


def read(conn: BlockingConnection, offset: int, length: int = 4096) -> bytes:
    return bytes(conn.call("read", {"key": KEY, "offset": offset, "length": length}).payload)


def test_the_loop_answers_page_cache_misses_while_a_disk_read_waits_in_the_pool(
    node: tuple[Node, ObjectStore], gate: threading.Event, entered: threading.Event
) -> None:
    n, store = node
    slow_offset = SLOW_FROM + 5 * 4096
    got: dict[str, bytes] = {}

    def slow_client() -> None:
        with BlockingConnection("127.0.0.1", n.port, request_timeout_s=WAIT_S) as c:
            got["slow"] = read(c, slow_offset)

    thread = threading.Thread(target=slow_client)
    thread.start()
    assert entered.wait(WAIT_S)  # its read is in a pool thread, waiting for the "disk"
    with BlockingConnection("127.0.0.1", n.port, request_timeout_s=WAIT_S) as c:
        for page in (3, 40, 77):  # misses of the block cache, held by the page cache
            assert read(c, page * 4096) == DATA[page * 4096 : (page + 1) * 4096]
        assert "slow" not in got and not gate.is_set()  # answered while the other waits
        counters = n.server.counters
        assert counters.inline_declined["read"] == 1  # only the slow one took the pool
        assert store.nowait.served == 3 and store.nowait.would_block == 1
        gate.set()
        thread.join(WAIT_S)
        assert got["slow"] == DATA[slow_offset : slow_offset + 4096]
        # Its blocks are cached now: answered on the loop, from the block cache.
        assert read(c, slow_offset) == got["slow"]
        assert counters.inline_declined["read"] == 1
