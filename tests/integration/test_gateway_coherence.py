"""Two node processes over one RADOS namespace keep their block caches coherent
(shuttle.store.rados_watch): a warm read through one node asks RADOS nothing, and a
change through the other is never followed by a stale read (docs/ceph.md)."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.cluster.ceph import LocalCeph
from tests.integration.nodeproc import NodeProcess


@pytest.fixture(scope="module")
def nodes(ceph: LocalCeph, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    extra = ceph.info().store_args(f"co{secrets.token_hex(4)}")
    root = tmp_path_factory.mktemp("coherence")
    procs = [NodeProcess(root / f"gw{i}", extra=extra).start() for i in range(2)]
    try:
        yield procs
    finally:
        for p in procs:
            p.terminate()


def _rados_stats(c: Client, node: NodeAddress) -> dict[str, Any]:
    stats: dict[str, Any] = c.node_stats(node)["store"]["rados"]
    return stats


def _wait_trusting(c: Client, node: NodeAddress, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        co = _rados_stats(c, node)["coherence"]
        if co["trusted"] and co["probation_s_left"] == 0:
            return
        assert time.monotonic() < deadline, f"node not trusting its cache: {co}"
        time.sleep(0.05)


def test_changes_through_one_node_are_never_read_stale_through_the_other(
    nodes: list[NodeProcess],
) -> None:
    addrs = [NodeAddress(p.data_dir.name, "127.0.0.1", p.port) for p in nodes]
    with Client(addrs, request_timeout_s=30) as c:
        one, two = addrs
        for node in addrs:
            _wait_trusting(c, node)

        def read_two(offset: int) -> bytes:
            args = {"key": "co/k", "offset": offset, "length": 4096}
            payload: bytes = c.call(two, "read", args).payload
            return payload

        before = _rados_stats(c, two)
        for i in range(30):
            data = bytes([i]) * 16384
            c.call(one, "put", {"key": "co/k"}, data)
            for _ in range(3):  # cold, then warm (on the node's event loop)
                assert read_two(4096) == data[:4096], f"stale read after change {i}"
        after = _rados_stats(c, two)
        assert after["validations"] == before["validations"]  # not one stat
        assert after["inline_hits"] - before["inline_hits"] >= 30
        assert after["announced"] - before["announced"] >= 29
