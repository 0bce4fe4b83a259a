"""Limits before authentication, and a duplicate request id, against real nodes.

A peer without the key can hold only a small share of a node's connections, and only
for seconds: connections that never send HELLO (or never start TLS) cannot keep a key
holder out, and one that stays silent is closed at the handshake deadline. A client
that pipelines two requests with the same id gets every request the node took
answered before the node closes on it: a put that ran is never left unanswered.
"""

from __future__ import annotations

import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shuttle
from shuttle.errors import NotFoundError
from shuttle.net import auth
from shuttle.wire import ConnectionClosed, ErrorResponse, Response
from tests.integration.nodeproc import NodeProcess
from tests.integration.test_node_errors import RawPeer
from tests.integration.wire_helpers import Pki

#: Connections of the flood: the issue's figure (a thousand that never say HELLO).
FLOOD = 1000


@pytest.fixture(autouse=True)
def no_ambient_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(auth.KEY_FILE_ENV, raising=False)
    monkeypatch.delenv("SHUTTLE_CLUSTER", raising=False)
    monkeypatch.delenv("SHUTTLE_TLS", raising=False)


@pytest.fixture
def descriptors() -> Iterator[None]:
    """Room in this process for the flood's sockets."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * FLOOD)), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _stats(address: str, key_file: Path | None, **tls: object) -> dict[str, Any]:
    with shuttle.connect(node=address, key_file=key_file, **tls) as c:  # type: ignore[arg-type]
        server: dict[str, Any] = c.node_stats(c.nodes[0])["server"]
        return server


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_flood_that_never_says_hello_does_not_keep_a_key_holder_out(
    tmp_path: Path, descriptors: None, tls: bool
) -> None:
    """1,000 connections that send nothing, on a node that serves at most 64: the key
    holder connects, puts and reads while every one of them is still open on our side
    (before: the flood took all 64 and the key holder got ``busy`` for over a minute)."""
    key_file = tmp_path / "cluster.key"
    auth.write_key_file(key_file)
    extra = ["--key-file", str(key_file), "--connections-max", "64"]
    client_tls: dict[str, object] = {}
    if tls:
        pki = Pki.make(tmp_path / "pki")
        extra += pki.serve_args()
        client_tls = {"tls": True, "ca_file": pki.ca.cert}
    node = NodeProcess(tmp_path / "node", extra=extra).start()
    flood: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            flood.append(socket.create_connection(("127.0.0.1", node.port)))
        with shuttle.connect(node=node.address, key_file=key_file, **client_tls) as c:  # type: ignore[arg-type]
            c.put("in/while/flooded", b"the key holder got in")
            assert c.get("in/while/flooded") == b"the key holder got in"
            server = c.node_stats(c.nodes[0])["server"]
        # Peers without the key held at most their share, and were closed to make room.
        assert server["unauthenticated_max"] == 16  # a quarter of 64
        assert server["unauthenticated"] <= 16
        assert server["unauthenticated_evicted"] >= FLOOD - 16 - 1
    finally:
        for s in flood:
            s.close()
        node.terminate()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_connection_that_does_not_finish_its_handshake_is_closed_at_the_deadline(
    tmp_path: Path, tls: bool
) -> None:
    """A peer that connects and says nothing is closed once the handshake deadline
    passes (plain: after an ERROR saying why), not kept until the idle timeout."""
    key_file = tmp_path / "cluster.key"
    auth.write_key_file(key_file)
    extra = ["--key-file", str(key_file), "--handshake-timeout", "1"]
    client_tls: dict[str, object] = {}
    if tls:
        pki = Pki.make(tmp_path / "pki")
        extra += pki.serve_args()
        client_tls = {"tls": True, "ca_file": pki.ca.cert}
    node = NodeProcess(tmp_path / "node", extra=extra).start()
    try:
        silent = socket.create_connection(("127.0.0.1", node.port))
        silent.settimeout(30)  # far beyond the deadline; the node's idle timeout is 300 s
        received = b""
        while chunk := silent.recv(1 << 16):
            received += chunk
        silent.close()
        if not tls:
            assert received.startswith(b"SH\x07")  # the CHALLENGE, then why it closed:
            assert b"did not finish within 1 s" in received
        assert _stats(node.address, key_file, **client_tls)["handshake_timeouts"] == 1
    finally:
        node.terminate()


def test_a_duplicate_request_id_never_leaves_a_put_that_ran_unanswered(tmp_path: Path) -> None:
    """Two puts pipelined with one id, many times: the node closes the connection with a
    protocol error each time, and whenever the first put took effect its answer came
    first (before: it was often applied and never answered). The second never runs."""
    node = NodeProcess(tmp_path / "node").start()
    outcomes = {"answered": 0, "refused_first": 0}
    try:
        for i in range(40):
            key = f"dup/{i}"
            peer = RawPeer(node.address)
            first = peer.raw_request(7, "put", {"key": key}, b"first" * 2000)
            second = peer.raw_request(7, "put", {"key": key}, b"second" * 2000)
            peer.sock.sendall(first + second)
            events = []
            while True:
                ev = peer.next_event()
                events.append(ev)
                if isinstance(ev, ConnectionClosed) or (
                    isinstance(ev, ErrorResponse) and ev.rid == 0
                ):
                    break
            assert isinstance(events[-1], ErrorResponse) and events[-1].code == "protocol"
            assert "already in flight" in events[-1].message
            answered = [e for e in events if isinstance(e, Response) and e.rid == 7]
            with shuttle.connect(node=node.address) as c:
                try:
                    stored: bytes | None = c.get(key)
                except NotFoundError:
                    stored = None
            assert stored in (None, b"first" * 2000), "the duplicate must never run"
            if answered:
                assert stored == b"first" * 2000
                assert answered[0].result["key"] == key
                outcomes["answered"] += 1
            else:
                assert stored is None, f"try {i}: the put ran and was never answered"
                outcomes["refused_first"] += 1
            peer.sock.close()
        stats = _stats(node.address, None)
        assert stats["protocol_errors"] >= 40
    finally:
        node.terminate()
    assert sum(outcomes.values()) == 40


def test_requests_sent_after_a_protocol_error_are_not_taken(tmp_path: Path) -> None:
    """What follows the duplicate on the wire is never read: only requests taken before
    the error are answered."""
    node = NodeProcess(tmp_path / "node").start()
    try:
        peer = RawPeer(node.address)
        data = (
            peer.raw_request(1, "put", {"key": "before"}, b"x" * 50_000)
            + peer.raw_request(1, "put", {"key": "before"}, b"y")
            + peer.raw_request(2, "put", {"key": "after"}, b"z")
        )
        peer.sock.sendall(data)
        deadline = time.monotonic() + 30
        answered = set()
        while time.monotonic() < deadline:
            ev = peer.next_event()
            if isinstance(ev, Response):
                answered.add(ev.rid)
            if isinstance(ev, ErrorResponse | ConnectionClosed):
                break
        assert answered == {1}
        with shuttle.connect(node=node.address) as c:
            assert c.get("before") == b"x" * 50_000
            with pytest.raises(NotFoundError):
                c.stat("after")
    finally:
        node.terminate()
