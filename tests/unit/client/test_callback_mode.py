"""The ``callback`` mode's client side against a scripted node: promises used with no
round trip, a grant that crosses its own break, a listener that fails, and a node
that serves no callbacks."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from shuttle.client import Client
from shuttle.errors import RemoteProtocolError, UnreachableError
from shuttle.faces.tree import KeyTree
from shuttle.net.attr_rows import encode_rows
from shuttle.net.blocking_stream import ConnectionCounters
from shuttle.testing import MemoryConnection, MemoryNode
from shuttle.wire import Response
from shuttle.wire.events import Payload


class ScriptedCallbacks:
    """The callback side of a node, scripted: the storage ops go to a MemoryNode."""

    def __init__(self, node: MemoryNode) -> None:
        self.node = node
        #: Answers the listener's next ``callback.wait`` (an exception: raised).
        self.answers: queue.Queue[dict[str, Any] | Exception] = queue.Queue()
        #: The ack each ``callback.wait`` carried.
        self.acks: queue.Queue[int] = queue.Queue()
        self.grants = 0
        #: Called while a promise request is in flight, before its reply.
        self.before_grant_reply: Any = None
        self.closes = 0
        #: False: play an older node, without ``callback.promise_list`` (and answering
        #: ``callback.promise_many`` in the map list whatever form is asked).
        self.lists = True
        #: What ``callback.promise_list`` answers as ``next`` (a node that pages wrong).
        self.next_page: str | None = None
        #: Not None: what ``callback.promise`` answers as its grant (a broken node).
        self.bad_grant: Any = None

    def _promised(self, conn: MemoryConnection, keys: list[str]) -> list[Any]:
        out: list[Any] = []
        for raw in conn.call("stat_many", {"keys": keys}).result:
            if raw is None:
                out.append(None)
                continue
            self.grants += 1
            out.append({**raw, "promise": {"seq": self.grants, "term_s": 30.0}})
        if self.before_grant_reply is not None:
            self.before_grant_reply(self.grants)
        return out

    def handle(self, conn: MemoryConnection, op: str, args: dict[str, Any]) -> Response | None:
        if op == "callback.open":
            return Response(0, {"session": "s1", "term_s": 30.0, "wait_s_max": 20.0}, b"")
        if op == "callback.wait":
            self.acks.put(args["ack"])
            answer = self.answers.get(timeout=5)
            if isinstance(answer, Exception):
                raise answer
            return Response(0, answer, b"")
        if op == "callback.promise":
            stat = conn.call("stat", {"key": args["key"]})
            self.grants += 1
            if self.before_grant_reply is not None:
                self.before_grant_reply(self.grants)
            grant = {"seq": self.grants, "term_s": 30} if self.bad_grant is None else self.bad_grant
            return Response(0, {**stat.result, "promise": grant}, b"")
        if op == "callback.promise_list" and self.lists:
            prefix = args["prefix"]
            page = conn.call("list", {"prefix": prefix, "delimiter": "/"}).result
            out = encode_rows(self._promised(conn, page["keys"]), promises=True)
            out["names"] = [k[len(prefix) :] for k in page["keys"]]
            out["prefixes"] = [p[len(prefix) :] for p in page["prefixes"]]
            out["next"] = self.next_page
            return Response(0, out, b"")
        if op == "callback.promise_many":
            return Response(0, self._promised(conn, args["keys"]), b"")
        if op == "callback.close":
            self.closes += 1
            self.answers.put({"breaks": [], "seq": 0, "closed": True})
            return Response(0, {"closed": True}, b"")
        return None


class ScriptedConnection:
    def __init__(self, script: ScriptedCallbacks) -> None:
        self.script = script
        self.inner = script.node.connect()
        self.counters: ConnectionCounters = self.inner.counters

    def call(
        self,
        op: str,
        args: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = True,
    ) -> Response:
        self.counters.requests += 1
        out = self.script.handle(self.inner, op, dict(args or {}))
        if out is not None:
            return out
        self.counters.requests -= 1  # counted again by the inner connection
        return self.inner.call(op, args, payload, idempotent=idempotent)

    def call_many(self, calls: Any, *, window: int = 16, idempotent: bool = True) -> Any:
        return self.inner.call_many(calls, window=window, idempotent=idempotent)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def script(node: MemoryNode) -> ScriptedCallbacks:
    return ScriptedCallbacks(node)


@pytest.fixture
def cb_client(node: MemoryNode, script: ScriptedCallbacks) -> Iterator[Client]:
    client = Client(
        [node.address], dial=lambda _: ScriptedConnection(script), validation="callback"
    )
    yield client
    client.close()


def _stats(client: Client) -> dict[str, int]:
    out: dict[str, int] = client.validation_mode().stats()
    return out


def test_a_live_promise_opens_with_no_round_trip(cb_client: Client) -> None:
    cb_client.put("k", b"v1")
    for _ in range(3):
        with cb_client.open("k") as f:
            assert f.read() == b"v1"
    stats = _stats(cb_client)
    assert (stats["promises_granted"], stats["opens_no_round_trip"]) == (1, 2)


def test_a_break_drops_the_promise_and_the_cache_before_the_ack(
    cb_client: Client, script: ScriptedCallbacks, node: MemoryNode
) -> None:
    cb_client.put("k", b"v1")
    with cb_client.open("k") as f:
        f.read()
    assert script.acks.get(timeout=5) == 0  # the listener is polling
    node.store.put("k", b"v2")  # the scripted node does not wait: the test plays it
    script.answers.put({"breaks": [["k", 1]], "seq": 1, "closed": False})
    assert script.acks.get(timeout=5) == 1  # acked on the next poll...
    assert _stats(cb_client)["promises_broken"] == 1  # ...after the promise was dropped
    assert cb_client.cache.version("k") is None  # and the cached copy
    with cb_client.open("k") as f:
        assert f.read() == b"v2"


def test_a_grant_that_arrives_after_its_break_is_void(
    cb_client: Client, script: ScriptedCallbacks
) -> None:
    cb_client.put("k", b"v1")

    def break_first(seq: int) -> None:
        script.before_grant_reply = None
        script.acks.get(timeout=5)  # the listener's first poll
        script.answers.put({"breaks": [["k", seq]], "seq": 1, "closed": False})
        assert script.acks.get(timeout=5) == 1  # the break was handled first

    script.before_grant_reply = break_first
    with cb_client.open("k") as f:
        assert f.read() == b"v1"  # this open's stat is still a valid check
    stats = _stats(cb_client)
    assert (stats["grants_void_on_arrival"], stats["promises_held"]) == (1, 0)
    with cb_client.open("k") as f:
        f.read()
    assert _stats(cb_client)["opens_no_round_trip"] == 0  # asked again


def test_a_listing_whose_grant_arrives_after_its_break_keeps_no_promise_on_it(
    cb_client: Client, script: ScriptedCallbacks
) -> None:
    for name in ("a", "b"):
        cb_client.put(f"d/{name}", name.encode())
    cb_client.put("d/e/f", b"f")

    def break_first(seq: int) -> None:
        # Before the listing's answer: a break on d/b (the keys are not yet known).
        script.before_grant_reply = None
        script.acks.get(timeout=5)
        script.answers.put({"breaks": [["d/b", seq]], "seq": 1, "closed": False})
        assert script.acks.get(timeout=5) == 1

    with cb_client.open("d/a") as f:  # starts the session
        f.read()
    script.before_grant_reply = break_first
    tree = KeyTree(cb_client, "callback")
    listing = tree.listdir("d")
    assert (listing.dirs, sorted(listing.files)) == (["e"], ["a", "b"])
    stats = _stats(cb_client)
    assert (stats["grants_void_on_arrival"], stats["promises_held"]) == (1, 1)  # d/a
    before = cb_client.counters()["requests"]
    with cb_client.open("d/a") as f:  # its promise came with the listing
        f.read()
    assert cb_client.counters()["requests"] == before
    with cb_client.open("d/b") as f:  # the listing's grant was void: asked again
        f.read()
    assert _stats(cb_client)["promises_granted"] == 3  # d/a twice, then d/b


def test_a_listing_whose_pages_do_not_move_on_is_refused(
    cb_client: Client, script: ScriptedCallbacks
) -> None:
    """A node that answers the same ``next`` again would page the client forever."""
    cb_client.put("d/a", b"a")
    with cb_client.open("d/a") as f:  # starts the session
        f.read()
    script.next_page = "d/a"
    with pytest.raises(RemoteProtocolError, match="next page after 'd/a'"):
        cb_client.validation_mode().listdir("d/")


@pytest.mark.parametrize(
    "grant", [[], {"seq": "1", "term_s": 30}, {"seq": 1}, {"seq": 1, "term_s": -1}]
)
def test_a_malformed_grant_is_the_nodes_fault_named_at_once(
    cb_client: Client, script: ScriptedCallbacks, grant: Any
) -> None:
    cb_client.put("k", b"v")
    script.bad_grant = grant
    with (
        pytest.raises(RemoteProtocolError, match="malformed callback promise for 'k'"),
        cb_client.open("k") as f,
    ):
        f.read()
    assert _stats(cb_client)["promises_held"] == 0


def test_an_older_node_is_listed_then_stated(
    cb_client: Client, script: ScriptedCallbacks, node: MemoryNode
) -> None:
    script.lists = False  # no callback.promise_list, and the map list for promise_many
    for name in ("a", "b"):
        cb_client.put(f"d/{name}", name.encode())
    tree = KeyTree(cb_client, "callback")
    for _ in range(2):
        listing = tree.listdir("d")
        assert {n: i.size for n, i in listing.files.items()} == {"a": 1, "b": 1}
    assert node.served["callback.promise_list"] == 1  # asked once, then not again
    assert _stats(cb_client)["promises_held"] == 2


def test_a_listener_that_fails_voids_every_promise(
    cb_client: Client, script: ScriptedCallbacks
) -> None:
    cb_client.put("a", b"1")
    cb_client.put("b", b"2")
    for key in ("a", "b"):
        with cb_client.open(key) as f:
            f.read()
    mode = cb_client.validation_mode()
    script.answers.put(UnreachableError("connection reset"))
    listener = next(iter(mode._listeners.values()))  # type: ignore[attr-defined]
    listener._thread.join(5)
    stats = _stats(cb_client)
    assert (stats["promises_voided"], stats["promises_held"], stats["sessions"]) == (2, 0, 0)
    cb_client.close()  # the session died with the connection: no close is sent for it
    assert script.closes == 0


def test_a_node_without_callbacks_is_checked_on_every_open(node: MemoryNode) -> None:
    with MemoryNode.client([node], validation="callback") as client:
        client.put("k", b"v1")
        for _ in range(2):
            with client.open("k") as f:
                assert f.read() == b"v1"
        stats = _stats(client)
        assert (stats["opens_without_session"], stats["opens_no_round_trip"]) == (2, 0)
        assert node.served["callback.open"] == 1  # not dialled again on every open
        assert not any(t.name.startswith("shuttle-callbacks") for t in threading.enumerate())


def test_the_environment_names_the_mode_of_connected_clients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shuttle.client.connect import connect
    from shuttle.errors import InvalidArgumentError

    monkeypatch.setenv("SHUTTLE_VALIDATION", "callback")
    with connect(node="127.0.0.1:1") as client:  # no connection is made yet
        assert client.validation == "callback"
    with connect(node="127.0.0.1:1", validation="check") as client:  # the argument wins
        assert client.validation == "check"
    monkeypatch.setenv("SHUTTLE_VALIDATION", "nfs")
    with pytest.raises(InvalidArgumentError, match="choose one of"):
        connect(node="127.0.0.1:1")
