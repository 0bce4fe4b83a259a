"""The ``ceph`` fixture: one single-host Ceph (a mon, three OSDs, a size-3 pool) for
the whole test session, torn down at its end (docs/ceph.md).

Tests that need Ceph take ``ceph`` (a :class:`~shuttle.cluster.ceph.LocalCeph`):
``ceph.info()`` for the conf, keyring and pool; ``ceph.rados()`` for a connected
client. A test that stops an OSD starts it again before it ends, and a test that
makes a pool deletes it: the next test gets the Ceph as it was. Ceph is not
optional: without it the fixture fails and says how to install it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.cluster.ceph import LocalCeph


@pytest.fixture(scope="session")
def ceph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCeph]:
    """A running local Ceph shared by the session: 3 OSDs, pool ``shuttle`` (size 3,
    min_size 2), all its PGs active."""
    # Its daemons die with this process: a killed test run leaves no Ceph behind.
    local = LocalCeph(tmp_path_factory.mktemp("ceph"), osds=3, die_with_parent=True)
    t0 = time.monotonic()
    local.start()
    print(f"\nlocal Ceph up in {time.monotonic() - t0:.1f} s under {local.root}")
    try:
        yield local
    finally:
        local.down()


def rados_stats(c: Client, node: NodeAddress) -> dict[str, Any]:
    """A RADOS node's store counters (``stats()["store"]["rados"]``)."""
    stats: dict[str, Any] = c.node_stats(node)["store"]["rados"]
    return stats


def wait_trusting(c: Client, node: NodeAddress, timeout_s: float = 30.0) -> None:
    """Wait until a RADOS node trusts its cache (its watch confirmed, the probation
    over), so that its reads are answered as the tests expect."""
    deadline = time.monotonic() + timeout_s
    while True:
        co = rados_stats(c, node)["coherence"]
        if co["trusted"] and co["probation_s_left"] == 0:
            return
        assert time.monotonic() < deadline, f"node not trusting its cache: {co}"
        time.sleep(0.05)
