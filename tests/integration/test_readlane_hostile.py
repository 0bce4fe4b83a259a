"""The read lane under hostile input, over a real socket to a node process.

A node hands every chunk a client sends to the read lane's parser first
(``shuttle.wire.readlane``: the C one of ``_readlane.c`` when Shuttle runs its compiled
modules, else the pure reference), before the codec has looked at it. So whatever a
peer sends that looks like a read (cut short, sent a byte at a time, over the header
limit, with arguments the lane does not take, followed by garbage, before the
handshake, or mutated at random) must be declined by the lane and then answered by the
general path with the read's bytes or with a clear error, the node must not crash, and
it must go on serving. docs/security.md, "The C extensions under hostile input", says
what was checked; ``make sanitize`` runs this module with the extensions built under
AddressSanitizer and UndefinedBehaviorSanitizer.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shuttle
from shuttle.errors import (
    InvalidArgumentError,
    InvalidKeyError,
    NotFoundError,
    RemoteProtocolError,
    VersionMismatchError,
)
from shuttle.wire import HEADER_BYTES_MAX, PAYLOAD_BYTES_MAX, ErrorResponse, FrameKind, Response
from shuttle.wire.frames import FrameReader
from shuttle.wire.readlane import pure_pack_read_request
from tests.examples import examples
from tests.integration.nodeproc import NodeProcess
from tests.integration.test_node_errors import RawPeer, still_serves

#: The object the reads ask for: three 64 KiB blocks of the node's cache, each byte
#: telling its offset apart from its neighbours'.
OBJECT = bytes((i * 7 + i // 251) & 0xFF for i in range(3 * 65536))


@pytest.fixture(scope="module")
def warm_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node for the module, holding ``k`` with every block in its cache, so that a
    well-formed read of it is answered by the lane itself (checked below)."""
    proc = NodeProcess(tmp_path_factory.mktemp("hostile") / "node").start()
    try:
        with shuttle.connect(node=proc.address) as c:
            c.put("k", OBJECT)
            assert c.read("k", 0, len(OBJECT)) == OBJECT
        yield proc
    finally:
        status = proc.terminate()
        assert status in (0, None), (
            f"node exited with {status}; log:\n{proc.log.read_text()[-3000:]}"
        )


@pytest.fixture(autouse=True)
def no_error_escapes(warm_node: NodeProcess) -> Iterator[None]:
    """After each test, nothing the peer sent made an exception escape into the node's
    event loop (a lane that raised instead of declining would: the loop logs a
    traceback and drops the connection, which a peer could not tell from a refusal)."""
    seen = warm_node.log.stat().st_size
    yield
    with open(warm_node.log, "rb") as log:
        log.seek(seen)
        new = log.read().decode(errors="replace")
    for sign in ("Traceback", "Fatal error", "ERROR"):
        assert sign not in new, f"the node logged an error:\n{new[-3000:]}"


def read_frame(rid: int, key: str = "k", offset: int = 0, length: int = 4096) -> bytes:
    frame = pure_pack_read_request(rid, key, offset, length, None)
    assert frame is not None
    return frame


def raw_frame(header: bytes, payload: bytes = b"", kind: int = 3) -> bytes:
    return struct.pack(">2sBBII", b"SH", kind, 0, len(header), len(payload)) + header + payload


def lane_reads(node: NodeProcess) -> int:
    with shuttle.connect(node=node.address) as c:
        return int(c.node_stats(c.nodes[0])["server"]["read_lane"])


def answer(peer: RawPeer, rid: int, frame: bytes) -> object:
    """Send ``frame`` (a request with id ``rid``) and return the node's answer to it."""
    peer.conn._in_flight.add(rid)  # so the codec takes the answer
    peer.sock.sendall(frame)
    return peer.next_event()


def test_a_well_formed_read_is_taken_by_the_lane(warm_node: NodeProcess) -> None:
    """The control: the frames below start from this one, which the lane answers (so
    what the lane declines is the lane's choice, not a node without a lane)."""
    before = lane_reads(warm_node)
    peer = RawPeer(warm_node.address)
    ev = answer(peer, 1, read_frame(1, offset=5000, length=3000))
    assert isinstance(ev, Response) and bytes(ev.payload) == OBJECT[5000:8000]
    assert lane_reads(warm_node) == before + 1


def test_a_read_sent_a_byte_at_a_time_is_answered(warm_node: NodeProcess) -> None:
    peer = RawPeer(warm_node.address)
    peer.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    peer.conn._in_flight.add(2)
    for byte in read_frame(2, offset=70000, length=100):
        peer.sock.sendall(bytes([byte]))
    ev = peer.next_event()
    assert isinstance(ev, Response) and bytes(ev.payload) == OBJECT[70000:70100]


def test_a_read_cut_short_by_the_peer_leaves_the_node_serving(warm_node: NodeProcess) -> None:
    for cut in (1, 11, 12, 20):  # in the prefix, at its end, in the header
        peer = RawPeer(warm_node.address)
        peer.sock.sendall(read_frame(3)[:cut])
        peer.sock.shutdown(socket.SHUT_WR)
        assert peer.closed_by_peer()
    assert warm_node.alive()
    still_serves(warm_node)


def test_a_read_whose_header_is_over_the_limit_is_refused_unparsed(
    warm_node: NodeProcess,
) -> None:
    """A whole read frame with a 2 MiB key: over the node's header limit. The lane
    declines it in whatever pieces it arrives in (and checks the limit itself when
    given a whole one, tests/unit/wire/test_readlane.py); the codec refuses it from its
    prefix, a protocol error."""
    peer = RawPeer(warm_node.address)
    peer.sock.sendall(read_frame(4, key="x" * (2 << 20)))
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and "over the limit" in ev.message
    assert peer.closed_by_peer()
    still_serves(warm_node)


def test_a_header_length_beyond_the_bytes_sent_waits_for_them(warm_node: NodeProcess) -> None:
    """A prefix that says the header is longer than what follows: the lane must not
    read past the chunk; the node waits for the rest, and the peer's end of stream
    closes the connection."""
    good = read_frame(5)
    lying = good[:4] + struct.pack(">I", len(good) - 12 + 100) + good[8:]
    peer = RawPeer(warm_node.address)
    peer.sock.sendall(lying)
    peer.sock.shutdown(socket.SHUT_WR)
    assert peer.closed_by_peer()
    still_serves(warm_node)


# Read requests the lane declines and the general path refuses, each with what the
# error must say (whose fault, and what to do is in the node's messages).
REFUSED = [
    ({"key": "k", "offset": -1, "length": 1}, InvalidArgumentError, "offset"),
    ({"key": "k", "offset": 0, "length": -1}, InvalidArgumentError, "length must be"),
    ({"key": b"k", "offset": 0, "length": 1}, InvalidArgumentError, "key"),
    ({"key": "../etc/passwd", "offset": 0, "length": 1}, InvalidKeyError, "key"),
    (
        {"key": "k", "offset": 0, "length": 1, "expected_version": -1},
        InvalidArgumentError,
        "expected_version",
    ),
    (
        {"key": "k", "offset": 0, "length": 1, "expected_version": 1 << 40},
        VersionMismatchError,
        "version",
    ),
    ({"key": "no-such-key", "offset": 0, "length": 1}, NotFoundError, "no-such-key"),
]


@pytest.mark.parametrize(("args", "error", "says"), REFUSED)
def test_read_arguments_the_lane_declines_get_a_clear_error(
    warm_node: NodeProcess, args: dict[str, object], error: type[Exception], says: str
) -> None:
    peer = RawPeer(warm_node.address)
    head = msgpack.packb([6, "read", args], use_bin_type=True)
    ev = answer(peer, 6, raw_frame(head))
    assert isinstance(ev, ErrorResponse) and ev.rid == 6, ev
    exc = ev.to_exception()
    assert isinstance(exc, error), exc
    assert says in ev.message
    # The connection lives on, and its next read is the lane's again.
    ev = answer(peer, 7, read_frame(7, offset=1, length=10))
    assert isinstance(ev, Response) and bytes(ev.payload) == OBJECT[1:11]


def test_reads_the_lane_declines_but_the_codec_takes_are_answered(warm_node: NodeProcess) -> None:
    """Encodings the lane leaves to the general path (a repeated argument, an offset
    beyond 64 bits' signed range, a length over the lane's size, an argument it does
    not know): answered as the codec reads them."""
    peer = RawPeer(warm_node.address)
    repeated = b"\x93\x08\xa4read\x84\xa3key\xa1j\xa6offset\x00\xa6length\x05\xa3key\xa1k"
    ev = answer(peer, 8, raw_frame(repeated))
    assert isinstance(ev, Response) and bytes(ev.payload) == OBJECT[:5]  # the last "key"
    head = msgpack.packb([9, "read", {"key": "k", "offset": (1 << 64) - 1, "length": 5}])
    ev = answer(peer, 9, raw_frame(head))
    assert isinstance(ev, Response) and bytes(ev.payload) == b""  # past the end
    head = msgpack.packb([16, "read", {"key": "k", "offset": 0, "length": 1 << 62}])
    ev = answer(peer, 16, raw_frame(head))  # over the lane's size: clipped at the end
    assert isinstance(ev, Response) and bytes(ev.payload) == OBJECT
    head = msgpack.packb([10, "read", {"key": "k", "offset": 3, "length": 2, "x": 1}])
    ev = answer(peer, 10, raw_frame(head))
    assert isinstance(ev, (Response, ErrorResponse))


def test_a_read_with_a_payload_is_answered_by_the_general_path(warm_node: NodeProcess) -> None:
    """The lane takes no read with a payload; the general path answers it (a read's
    payload is ignored) and the connection goes on."""
    frame = read_frame(11)
    with_payload = frame[:8] + struct.pack(">I", 3) + frame[12:] + b"abc"
    peer = RawPeer(warm_node.address)
    ev = answer(peer, 11, with_payload)
    assert isinstance(ev, Response) and bytes(ev.payload) == OBJECT[:4096]
    ev = answer(peer, 12, read_frame(12, offset=2, length=3))
    assert isinstance(ev, Response) and bytes(ev.payload) == OBJECT[2:5]


@pytest.mark.parametrize("rid", [0, -5])
def test_a_read_whose_id_is_not_positive_is_a_protocol_error(
    warm_node: NodeProcess, rid: int
) -> None:
    peer = RawPeer(warm_node.address)
    peer.sock.sendall(
        raw_frame(msgpack.packb([rid, "read", {"key": "k", "offset": 0, "length": 1}]))
    )
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and ev.code == "protocol", ev
    assert ev.message
    assert peer.closed_by_peer()
    still_serves(warm_node)


def test_garbage_after_a_whole_read_in_one_chunk(warm_node: NodeProcess) -> None:
    """The read is answered, then the garbage is a protocol error and the end."""
    peer = RawPeer(warm_node.address)
    peer.conn._in_flight.add(13)
    peer.sock.sendall(read_frame(13, offset=9, length=4) + b"GET / HTTP/1.1\r\n\r\n")
    ev = peer.next_event()
    assert isinstance(ev, Response) and bytes(ev.payload) == OBJECT[9:13]
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and "magic" in ev.message
    assert peer.closed_by_peer()


def test_a_read_before_the_handshake_is_refused(warm_node: NodeProcess) -> None:
    peer = RawPeer(warm_node.address, handshake=False)
    peer.next_event()  # the node's challenge
    peer.sock.sendall(read_frame(14))
    ev = peer.next_event()
    assert isinstance(ev, ErrorResponse) and ev.rid == 0 and ev.code == "protocol"
    assert "Request in state CHALLENGED" in ev.message
    assert peer.closed_by_peer()


def _frames_until_closed(peer: RawPeer) -> list[tuple[FrameKind, object, bytes]]:
    """Every frame the node sends until it closes (the peer has shut its side), read
    by the codec's frame reader alone (a mutated id is a fine request, so no check of
    ids in flight here); a frame the reader cannot read fails the test."""
    reader = FrameReader(header_bytes_max=HEADER_BYTES_MAX, payload_bytes_max=PAYLOAD_BYTES_MAX)
    frames: list[tuple[FrameKind, object, bytes]] = []
    peer.sock.settimeout(10)
    while True:
        try:
            data = peer.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            assert reader.buffered_bytes == 0, "the node's last frame was cut short"
            return frames
        reader.feed(data)
        try:
            while (frame := reader.next_frame()) is not None:
                frames.append((frame[0], frame[1], bytes(frame[2])))
        except RemoteProtocolError as exc:
            raise AssertionError(f"the node sent a malformed frame: {exc}") from exc


@settings(
    max_examples=examples(25),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(st.data())
def test_mutated_read_frames_never_crash_the_node(
    warm_node: NodeProcess, data: st.DataObject
) -> None:
    """A valid read with one to three bytes changed, sent on its own connection with
    the end of stream after it: whatever the node makes of it, it answers in whole
    frames the codec reads (a response, an error, a goodbye) and closes, and it keeps
    running."""
    frame = bytearray(read_frame(15, offset=data.draw(st.integers(0, 1 << 20)), length=4096))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    peer = RawPeer(warm_node.address)
    peer.sock.sendall(bytes(frame))
    peer.sock.shutdown(socket.SHUT_WR)
    for kind, header, _payload in _frames_until_closed(peer):
        assert kind in (FrameKind.RESPONSE, FrameKind.ERROR, FrameKind.GOODBYE), kind
        assert isinstance(header, list) and header, header
    assert warm_node.alive(), warm_node.log.read_text()[-3000:]
