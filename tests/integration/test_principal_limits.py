"""One principal at its limit does not keep another out: connections, requests in flight
and hosted objects, each counted per principal on a real node process on 127.0.0.1
(net/principal_limits.py; docs/security.md, "Principals and capabilities"). Each node
here is started with small limits, and each test has the first principal take all it
can: without the per-principal limit it would take the node's whole bound and the
second principal would be refused."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuttle.errors import NodeBusyError, ShuttleError
from shuttle.net import auth
from shuttle.net.blocking import BlockingConnection
from tests.integration.test_principals import KeyedCluster

#: How long the test waits for requests it sent to be in flight at the node (polling
#: its counters), on a machine shared with other test suites.
WAIT_S = 20.0


@pytest.fixture
def make_node(tmp_path: Path) -> Iterator[Any]:
    made: list[KeyedCluster] = []

    def make(*flags: str) -> KeyedCluster:
        root = tmp_path / f"c{len(made)}"
        root.mkdir()
        c = KeyedCluster(root, count=1, extra=flags)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop()


def _connect(c: KeyedCluster, key_file: Path) -> BlockingConnection:
    creds = auth.load_credentials(key_file)
    conn = BlockingConnection(
        "127.0.0.1",
        c.procs[0].port,
        key=creds.key,
        principal=creds.principal,
        request_timeout_s=30,
    )
    conn.connect()
    return conn


def _held(c: KeyedCluster, kind: str) -> int:
    with BlockingConnection("127.0.0.1", c.procs[0].port, key=c.key) as admin:
        stats = admin.call("node.stats").result
    return int(stats["server"]["principals"]["held_total"].get(kind, 0))


def test_a_principal_at_its_connection_limit_does_not_keep_another_out(make_node: Any) -> None:
    c = make_node("--connections-max", "8", "--principal-connections-max", "3")
    alice = c.add("alice", "--read", "data/")
    bob = c.add("bob", "--read", "data/")
    held: list[BlockingConnection] = []
    refusal: NodeBusyError | None = None
    try:
        for _ in range(10):  # past the node's 8: alice takes all she can
            try:
                held.append(_connect(c, alice))
            except NodeBusyError as exc:
                refusal = exc
                break
        assert len(held) == 3
        assert refusal is not None and "--principal-connections-max" in str(refusal)
        assert "principal 'alice'" in str(refusal)
        with _connect(c, bob) as conn:  # bob is not kept out
            conn.call("ping")
        held.pop().close()  # one given back: alice may connect again
        held.append(_connect(c, alice))
    finally:
        for conn in held:
            conn.close()


def test_a_principal_at_its_request_limit_does_not_keep_another_out(make_node: Any) -> None:
    c = make_node("--principal-requests-max", "2", "--requests-max", "3")
    alice = c.add("alice", "--read", "data/")
    bob = c.add("bob", "--read", "data/")
    conns = [_connect(c, alice) for _ in range(3)]
    sessions = [conn.call("callback.open").result["session"] for conn in conns]
    errors: list[BaseException] = []

    def long_wait(conn: BlockingConnection, session: str) -> None:
        # A callback wait stays in flight until a promise breaks or 20 s pass.
        try:
            conn.call("callback.wait", {"session": session, "timeout_s": 20})
        except (ShuttleError, OSError) as exc:  # the node stopping at the end
            errors.append(exc)

    waiters = [
        threading.Thread(target=long_wait, args=(conn, s), daemon=True)
        for conn, s in zip(conns[:2], sessions[:2], strict=True)
    ]
    try:
        for t in waiters:
            t.start()
        deadline = time.monotonic() + WAIT_S
        while _held(c, "requests") < 2:
            assert time.monotonic() < deadline, "alice's waits never reached the node"
            time.sleep(0.02)  # polling the node's counters, not ordering threads
        # Alice's third request in flight is refused, naming her limit...
        with pytest.raises(NodeBusyError, match=r"principal 'alice'.*--principal-requests-max"):
            conns[2].call("callback.wait", {"session": sessions[2], "timeout_s": 20})
        # ...and bob's is taken (without alice's limit the node's 3 would be all hers).
        with _connect(c, bob) as conn:
            session = conn.call("callback.open").result["session"]
            out = conn.call("callback.wait", {"session": session, "timeout_s": 0.05}).result
            assert out["breaks"] == []
    finally:
        c.stop()  # ends alice's waits
        for t in waiters:
            t.join(30)
        for conn in conns:
            conn.close()


def test_a_principal_at_its_object_limit_does_not_keep_another_out(make_node: Any) -> None:
    c = make_node("--principal-objects-max", "2", "--objects-max", "3")
    alice = c.add("alice", "--read", "")
    bob = c.add("bob", "--read", "")
    node = c.procs[0].data_dir.name

    def grep(rt: Any) -> Any:
        return rt.create(
            "grep", at=node, pattern="x", storage=rt.storage(node), keys=[], placement="static"
        )

    with c.runtime(alice) as rt_alice, c.runtime(bob) as rt_bob:
        mine = []
        refusal: ShuttleError | None = None
        for _ in range(5):  # past the node's 3: alice makes all she can
            try:
                mine.append(grep(rt_alice))
            except NodeBusyError as exc:
                refusal = exc
                break
        assert len(mine) == 2
        assert refusal is not None and "--principal-objects-max" in str(refusal)
        theirs = grep(rt_bob)  # bob is not kept out
        assert rt_bob.where(theirs) == node
        rt_alice.destroy(mine.pop())  # ended: alice has room again
        mine.append(grep(rt_alice))
