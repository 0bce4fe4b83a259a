"""Many clients at once, and many requests in flight on one connection."""

from __future__ import annotations

import threading

import shuttle
from shuttle.net.blocking import BlockingConnection, Call
from tests.integration.nodeproc import NodeProcess


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
    answers out of order, the client matches responses by id."""
    with BlockingConnection("127.0.0.1", node.port) as conn:
        conn.call("put", {"key": "small"}, b"tiny")
        calls = [Call("put", {"key": "large"}, b"L" * (8 << 20))] + [
            Call("read", {"key": "small", "offset": 0, "length": 4}) for _ in range(20)
        ]
        responses = list(conn.call_many(calls, window=32))
        assert [bytes(r.payload) for r in responses[1:]] == [b"tiny"] * 20
        assert responses[0].result["size"] == 8 << 20
