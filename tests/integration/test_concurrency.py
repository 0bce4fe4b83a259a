"""Many clients at once, and many requests in flight on one connection."""

from __future__ import annotations

import socket
import threading

import shuttle
from shuttle.net.blocking import BlockingConnection, Call
from shuttle.wire import Challenge, Connection, Event, Hello, NeedData, Request, Response, Role
from tests.integration.nodeproc import NodeProcess


class RawClient:
    """A client socket driven by hand, to see answers in the order they arrive."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.conn = Connection(Role.CLIENT)
        assert isinstance(self.next_event(), Challenge)  # a keyless node: no proof needed
        self.sock.sendall(self.conn.send_bytes(Hello(2, 2, "raw")))
        self.next_event()

    def next_event(self) -> Event:
        while isinstance(ev := self.conn.next_event(), NeedData):
            self.conn.receive_data(self.sock.recv(1 << 16))
        return ev


def test_concurrent_clients_each_see_their_own_data(node: NodeProcess) -> None:
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            with shuttle.connect(node=node.address) as c:
                for i in range(40):
                    body = f"client {n} object {i} ".encode() * (i + 1)
                    c.put(f"c{n}/o{i}", body)
                    assert c.get(f"c{n}/o{i}") == body
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    with shuttle.connect(node=node.address) as c:
        assert len(list(c.list("c"))) == 8 * 40


def test_one_client_shared_by_threads(node: NodeProcess) -> None:
    c = shuttle.connect(node=node.address)
    c.put("shared", b"s" * 100_000)
    results: list[bool] = []

    def read() -> None:
        results.extend(c.get("shared") == b"s" * 100_000 for _ in range(30))

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [True] * 180
    assert c.counters()["connects"] == 7  # one connection per thread (and the main one)
    c.close()


def test_pipelined_requests_are_answered_in_order_of_ids(node: NodeProcess) -> None:
    with BlockingConnection("127.0.0.1", node.port) as conn:
        conn.call("put", {"key": "p"}, bytes(range(256)) * 64)
        calls = [Call("read", {"key": "p", "offset": i, "length": 7}) for i in range(500)]
        got = [bytes(r.payload) for r in conn.call_many(calls, window=64)]
        whole = bytes(range(256)) * 64
        assert got == [whole[i : i + 7] for i in range(500)]
        # 500 requests, never more than 64 outstanding, all on one connection.
        assert conn.counters.connects == 1 and conn.counters.requests == 501


def test_slow_and_fast_requests_overlap_on_one_connection(node: NodeProcess) -> None:
    """A big fsync'd write does not hold up the small reads pipelined behind it: the node
    answers them first, out of order, and the client matches responses by id."""
    with BlockingConnection("127.0.0.1", node.port) as conn:
        conn.call("put", {"key": "small"}, b"tiny")
    peer = RawClient(node.port)
    read = {"key": "small", "offset": 0, "length": 4}
    requests = [Request(1, "put", {"key": "large"}, b"L" * (8 << 20))]
    requests += [Request(rid, "read", read) for rid in range(2, 22)]
    peer.sock.sendall(b"".join(peer.conn.send_bytes(r) for r in requests))
    answers = [peer.next_event() for _ in requests]
    peer.sock.close()
    assert all(isinstance(a, Response) for a in answers), answers
    arrival = [a.rid for a in answers if isinstance(a, Response)]
    assert sorted(arrival) == list(range(1, 22))
    # Executed one after another, the write's answer would come first.
    assert arrival[0] != 1, "the reads waited for the write: the node ran them serially"

    with BlockingConnection("127.0.0.1", node.port) as conn:  # and the client copes
        calls = [Call("put", {"key": "large"}, b"L" * (8 << 20))] + [
            Call("read", read) for _ in range(20)
        ]
        responses = list(conn.call_many(calls, window=32))
        assert [bytes(r.payload) for r in responses[1:]] == [b"tiny"] * 20
        assert responses[0].result["size"] == 8 << 20
