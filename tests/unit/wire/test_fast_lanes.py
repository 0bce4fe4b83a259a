"""The codec's fast lanes (``send_request``/``send_response`` with ``join_below``,
``receive_event`` on whole frames) are the general path in short: for any frames, in
any split, they produce the same bytes and the same events, and garbage fed through
them raises the same protocol error."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import LimitExceededError, LocalProtocolError, RemoteProtocolError
from shuttle.wire import (
    NEED_DATA,
    Connection,
    ErrorResponse,
    Event,
    Limits,
    NeedData,
    Request,
    RequestRejected,
    Response,
    State,
)
from shuttle.wire.events import FrameKind
from shuttle.wire.frames import encode_frame_fast
from tests.unit.wire.test_codec import (
    args_st,
    chunking,
    drain,
    handshake,
    normalise,
    request_batches,
)

JOIN = 64 << 10


def receive_all(conn: Connection, pieces: list[bytes]) -> list[Event]:
    """Feed each piece with receive_event, then drain, as an I/O layer does."""
    events: list[Event] = []
    for piece in pieces:
        if not piece:
            continue
        ev: Event | NeedData = conn.receive_event(piece)
        while ev is not NEED_DATA:
            assert not isinstance(ev, NeedData)
            events.append(ev)
            ev = conn.next_event()
    return events


def split(data: bytes, sizes: list[int]) -> list[bytes]:
    out, pos = [], 0
    for size in sizes:
        out.append(data[pos : pos + size])
        pos += size
    out.append(data[pos:])
    return [p for p in out if p]


@settings(max_examples=150, deadline=None)
@given(requests=request_batches(), sizes=chunking, whole=st.booleans())
def test_fast_lanes_round_trip_like_the_general_path(
    requests: list[Request], sizes: list[int], whole: bool
) -> None:
    client, server = handshake()
    client_ref, _ = handshake()
    frames = [
        b"".join(client.send_request(r.rid, r.op, r.args, r.payload, join_below=JOIN))
        for r in requests
    ]
    assert frames == [client_ref.send_bytes(r) for r in requests]  # the same bytes
    # Frame by frame (each one whole: the fast lane) or in any split (the long way).
    pieces = frames if whole else split(b"".join(frames), sizes)
    received = receive_all(server, pieces)
    assert [normalise(e) for e in received] == [normalise(r) for r in requests]

    answers = [
        b"".join(server.send_response(r.rid, {"n": i}, r.payload, join_below=JOIN))
        for i, r in enumerate(requests)
    ]
    pieces = answers if whole else split(b"".join(answers), list(reversed(sizes)))
    got = receive_all(client, pieces)
    assert [normalise(e) for e in got] == [
        normalise(Response(r.rid, {"n": i}, r.payload)) for i, r in enumerate(requests)
    ]
    assert client.in_flight == 0 and server.in_flight == 0


@settings(max_examples=300)
@given(garbage=st.binary(min_size=1, max_size=400), kind=st.sampled_from([3, 4, 5]))
def test_garbage_through_the_fast_lane_raises_the_protocol_error(garbage: bytes, kind: int) -> None:
    """Whole-looking frames with any header bytes: a request or error, or the protocol
    error, exactly as the general path answers them."""
    frame = struct.pack(">2sBBII", b"SH", kind, 0, len(garbage), 0) + garbage
    for role in (0, 1):  # a client, then a node, receiving it
        fast_conn, ref_conn = handshake()[role], handshake()[role]
        try:
            ref_conn.receive_data(frame)
            expected: Any = drain(ref_conn)
        except RemoteProtocolError as exc:
            expected = type(exc)
        try:
            got: Any = receive_all(fast_conn, [frame])
        except RemoteProtocolError as exc:
            got = type(exc)
            assert fast_conn.state is State.ERROR
        if isinstance(expected, list):
            assert isinstance(got, list)
            assert [type(e) for e in got] == [type(e) for e in expected]
        else:
            assert got is expected


def test_a_whole_frame_with_more_after_it_goes_the_long_way() -> None:
    client, server = handshake()
    a = b"".join(client.send_request(1, "stat", {"key": "a"}))
    b = b"".join(client.send_request(2, "stat", {"key": "b"}))
    events = receive_all(server, [a + b[:5], b[5:]])
    assert [e.rid for e in events] == [1, 2]  # type: ignore[union-attr]


def test_fast_lane_requests_are_checked_like_any() -> None:
    client, server = handshake(Limits(in_flight_max=1))
    client.peer_limits = Limits()  # a client that ignores the node's limit

    def raw(header: Any) -> bytes:
        h = msgpack.packb(header)
        return struct.pack(">2sBBII", b"SH", 3, 0, len(h), 0) + h

    [first] = receive_all(server, [raw([1, "stat", {}])])
    assert isinstance(first, Request)
    [second] = receive_all(server, [raw([2, "stat", {}])])  # over the in-flight limit
    assert isinstance(second, RequestRejected)
    server.send_response(1, None)
    server.send(ErrorResponse.from_exception(2, second.error))
    [dup_a] = receive_all(server, [raw([3, "stat", {}])])
    assert isinstance(dup_a, Request)
    with pytest.raises(RemoteProtocolError, match="already in flight"):
        receive_all(server, [raw([3, "stat", {}])])  # id 3 is still in flight
    _, server = handshake()
    with pytest.raises(RemoteProtocolError):
        receive_all(server, [raw([0, "stat", {}])])  # id 0 is the connection's


def test_a_response_nobody_asked_for_is_a_protocol_error_in_the_fast_lane() -> None:
    client, server = handshake()
    client.send_request(1, "stat", {})
    server.receive_data(b"".join(client.send_request(2, "stat", {})))
    h = msgpack.packb([99, None])
    with pytest.raises(RemoteProtocolError, match="not in flight"):
        client.receive_event(struct.pack(">2sBBII", b"SH", 4, 0, len(h), 0) + h)
    assert client.state is State.ERROR


def test_a_read_reply_received_whole_is_taken_only_if_its_id_is_in_flight() -> None:
    """``take_read_reply`` (after ``recv_read_reply`` took the reply off the socket):
    the id in flight is taken out once; any other leaves the connection as it was."""
    client, server = handshake()
    frame = client.send_read_request(3, "k", 0, 10, None)
    assert frame is not None and client.in_flight == 1
    assert not client.take_read_reply(4)  # not asked for
    assert client.in_flight == 1
    assert client.take_read_reply(3)
    assert client.in_flight == 0
    assert not client.take_read_reply(3)  # answered already
    assert not server.take_read_reply(3)  # a node never takes a reply
    client.receive_data(b"SH")  # part of a frame waiting: not at a frame's boundary
    client.send_read_request(5, "k", 0, 10, None)
    assert not client.take_read_reply(5)
    assert client.in_flight == 1


def test_send_lanes_refuse_what_send_refuses() -> None:
    client, server = handshake(Limits(payload_bytes_max=10, in_flight_max=1))
    with pytest.raises(LocalProtocolError, match="no request 5"):
        server.send_response(5, None)
    client.send_request(1, "stat", {})
    with pytest.raises(LocalProtocolError, match="already in flight"):
        client.send_request(1, "stat", {})
    client2, _ = handshake(Limits(payload_bytes_max=10, in_flight_max=1))
    with pytest.raises(LimitExceededError, match="limit of 10"):
        client2.send_request(1, "write", {}, b"x" * 11)
    with pytest.raises(LimitExceededError, match="frame header"):
        client2.send_request(1, "write", {"k": "x" * (2 << 20)})
    assert client2.in_flight == 0
    small = client2.send_request(1, "write", {}, b"x" * 10, join_below=JOIN)
    assert len(small) == 1  # joined: one buffer to write
    big, _ = handshake()
    payload = memoryview(bytearray(100))
    buffers = big.send_request(1, "write", {}, payload, join_below=50)
    assert buffers[-1] is payload  # not joined: the payload is not copied


@given(args=args_st)
def test_requests_with_any_arguments_pass_the_fast_lane(args: dict[str, Any]) -> None:
    client, server = handshake()
    [ev] = receive_all(server, [b"".join(client.send_request(1, "op", args))])
    assert isinstance(ev, Request) and ev.args == args


def norm(ev: Event) -> Any:
    """:func:`normalise`, with a rejection compared by its error's type and message."""
    if isinstance(ev, RequestRejected):
        return ("RequestRejected", ev.rid, type(ev.error), str(ev.error))
    return normalise(ev)


def lane_or_event(conn: Connection, frame: bytes, node: bool) -> Any:
    """What an I/O layer gets for one chunk: the lane's answer, or (when the lane
    declines, having consumed nothing) the general path's events or protocol error."""
    in_flight = conn.in_flight
    got: Any = conn.receive_request(frame) if node else conn.receive_response(frame)
    if got is not None:
        return ("lane", normalise(Request(*got)) if node else normalise(got))
    assert conn.in_flight == in_flight and conn.state is State.READY  # nothing consumed
    try:
        return ("events", [norm(e) for e in receive_all(conn, [frame])])
    except RemoteProtocolError as exc:
        return ("error", type(exc))


@settings(max_examples=150, deadline=None)
@given(requests=request_batches())
def test_the_request_and_response_lanes_take_what_the_general_path_takes(
    requests: list[Request],
) -> None:
    """The node's request lane and the client's response lane (the calls the I/O
    layers make first) give the same request and response as receive_event."""
    client, server = handshake()
    ref_client, ref_server = handshake()
    for r in requests:
        frame = b"".join(client.send_request(r.rid, r.op, r.args, r.payload, join_below=JOIN))
        ref_client.send_request(r.rid, r.op, r.args, r.payload, join_below=JOIN)
        kind, got = lane_or_event(server, frame, node=True)
        assert kind == "lane" or len(r.payload) >= JOIN  # small: always the lane
        [expected] = receive_all(ref_server, [frame])
        assert (got if kind == "lane" else got[0]) == normalise(expected)
    for i, r in enumerate(requests):
        answer = b"".join(server.send_response(r.rid, {"n": i}, r.payload, join_below=JOIN))
        ref_server.send_response(r.rid, {"n": i}, r.payload, join_below=JOIN)
        kind, got = lane_or_event(client, answer, node=False)
        [expected] = receive_all(ref_client, [answer])
        assert (got if kind == "lane" else got[0]) == normalise(expected)
    assert client.in_flight == server.in_flight == 0


@settings(max_examples=300)
@given(
    header=st.one_of(
        st.binary(max_size=60),
        st.tuples(
            st.one_of(st.integers(1, 3), st.integers(-2, 0), st.booleans(), st.none()),
            st.one_of(st.text(min_size=1, max_size=3), st.just(""), st.integers(-9, 9)),
            st.one_of(
                st.dictionaries(st.text(max_size=2), st.integers(-9, 9), max_size=2),
                st.lists(st.integers(-9, 9), max_size=2),
                st.none(),
            ),
        ).map(lambda t: msgpack.packb(list(t))),
        st.tuples(
            st.one_of(st.integers(-1, 3), st.booleans(), st.none()),
            st.one_of(st.none(), st.integers(-9, 9)),
        ).map(lambda t: msgpack.packb(list(t))),
    ),
    kind=st.sampled_from([3, 4, 5]),
    in_flight=st.lists(st.integers(1, 3), max_size=3),
)
def test_the_lanes_and_the_general_path_agree_on_any_header(
    header: bytes, kind: int, in_flight: list[int]
) -> None:
    """Any frame through a lane: taken alike, or declined with nothing consumed and
    then answered by the general path exactly as a connection that never tried it."""
    frame = struct.pack(">2sBBII", b"SH", kind, 0, len(header), 0) + header
    for node in (True, False):
        pair, ref_pair = handshake(), handshake()
        conn, ref = pair[1 if node else 0], ref_pair[1 if node else 0]
        for peer, c in ((pair[0], conn), (ref_pair[0], ref)):
            for rid in dict.fromkeys(in_flight):  # requests already in flight
                if node:
                    receive_all(c, [b"".join(peer.send_request(rid, "stat", {}))])
                else:
                    c.send_request(rid, "stat", {})
        got = lane_or_event(conn, frame, node)
        try:
            expected: Any = ("events", [norm(e) for e in receive_all(ref, [frame])])
        except RemoteProtocolError as exc:
            expected = ("error", type(exc))
        if got[0] == "lane":
            assert expected[0] == "events" and expected[1] == [got[1]]
        else:
            assert got == expected


def test_the_read_lane_replies_with_a_range_of_a_buffer_as_send_response_would() -> None:
    """The node's read lane hands the connection a cached block and the read's range:
    the reply is ``send_response`` of that range's bytes (the payload copied once, into
    the frame), with the same checks: the id in flight, the client's payload limit."""
    client, server = handshake()
    block = bytes(range(256)) * 16
    for rid in (7, 8, 9):
        frame = client.send_read_request(rid, "k", 100, 200, None)
        assert frame is not None and server.receive_read_request(frame) is not None
    reply = server.send_read_reply(7, block, 100, 300)
    general = encode_frame_fast(FrameKind.RESPONSE, [7, None], block[100:300], 1 << 30, 1 << 30)
    assert reply == b"".join(general)
    assert client.receive_read_reply(reply, 7) == block[100:300]
    with pytest.raises(LocalProtocolError, match="no request 7"):
        server.send_read_reply(7, block, 100, 300)  # answered already
    server.peer_limits = Limits(payload_bytes_max=100)
    with pytest.raises(LimitExceededError, match="limit of 100"):
        server.send_read_reply(8, block, 0, 101)  # the range is over the client's limit
    assert client.receive_read_reply(server.send_read_reply(8, block, 0, 100), 8) == block[:100]
    with pytest.raises(ValueError, match="start <= stop"):
        server.send_read_reply(9, block, 10, 5)  # a caller's bug: nothing is sent
    assert server.in_flight == 1  # 9 still waits for its answer
