"""A node under hostile or careless clients keeps its memory, descriptors and upload
sessions bounded, answers every request it takes, and keeps serving the others.

Each test drives a real node process over real sockets (docs/operations.md)."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

import shuttle
from shuttle.errors import InvalidKeyError, LimitExceededError, NodeBusyError
from shuttle.net import blocking
from shuttle.node.config import NodeConfig
from shuttle.wire import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Goodbye,
    Hello,
    Role,
)
from tests.integration.nodeproc import NodeProcess, shuttle_cli
from tests.integration.test_node_errors import RawPeer

MiB = 1 << 20


def rss_bytes(node: NodeProcess) -> int:
    assert node.proc is not None
    for line in Path(f"/proc/{node.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def server_stats(node: NodeProcess) -> dict[str, Any]:
    with shuttle.connect(node=node.address) as c:
        [n] = c.nodes
        stats: dict[str, Any] = c.node_stats(n)
        return stats


def wait_until(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll ``check`` (a condition on the node's state) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


def frame(kind: int, header: object, payload: bytes = b"", claimed: int | None = None) -> bytes:
    head = msgpack.packb(header)
    size = len(payload) if claimed is None else claimed
    return struct.pack(">2sBBII", b"SH", kind, 0, len(head), size) + head + payload


def events_until_closed(peer: RawPeer) -> list[object]:
    """Every event the node sends until it closes the connection."""
    out: list[object] = []
    peer.sock.settimeout(30)
    while True:
        ev = peer.conn.next_event()
        if ev is NEED_DATA:
            try:
                data = peer.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                return out
            peer.conn.receive_data(data)
        elif isinstance(ev, ConnectionClosed):
            return out
        else:
            out.append(ev)


@pytest.fixture
def small_node(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[NodeProcess]:
    """A node started with the flags the test passes as its (indirect) parameter."""
    args: list[str] = getattr(request, "param", [])
    node = NodeProcess(tmp_path / "n1", extra=args).start()
    try:
        yield node
    finally:
        node.terminate()


# --- memory --------------------------------------------------------------------------


def test_stalled_frames_cost_the_bytes_that_arrived(node: NodeProcess) -> None:
    """64 connections each claiming a 16 MiB payload and sending 10 bytes of it once
    made the node allocate 1 GiB; now they cost about what they sent."""
    before = rss_bytes(node)
    peers = []
    for i in range(64):
        peer = RawPeer(node.address)
        peer.sock.sendall(frame(3, [1, "put", {"key": f"k{i}"}], b"x" * 10, claimed=16 * MiB))
        peers.append(peer)
    wait_until(
        "the node has read every stalled frame",
        lambda: server_stats(node)["server"]["connections_mid_frame"] == 64,
    )
    grown = rss_bytes(node) - before
    assert grown < 64 * MiB, f"64 stalled 16 MiB frames cost the node {grown >> 20} MiB"
    for peer in peers:
        peer.sock.close()
    still_serves(node)


@pytest.mark.parametrize("small_node", [["--frame-timeout", "1"]], indirect=True)
def test_a_stalled_frame_is_cut_after_the_frame_timeout(small_node: NodeProcess) -> None:
    peer = RawPeer(small_node.address)
    peer.sock.sendall(frame(3, [1, "put", {"key": "k"}], b"x" * 10, claimed=1 * MiB))
    [err] = events_until_closed(peer)
    assert isinstance(err, ErrorResponse) and err.rid == 0
    assert "incomplete with nothing arriving" in err.message and "(10 bytes" in err.message
    assert server_stats(small_node)["server"]["frame_timeouts"] == 1
    assert not small_node.log.read_text().count("Traceback")
    still_serves(small_node)


@pytest.mark.parametrize("small_node", [["--idle-timeout", "1"]], indirect=True)
def test_idle_connections_are_closed_and_clients_reconnect(small_node: NodeProcess) -> None:
    with shuttle.connect(node=small_node.address) as client:
        client.put("before", b"1")  # the client's pooled connection, now idle
        peer = RawPeer(small_node.address)
        [bye] = events_until_closed(peer)
        assert isinstance(bye, Goodbye) and "idle" in bye.reason
        # The sweep starts a connection's idle clock at the first sweep after its
        # last request, so the pooled connection may close one sweep after the peer.
        wait_until(
            "the client's pooled connection is closed as idle",
            lambda: server_stats(small_node)["server"]["idle_closed"] >= 2,
        )
        # A put is not idempotent: it must not be sent into the closed connection.
        client.put("after", b"2")
        assert client.get("after") == b"2"


@pytest.mark.parametrize("small_node", [["--idle-timeout", "1"]], indirect=True)
def test_a_connection_with_an_open_upload_is_not_idle(small_node: NodeProcess) -> None:
    """A slow writer keeps its session: the idle sweep passes over its connection."""
    writer = RawPeer(small_node.address)
    writer.sock.sendall(writer.raw_request(1, "upload.begin", {"key": "slow"}))
    begun = writer.next_event()
    assert not isinstance(begun, ErrorResponse), begun
    upload = begun.result["upload"]  # type: ignore[attr-defined]
    idler = RawPeer(small_node.address)  # opened later, owns nothing: closed first
    [bye] = events_until_closed(idler)
    assert isinstance(bye, Goodbye)
    writer.sock.sendall(
        writer.raw_request(2, "upload.write", {"upload": upload, "offset": 0}, b"x")
    )
    assert not isinstance(writer.next_event(), ErrorResponse)
    writer.sock.sendall(writer.raw_request(3, "upload.commit", {"upload": upload}))
    assert not isinstance(writer.next_event(), ErrorResponse)
    with shuttle.connect(node=small_node.address) as c:
        assert c.get("slow") == b"x"


def test_the_idle_probe_keeps_healthy_connections(
    node: NodeProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Probing before every call (as after an idle second) must not drop a connection
    the node keeps, even on a descriptor above select()'s 1024."""
    monkeypatch.setattr(blocking, "IDLE_PROBE_S", -1.0)
    spare = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        with shuttle.connect(node=node.address) as c:
            for i in range(5):
                c.put(f"p{i}", b"v")
            [n] = c.nodes
            connection = c.connection(n)
            assert isinstance(connection, blocking.BlockingConnection)
            assert connection._sock is not None and connection._sock.fileno() > 1024
            assert connection.counters.connects == 1
    finally:
        for fd in spare:
            os.close(fd)


def test_clients_that_never_read_replies_hold_a_bounded_amount(node: NodeProcess) -> None:
    """Three connections pipelining 256 reads of 16 MiB and never reading once took the
    node to 3.4 GB; now each stops being served after a few replies."""
    with shuttle.connect(node=node.address) as c:
        c.put("big", os.urandom(16 * MiB))
    before = rss_bytes(node)
    hogs = []
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", node.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        peer = RawPeer.__new__(RawPeer)
        peer.sock, peer.conn = sock, Connection(Role.CLIENT)
        peer.next_event()  # the challenge
        sock.sendall(peer.conn.send_bytes(Hello(2, 2, "hog")))
        peer.next_event()  # welcome
        burst = b"".join(
            peer.raw_request(rid, "read", {"key": "big", "offset": 0, "length": 16 * MiB})
            for rid in range(1, 257)
        )
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):  # the node stopped reading: the point
            sock.sendall(burst)
        hogs.append(sock)
    wait_until(
        "the node holds back all three connections",
        lambda: server_stats(node)["server"]["connections_held"] >= 3,
    )
    grown = rss_bytes(node) - before
    assert grown < 256 * MiB, f"three non-reading clients cost the node {grown >> 20} MiB"
    still_serves(node)  # others are served meanwhile
    for sock in hogs:
        sock.close()
    wait_until("the hogs are gone", lambda: server_stats(node)["server"]["connections_held"] == 0)


@pytest.mark.parametrize("small_node", [["--frame-timeout", "1"]], indirect=True)
def test_a_client_that_stopped_reading_is_dropped(small_node: NodeProcess) -> None:
    """Held forever otherwise: its replies would keep the node's memory and a slot."""
    with shuttle.connect(node=small_node.address) as c:
        c.put("big", b"b" * (8 * MiB))
    hog = socket.create_connection(("127.0.0.1", small_node.port))
    hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    peer = RawPeer.__new__(RawPeer)
    peer.sock, peer.conn = hog, Connection(Role.CLIENT)
    peer.next_event()
    hog.sendall(peer.conn.send_bytes(Hello(2, 2, "hog")))
    peer.next_event()
    hog.sendall(peer.raw_request(1, "read", {"key": "big", "offset": 0, "length": 8 * MiB}))
    wait_until(
        "the node drops the connection",
        lambda: server_stats(small_node)["server"]["send_timeouts"] == 1,
    )
    stats = server_stats(small_node)["server"]
    assert stats["connections_held"] == 0 and stats["connections_open"] == 1  # ours
    hog.close()


def test_a_pipelining_client_gets_backpressure_and_every_answer(node: NodeProcess) -> None:
    """Requests past what the node runs at once wait in the socket; none is lost."""
    with shuttle.connect(node=node.address) as c:
        c.put("obj", b"z" * 100_000)
    peer = RawPeer(node.address)
    wire = b"".join(
        peer.raw_request(rid, "read", {"key": "obj", "offset": 0, "length": 100_000})
        for rid in range(1, 201)
    )
    peer.sock.sendall(wire)
    answers = [peer.next_event() for _ in range(200)]
    assert sorted(a.rid for a in answers) == list(range(1, 201))  # type: ignore[attr-defined]
    assert all(bytes(a.payload) == b"z" * 100_000 for a in answers)  # type: ignore[attr-defined]


# --- connections and descriptors ------------------------------------------------------


@pytest.mark.parametrize("small_node", [["--connections-max", "8"]], indirect=True)
def test_connections_over_the_cap_are_refused_as_busy(small_node: NodeProcess) -> None:
    peers = [RawPeer(small_node.address) for _ in range(8)]
    with pytest.raises(NodeBusyError, match="maximum of 8 connections"):
        _put_works(small_node, busy_ok=False)
    cli = shuttle_cli("put", "--node", small_node.address, "-", "k", input=b"v")
    assert cli.returncode == 8, cli.stderr
    assert b"busy" in cli.stderr.lower() or b"maximum" in cli.stderr
    for peer in peers:
        peer.sock.close()
    wait_until(
        "the node has seen the connections close",
        lambda: _put_works(small_node),
    )


def _put_works(node: NodeProcess, *, busy_ok: bool = True) -> bool:
    try:
        with shuttle.connect(node=node.address) as c:
            c.put("k", b"v")
            return c.get("k") == b"v"
    except NodeBusyError:
        if not busy_ok:
            raise
        return False


def test_a_low_descriptor_limit_refuses_connections_and_never_poisons_the_store(
    tmp_path: Path,
) -> None:
    """``ulimit -n 256``: the cap is fitted below it, so idle connections past it get
    ``busy`` instead of taking the descriptors a put needs; once they close, writes work
    (the store never took the shortage for a disk fault). The idle connections finish
    their handshake: ones that never do are closed to make room (test_wire_limits.py)."""
    node = NodeProcess(tmp_path / "n1", prefix=["prlimit", "--nofile=256:256"]).start()
    try:
        with shuttle.connect(node=node.address) as c:
            c.put("before", b"1")
        idle = []
        with pytest.raises(NodeBusyError, match="connections"):
            for _ in range(300):
                conn = blocking.BlockingConnection("127.0.0.1", node.port)
                idle.append(conn)
                conn.connect()
        with pytest.raises(NodeBusyError, match="connections"):
            _put_works(node, busy_ok=False)
        for conn in idle:
            conn.close()
        wait_until("writes work again", lambda: _put_works(node))
        stats = server_stats(node)["server"]
        assert stats["connections_refused"] > 0 and stats["connections_max"] <= 256
        with shuttle.connect(node=node.address) as c:
            assert c.get("before") == b"1"
        assert "Too many open files" not in node.log.read_text()
    finally:
        node.terminate()


def test_the_store_treats_running_out_of_descriptors_as_transient(tmp_path: Path) -> None:
    """EMFILE inside the store is ``busy`` (nothing changed), never a disk fault that
    makes the store refuse every later change."""
    script = f"""
import os, resource
from shuttle.errors import NodeBusyError
from shuttle.store import ObjectStore
store = ObjectStore({str(tmp_path / "data")!r})
store.put("a", b"1")
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    store.put("b/c/d", b"2" * 200_000)
    print("no error")
except NodeBusyError as exc:
    print("busy:", exc)
for fd in fds:
    os.close(fd)
store.put("b/c/d", b"3" * 200_000)
assert bytes(store.read("b/c/d")) == b"3" * 200_000
store.remove("a")
print("writes work")
store.close()
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "busy: " in out.stdout and "file descriptors" in out.stdout
    assert "writes work" in out.stdout


# --- upload sessions --------------------------------------------------------------------


def test_upload_sessions_are_per_connection_and_end_with_it(node: NodeProcess) -> None:
    hog = RawPeer(node.address)
    for rid in range(1, 17):
        hog.sock.sendall(hog.raw_request(rid, "upload.begin", {"key": f"u{rid}"}))
    opened = [hog.next_event() for _ in range(16)]
    assert all(not isinstance(ev, ErrorResponse) for ev in opened), opened
    hog.sock.sendall(hog.raw_request(99, "upload.begin", {"key": "one-too-many"}))
    refused = hog.next_event()
    assert isinstance(refused, ErrorResponse) and refused.code == LimitExceededError.code
    assert "this connection" in refused.message
    # A client cannot pose as another connection to dodge the quota.
    hog.sock.sendall(hog.raw_request(100, "upload.begin", {"key": "x", "_connection": 12345}))
    forged = hog.next_event()
    assert isinstance(forged, ErrorResponse) and forged.code == LimitExceededError.code
    assert server_stats(node)["store"]["uploads_open"] == 16
    hog.sock.close()  # its sessions go at once, not after the 600 s idle expiry
    wait_until(
        "the sessions are released", lambda: server_stats(node)["store"]["uploads_open"] == 0
    )


def test_a_node_out_of_upload_sessions_says_busy(node: NodeProcess) -> None:
    hogs = []
    for h in range(16):
        hog = RawPeer(node.address)
        for rid in range(1, 17):
            hog.sock.sendall(hog.raw_request(rid, "upload.begin", {"key": f"u{h}/{rid}"}))
        assert all(not isinstance(hog.next_event(), ErrorResponse) for _ in range(16))
        hogs.append(hog)
    big = os.urandom(5 * MiB)  # over the single-request put: it needs a session
    with (
        pytest.raises(NodeBusyError, match="upload sessions"),
        shuttle.connect(node=node.address) as c,
    ):
        c.put("big", big)
    src = node.data_dir.parent / "big.bin"
    src.write_bytes(big)
    cli = shuttle_cli("put", "--node", node.address, str(src), "big")
    assert cli.returncode == 8, cli.stderr
    for hog in hogs:
        hog.sock.close()
    wait_until("sessions are free", lambda: server_stats(node)["store"]["uploads_open"] == 0)
    with shuttle.connect(node=node.address) as c:
        c.put("big", big)
        assert c.get("big") == big


# --- the protocol's corners -------------------------------------------------------------


def test_a_duplicate_request_id_is_a_protocol_error_answered_cleanly(node: NodeProcess) -> None:
    peer = RawPeer(node.address)
    peer.sock.sendall(
        peer.raw_request(7, "put", {"key": "dup"}, b"a")
        + peer.raw_request(7, "stat", {"key": "dup"})
    )
    events = events_until_closed(peer)
    errors = [ev for ev in events if isinstance(ev, ErrorResponse) and ev.rid == 0]
    assert errors and errors[-1].code == "protocol"
    assert "already in flight" in errors[-1].message
    assert "Traceback" not in node.log.read_text()
    still_serves(node)


def test_a_deeply_nested_header_gets_the_error_frame(node: NodeProcess) -> None:
    nested: object = 1
    for _ in range(1000):
        nested = [nested]
    peer = RawPeer(node.address)
    peer.sock.sendall(frame(3, [1, "stat", {"key": nested}]))
    [err] = events_until_closed(peer)
    assert isinstance(err, ErrorResponse) and err.code == "protocol"
    assert "deeper than" in err.message
    assert "RecursionError" not in node.log.read_text()
    still_serves(node)


def test_a_file_hard_linked_into_the_data_directory_is_refused(
    node: NodeProcess, tmp_path: Path
) -> None:
    outside = tmp_path / "outside-secret"
    outside.write_bytes(b"secret")
    os.link(outside, node.data_dir / "linked")
    with shuttle.connect(node=node.address) as c:
        with pytest.raises(InvalidKeyError, match="hard links"):
            c.get("linked")
        with pytest.raises(InvalidKeyError, match="hard links"):
            c.put("linked", b"overwritten")
    assert outside.read_bytes() == b"secret"
    still_serves(node)


def test_listening_beyond_loopback_needs_a_key_or_insecure(tmp_path: Path) -> None:
    refused = shuttle_cli("serve", "--data", str(tmp_path / "d"), "--listen", "0.0.0.0:0")
    assert refused.returncode == 2
    assert b"without a cluster key" in refused.stderr and b"--insecure" in refused.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was created
    insecure = NodeConfig(data_dir=tmp_path / "d", host="0.0.0.0", insecure=True, tls=False)
    assert insecure.host == "0.0.0.0"


def still_serves(node: NodeProcess) -> None:
    with shuttle.connect(node=node.address) as c:
        c.put("alive", b"yes")
        assert c.get("alive") == b"yes"
