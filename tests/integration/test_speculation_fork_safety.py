"""Forking inside a busy process does not hang: an asyncio loop runs in one thread, a
thread pool hammers the same client, its cache and a logging handler, and the main
thread makes many fork speculations (half of them on a stale copy, so children are
killed too). Every child logs, uses the client after its checkpoint and returns a
result larger than a pipe's buffer. pytest-timeout fails the test if anything hangs.

The node is a real process, as a user's would be: an in-process ``MemoryNode`` would
put the node's own locks (its block cache, its key locks) in the forking process,
where a pool thread can hold one at the instant of a fork and the child, reading
through its copy of that node, waits on it forever (seen in CI once in many runs)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

import shuttle
from shuttle.client import Client
from tests.integration.nodeproc import NodeProcess

KEY = "fork/object"
SPECULATIONS = 40
POOL_THREADS = 4
#: The pool threads log here; it propagates to the root logger's handlers, so they also
#: hold the locks of pytest's captured streams, often at the instant of a fork.
log = logging.getLogger("shuttle.tests.fork_safety")
#: The branches log here: logging's own locks are re-created at fork, and the stream is
#: the child's private StringIO (a forked branch must not write to a shared stream).
branch_log = logging.getLogger("shuttle.tests.fork_safety.branch")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    proc = NodeProcess(tmp_path / "n1").start()
    try:
        yield proc
    finally:
        proc.terminate()


@pytest.fixture
def busy_process(node: NodeProcess) -> Iterator[tuple[Client, threading.Lock]]:
    """A client shared by a running event loop, a busy pool and the test's thread, and
    the lock each pool pass holds (so the test can keep the pool off the key a while)."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    branch_log.addHandler(logging.StreamHandler(io.StringIO()))
    branch_log.propagate = False
    client = shuttle.connect(node=node.address, cache_bytes=1 << 20, cache_block_bytes=1024)
    client.put(KEY, b"v0" * 5000)
    stop = threading.Event()
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, name="event-loop")
    loop_thread.start()

    async def churn() -> None:
        lock = asyncio.Lock()
        while not stop.is_set():
            async with lock:
                await asyncio.sleep(0)

    churning = asyncio.run_coroutine_threadsafe(churn(), loop)
    shared = threading.Lock()

    def hammer(i: int) -> int:
        n = 0
        while not stop.is_set():
            with shared:
                client.stat(KEY)
                with client.open(KEY) as f:
                    f.read(3000)
                client.counters()
            log.info("pool thread %d pass %d", i, n)
            loop.call_soon_threadsafe(lambda: None)
            n += 1
        return n

    pool = ThreadPoolExecutor(POOL_THREADS)
    passes: list[Future[int]] = [pool.submit(hammer, i) for i in range(POOL_THREADS)]
    try:
        yield client, shared
    finally:
        stop.set()
        assert all(f.result(timeout=10) > 0 for f in passes)
        pool.shutdown()
        churning.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(10)
        loop.close()
        client.close()
        log.removeHandler(handler)
        branch_log.handlers.clear()


@pytest.mark.timeout(30)
def test_fork_speculations_in_a_busy_process_never_hang(
    busy_process: tuple[Client, threading.Lock], node: NodeProcess
) -> None:
    client, pool_pass = busy_process
    writer = shuttle.connect(node=node.address)
    parent = os.getpid()
    assert client.speculate(KEY, lambda data, _: len(data), mechanism="none") == 10_000

    def work(data: bytes, checkpoint: Callable[[], None]) -> tuple[int, bytes, int]:
        branch_log.info("branch on %d bytes", len(data))
        checkpoint()
        with client.open(KEY) as f:  # the child's own connection, lock and cache
            f.read()
            version = f.info.version
        return os.getpid(), data * 20, version  # 200 KB: more than a pipe holds

    def speculate() -> None:
        nonlocal forked
        pid, data, version = client.speculate(KEY, work, mechanism="fork")
        assert len(data) == 20 * len(client.get(KEY)) and data.startswith(b"v")
        assert version >= 1
        forked += pid != parent

    forked = 0
    for i in range(SPECULATIONS):
        if i % 2:
            # Keep the pool off the key between the write and the fork, so the copy the
            # child runs on is surely stale (a pool pass would fetch the new version).
            with pool_pass:
                writer.put(KEY, b"v%d" % i * 5000)
                speculate()
        else:
            speculate()  # while the pool and the loop run
    stats = client.counters()["validation"]["speculative"]
    assert stats["speculated"]["fork"] == SPECULATIONS
    assert stats["stale"] >= SPECULATIONS // 2 and stats["confirmed"] >= 1
    assert forked == stats["confirmed"]  # each confirmed result came from its child
    writer.close()
