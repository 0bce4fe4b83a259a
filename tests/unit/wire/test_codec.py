"""The sans-I/O codec: frames round-trip whole, byte by byte and in any chunking;
garbage never crashes the parser, it raises the protocol error."""

from __future__ import annotations

import struct
import tracemalloc
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    LocalProtocolError,
    RemoteProtocolError,
)
from shuttle.wire import (
    NEED_DATA,
    PROTOCOL_VERSION_MAX,
    PROTOCOL_VERSION_MIN,
    Challenge,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Event,
    Goodbye,
    Hello,
    Limits,
    Request,
    RequestRejected,
    Response,
    Role,
    State,
    Welcome,
    choose_version,
)
from shuttle.wire.events import FrameKind
from shuttle.wire.limits import HEADER_DEPTH_MAX

# --- helpers ----------------------------------------------------------------------


def drain(conn: Connection) -> list[Event]:
    events: list[Event] = []
    while True:
        ev = conn.next_event()
        if ev is NEED_DATA:
            return events
        assert not isinstance(ev, type(NEED_DATA))
        events.append(ev)


def feed_in_chunks(conn: Connection, data: bytes, sizes: list[int]) -> list[Event]:
    events: list[Event] = []
    pos = 0
    for size in sizes:
        if pos >= len(data):
            break
        conn.receive_data(data[pos : pos + size])
        pos += size
        events += drain(conn)
    if pos < len(data):
        conn.receive_data(data[pos:])
        events += drain(conn)
    return events


#: A fixed challenge nonce (the node draws a fresh random one per connection).
NONCE = bytes(range(32))


def handshake(limits: Limits | None = None) -> tuple[Connection, Connection]:
    """Both ends through CHALLENGE, HELLO and WELCOME (no key), in state READY."""
    client = Connection(Role.CLIENT)
    server = Connection(Role.SERVER, limits)
    challenge = Challenge(NONCE, False, "blake3-keyed-v1")
    client.receive_data(server.send_bytes(challenge))
    assert drain(client) == [challenge]
    hello = Hello(PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX, "test")
    server.receive_data(client.send_bytes(hello))
    [hello] = drain(server)
    assert isinstance(hello, Hello)
    welcome = Welcome(choose_version(hello), "node-1", server.our_limits.to_wire())
    client.receive_data(server.send_bytes(welcome))
    assert drain(client) == [welcome]
    assert client.state is State.READY and server.state is State.READY
    return client, server


def normalise(ev: Event) -> Any:
    """Events compare equal regardless of payload buffer type."""
    if isinstance(ev, Request | Response):
        return (type(ev).__name__, vars_of(ev), bytes(ev.payload))
    return ev


def vars_of(ev: Request | Response) -> Any:
    if isinstance(ev, Request):
        return (ev.rid, ev.op, ev.args)
    return (ev.rid, ev.result)


# --- strategies -------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=30)
    | st.binary(max_size=30)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
args_st = st.dictionaries(st.text(max_size=12), values, max_size=5)
payload_st = st.binary(max_size=3000)
chunking = st.lists(st.integers(min_value=1, max_value=700), max_size=60)


@st.composite
def request_batches(draw: st.DrawFn) -> list[Request]:
    n = draw(st.integers(min_value=0, max_value=12))
    return [
        Request(i + 1, draw(st.text(min_size=1, max_size=20)), draw(args_st), draw(payload_st))
        for i in range(n)
    ]


# --- round trips ------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(requests=request_batches(), sizes=chunking, order=st.randoms())
def test_any_sequence_of_frames_round_trips_in_any_chunking(
    requests: list[Request], sizes: list[int], order: Any
) -> None:
    client, server = handshake()
    wire = b"".join(client.send_bytes(r) for r in requests)
    received = feed_in_chunks(server, wire, sizes)
    assert [normalise(e) for e in received] == [normalise(r) for r in requests]

    # The node answers in any order; the client matches them by request id.
    answers: list[Event] = []
    for req in order.sample(requests, len(requests)):
        if req.rid % 3 == 0:
            answers.append(ErrorResponse(req.rid, "not_found", f"no {req.op}"))
        else:
            answers.append(Response(req.rid, {"echo": req.args}, req.payload))
    back = b"".join(server.send_bytes(a) for a in answers)
    got = feed_in_chunks(client, back, list(reversed(sizes)))
    assert [normalise(e) for e in got] == [normalise(a) for a in answers]
    assert client.in_flight == 0 and server.in_flight == 0


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=request_batches())
def test_byte_by_byte_equals_whole(requests: list[Request]) -> None:
    client, server_whole = handshake()
    _, server_bytes = handshake()
    wire = b"".join(client.send_bytes(r) for r in requests)
    if wire:  # an empty receive_data means end of stream
        server_whole.receive_data(wire)
    whole = drain(server_whole)
    one_by_one = feed_in_chunks(server_bytes, wire, [1] * len(wire))
    assert [normalise(e) for e in whole] == [normalise(e) for e in one_by_one]
    assert len(whole) == len(requests)


def test_trailing_partial_frame_waits_for_more() -> None:
    client, server = handshake()
    first = client.send_bytes(Request(1, "stat", {"key": "a"}))
    second = client.send_bytes(Request(2, "read", {"key": "a"}, b"x" * 100))
    server.receive_data(first + second[:7])
    [ev] = drain(server)
    assert isinstance(ev, Request) and ev.rid == 1
    server.receive_data(second[7:50])
    assert server.next_event() is NEED_DATA
    server.receive_data(second[50:])
    [ev2] = drain(server)
    assert isinstance(ev2, Request) and bytes(ev2.payload) == b"x" * 100


def test_payload_buffers_are_not_copied_by_send() -> None:
    client, _ = handshake()
    payload = memoryview(bytearray(b"p" * 5000))
    buffers = client.send(Request(1, "write", {}, payload))
    assert buffers[-1] is payload


# --- errors, limits, clean close ----------------------------------------------------


@settings(max_examples=300)
@given(garbage=st.binary(min_size=1, max_size=400), sizes=chunking)
def test_garbage_never_crashes_the_parser(garbage: bytes, sizes: list[int]) -> None:
    for prefix in (b"", b"SH\x03\x00"):
        _, server = handshake()
        try:
            feed_in_chunks(server, prefix + garbage, sizes)
        except RemoteProtocolError:
            assert server.state is State.ERROR
            with pytest.raises(RemoteProtocolError):
                server.next_event()


@given(header=st.binary(max_size=200))
@example(header=b"")  # no header at all
@example(header=b"\xc1")  # a byte msgpack never uses
@example(header=b"\x93\x01\xa1a\x80\x00")  # a request followed by a stray byte
@example(header=b"\xa1x")  # decodes, but to a string, not [rid, op, args]
def test_undecodable_headers_raise_the_protocol_error(header: bytes) -> None:
    _, server = handshake()
    frame = struct.pack(">2sBBII", b"SH", 3, 0, len(header), 0) + header
    server.receive_data(frame)
    try:
        events = drain(server)
    except RemoteProtocolError as exc:
        assert "header" in str(exc)
        assert server.state is State.ERROR
        with pytest.raises(RemoteProtocolError):
            server.next_event()  # the stream stays broken
        return
    # Only a header that really is [rid, op, args] may get through: as that request,
    # or as its rejection (the rid is known, so the node can answer it).
    decoded = msgpack.unpackb(header)
    assert isinstance(decoded, list) and len(decoded) == 3, decoded
    assert len(events) == 1 and isinstance(events[0], Request | RequestRejected)
    assert events[0].rid == decoded[0] and server.state is State.READY


def test_bad_magic_is_a_protocol_error_naming_the_problem() -> None:
    _, server = handshake()
    server.receive_data(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(RemoteProtocolError, match="magic"):
        server.next_event()


def test_oversized_payload_is_rejected_and_skipped_without_buffering() -> None:
    client, server = handshake(Limits(payload_bytes_max=1000))
    client.peer_limits = Limits()  # a client that ignores the node's announced limit
    big = client.send_bytes(Request(1, "write", {"key": "a"}, b"z" * 50_000))
    small = client.send_bytes(Request(2, "stat", {"key": "a"}))
    events = feed_in_chunks(server, big + small, [4096] * 20)
    assert isinstance(events[0], RequestRejected)
    assert isinstance(events[0].error, LimitExceededError)
    assert "50000" in str(events[0].error)
    assert isinstance(events[1], Request) and events[1].rid == 2
    # The node answers the rejected request like any other; the connection lives on.
    reply = server.send_bytes(ErrorResponse.from_exception(1, events[0].error))
    client.receive_data(reply)
    [err] = drain(client)
    assert isinstance(err, ErrorResponse)
    assert isinstance(err.to_exception(), LimitExceededError)


def test_oversized_header_is_refused_as_a_corrupt_stream() -> None:
    _, server = handshake(Limits(header_bytes_max=100))
    header = msgpack.packb([1, "stat", {"k": "x" * 500}])
    server.receive_data(struct.pack(">2sBBII", b"SH", 3, 0, len(header), 0) + header)
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        server.next_event()


def test_sender_refuses_to_cross_the_peers_limits() -> None:
    client, _ = handshake(Limits(payload_bytes_max=10, in_flight_max=2))
    with pytest.raises(LimitExceededError, match="payload"):
        client.send(Request(1, "write", {}, b"x" * 11))
    client.send(Request(1, "stat", {}))
    client.send(Request(2, "stat", {}))
    with pytest.raises(LimitExceededError, match="in flight"):
        client.send(Request(3, "stat", {}))


def test_node_rejects_too_many_requests_in_flight_with_a_typed_error() -> None:
    client, server = handshake(Limits(in_flight_max=2))
    client.peer_limits = Limits()
    wire = b"".join(client.send_bytes(Request(i, "stat", {})) for i in (1, 2, 3))
    server.receive_data(wire)
    events = drain(server)
    assert [type(e) for e in events] == [Request, Request, RequestRejected]


def test_duplicate_request_id_and_bad_arguments_are_rejected() -> None:
    _, server = handshake()

    # Forge frames a correct client would never send.
    def raw_request(header: Any) -> bytes:
        h = msgpack.packb(header)
        return struct.pack(">2sBBII", b"SH", 3, 0, len(h), 0) + h

    server.receive_data(raw_request([6, "stat", [1, 2]]) + raw_request([7, 42, {}]))
    rejected = drain(server)
    assert len(rejected) == 2
    assert all(isinstance(e, RequestRejected) for e in rejected)
    assert all(isinstance(e.error, InvalidArgumentError) for e in rejected)  # type: ignore[union-attr]
    # A second request with an id already in flight is a protocol error: its answer
    # could not be told from the first one's.
    server.receive_data(raw_request([5, "stat", {}]) + raw_request([5, "stat", {}]))
    assert isinstance(server.next_event(), Request)
    with pytest.raises(RemoteProtocolError, match="request id 5 is already in flight"):
        server.next_event()


def test_a_deeply_nested_header_is_a_protocol_error_with_a_short_message() -> None:
    """~1,000 levels once made building the error message hit the recursion limit."""
    for depth in (HEADER_DEPTH_MAX + 1, 1000):
        _, server = handshake()
        nested: Any = 1
        for _ in range(depth):
            nested = [nested]
        head = msgpack.packb([1, "stat", {"a": nested}])
        frame = struct.pack(">2sBBII", b"SH", 3, 0, len(head), 0) + head
        with pytest.raises(RemoteProtocolError, match="deeper than") as err:
            server.receive_event(frame)
        assert len(str(err.value)) < 300
        _, server = handshake()  # the same through the node's fast lane
        assert server.receive_request(frame) is None
    _, server = handshake()  # a malformed deep header: the message stays short
    nested = [1]
    for _ in range(1000):
        nested = [nested]
    head = msgpack.packb(nested)
    server.receive_data(struct.pack(">2sBBII", b"SH", 3, 0, len(head), 0) + head)
    with pytest.raises(RemoteProtocolError) as err:
        server.next_event()
    assert len(str(err.value)) < 300
    # Nesting up to the limit is served.
    _, server = handshake()
    nested = 1
    for _ in range(HEADER_DEPTH_MAX - 3):
        nested = [nested]
    head = msgpack.packb([1, "stat", {"a": nested}])
    ev = server.receive_event(struct.pack(">2sBBII", b"SH", 3, 0, len(head), 0) + head)
    assert isinstance(ev, Request)


def test_requests_before_the_handshake_are_a_protocol_error() -> None:
    client = Connection(Role.CLIENT)
    server = Connection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        client.send(Request(1, "stat", {}))
    h = msgpack.packb([1, "stat", {}])
    server.receive_data(struct.pack(">2sBBII", b"SH", 3, 0, len(h), 0) + h)
    with pytest.raises(RemoteProtocolError, match="Request in state START"):
        server.next_event()


def test_no_common_version_is_refused_with_both_ranges() -> None:
    with pytest.raises(RemoteProtocolError, match=r"client speaks 7\.\.9"):
        choose_version(Hello(7, 9))


def test_response_for_unknown_request_is_a_protocol_error() -> None:
    client, server = handshake()
    client.send(Request(1, "stat", {}))
    server.receive_data(b"".join(client.send(Request(2, "stat", {}))))
    h = msgpack.packb([99, {}])
    client.receive_data(struct.pack(">2sBBII", b"SH", 4, 0, len(h), 0) + h)
    with pytest.raises(RemoteProtocolError, match="not in flight"):
        client.next_event()


def test_clean_eof_between_frames_and_eof_mid_frame() -> None:
    client, server = handshake()
    server.receive_data(client.send_bytes(Request(1, "stat", {})))
    server.receive_data(b"")
    assert [type(e) for e in drain(server)] == [Request, ConnectionClosed]
    assert server.state is State.CLOSED

    client2, server2 = handshake()
    server2.receive_data(client2.send_bytes(Request(1, "stat", {}))[:-1])
    server2.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="middle of a frame"):
        server2.next_event()


def test_goodbye_closes_either_side() -> None:
    client, server = handshake()
    server.receive_data(client.send_bytes(Goodbye("done")))
    assert drain(server) == [Goodbye("done")]
    assert server.state is State.CLOSED and client.state is State.CLOSED


# --- large payloads: received into their own buffer -----------------------------------


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(min_value=64 << 10, max_value=300_000),
    sizes=st.lists(st.integers(min_value=1, max_value=90_000), min_size=1, max_size=40),
)
def test_large_payloads_round_trip_in_any_chunking(size: int, sizes: list[int]) -> None:
    client, server = handshake()
    body = bytes(range(256)) * (size // 256) + b"t" * (size % 256)
    wire = client.send_bytes(Request(1, "put", {"k": 1}, body)) + client.send_bytes(
        Request(2, "stat", {})
    )
    events = feed_in_chunks(server, wire, sizes)
    assert [type(e) for e in events] == [Request, Request]
    assert bytes(events[0].payload) == body  # type: ignore[union-attr]


def test_large_payload_received_in_place() -> None:
    """A client may write a large reply's payload straight into its final buffer."""
    client, _server = handshake()
    body = bytes(range(256)) * 1024  # 256 KiB
    client.send_bytes(Request(1, "read", {}))
    client.send_bytes(Request(2, "ping", {}))
    wire = server_reply(1, body) + server_reply(2, b"")
    client.receive_data(wire[:100])  # the header and a little of the payload
    assert client.next_event() is NEED_DATA
    pos = 100
    while (target := client.receive_buffer()) is not None:
        n = min(len(target), 50_000, len(wire) - pos)
        target[:n] = wire[pos : pos + n]
        client.received_into(n)
        pos += n
    events = [client.next_event()]
    client.receive_data(wire[pos:])
    events += drain(client)
    assert isinstance(events[0], Response) and bytes(events[0].payload) == body
    assert isinstance(events[1], Response) and events[1].rid == 2


def server_reply(rid: int, payload: bytes) -> bytes:
    """A RESPONSE frame as a node sends it."""
    head = msgpack.packb([rid, None])
    return struct.pack(">2sBBII", b"SH", FrameKind.RESPONSE, 0, len(head), len(payload)) + (
        head + payload
    )


def test_a_node_holds_only_the_payload_bytes_that_arrived() -> None:
    """A request whose prefix claims 16 MiB and delivers 10 bytes costs the node 10
    bytes, not 16 MiB (a stalled or hostile client cannot make it allocate)."""
    client, server = handshake()
    body = b"x" * (16 << 20)
    wire = client.send_bytes(Request(1, "put", {"key": "k"}, body))
    tracemalloc.start()
    try:
        server.receive_data(wire[: len(wire) - len(body) + 10])
        assert server.next_event() is NEED_DATA
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert server.partial_frame
    assert held < 1 << 20, f"{held} bytes held for a 10-byte partial payload"
    # The rest arrives in pieces; the request comes out whole and correct.
    sizes = [1, 65_536, 3 << 20, 1 << 20]
    events = feed_in_chunks(server, wire[len(wire) - len(body) + 10 :], sizes)
    assert len(events) == 1 and isinstance(events[0], Request)
    assert bytes(events[0].payload) == body
    assert not server.partial_frame
