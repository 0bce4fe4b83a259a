"""The challenge handshake, sans-I/O: the node speaks first (CHALLENGE), the client's
HELLO answers it, the node's WELCOME may carry its proof. Anything out of that order,
or a malformed CHALLENGE, is refused with the error that names whose fault it is."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import LocalProtocolError, RemoteProtocolError
from shuttle.wire import (
    NONCE_BYTES,
    Challenge,
    Connection,
    ConnectionClosed,
    ErrorResponse,
    Goodbye,
    Hello,
    Request,
    Response,
    Role,
    State,
    Welcome,
)
from shuttle.wire.events import FrameKind
from tests.unit.wire.test_codec import NONCE, chunking, drain, feed_in_chunks

SCHEME = "blake3-keyed-v1"
CREDENTIALS = {"scheme": SCHEME, "nonce": b"c" * NONCE_BYTES, "proof": b"p" * 32}


def raw_frame(kind: int, header: Any) -> bytes:
    head = msgpack.packb(header)
    return struct.pack(">2sBBII", b"SH", kind, 0, len(head), 0) + head


def challenged() -> tuple[Connection, Connection]:
    """A pair where the node has sent its challenge and the client has read it."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    client.receive_data(server.send_bytes(Challenge(NONCE, True, SCHEME)))
    [ev] = drain(client)
    assert isinstance(ev, Challenge)
    assert client.state is State.CHALLENGED and server.state is State.CHALLENGED
    return client, server


def test_the_handshake_in_order_on_both_ends() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    assert client.state is State.START and server.state is State.START

    challenge = Challenge(NONCE, True, SCHEME)
    client.receive_data(server.send_bytes(challenge))
    assert drain(client) == [challenge]
    assert (client.state, server.state) == (State.CHALLENGED, State.CHALLENGED)

    hello = Hello(2, 2, "test", dict(CREDENTIALS))
    server.receive_data(client.send_bytes(hello))
    assert drain(server) == [hello]  # the credentials pass through untouched
    assert (client.state, server.state) == (State.AWAIT_WELCOME, State.GREETING)

    welcome = Welcome(1, "n1", {"in_flight_max": 8}, proof=b"q" * 32)
    client.receive_data(server.send_bytes(welcome))
    assert drain(client) == [welcome]
    assert (client.state, server.state) == (State.READY, State.READY)
    assert client.peer_limits.in_flight_max == 8

    server.receive_data(client.send_bytes(Request(1, "ping", {})))
    [req] = drain(server)
    client.receive_data(server.send_bytes(Response(1, "pong")))
    assert [type(e) for e in drain(client)] == [Response] and isinstance(req, Request)


def test_welcome_without_proof_stays_optional_on_the_wire() -> None:
    client, server = challenged()
    server.receive_data(client.send_bytes(Hello(2, 2, "test")))
    drain(server)
    wire = server.send_bytes(Welcome(1, "n1", {}))
    assert b"proof" not in wire  # an old-style WELCOME, byte for byte
    [welcome] = feed_in_chunks(client, wire, [])
    assert isinstance(welcome, Welcome) and welcome.proof is None


@settings(max_examples=60, deadline=None)
@given(
    nonce=st.binary(min_size=NONCE_BYTES, max_size=NONCE_BYTES),
    required=st.booleans(),
    proof=st.none() | st.binary(max_size=64),
    sizes=chunking,
)
def test_handshake_frames_round_trip_in_any_chunking(
    nonce: bytes, required: bool, proof: bytes | None, sizes: list[int]
) -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    challenge = Challenge(nonce, required, SCHEME)
    assert feed_in_chunks(client, server.send_bytes(challenge), sizes) == [challenge]
    hello = Hello(2, 2, "t", dict(CREDENTIALS))
    assert feed_in_chunks(server, client.send_bytes(hello), sizes) == [hello]
    welcome = Welcome(1, "n", {}, proof)
    assert feed_in_chunks(client, server.send_bytes(welcome), sizes) == [welcome]


def test_a_client_cannot_say_hello_before_the_challenge() -> None:
    client = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError, match="cannot send Hello in state START"):
        client.send(Hello(2, 2, "eager"))
    assert client.state is State.START  # nothing sent, nothing changed


def test_a_node_refuses_a_hello_before_it_sent_its_challenge() -> None:
    server = Connection(Role.SERVER)
    server.receive_data(raw_frame(FrameKind.HELLO, {"version_min": 2, "version_max": 2}))
    with pytest.raises(RemoteProtocolError, match="Hello in state START"):
        server.next_event()
    assert server.state is State.ERROR


def test_only_the_node_sends_a_challenge() -> None:
    with pytest.raises(LocalProtocolError):
        Connection(Role.CLIENT).send(Challenge(NONCE, False, SCHEME))
    _, server = challenged()
    server.receive_data(
        raw_frame(FrameKind.CHALLENGE, {"nonce": NONCE, "key_required": False, "scheme": SCHEME})
    )
    with pytest.raises(RemoteProtocolError, match="Challenge in state CHALLENGED as SERVER"):
        server.next_event()


@pytest.mark.parametrize("after", ["challenge", "welcome"])
def test_a_second_challenge_is_a_protocol_error(after: str) -> None:
    client, server = challenged()
    if after == "welcome":
        server.receive_data(client.send_bytes(Hello(2, 2, "test")))
        drain(server)
        client.receive_data(server.send_bytes(Welcome(1, "n1")))
        drain(client)
        assert client.state is State.READY
    header = {"nonce": b"x" * NONCE_BYTES, "key_required": False, "scheme": SCHEME}
    client.receive_data(raw_frame(FrameKind.CHALLENGE, header))
    with pytest.raises(RemoteProtocolError, match="peer sent Challenge"):
        client.next_event()
    assert client.state is State.ERROR


@pytest.mark.parametrize(
    "header",
    [
        {"nonce": b"short", "key_required": True, "scheme": SCHEME},
        {"nonce": b"n" * (NONCE_BYTES + 1), "key_required": True, "scheme": SCHEME},
        {"nonce": "n" * NONCE_BYTES, "key_required": True, "scheme": SCHEME},
        {"key_required": True, "scheme": SCHEME},
        {"nonce": NONCE, "key_required": 1, "scheme": SCHEME},
        {"nonce": NONCE, "scheme": SCHEME},
        {"nonce": NONCE, "key_required": False},
        {"nonce": NONCE, "key_required": False, "scheme": ""},
        {"nonce": NONCE, "key_required": False, "scheme": "s" * 65},
        [NONCE, False, SCHEME],
    ],
)
def test_a_malformed_challenge_is_a_protocol_error(header: Any) -> None:
    client = Connection(Role.CLIENT)
    client.receive_data(raw_frame(FrameKind.CHALLENGE, header))
    with pytest.raises(RemoteProtocolError, match="malformed CHALLENGE header"):
        client.next_event()
    assert client.state is State.ERROR


def test_a_welcome_with_a_proof_that_is_not_bytes_is_a_protocol_error() -> None:
    client, server = challenged()
    server.receive_data(client.send_bytes(Hello(2, 2, "test")))
    drain(server)
    client.receive_data(
        raw_frame(FrameKind.WELCOME, {"version": 1, "node": "n", "limits": {}, "proof": "x"})
    )
    with pytest.raises(RemoteProtocolError, match="malformed WELCOME"):
        client.next_event()


def test_goodbye_and_clean_eof_end_a_challenged_connection() -> None:
    client, server = challenged()
    client.receive_data(server.send_bytes(Goodbye("shutting down")))
    assert drain(client) == [Goodbye("shutting down")]
    assert client.state is State.CLOSED and server.state is State.CLOSED

    client, server = challenged()
    server.receive_data(b"")  # the client hung up without answering
    assert drain(server) == [ConnectionClosed()]
    assert server.state is State.CLOSED


def test_the_node_may_refuse_the_hello_with_an_error_and_close() -> None:
    client, server = challenged()
    server.receive_data(client.send_bytes(Hello(2, 2, "test")))
    drain(server)
    refusal = ErrorResponse(0, "unauthenticated", "node n1 requires the cluster key")
    client.receive_data(server.send_bytes(refusal))
    assert drain(client) == [refusal]
    assert client.state is State.CLOSED and server.state is State.CLOSED


def test_the_node_may_refuse_a_client_that_broke_the_protocol_before_its_hello() -> None:
    client, server = challenged()
    server.receive_data(raw_frame(FrameKind.REQUEST, [1, "stat", {}]))
    with pytest.raises(RemoteProtocolError, match="Request in state CHALLENGED"):
        server.next_event()
    # The node reports it on the connection (rid 0); the client reads why and closes.
    client.receive_data(raw_frame(FrameKind.ERROR, [0, "protocol", "peer sent Request"]))
    [error] = drain(client)
    assert isinstance(error, ErrorResponse) and error.rid == 0
    assert client.state is State.CLOSED
