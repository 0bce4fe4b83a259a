"""The client cache: blocks validated on open by the object's version (NFS's check),
counted by its counters."""

from __future__ import annotations

import pytest

from shuttle.client import Client, ClientCache, ObjectInfo
from shuttle.client import cache as cache_mod
from shuttle.client.files import RemoteReader
from shuttle.errors import VersionMismatchError
from shuttle.testing import MemoryNode

DATA = bytes(range(256)) * 16  # 4 KiB: four 1 KiB cache blocks


def info(key: str = "k", version: int = 1, size: int = len(DATA)) -> ObjectInfo:
    return ObjectInfo(key=key, size=size, version=version, mtime_ns=0, hash=b"")


class Fetches:
    """A fetch function over DATA that records what it was asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, start: int, end: int) -> bytes:
        self.calls.append((start, end))
        return DATA[start:end]


def test_an_open_at_the_same_version_keeps_the_blocks() -> None:
    cache, fetch = ClientCache(8 << 10, 1 << 10), Fetches()
    assert not cache.validate(info(version=1))  # first sight: nothing to keep
    assert cache.read(info(version=1), 100, 2000, fetch) == DATA[100:2100]
    assert fetch.calls == [(0, 3072)]  # one fetch for the run of missing blocks
    assert cache.validate(info(version=1))
    assert cache.read(info(version=1), 0, 3000, fetch) == DATA[:3000]
    assert len(fetch.calls) == 1  # all hits
    stats = cache.stats()
    assert (stats["hits"], stats["misses"]) == (3, 3)
    assert (stats["validations"], stats["validations_valid"]) == (2, 1)


def test_a_new_version_drops_the_blocks() -> None:
    cache, fetch = ClientCache(8 << 10, 1 << 10), Fetches()
    cache.validate(info(version=1))
    cache.read(info(version=1), 0, 1024, fetch)
    assert not cache.validate(info(version=2))
    assert cache.stats()["validations_invalidated"] == 1
    assert cache.stats()["blocks_cached"] == 0
    cache.read(info(version=2), 0, 1024, fetch)
    assert fetch.calls == [(0, 1024), (0, 1024)]


def test_forget_and_clear() -> None:
    cache, fetch = ClientCache(8 << 10, 1 << 10), Fetches()
    for key in ("a", "b"):
        cache.validate(info(key))
        cache.read(info(key), 0, 10, fetch)
    cache.forget("a")
    assert not cache.validate(info("a"))  # its version is forgotten too
    assert cache.validate(info("b"))
    cache.clear()
    assert cache.stats()["blocks_cached"] == 0 and not cache.validate(info("b"))


def test_the_versions_kept_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "VERSIONS_KEPT_MAX", 4)
    cache, fetch = ClientCache(8 << 10, 1 << 10), Fetches()
    for i in range(4):
        cache.validate(info(f"k{i}"))
        cache.read(info(f"k{i}"), 0, 10, fetch)
    cache.validate(info("k4"))  # over the bound: the older half goes, blocks and all
    assert cache.validate(info("k2")) and cache.validate(info("k3"))
    assert cache.stats()["blocks_cached"] == 2
    assert not cache.validate(info("k0"))


def test_a_zero_byte_cache_is_disabled() -> None:
    assert not ClientCache(0).enabled and ClientCache().enabled


# --- through the client, against an in-memory node ---------------------------------


def test_reopening_an_unchanged_object_reads_nothing_from_the_node(
    client: Client, node: MemoryNode
) -> None:
    client.put("k", DATA)
    with client.open("k") as f:
        assert f.read() == DATA
    reads = node.served["read"]
    assert reads == 1  # one run of four missing blocks
    with client.open("k") as f:
        assert isinstance(f, RemoteReader) and f.cache_was_valid
        assert f.read() == DATA
    assert node.served["read"] == reads  # all from the cache
    assert node.served["stat"] == 2  # each open checks the version
    counters = client.counters()
    assert (counters["cache_hits"], counters["cache_misses"]) == (4, 4)


def test_a_change_by_another_client_is_seen_at_the_next_open(
    client: Client, node: MemoryNode
) -> None:
    other = MemoryNode.client([node])
    client.put("k", DATA)
    with client.open("k") as f:
        f.read()
    other.write("k", 0, b"NEW")
    with client.open("k") as f:
        assert isinstance(f, RemoteReader) and not f.cache_was_valid
        assert f.read(5) == b"NEW" + DATA[3:5]
    assert client.cache.counters.invalidated == 1


def test_a_change_between_open_and_read_is_an_error_not_a_mix(
    client: Client, node: MemoryNode
) -> None:
    client.put("k", DATA)
    f = client.open("k")
    assert f.read(10) == DATA[:10]  # block 0 cached at version 1
    MemoryNode.client([node]).write("k", 2048, b"changed")
    assert f.read(1014) == DATA[10:1024]  # still block 0: the cached version-1 bytes
    with pytest.raises(VersionMismatchError):
        f.read(100)  # block 1 must come from version 1, which is gone


def test_this_clients_own_writes_drop_its_cached_blocks(client: Client) -> None:
    client.put("k", DATA)
    with client.open("k") as f:
        f.read()
    client.write("k", 0, b"mine")
    assert client.cache.stats()["blocks_cached"] == 0
    with client.open("k") as f:
        assert f.read(4) == b"mine"
