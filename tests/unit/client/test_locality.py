"""Gateway locality without Ceph: the PG hash against values Ceph computed (``ceph osd
map``, Pacific), and the client's location cache (order, bound, expiry, and giving up
on nodes that cannot locate). The real thing runs in
tests/integration/test_gateway_locality.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from shuttle.client import locality
from shuttle.client.locality import Locality
from shuttle.client.model import NodeAddress
from shuttle.errors import UnknownOperationError
from shuttle.store.rados_locality import placement_seed, rjenkins, stable_mod

# (key, namespace, raw hash, PG in a pool of 16 PGs) as `ceph osd map` answered them.
CEPH_MAPPED = [
    ("a", "", 0x29EEC818, 0x8),
    ("hello/world", "", 0x7F5A0B27, 0x7),
    ("x" * 12, "", 0x665D9C6E, 0xE),
    ("z" * 25, "", 0xBC6D6EF4, 0x4),
    ("k39", "gw12ab", 0x4E499F4, 0x4),
    ("ключ", "", 0xF71F5F7A, 0xA),
]


@pytest.mark.parametrize(("key", "ns", "raw", "pg"), CEPH_MAPPED)
def test_the_placement_group_is_the_one_ceph_computes(key: str, ns: str, raw: int, pg: int) -> None:
    name = (ns.encode() + b"\x1f" if ns else b"") + key.encode()
    assert rjenkins(name) == raw
    assert placement_seed(key, ns, 16) == pg


def test_stable_mod_folds_onto_a_count_that_is_not_a_power_of_two() -> None:
    assert [stable_mod(x, 12) for x in (3, 11, 12, 13, 15, 16)] == [3, 11, 4, 5, 7, 0]


NODES = [NodeAddress(f"n{i}", "127.0.0.1", 1000 + i) for i in range(3)]
HOST_OF_NODE = {"n0": "h0", "n1": "h1", "n2": "h2"}


class Nodes:
    """What the nodes answer to ``rados.locate``: every key's host is ``where``."""

    def __init__(self, where: dict[str, str]) -> None:
        self.where = where
        self.calls: list[tuple[str, int]] = []
        self.refuse = False
        self.lock = threading.Lock()

    def __call__(self, node: NodeAddress, op: str, args: dict[str, Any]) -> Any:
        assert op == "rados.locate"
        if self.refuse:
            raise UnknownOperationError("no such operation 'rados.locate'")
        with self.lock:
            self.calls.append((node.node_id, len(args["keys"])))
        keys = args["keys"]
        return {
            "host": HOST_OF_NODE[node.node_id],
            "epoch": 1,
            "hosts": [self.where.get(k) for k in keys],
            "osds": [0] * len(keys),
        }


def _locality(nodes: Nodes, **kwargs: Any) -> Locality:
    return Locality(NODES, nodes, lambda key: list(NODES), **kwargs)


def test_a_key_is_routed_to_the_node_on_its_host_once_located() -> None:
    answers = Nodes({"k": "h2", "far": "elsewhere"})
    loc = _locality(answers)
    try:
        assert loc.prefer("k", list(NODES)) == NODES  # unknown: order unchanged, queued
        assert loc.wait_idle(10)
        assert loc.prefer("k", list(NODES)) == [NODES[2], NODES[0], NODES[1]]
        assert loc.prefer("far", list(NODES)) == NODES  # queued now
        assert loc.wait_idle(10)
        assert loc.prefer("far", list(NODES)) == NODES  # no node on that host
        trips = loc.round_trips
        for _ in range(100):  # known keys ask nothing more
            loc.prefer("k", list(NODES))
        assert loc.round_trips == trips
    finally:
        loc.close()


def test_the_cache_is_bounded_and_answers_expire() -> None:
    answers = Nodes({})
    loc = _locality(answers, capacity=10)
    try:
        for i in range(50):
            loc.host_of(f"k{i}")
        assert loc.wait_idle(10)
        assert len(loc._keys) == 10
        expired = _locality(answers, ttl_s=0.0)
        expired.host_of("k")
        assert expired.wait_idle(10)
        n = len(answers.calls)
        assert expired.host_of("k") is None  # expired: asked again
        assert expired.wait_idle(10)
        assert len(answers.calls) > n
        expired.close()
    finally:
        loc.close()


def test_nodes_that_cannot_locate_are_not_asked_again() -> None:
    answers = Nodes({})
    answers.refuse = True
    loc = _locality(answers)
    try:
        loc.host_of("k")
        assert loc.wait_idle(10)
        assert not loc.enabled
        assert loc.host_of("other") is None
        assert loc.wait_idle(10)
        assert answers.calls == []
    finally:
        loc.close()


def test_a_thread_close_gave_up_on_ends_when_its_lookup_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close() waits CLOSE_WAIT_S for a thread stuck in a lookup (a node that does not
    answer), then reopens the Locality for later use: the old thread must still end."""
    monkeypatch.setattr(locality, "CLOSE_WAIT_S", 0.05)
    entered, release = threading.Event(), threading.Event()
    answers = Nodes({})

    def stuck(node: NodeAddress, op: str, args: dict[str, Any]) -> Any:
        entered.set()
        assert release.wait(30), "the test never released the lookup"
        return answers(node, op, args)

    loc = Locality(NODES, stuck, lambda key: list(NODES))
    loc.host_of("k")
    assert entered.wait(10)
    old = loc._thread
    assert old is not None
    loc.close()  # gives up on the stuck thread
    assert old.is_alive()
    release.set()
    old.join(10)
    assert not old.is_alive(), "the thread close() gave up on runs on forever"
    loc.close()
