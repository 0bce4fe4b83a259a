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
