"""Gateway locality: with the session Ceph's OSDs put in distinct CRUSH hosts
(osd.0 in ``loc-a``, osd.1 in ``loc-b``, osd.2 in ``loc-c``) and two nodes started with
``--ceph-host loc-a`` and ``--ceph-host loc-b``, a key whose primary OSD is on loc-a is
served by the loc-a node (its request counters say so), the nodes' mapping is Ceph's
own (``osd map``), and when the loc-a node dies its keys go to the other node
(docs/ceph.md, "Nodes that are gateways")."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shuttle.client.gateways import GatewayClient
from shuttle.client.model import NodeAddress
from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import mon_command
from shuttle.store.rados_locality import EPOCH_CHECK_S, placement_seed
from tests.integration.nodeproc import NodeProcess

HOSTS = ("loc-a", "loc-b", "loc-c")
KEYS = [f"loc/{i:03d}" for i in range(48)]


def _mon(ceph: LocalCeph, prefix: str, **args: Any) -> Any:
    out = mon_command(ceph.admin(), prefix=prefix, **args)
    return json.loads(out) if out.strip() else None


@pytest.fixture(scope="module")
def crush_hosts(ceph: LocalCeph) -> Iterator[None]:
    """osd.i in CRUSH host HOSTS[i] for the module; put back where they were after."""
    tree = _mon(ceph, "osd tree")["nodes"]
    weight = {n["id"]: n["crush_weight"] for n in tree if n["type"] == "osd"}
    was = {c: n["name"] for n in tree if n["type"] == "host" for c in n.get("children", ())}
    pool = ceph.info().pool
    try:
        for osd, host in enumerate(HOSTS):
            _mon(ceph, "osd crush add-bucket", name=host, type="host", args=["root=default"])
            _mon(
                ceph,
                "osd crush set",
                id=osd,
                weight=weight[osd],
                args=["root=default", f"host={host}"],
            )
        ceph.wait_active(pool, timeout_s=60)
        yield
    finally:
        for osd, host in was.items():
            _mon(
                ceph,
                "osd crush set",
                id=osd,
                weight=weight[osd],
                args=["root=default", f"host={host}"],
            )
        for host in HOSTS:
            _mon(ceph, "osd crush remove", name=host)
        ceph.wait_active(pool, timeout_s=60)


@pytest.fixture(scope="module")
def nodes(
    ceph: LocalCeph, crush_hosts: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    """Two nodes over one fresh namespace, on CRUSH hosts loc-a and loc-b."""
    info = ceph.info()
    extra = info.store_args(f"loc{secrets.token_hex(4)}")
    root = tmp_path_factory.mktemp("locality")
    procs = [
        NodeProcess(root / f"gw-{h}", extra=[*extra, "--ceph-host", h]).start() for h in HOSTS[:2]
    ]
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()


@pytest.fixture(scope="module")
def stored(nodes: list[NodeProcess]) -> list[str]:
    """KEYS written (each key's value is its name) in the module's namespace. A test that
    reads KEYS takes this fixture rather than count on an earlier test's writes: under
    ``pytest -n`` the tests of one module may run on different workers, each with its own
    Ceph and namespace."""
    with _client(nodes, locality=False) as c:
        for key in KEYS:
            c.put(key, key.encode())
    return KEYS


def _client(nodes: list[NodeProcess], **kwargs: Any) -> GatewayClient:
    addrs = [NodeAddress(p.data_dir.name, "127.0.0.1", p.port) for p in nodes]
    return GatewayClient(addrs, request_timeout_s=30, cache_bytes=0, **kwargs)


def _reads(c: GatewayClient, node: NodeAddress) -> int:
    return int(c.node_stats(node)["store"]["ops"].get("read", 0))


def _primaries(ceph: LocalCeph, namespace: str) -> dict[str, int]:
    pool = ceph.info().pool
    out = {}
    for key in KEYS:
        m = _mon(ceph, "osd map", pool=pool, object=key, nspace=namespace)
        out[key] = int(m["acting_primary"])
    return out


def _namespace(nodes: list[NodeProcess]) -> str:
    spec = nodes[0].extra[nodes[0].extra.index("--store") + 1]
    return spec.split("/", 1)[1]


def test_the_nodes_locate_keys_as_ceph_maps_them(nodes: list[NodeProcess], ceph: LocalCeph) -> None:
    ns = _namespace(nodes)
    pool = ceph.info().pool
    pg_num = next(p["pg_num"] for p in _mon(ceph, "osd dump")["pools"] if p["pool_name"] == pool)
    for key in KEYS:  # the PG computed locally is the one Ceph computes
        pgid = _mon(ceph, "osd map", pool=pool, object=key, nspace=ns)["pgid"]
        assert int(pgid.split(".")[1], 16) == placement_seed(key, ns, pg_num), key
    want = _primaries(ceph, ns)
    with _client(nodes, locality=False) as c:
        for node, host in zip(c.nodes, HOSTS, strict=False):
            got = c.call(node, "rados.locate", {"keys": KEYS}).result
            assert got["host"] == host
            assert got["osds"] == [want[k] for k in KEYS]
            assert got["hosts"] == [HOSTS[want[k]] for k in KEYS]
            assert c.node_stats(node)["locality"]["host"] == host
    assert {HOSTS[o] for o in want.values()} == set(HOSTS)  # every host has keys


def test_a_key_is_served_by_the_node_beside_its_primary_osd(
    nodes: list[NodeProcess], ceph: LocalCeph, stored: list[str]
) -> None:
    primaries = _primaries(ceph, _namespace(nodes))
    with _client(nodes) as c:
        node_of = {HOSTS[i]: n for i, n in enumerate(c.nodes)}
        for key in KEYS:
            c.stat(key)  # learn locations (in the background)
        assert c.locality is not None and c.locality.wait_idle(30)
        trips = c.locality.round_trips
        for key in KEYS:
            host = HOSTS[primaries[key]]
            before = [_reads(c, n) for n in c.nodes]
            assert c.get(key) == key.encode()
            served = [i for i, n in enumerate(c.nodes) if _reads(c, n) > before[i]]
            if host in node_of:  # a node on the primary's host serves it
                assert served == [c.nodes.index(node_of[host])], (key, host)
            else:  # loc-c has no node: the rendezvous node
                assert len(served) == 1, key
        assert c.locality.round_trips == trips  # warm reads asked nothing more


def test_keys_follow_their_primary_when_it_moves(nodes: list[NodeProcess], ceph: LocalCeph) -> None:
    """Primary affinity 0 on osd.0 moves its primaries (a new OSD map epoch): the nodes
    see it within EPOCH_CHECK_S."""
    ns = _namespace(nodes)
    _mon(ceph, "osd primary-affinity", id=0, weight=0.0)
    try:
        deadline = time.monotonic() + 30
        while True:
            want = _primaries(ceph, ns)
            if 0 not in want.values() or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # polling Ceph's own map, with a deadline
        assert 0 not in want.values()
        assert _nodes_agree(nodes, want) == [[want[k] for k in KEYS]] * 2
    finally:
        _mon(ceph, "osd primary-affinity", id=0, weight=1.0)
        ceph.wait_active(ceph.info().pool, timeout_s=60)
    _nodes_agree(nodes, _primaries(ceph, ns))  # the next test starts from the usual map


def _nodes_agree(nodes: list[NodeProcess], want: dict[str, int]) -> list[list[int]]:
    """What each node locates KEYS at, once they agree with ``want`` (or after a few
    epoch checks: they see a new map within EPOCH_CHECK_S)."""
    deadline = time.monotonic() + 10 * EPOCH_CHECK_S
    with _client(nodes, locality=False) as c:
        while True:
            got = [c.call(n, "rados.locate", {"keys": KEYS}).result["osds"] for n in c.nodes]
            if all(g == [want[k] for k in KEYS] for g in got) or time.monotonic() > deadline:
                return got
            time.sleep(EPOCH_CHECK_S / 4)  # polling the nodes' view, with a deadline


def test_when_the_node_beside_the_data_dies_its_keys_go_to_the_other(
    nodes: list[NodeProcess], ceph: LocalCeph, stored: list[str]
) -> None:
    primaries = _primaries(ceph, _namespace(nodes))
    on_a = [k for k in KEYS if HOSTS[primaries[k]] == "loc-a"]
    assert on_a
    with _client(nodes) as c:
        for key in on_a:
            c.stat(key)
        assert c.locality is not None and c.locality.wait_idle(30)
        a, b = c.nodes
        assert all(c.node_for(k).node_id == a.node_id for k in on_a)
        nodes[0].kill()
        try:
            before = _reads(c, b)
            for key in on_a:
                assert c.get(key) == key.encode()
            assert _reads(c, b) - before == len(on_a)  # every one served by loc-b's node
            assert c.failovers >= 1
        finally:
            nodes[0].start()
