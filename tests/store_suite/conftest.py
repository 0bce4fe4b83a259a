"""One storage suite over every store in :data:`shuttle.store.registry.STORES` (as
fsspec tests its filesystems): each test here takes ``store`` and runs once per
implementation, ``local`` (a fresh data directory) and ``rados`` (a fresh RADOS
namespace in the session's local Ceph pool, so tests never see each other's keys).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shuttle.cluster.ceph import LocalCeph
from shuttle.store import StoreConfig
from shuttle.store.interface import Store
from shuttle.store.rados_conn import CephOptions
from shuttle.store.registry import STORES, StoreSpec, open_store

#: Small cache blocks, so a few bytes of a test object make several blocks.
SUITE_CONFIG = StoreConfig(cache_capacity_bytes=1 << 20, cache_block_size_bytes=4096)

#: ``open(namespace)``: a store; with RADOS, stores opened on one namespace share it.
Opener = Callable[[str], Store]


@pytest.fixture(params=sorted(STORES))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def opener(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Opener]:
    """Opens stores of ``kind``; every one is closed when the test ends."""
    opened: list[Store] = []
    ceph: LocalCeph | None = request.getfixturevalue("ceph") if kind == "rados" else None

    def open_(namespace: str) -> Store:
        if ceph is None:
            s = open_store(StoreSpec("local"), tmp_path / namespace, SUITE_CONFIG)
        else:
            info = ceph.info()
            opts = CephOptions(info.conf_path, info.keyring_path, op_timeout_s=20)
            s = open_store(StoreSpec("rados", info.pool, namespace), tmp_path, SUITE_CONFIG, opts)
        opened.append(s)
        return s

    try:
        yield open_
    finally:
        for s in opened:
            s.close()


@pytest.fixture
def store(opener: Opener) -> Store:
    """A fresh, empty store of each kind."""
    return opener(f"t{secrets.token_hex(6)}")
