"""Durable objects on real nodes: every acknowledged call survives ``kill -9`` of the
node the object runs on (its home brings it back) and of its home (which reads its
records back when it restarts)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.runtime.mobile import MobileObject
from tests.integration.nodeproc import NodeProcess
from tests.integration.test_runtime import SANDBOX, Nodes

#: A short lease, so that a node's death is waited out in about two seconds; and a
#: short application lease (the default is 30 s), so that a node that wrongly took a
#: live application for a dead one would drop its objects within the test.
LEASE = ["--durable-lease", "1", "--lease", "2"]


class Journal(MobileObject):
    """A shipped durable class: what an application keeps and must not lose."""

    durable = True
    readonly = frozenset({"items"})

    def __init__(self) -> None:
        self.entries: list[int] = []

    def append(self, x: int) -> int:
        self.entries.append(x)
        return len(self.entries)

    def items(self) -> list[int]:
        return list(self.entries)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    n = Nodes.__new__(Nodes)
    from shuttle.net.auth import write_key_file

    n.key_file = tmp_path / "cluster.key"
    n.key = write_key_file(n.key_file)
    n.procs = [
        NodeProcess(
            tmp_path / f"n{i}", extra=["--key-file", str(n.key_file), *SANDBOX, *LEASE]
        ).start()
        for i in (1, 2)
    ]
    yield n
    for p in n.procs:
        p.terminate()


def test_kill_9_of_its_node_loses_no_acknowledged_call(nodes: Nodes) -> None:
    with nodes.runtime() as rt:
        journal = rt.create(Journal, at="n2", home="n1")
        for i in range(20):
            assert journal.append(i) == i + 1
        nodes.procs[1].kill()  # n2, where it runs
        started = time.monotonic()
        assert journal.append(20) == 21  # a delay, not an error
        assert time.monotonic() - started >= 1.0  # n2's lease was waited out
        assert journal.items() == list(range(21))
        assert rt.where(journal) == "n1"
        nodes.procs[1].start()  # n2 back: the object stays where its home made it
        assert journal.append(21) == 22


def test_a_live_application_keeps_its_durable_object_on_a_node_that_is_not_its_home(
    nodes: Nodes,
) -> None:
    """The application's digests go to the object's home (n1), not to n2 where it
    runs: n2 must not take that silence for the application's death (its home
    judges), or the object would be dropped after the application lease."""
    with nodes.runtime(window_s=0.25) as rt:
        journal = rt.create(Journal, at="n2", home="n1")
        journal.append(1)
        time.sleep(3.0)  # over the 2 s application lease, idle
        assert journal.items() == [1]
        assert rt.where(journal) == "n2"


def test_kill_9_of_its_home_and_node_brings_it_back_from_disk(nodes: Nodes) -> None:
    with nodes.runtime() as rt:
        journal = rt.create(Journal, at="n1")  # its home and its node
        for i in range(10):
            journal.append(i)
        nodes.procs[0].restart()  # kill -9, then the same node on the same data
        deadline = time.monotonic() + 30
        while True:
            try:
                assert journal.items() == list(range(10))
                break
            except Exception:
                assert time.monotonic() < deadline, "not back within 30 s"
                time.sleep(0.1)
        assert journal.append(10) == 11


def test_a_principal_s_durable_object_comes_back_acting_for_it(tmp_path: Path) -> None:
    """A principal's durable object is recorded at its home as that principal's (the
    host registers it acting for its creator, docs/security.md); its node is killed: the
    home brings it back acting for the same principal, so the principal's calls go on
    (an object brought back as nobody's would refuse them: it belongs to its owner)."""
    from tests.integration.test_principals import KeyedCluster

    cluster = KeyedCluster(tmp_path, extra=(*SANDBOX, *LEASE))
    try:
        owner = cluster.add("owner", "--read", "data/", "--ship")
        with cluster.runtime(owner) as rt:
            journal = rt.create(Journal, at="n2", home="n1")
            for i in range(5):
                assert journal.append(i) == i + 1
            cluster.procs[1].kill()  # n2, where it runs
            assert journal.append(5) == 6
            assert journal.items() == list(range(6))
            assert rt.where(journal) == "n1"
    finally:
        cluster.stop()


def test_a_directory_object_comes_back_after_its_node_dies(nodes: Nodes) -> None:
    """A directory object (durable by its class) runs on n2 with its home and its
    volume's root on n1; n2 is killed: the home brings it back, same id, and every
    entry it acknowledged is there."""
    with nodes.runtime() as rt:
        volume = next(
            v for v in (f"vol{i}" for i in range(100)) if rt.node_for(f"{v}/.dirs/root") == "n1"
        )
        isolations = {n.node_id: rt.service(n.node_id, "isolation") for n in rt.nodes}
        d = rt.create("directory", at="n2", home="n1", volume=volume, isolations=isolations)
        for i in range(5):
            d.create(f"/f{i}", {"type": "file", "key": f"k{i}"})
        nodes.procs[1].kill()
        d.create("/f5", {"type": "file", "key": "k5"})
        assert [name for name, _ in d.listdir("/")] == [f"f{i}" for i in range(6)]
        assert rt.where(d) == "n1"
