"""A RADOS gateway whose block cache is full reads only the bytes asked for when a
miss's block would not stay (shuttle.store.rados_admission, rados_miss): the bytes of
the version RADOS reports for that read, cached nowhere, with the version checks of a
whole-block read. Real Ceph, two gateways on one namespace, a cache of four blocks."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from shuttle.cluster.ceph import LocalCeph
from shuttle.errors import VersionMismatchError
from shuttle.store import StoreConfig
from shuttle.store.rados import RadosStore
from tests.store_suite.gateway_waits import trusting, two_gateways, wait_until

BLOCK = 16384
#: Four blocks of 16 KiB: a 256 KiB object is four times the cache.
CONFIG = StoreConfig(cache_capacity_bytes=4 * BLOCK, cache_block_size_bytes=BLOCK)
PAGE = 4096

Pair = tuple[RadosStore, RadosStore]


@pytest.fixture(scope="module")
def gateways(ceph: LocalCeph) -> Iterator[Pair]:
    yield from two_gateways(ceph, CONFIG, "p")


@pytest.fixture
def pair(gateways: Pair) -> Pair:
    for s in gateways:
        wait_until(lambda s=s: trusting(s), "trusting its cache")  # type: ignore[misc]
        s.reader.clear()  # every test starts with an empty cache
    return gateways


def _rados(s: RadosStore) -> dict[str, Any]:
    out: dict[str, Any] = s.stats()["rados"]
    return out


def _aio(s: RadosStore, key: str, offset: int, length: int, expected: int | None = None) -> bytes:
    async def go() -> bytes:
        fut = s.read_async(key, offset, length, expected, bytes)
        assert fut is not None, "the read was not started on the loop"
        return await fut

    return asyncio.run(go())


def _full(a: RadosStore, b: RadosStore, key: str, data: bytes) -> int:
    """Put ``data``; b reads its first four blocks (whole: the cache had room), which
    fill b's cache; b's entry of the key is trusted. Returns the version."""
    version = a.put(key, data).version
    assert b.read(key, 0, PAGE) == data[:PAGE]  # the first read makes the entry
    for i in range(1, 4):
        assert _aio(b, key, i * BLOCK, PAGE) == data[i * BLOCK : i * BLOCK + PAGE]
    cache = b.cache.stats()
    assert cache.bytes_cached == cache.capacity_bytes
    return version


def test_a_miss_in_a_full_cache_reads_only_the_asked_range(pair: Pair) -> None:
    a, b = pair
    data = secrets.token_bytes(16 * BLOCK)
    _full(a, b, "p/k", data)
    before, cache_before = _rados(b), b.cache.stats()
    at = 9 * BLOCK + 100
    assert _aio(b, "p/k", at, PAGE) == data[at : at + PAGE]
    after = _rados(b)
    assert after["partial_reads"] - before["partial_reads"] == 1
    assert after["aio_bytes"] - before["aio_bytes"] == PAGE  # not the 16 KiB block
    assert after["aio_reads"] - before["aio_reads"] == 1
    assert after["validations"] == before["validations"]
    cache_after = b.cache.stats()
    assert cache_after.evictions == cache_before.evictions  # nothing evicted for it
    assert b.read_cached("p/k", 9 * BLOCK, PAGE) is None  # and nothing cached
    assert b.read_cached("p/k", 0, PAGE) == data[:PAGE]  # what was there stays
    # Read again at once: its block would have stayed, so it is read whole and cached.
    assert _aio(b, "p/k", at, PAGE) == data[at : at + PAGE]
    again = _rados(b)
    assert again["ghost_hits"] - after["ghost_hits"] == 1
    assert again["aio_bytes"] - after["aio_bytes"] == BLOCK
    assert b.read_cached("p/k", 9 * BLOCK, BLOCK) == data[9 * BLOCK : 10 * BLOCK]


def test_a_partial_read_at_the_object_s_end_is_short_and_tells_the_size(pair: Pair) -> None:
    a, b = pair
    data = secrets.token_bytes(10 * BLOCK + 1000)
    _full(a, b, "p/e", data)
    at = 10 * BLOCK + 500
    before = _rados(b)
    assert _aio(b, "p/e", at, PAGE) == data[at:]
    after = _rados(b)
    assert after["partial_reads"] - before["partial_reads"] == 1
    assert after["aio_bytes"] - before["aio_bytes"] == 500  # the object's last 500 bytes
    # The size is known now: a read past it starts nothing (the thread path answers b"").
    assert b.read_async("p/e", len(data), 10, None, bytes) is None
    assert b.read("p/e", len(data), 10) == b""


def test_a_partial_read_of_a_change_written_with_librados_answers_the_new_version(
    pair: Pair,
) -> None:
    """b trusts its entry of the old version (librados announces nothing): its partial
    read finds the new version, answers its bytes, names no other version, caches
    nothing, and drops the stale entry."""
    a, b = pair
    old = b"1" * (8 * BLOCK)
    version = _full(a, b, "p/c", old)
    new = b"2" * (8 * BLOCK)
    a.conn.ioctx().write("p/c", new, 0)
    before = _rados(b)
    with pytest.raises(VersionMismatchError, match=f"expected version {version}"):
        _aio(b, "p/c", 6 * BLOCK, PAGE, expected=version)
    mid = _rados(b)
    assert mid["partial_reads"] - before["partial_reads"] == 1
    assert mid["aio_bytes"] - before["aio_bytes"] == PAGE
    assert mid["aio_newer"] - before["aio_newer"] == 1
    assert b.read_async("p/c", 6 * BLOCK, PAGE, None, bytes) is None  # the entry is gone
    assert b.read("p/c", 6 * BLOCK, PAGE) == new[:PAGE]
    with pytest.raises(VersionMismatchError):
        b.read("p/c", 6 * BLOCK, PAGE, expected_version=version)


def test_a_change_through_another_gateway_during_a_partial_read(pair: Pair) -> None:
    """The partial read is in flight when a changes the key (its announcement drops b's
    entry first): it returns the version before or after the change, whole, caches
    nothing, and b's next read is of the new version."""
    a, b = pair
    for i in range(4):
        key = f"p/f{i}"  # a key of its own: its block is not one missed just before
        old, new = bytes([i]) * (8 * BLOCK), bytes([100 + i]) * (8 * BLOCK)
        _full(a, b, key, old)
        before = _rados(b)

        async def go(key: str, new: bytes) -> bytes:
            fut = b.read_async(key, 6 * BLOCK, PAGE, None, bytes)
            assert fut is not None
            a.put(key, new)  # on the loop's thread: the read's answer waits for it
            return await fut

        got = asyncio.run(go(key, new))
        assert got in (old[:PAGE], new[:PAGE])
        after = _rados(b)
        assert after["partial_reads"] - before["partial_reads"] == 1
        assert after["aio_bytes"] - before["aio_bytes"] == PAGE
        assert b.read_cached(key, 6 * BLOCK, PAGE) is None
        assert b.read(key, 6 * BLOCK, PAGE) == new[:PAGE]
