"""The ``callback`` validation mode against real nodes: promises broken on write, a write
that waits for the ack, terms that free writers from a stopped client, sessions that
end with their connection, and a listener whose connection dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import shuttle
from shuttle.client.files import RemoteReader
from shuttle.net.blocking import BlockingConnection
from tests.integration.nodeproc import NodeProcess

#: The term of the node used to test expiry: short, so the test is.
SHORT_TERM_S = 1.0

#: A client process that takes a promise on ``k`` and then waits to be stopped or killed.
HOLDER = """
import sys, shuttle
c = shuttle.connect(node=sys.argv[1], validation="callback")
with c.open("k") as f:
    f.read()
assert c.counters()["validation"]["callback"]["promises_held"] == 1
print("holding", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def short_node(tmp_path: Path) -> Iterator[NodeProcess]:
    proc = NodeProcess(tmp_path / "node", extra=["--callback-term", str(SHORT_TERM_S)]).start()
    yield proc
    proc.terminate()


def _holder(address: str) -> subprocess.Popen[bytes]:
    """Start a client process holding a promise on ``k`` (returns once it holds it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"holding\n"
    return proc


def _wait_until_stopped(pid: int) -> None:
    """Return once the kernel shows ``pid`` stopped (SIGSTOP is delivered asynchronously)."""
    stat = Path(f"/proc/{pid}/stat")
    while stat.read_text().rpartition(")")[2].split()[0] != "T":
        time.sleep(0.001)


def _callbacks(client: shuttle.Client) -> dict[str, float]:
    stats: dict[str, float] = client.node_stats(client.nodes[0])["callbacks"]
    return stats


def test_a_write_breaks_the_promise_and_the_next_open_sees_it(node: NodeProcess) -> None:
    reader = shuttle.connect(node=node.address, validation="callback")
    writer = shuttle.connect(node=node.address)
    try:
        writer.put("k", b"v1")
        with reader.open("k") as f:
            assert f.read() == b"v1"
        before = reader.counters()["requests"]
        with reader.open("k") as f:
            assert isinstance(f, RemoteReader)
            assert f.read() == b"v1" and f.cache_was_valid
        assert reader.counters()["requests"] == before  # a live promise: no round trip
        writer.put("k", b"v2")  # returns only once the reader dropped its copy
        mode = reader.counters()["validation"]["callback"]
        assert mode["promises_broken"] == 1 and mode["promises_held"] == 0
        with reader.open("k") as f:
            assert f.read() == b"v2"
        stats = _callbacks(writer)
        assert stats["breaks_acked"] == 1 and stats["promises_outstanding"] == 1
    finally:
        reader.close()
        writer.close()


def test_a_listing_takes_a_promise_on_every_file_it_finds(node: NodeProcess) -> None:
    reader = shuttle.connect(node=node.address, validation="callback")
    writer = shuttle.connect(node=node.address)
    try:
        for name in "abc":
            writer.put(f"d/{name}", name.encode())
        infos = reader.validation_mode().stat_many(["d/a", "d/b", "d/c", "d/missing"])
        assert [i and i.size for i in infos] == [1, 1, 1, None]
        assert reader.counters()["validation"]["callback"]["promises_held"] == 3
        before = reader.counters()["requests"]
        for name in "abc":
            with reader.open(f"d/{name}") as f:
                assert f.read() == name.encode()
        # The opens cost nothing beyond the one read each that fills the cache.
        assert reader.counters()["requests"] == before + 3
        writer.put("d/b", b"B")  # breaks the promise the listing took
        with reader.open("d/b") as f:
            assert f.read() == b"B"
        assert _callbacks(writer)["breaks_acked"] == 1
    finally:
        reader.close()
        writer.close()


def test_every_kind_of_change_breaks_promises(node: NodeProcess) -> None:
    reader = shuttle.connect(node=node.address, validation="callback")
    writer = shuttle.connect(node=node.address)
    try:
        changes: list[Callable[[], object]] = [
            lambda: writer.write("k", 0, b"W"),
            lambda: writer.truncate("k", 1),
            lambda: writer.put("k", iter([b"x" * 10, b"y"])),  # an upload session's commit
            lambda: writer.remove_many(["k"]),
        ]
        writer.put("k", b"abc")
        for change in changes:
            with reader.open("k") as f:
                f.read()
            change()
            assert reader.counters()["validation"]["callback"]["promises_held"] == 0
        assert _callbacks(writer)["breaks_acked"] == len(changes)
    finally:
        reader.close()
        writer.close()


def test_a_write_waits_until_the_holder_acks(node: NodeProcess) -> None:
    """A hand-driven holder: the write is not applied until the next poll carries the ack."""
    writer = shuttle.connect(node=node.address)
    writer.put("k", b"old")
    listen = BlockingConnection("127.0.0.1", node.port)
    other = BlockingConnection("127.0.0.1", node.port)
    try:
        session = listen.call("callback.open").result["session"]
        got = other.call("callback.promise", {"key": "k", "session": session}).result
        assert got["promise"] is not None and got["version"] > 0
        done = threading.Event()

        def write() -> None:
            writer.put("k", b"new")
            done.set()

        thread = threading.Thread(target=write)
        thread.start()
        out = listen.call("callback.wait", {"session": session, "ack": 0}).result
        assert out["breaks"] == [["k", got["promise"]["seq"]]]
        assert not done.wait(0.2)
        assert other.call("read", {"key": "k", "offset": 0, "length": 9}).payload == b"old"
        # No new promise while the change is pending: the stat comes without one.
        assert (
            other.call("callback.promise", {"key": "k", "session": session}).result["promise"]
            is None
        )
        ack = {"session": session, "ack": out["seq"], "timeout_s": 0.01}
        listen.call("callback.wait", ack)
        thread.join(5)
        assert done.is_set()
        assert other.call("read", {"key": "k", "offset": 0, "length": 9}).payload == b"new"
    finally:
        listen.close()
        other.close()
        writer.close()


def test_a_stopped_holder_blocks_writers_only_until_the_term_ends(
    short_node: NodeProcess,
) -> None:
    writer = shuttle.connect(node=short_node.address)
    writer.put("k", b"v1")
    holder = _holder(short_node.address)
    try:
        holder.send_signal(signal.SIGSTOP)  # alive, connection open, never answers
        _wait_until_stopped(holder.pid)
        start = time.monotonic()
        writer.put("k", b"v2")
        waited_s = time.monotonic() - start
        # Bounded by the term (without it the put waits until SIGCONT); the margin is
        # for a loaded machine. That the wait ended by expiry is breaks_expired below.
        assert waited_s < SHORT_TERM_S + 2.0
        stats = _callbacks(writer)
        assert stats["breaks_expired"] == 1 and stats["writer_wait_s_max"] > 0, str(stats)
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait(10)
        writer.close()


def test_a_holder_that_vanishes_releases_writers_at_once(node: NodeProcess) -> None:
    """The default term is 30 s; a killed client's connection closes, and with it its
    session: the writer does not wait."""
    writer = shuttle.connect(node=node.address)
    writer.put("k", b"v1")
    holder = _holder(node.address)
    holder.kill()
    holder.wait(10)
    start = time.monotonic()
    writer.put("k", b"v2")
    assert time.monotonic() - start < 5.0
    writer.close()


def test_a_client_that_closes_ends_its_sessions(node: NodeProcess) -> None:
    reader = shuttle.connect(node=node.address, validation="callback")
    reader.put("k", b"v1")
    with reader.open("k") as f:
        f.read()
    reader.close()  # ends the session (and its thread) cleanly
    assert not any(t.name.startswith("shuttle-callbacks") for t in threading.enumerate())
    writer = shuttle.connect(node=node.address)
    stats = _callbacks(writer)
    assert stats["sessions_open"] == 0 and stats["promises_outstanding"] == 0
    writer.close()


def test_a_client_writing_what_it_holds_a_promise_on(node: NodeProcess) -> None:
    client = shuttle.connect(node=node.address, validation="callback")
    try:
        client.put("k", b"v1")
        with client.open("k") as f:
            f.read()
        start = time.monotonic()
        client.put("k", b"v2")  # its own listener acks the break
        assert time.monotonic() - start < 5.0
        with client.open("k") as f:
            assert f.read() == b"v2"
    finally:
        client.close()


def test_a_listener_whose_connection_dies_voids_its_promises(node: NodeProcess) -> None:
    reader = shuttle.connect(node=node.address, validation="callback")
    try:
        reader.put("k", b"v1")
        with reader.open("k") as f:
            f.read()
        node.restart()  # SIGKILL: every connection fails; the new node knows no promise
        mode = reader.validation_mode("callback")
        while mode.stats()["sessions"]:  # the listener notices its connection died
            time.sleep(0.01)
        assert mode.stats()["promises_voided"] == 1
        writer = shuttle.connect(node=node.address)
        writer.put("k", b"v2")
        writer.close()
        with reader.open("k") as f:
            assert f.read() == b"v2"
    finally:
        reader.close()


def test_writers_waiting_for_a_break_hold_no_thread(node: NodeProcess) -> None:
    """More writers wait than the node has threads (4); a read that needs a thread is
    still served, because the wait happens before the thread hop."""
    setup = shuttle.connect(node=node.address)
    setup.put("k", b"old")
    setup.put("big", os.urandom(256 << 10))
    listen = BlockingConnection("127.0.0.1", node.port)
    other = BlockingConnection("127.0.0.1", node.port, request_timeout_s=5)
    writers = [shuttle.connect(node=node.address) for _ in range(8)]
    try:
        session = listen.call("callback.open").result["session"]
        other.call("callback.promise", {"key": "k", "session": session})
        threads = [threading.Thread(target=w.put, args=("k", b"new")) for w in writers]
        for t in threads:
            t.start()
        # Every writer waiting (or, were they holding threads, four of them stuck).
        deadline = time.monotonic() + 10.0
        while _callbacks(setup)["changes_pending"] < len(writers) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert _callbacks(setup)["changes_pending"] == len(writers)  # else nothing is tested
        big = other.call("read", {"key": "big", "offset": 0, "length": 256 << 10})
        assert len(big.payload) == 256 << 10
        out = listen.call("callback.wait", {"session": session, "ack": 0}).result
        listen.call("callback.wait", {"session": session, "ack": out["seq"], "timeout_s": 0.01})
        for t in threads:
            t.join(5)
        assert not any(t.is_alive() for t in threads)
    finally:
        for w in writers:
            w.close()
        listen.close()
        other.close()
        setup.close()
