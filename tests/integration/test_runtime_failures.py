"""The run-time when things go wrong: a caller that hangs up mid-migration, call
cycles, anchored and taken ids, malformed digests, lost objects, applications that
die with objects on nodes. (A lost answer during activation: tests/unit/runtime/
test_fencing.py and test_migration_machine.py.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuttle.client.aio import AsyncConnection
from shuttle.errors import (
    InvalidArgumentError,
    ObjectNotFoundError,
)
from shuttle.runtime import values
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.refs import Ref
from tests.integration.nodeproc import NodeProcess
from tests.integration.test_runtime import SANDBOX, Nodes


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    n = Nodes(tmp_path)
    yield n
    for p in n.procs:
        p.terminate()


def node_objects(nodes: Nodes, index: int) -> dict[str, Any]:
    async def ask() -> Any:
        conn = AsyncConnection("127.0.0.1", nodes.procs[index].port, key=nodes.key)
        try:
            return values.unpack((await conn.call("runtime.objects", {})).payload)
        finally:
            await conn.close()

    return {o["rid"]: o for o in asyncio.run(ask())["objects"]}


def wait_until(check: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


class Slow(MobileObject):
    """A shipped object with a long call, and a counter."""

    def __init__(self) -> None:
        self.n = 0

    def busy(self, seconds: float) -> int:
        time.sleep(seconds)
        self.n += 1
        return self.n

    def add(self) -> int:
        self.n += 1
        return self.n


def test_a_migration_whose_caller_hangs_up_still_ends_cleanly(nodes: Nodes) -> None:
    """The caller of object.migrate drops its connection while the migration waits
    for a long call to drain: the migration goes on (or rolls back) all the same,
    and the object ends up serving somewhere, never stuck quiescing."""
    with nodes.runtime() as rt:
        obj = rt.create(Slow, at="n1")
        busy = threading.Thread(target=obj.busy, args=(1.5,))
        busy.start()
        wait_until(lambda: node_objects(nodes, 0)[str(obj.rid)]["since_s"] >= 0)

        async def hang_up() -> None:
            conn = AsyncConnection("127.0.0.1", nodes.procs[0].port, key=nodes.key)
            asyncio.get_running_loop().create_task(
                conn.call(
                    "object.migrate",
                    {"rid": str(obj.rid), "to": "n2", "to_address": nodes.procs[1].address},
                )
            )
            for _ in range(500):  # until the node is draining the busy call
                objs = values.unpack((await conn.call("runtime.objects", {})).payload)
                if any(o["state"] == "quiescing" for o in objs["objects"]):
                    break
                await asyncio.sleep(0.01)
            await conn.close()

        asyncio.run(hang_up())
        busy.join(30)

        def settled() -> bool:  # one snapshot: the move may complete between two asks
            entry = node_objects(nodes, 0).get(str(obj.rid))
            return entry is None or entry["state"] == "open"

        wait_until(settled)
        assert obj.add() == 2  # served, with its state, wherever it is now
        assert rt.where(obj) == "n2"


def test_destroying_an_object_while_it_moves_waits_for_it_to_settle(nodes: Nodes) -> None:
    """The run-time may move an object at any moment: destroying it mid-move waits
    for the move to end, then ends the object where it landed (no ObjectBusyError for
    the application to retry)."""
    with nodes.runtime() as rt:
        obj = rt.create(Slow, at="n1")
        busy = threading.Thread(target=obj.busy, args=(1.0,))
        busy.start()
        wait_until(lambda: node_objects(nodes, 0)[str(obj.rid)]["since_s"] >= 0)
        moved: list[object] = []
        mover = threading.Thread(target=lambda: moved.append(rt.migrate(obj, "n2")))
        mover.start()
        wait_until(lambda: node_objects(nodes, 0)[str(obj.rid)]["state"] == "quiescing")
        rt.destroy(obj)  # while n1 drains the busy call before shipping the object
        mover.join(30)
        busy.join(30)
        assert moved and moved[0]["moved"]
        assert str(obj.rid) not in node_objects(nodes, 0)
        assert str(obj.rid) not in node_objects(nodes, 1)
        with pytest.raises(ObjectNotFoundError):
            obj.add()


class Ping(MobileObject):
    def bounce(self, other: Ref, me: Ref, n: int) -> str:
        if n == 0:
            return "done"
        result: str = other.bounce(me, other, n - 1)
        return result


def test_a_call_cycle_across_run_times_does_not_deadlock(nodes: Nodes) -> None:
    """A in one application calls B in another, which calls A back: the call comes
    back on another thread but belongs to the same chain, so it enters A."""
    with nodes.runtime() as one, nodes.runtime() as two:
        a = one.create(Ping)
        b_there = two.create(Ping)
        b = one.bm.ref(b_there.rid, b_there.home_address)
        result: list[str] = []
        caller = threading.Thread(target=lambda: result.append(a.bounce(b, a, 5)))
        caller.start()
        caller.join(20)
        assert result == ["done"], "the cycle deadlocked"


def test_a_cycle_through_a_shipped_object_is_refused_at_once(nodes: Nodes) -> None:
    """A shipped object's worker cannot be re-entered from another node's call: the
    cycle gets a clear error instead of hanging until a timeout."""
    from shuttle.errors import ObjectBusyError

    with nodes.runtime() as rt:
        a = rt.create(Ping)
        b = rt.create(Ping, at="n1")
        outcome: list[BaseException | str] = []

        def call() -> None:
            try:
                outcome.append(a.bounce(b, a, 4))
            except BaseException as exc:
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        caller.join(20)
        assert len(outcome) == 1, "the cycle hung"
        assert isinstance(outcome[0], ObjectBusyError) and "call cycle" in str(outcome[0])


def test_anchored_and_taken_ids_are_refused(nodes: Nodes) -> None:
    with nodes.runtime() as rt:
        with pytest.raises(InvalidArgumentError, match="anchored"):
            rt.destroy(rt.storage("n1"))
        with pytest.raises(InvalidArgumentError, match="anchored"):
            rt.create("storage")
        grep = rt.create("grep", at="n1", pattern="x", storage=rt.storage("n1"), keys=[])

        def create(rid: str, type_name: str) -> None:
            rt.bm.run(
                rt.peers.call(
                    "n1",
                    "object.create",
                    {
                        "rid": rid,
                        "type": type_name,
                        "params": values.pack(
                            {"pattern": "y", "storage": rt.storage("n1"), "keys": []}
                        ),
                    },
                )
            )

        with pytest.raises(InvalidArgumentError, match="taken"):
            create(str(grep.rid), "grep")
        with pytest.raises(InvalidArgumentError, match="storage"):
            create("n1/storage", "grep")
        assert grep.next() == [True, []]  # the original is untouched
        with nodes.client() as client:
            client.put("k", b"still here")
            assert rt.storage(rt.node_for("k")).read("k") == b"still here"


def test_a_malformed_digest_is_refused_by_name_and_placement_keeps_working(
    nodes: Nodes,
) -> None:
    with nodes.runtime() as rt:
        for bad, field in (
            ({"runtime": "x", "objects": [{"rid": "x/1"}]}, None),
            ({"runtime": "x", "objects": [{"rid": "x/1", "cpu_s": "lots"}]}, "cpu_s"),
            ({"runtime": ["a"]}, "runtime"),
            ({"runtime": "n1"}, "this node itself"),
            ({"runtime": "x", "edges": [{"caller": "nohome", "callee": "n1/storage"}]}, "home"),
        ):
            call = rt.peers.call("n1", "runtime.digest", {}, values.pack(bad))
            if field is None:
                rt.bm.run(call)  # missing fields take defaults
                continue
            with pytest.raises(InvalidArgumentError, match=field):
                rt.bm.run(call)
        with nodes.client() as client:
            client.put("big", b"".join(b"line %d\n" % i for i in range(60_000)))
    from shuttle.apps.grep import run_grep

    with nodes.runtime(link="lan") as rt:
        result = run_grep(rt, "line 4242$", ["big"])
    assert result.matches == 1 and result.migrations


def test_an_object_lost_with_its_node_is_reported_as_lost(nodes: Nodes) -> None:
    with nodes.runtime() as rt:
        obj = rt.create(Slow, at="n1")
        assert obj.add() == 1
        nodes.procs[0].restart()  # same port, objects (in memory) gone
        with pytest.raises(ObjectNotFoundError, match=r"lost.*did n1 restart"):
            obj.add()


CLIENT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from shuttle.client.model import NodeAddress
    from shuttle.net.auth import load_key_file
    from shuttle.runtime.client import Runtime
    from shuttle.runtime.config import RuntimeConfig
    port, key_file = int(sys.argv[1]), sys.argv[2]
    rt = Runtime([NodeAddress("n1", "127.0.0.1", port)], key=load_key_file(key_file),
                 config=RuntimeConfig(window_s=0.25))
    ref = rt.create("grep", at="n1", pattern="x", storage=rt.storage("n1"), keys=[])
    print(ref.rid, flush=True)
    time.sleep(600)
    """
)


def test_a_dead_application_s_objects_go_when_its_lease_runs_out(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    from shuttle.net.auth import write_key_file

    key = write_key_file(key_file)
    node = NodeProcess(
        tmp_path / "n1", extra=["--key-file", str(key_file), "--lease", "1.5", *SANDBOX]
    ).start()
    try:
        app = subprocess.Popen(
            [sys.executable, "-c", CLIENT_SCRIPT, str(node.port), str(key_file)],
            stdout=subprocess.PIPE,
        )
        assert app.stdout is not None
        rid = app.stdout.readline().decode().strip()
        nodes = Nodes.__new__(Nodes)
        nodes.procs, nodes.key = [node], key
        # Alive and idle, it keeps its object past the lease (a digest every H).
        time.sleep(2.5)
        assert rid in node_objects(nodes, 0)
        app.kill()
        app.wait(10)
        wait_until(lambda: rid not in node_objects(nodes, 0), timeout_s=20)
    finally:
        node.terminate()
    log = node.log.read_text()
    assert "has not been heard from" in log
    json.dumps(log[-100:])


class Heavy(MobileObject):
    """Holds 150 MiB: its checkpoint (a second copy) cannot fit in 256 MiB."""

    def __init__(self) -> None:
        self.blob = bytearray(150 << 20)

    def size(self) -> int:
        return len(self.blob)


def test_a_checkpoint_that_kills_a_shipped_object_is_reported_as_a_loss(nodes: Nodes) -> None:
    from shuttle.errors import MigrationError

    with nodes.runtime() as rt:
        heavy = rt.create(Heavy, at="n1")
        assert heavy.size() == 150 << 20
        with pytest.raises(MigrationError, match="was lost while it was checkpointed"):
            rt.migrate(heavy, "client")
        with pytest.raises(ObjectNotFoundError):
            heavy.size()  # its home no longer lists it: a clear "no such object"
