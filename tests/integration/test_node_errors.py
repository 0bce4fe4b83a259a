"""Bad input gets a clear, typed error and loses nothing; the node keeps serving others."""

from __future__ import annotations

import os
import socket
import struct
import time

import msgpack
import pytest

import shuttle
from shuttle.errors import (
    InvalidArgumentError,
    InvalidKeyError,
    LimitExceededError,
    NotFoundError,
    RemoteProtocolError,
    UnknownOperationError,
    UnreachableError,
)
from shuttle.net.blocking import BlockingConnection
from shuttle.wire import (
    NEED_DATA,
    Challenge,
    Connection,
    ErrorResponse,
    Hello,
    Request,
    Response,
    Role,
)
from tests.integration.nodeproc import NodeProcess


class RawPeer:
    """A hand-driven client socket, to send what a correct client never would."""

    def __init__(self, address: str, *, handshake: bool = True) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.conn = Connection(Role.CLIENT)
        if handshake:
            assert isinstance(self.next_event(), Challenge)  # the node speaks first
            self.sock.sendall(self.conn.send_bytes(Hello(2, 2, "raw")))
            self.next_event()

    def next_event(self) -> object:
        while True:
            ev = self.conn.next_event()
            if ev is not NEED_DATA:
                return ev
            data = self.sock.recv(1 << 16)
            self.conn.receive_data(data)

    def raw_frame(self, kind: int, header: object, payload: bytes = b"") -> bytes:
        head = msgpack.packb(header)
        return struct.pack(">2sBBII", b"SH", kind, 0, len(head), len(payload)) + head + payload

    def raw_request(
        self, rid: int, op: str, args: dict[str, object], payload: bytes = b""
    ) -> bytes:
        """A request frame built by hand (bypassing the sender's limit checks)."""
        self.conn._in_flight.add(rid)  # so the codec accepts the answer
        return self.raw_frame(3, [rid, op, args], payload)

    def closed_by_peer(self) -> bool:
        self.sock.settimeout(5)
        try:
            while self.sock.recv(1 << 16):
                pass
        except ConnectionResetError:
            pass
        return True


def still_serves(node: NodeProcess) -> None:
    with shuttle.connect(node=node.address) as c:
        c.put("alive", b"yes")
        assert c.get("alive") == b"yes"


def test_garbage_bytes_get_an_error_frame_then_the_connection_closes(node: NodeProcess) -> None:
    peer = RawPeer(node.address)
    peer.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0
    assert ev.code == "protocol" and "magic" in ev.message
    assert peer.closed_by_peer()
    still_serves(node)


def test_request_before_handshake_is_refused(node: NodeProcess) -> None:
    peer = RawPeer(node.address, handshake=False)
    assert isinstance(peer.next_event(), Challenge)
    peer.sock.sendall(peer.raw_frame(3, [1, "stat", {"key": "a"}]))
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and ev.code == "protocol"
    assert "Request in state CHALLENGED" in ev.message
    assert peer.closed_by_peer()
    still_serves(node)


def test_oversized_payload_gets_a_limit_error_and_the_connection_lives(node: NodeProcess) -> None:
    peer = RawPeer(node.address)
    big = b"x" * (17 << 20)  # over the 16 MiB frame payload limit
    peer.sock.sendall(peer.raw_request(1, "put", {"key": "big"}, big))
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 1
    assert isinstance(ev.to_exception(), LimitExceededError)
    assert "split it" in ev.message
    peer.sock.sendall(peer.raw_request(2, "ping", {}))  # same connection still works
    ok = peer.next_event()
    assert isinstance(ok, Response) and ok.rid == 2
    with shuttle.connect(node=node.address) as c, pytest.raises(NotFoundError):
        c.stat("big")  # nothing was stored


def test_oversized_header_is_a_protocol_error(node: NodeProcess) -> None:
    peer = RawPeer(node.address)
    peer.sock.sendall(struct.pack(">2sBBII", b"SH", 3, 0, 2 << 20, 0))
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and "over the limit" in ev.message
    still_serves(node)


def test_a_client_still_sending_after_a_protocol_error_reads_the_error_not_a_reset(
    node: NodeProcess,
) -> None:
    """A frame whose header is over the limit, sent whole (16 MiB, more than the
    kernel's socket buffers hold): the node refuses it from its prefix while the rest
    is still arriving. It must drain that rest rather than close on it (a close with
    unread bytes is a reset: the client's send fails and the error is lost), so the
    client sends all of it, reads the error, then a clean end of stream."""
    peer = RawPeer(node.address)
    head_len = 16 << 20
    peer.sock.sendall(struct.pack(">2sBBII", b"SH", 3, 0, head_len, 0) + b"\x00" * head_len)
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and "over the limit" in ev.message
    assert peer.sock.recv(1 << 16) == b""  # the node's end of stream, not a reset
    still_serves(node)


def test_unknown_operation_and_bad_arguments_are_typed_errors(node: NodeProcess) -> None:
    with BlockingConnection("127.0.0.1", node.port) as conn:
        with pytest.raises(UnknownOperationError, match="unknown operation 'frobnicate'"):
            conn.call("frobnicate")
        with pytest.raises(InvalidArgumentError, match="missing argument 'key'"):
            conn.call("stat", {})
        with pytest.raises(InvalidArgumentError, match="'offset' must be int"):
            conn.call("read", {"key": "a", "offset": "zero"})
        assert conn.call("ping").result["node"] == "node"  # the connection survived


@pytest.mark.parametrize(
    "key",
    ["../escape", "a/../../b", "/etc/passwd", "nul\0byte", "", "a//b", ".shuttle/journal"],
)
def test_keys_that_escape_the_data_directory_are_refused(
    node: NodeProcess, client: shuttle.Client, key: str
) -> None:
    with pytest.raises(InvalidKeyError):
        client.put(key, b"x")
    still_serves(node)


def test_symlink_out_of_the_data_directory_is_refused(
    node: NodeProcess, client: shuttle.Client, tmp_path: os.PathLike[str]
) -> None:
    outside = os.path.join(tmp_path, "outside")
    os.mkdir(outside)
    with open(os.path.join(outside, "secret"), "wb") as f:
        f.write(b"secret")
    os.symlink(outside, node.data_dir / "link")
    with pytest.raises(InvalidKeyError, match="symlink"):
        client.get("link/secret")
    with pytest.raises(InvalidKeyError):
        client.put("link/new", b"x")
    assert not os.path.exists(os.path.join(outside, "new"))


def test_client_disconnecting_mid_request_does_not_disturb_others(node: NodeProcess) -> None:
    # Half a frame, then gone.
    peer = RawPeer(node.address)
    frame = peer.raw_frame(3, [1, "put", {"key": "half"}], b"y" * 100_000)
    peer.sock.sendall(frame[: len(frame) // 2])
    peer.sock.close()
    # A whole write whose response nobody waits for.
    # Closed once the put is done, with its answer unread: the close becomes a reset,
    # and the node's reply meets a dead socket.
    peer2 = RawPeer(node.address)
    peer2.sock.sendall(peer2.raw_frame(3, [1, "put", {"key": "orphan"}], b"z" * 1_000_000))
    with shuttle.connect(node=node.address) as c:
        deadline = time.monotonic() + 30
        while not c.exists("orphan"):  # a whole frame arrived: the node must apply it
            assert time.monotonic() < deadline, "the node never applied a whole request"
            time.sleep(0.01)
        peer2.sock.close()
        assert c.get("orphan") == b"z" * 1_000_000  # and applied it whole
        with pytest.raises(NotFoundError):
            c.stat("half")  # the half-sent put never happened
    still_serves(node)
    with shuttle.connect(node=node.address) as c:
        assert c.get("orphan") == b"z" * 1_000_000
        stats = c.node_stats(c.nodes[0])
    assert stats["server"]["connections_open"] >= 1


def test_unreachable_node_gives_a_clear_error(tmp_path: os.PathLike[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = shuttle.connect(node=f"127.0.0.1:{port}", connect_timeout_s=2)
    with pytest.raises(UnreachableError, match=rf"cannot reach node 127.0.0.1:{port}.*running"):
        c.stat("x")


def test_node_killed_mid_call_gives_unreachable_then_recovers(node: NodeProcess) -> None:
    c = shuttle.connect(node=node.address, request_timeout_s=10)
    c.put("k", b"v")
    node.kill()
    with pytest.raises(UnreachableError):
        c.put("k2", b"v2")
    node.start()
    assert c.get("k") == b"v"
    c.close()


def test_version_mismatch_from_a_newer_client_is_explained(node: NodeProcess) -> None:
    peer = RawPeer(node.address, handshake=False)
    assert isinstance(peer.next_event(), Challenge)
    peer.sock.sendall(peer.conn.send_bytes(Hello(7, 9, "future")))
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse)
    with pytest.raises(RemoteProtocolError, match="no common protocol version"):
        raise ev.to_exception()


def test_a_burst_past_the_in_flight_limit_gets_backpressure_and_every_answer(
    node: NodeProcess,
) -> None:
    """399 slow requests (fsync'd puts) sent at once, more than the 256 a connection may
    have in flight: the node runs a few at a time and stops reading the rest until they
    are answered (TCP backpressure), so none is refused, lost or answered twice."""
    peer = RawPeer(node.address)
    peer.conn.peer_limits = type(peer.conn.peer_limits)(in_flight_max=10_000)
    wire = b"".join(
        peer.conn.send_bytes(Request(i, "put", {"key": f"f/{i}"}, b"p")) for i in range(1, 400)
    )
    peer.sock.sendall(wire)
    answers = [peer.next_event() for _ in range(399)]
    assert all(isinstance(a, Response) for a in answers), [
        a for a in answers if not isinstance(a, Response)
    ][:3]
    rids = sorted(a.rid for a in answers if isinstance(a, Response))
    assert rids == list(range(1, 400))  # each answered once
    with shuttle.connect(node=node.address) as c:
        [n] = c.nodes
        assert c.node_stats(n)["server"]["holds"] > 0  # the node did hold the rest back
        assert c.get("f/399") == b"p"
