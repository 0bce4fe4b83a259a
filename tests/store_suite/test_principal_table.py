"""A pool's principal table (node/principal_store.py's RADOS backend) against the
session's Ceph, in this process: every gateway of a pool shares one table, changed by a
compare-and-set on the object's RADOS version. The gateways as node processes are
tests/integration/test_principals_rados.py; the file backend and the operations are
tests/unit/node/test_principal_store.py."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.cluster.ceph import LocalCeph
from shuttle.errors import ConfigError, StorageIOError, VersionMismatchError
from shuttle.net.principals import Caps, PrincipalTable, new_principal
from shuttle.node import principal_store
from shuttle.node.principal_store import TABLE_OBJECT, RadosBackend, backend_for
from shuttle.store.rados import RadosStore
from shuttle.store.rados_conn import CephOptions

ONE = PrincipalTable(1, {"alice": new_principal("alice", Caps.of(read=["data/"]))})
TWO = ONE.with_principal(new_principal("bob", Caps()))


@pytest.fixture
def stores(ceph: LocalCeph) -> Iterator[list[RadosStore]]:
    """Two gateways' stores on one pool and a namespace of this test's own."""
    info = ceph.info()
    namespace = f"t{secrets.token_hex(6)}"
    made = [
        RadosStore(
            info.pool, namespace=namespace, ceph=CephOptions(info.conf_path, info.keyring_path)
        )
        for _ in range(2)
    ]
    yield made
    for s in made:
        s.close()


def test_a_pool_without_a_table_has_an_empty_one(stores: list[RadosStore]) -> None:
    backend = backend_for(stores[0], Path("/nonexistent"), rados=True)  # no table file
    assert isinstance(backend, RadosBackend)
    assert backend.where == f"RADOS object .shuttle/principals of pool {stores[0].conn.pool}"
    assert backend.load() == PrincipalTable()


def test_every_gateway_reads_the_table_one_stored(stores: list[RadosStore]) -> None:
    a, b = RadosBackend(stores[0]), RadosBackend(stores[1])
    a.load()
    a.save(ONE)
    assert b.load() == ONE
    b.save(TWO)  # b read ONE's version: its change goes over it
    assert a.load() == TWO
    raw = bytes(stores[0].conn.ioctx().read(TABLE_OBJECT, 1 << 20, 0))
    assert raw == TWO.encode()


def test_a_gateways_own_change_is_not_a_change_meanwhile(stores: list[RadosStore]) -> None:
    backend = RadosBackend(stores[0])
    backend.load()
    backend.save(ONE)
    backend.save(TWO)  # over its own: the version it stored is the one it expects
    assert RadosBackend(stores[1]).load() == TWO


@pytest.mark.parametrize("first_made", [True, False])
def test_a_change_over_a_table_changed_meanwhile_is_refused(
    stores: list[RadosStore], first_made: bool
) -> None:
    a, b = RadosBackend(stores[0]), RadosBackend(stores[1])
    if first_made:
        a.save(ONE)  # then both read it
    a.load()
    b.load()
    b.save(TWO if first_made else ONE)
    with pytest.raises(VersionMismatchError) as info:
        a.save(PrincipalTable(9, {}))
    assert str(info.value) == (
        "the principals changed in the pool meanwhile (RADOS object .shuttle/principals of "
        f"pool {stores[0].conn.pool}); nothing was changed: run the command again"
    )
    assert a.load() == (TWO if first_made else ONE)
    a.save(PrincipalTable(9, {}))  # read again: now it goes over
    assert b.load() == PrincipalTable(9, {})


def test_a_table_object_over_the_limit_is_refused_without_reading_it(
    stores: list[RadosStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = RadosBackend(stores[0])
    backend.save(TWO)
    size = len(TWO.encode())
    monkeypatch.setattr(principal_store, "TABLE_BYTES_MAX", size)
    assert backend.load() == TWO  # exactly the limit: read
    monkeypatch.setattr(principal_store, "TABLE_BYTES_MAX", size - 1)
    with pytest.raises(StorageIOError) as info:
        backend.load()
    assert str(info.value) == (
        f"the principals ({backend.where}) take {size} bytes, over the {size - 1} a table "
        "may: was the object written by hand?"
    )


def test_a_malformed_table_object_names_where_it_is(stores: list[RadosStore]) -> None:
    stores[0].conn.ioctx().write_full(TABLE_OBJECT, b"{not json")
    backend = RadosBackend(stores[0])
    with pytest.raises(
        ConfigError, match=r"^RADOS object \.shuttle/principals of pool .*: malformed"
    ):
        backend.load()
