"""A RADOS gateway's reads that miss its block cache, started on an event loop
(``RadosStore.read_async``, shuttle.store.rados_aio): the bytes of the version RADOS
reports for that read, cached only when it is the trusted entry's, and the thread
path's errors. Real Ceph, two gateways on one namespace."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from shuttle.blockcache import NO_SPAN
from shuttle.cluster.ceph import LocalCeph
from shuttle.errors import NotFoundError, StorageIOError, VersionMismatchError
from shuttle.net.registry import OperationRegistry, Reply
from shuttle.node.handlers import INLINE_READ_BYTES_MAX, register_storage_ops
from shuttle.store.rados import RadosStore
from shuttle.store.rados_aio import native_completions, read_error
from shuttle.store.rados_conn import CephOptions
from shuttle.store.rados_miss import InlineReads
from tests.store_suite.conftest import SUITE_CONFIG
from tests.store_suite.gateway_waits import trusting, two_gateways, wait_until

Pair = tuple[RadosStore, RadosStore]


@pytest.fixture(scope="module")
def gateways(ceph: LocalCeph) -> Iterator[Pair]:
    """Two gateways on a fresh namespace, shared by the module's tests."""
    yield from two_gateways(ceph, SUITE_CONFIG, "a")


@pytest.fixture
def pair(gateways: Pair) -> Pair:
    """The module's gateways, each trusting its cache (a watch can lapse under load)."""
    for s in gateways:
        wait_until(lambda s=s: trusting(s), "trusting its cache")  # type: ignore[misc]
    return gateways


def _rados(s: RadosStore) -> dict[str, Any]:
    out: dict[str, Any] = s.stats()["rados"]
    return out


def _aio(s: RadosStore, key: str, offset: int, length: int, expected: int | None = None) -> bytes:
    """``s.read_async`` on an event loop of its own; fails if it did not start."""

    async def go() -> bytes:
        fut = s.read_async(key, offset, length, expected, bytes)
        assert fut is not None, "the read was not started on the loop"
        return await fut

    return asyncio.run(go())


def _warm_entry(a: RadosStore, b: RadosStore, key: str, data: bytes) -> int:
    """Put ``data``; b reads it (its entry for the key is then trusted) and drops the
    blocks, keeping the entry: b's next read of it misses the cache."""
    version = a.put(key, data).version
    assert b.read(key, 0, 4096) == data[:4096]
    b.cache.clear()
    return version


def test_a_miss_of_a_trusted_key_is_read_on_the_loop_and_cached(pair: Pair) -> None:
    a, b = pair
    data = secrets.token_bytes(16384)  # four blocks of the suite's 4 KiB
    _warm_entry(a, b, "m/k", data)
    before = _rados(b)
    assert _aio(b, "m/k", 4096 + 100, 5000) == data[4196:9196]  # over two blocks
    after = _rados(b)
    assert after["aio_reads"] - before["aio_reads"] == 1
    assert after["cold_reads"] == before["cold_reads"]  # not the thread path's read
    assert after["validations"] == before["validations"]  # and no stat
    assert after["aio_in_flight"] == 0
    # The C completions where Shuttle runs its compiled modules, else the ctypes path.
    assert after["aio_completion"] == ("c" if native_completions() else "ctypes")
    assert b.read_cached("m/k", 4096, 8192) == data[4096:12288]  # both blocks resident
    # The object's end: a short read, clipped.
    assert _aio(b, "m/k", 16000, 4096) == data[16000:]


def test_a_read_past_what_the_entry_knows_is_started_and_tells_the_size(pair: Pair) -> None:
    a, b = pair
    data = secrets.token_bytes(10000)
    _warm_entry(a, b, "m/s", data)  # its entry knows 4096 bytes at least
    assert _aio(b, "m/s", 8000, 4096) == data[8000:]  # a short read: the end
    assert b.read_async("m/s", 10000, 10, None, bytes) is None  # the end is known now
    assert b.read_cached("m/s", 8192, 4096) == data[8192:]


def test_a_read_without_trust_or_of_another_version_is_not_started(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    data = secrets.token_bytes(8000)
    version = _warm_entry(a, b, "m/n", data)
    assert _aio(b, "m/n", 4096, 4096) == data[4096:]  # a short read: the size is known

    async def started(offset: int, length: int, expected: int | None = None) -> bool:
        fut = b.read_async("m/n", offset, length, expected, bytes)
        if fut is None:
            return False
        await fut
        return True

    assert not asyncio.run(started(0, 4096, version + 1))  # the pool words the mismatch
    assert not asyncio.run(started(8000, 10))  # nothing there: the pool answers b""
    assert not asyncio.run(started(0, SUITE_CONFIG.cache_read_bytes_max + 1))
    assert not asyncio.run(started(-1, 10))
    assert not asyncio.run(started(0, 0))
    monkeypatch.setattr(b.coherence, "trusted", lambda: False)
    assert not asyncio.run(started(0, 4096))  # no trust: confirmed on the thread path
    monkeypatch.undo()
    assert asyncio.run(started(0, 4096))


def test_a_change_through_librados_before_the_read_is_answered_at_its_version(
    pair: Pair,
) -> None:
    """A change written with librados directly announces nothing, so b still trusts
    its entry of the old version; its miss reads the new version, as RADOS reports it:
    the bytes are answered (the version they are of is the one the read names), not
    cached as the old version's, and the stale entry is dropped."""
    a, b = pair
    old, new = b"1" * 8192, b"2" * 8192
    version = _warm_entry(a, b, "m/c", old)
    a.conn.ioctx().write("m/c", new, 0)
    with pytest.raises(VersionMismatchError, match="expected version"):
        _aio(b, "m/c", 0, 4096, expected=version)
    before = _rados(b)
    assert b.read_async("m/c", 0, 4096, None, bytes) is None  # the entry is gone
    assert b.read("m/c", 0, 4096) == new[:4096]
    assert b.read_cached("m/c", 0, 4096, version) is None  # nothing cached as the old
    with pytest.raises(VersionMismatchError):
        b.read("m/c", 0, 4096, expected_version=version)
    assert _rados(b)["aio_newer"] == before["aio_newer"]  # counted when the read found it


def test_a_newer_version_found_by_a_read_is_not_cached_as_the_old(pair: Pair) -> None:
    a, b = pair
    old, new = b"3" * 8192, b"4" * 8192
    version = _warm_entry(a, b, "m/d", old)
    a.conn.ioctx().write("m/d", new, 0)
    before = _rados(b)
    assert _aio(b, "m/d", 0, 4096) == new[:4096]
    assert _rados(b)["aio_newer"] - before["aio_newer"] == 1
    assert b.read_cached("m/d", 0, 4096, version) is None
    assert b.read("m/d", 4096, 4096) == new[4096:]


def test_the_thread_path_reads_an_unannounced_change_too(pair: Pair) -> None:
    """The same miss on the thread path (``read``, as the node's pool calls it): it used
    to race the stale entry until it gave up ("kept changing while read")."""
    a, b = pair
    old, new = b"5" * 8192, b"6" * 8192
    version = _warm_entry(a, b, "m/t", old)
    a.conn.ioctx().write("m/t", new, 0)
    assert b.read("m/t", 0, 4096) == new[:4096]
    assert b.read("m/t", 4096, 4096) == new[4096:]
    with pytest.raises(VersionMismatchError):
        b.read("m/t", 0, 4096, expected_version=version)


def test_a_change_through_another_gateway_during_an_in_flight_read(pair: Pair) -> None:
    """The read is in flight when a changes the key (its announcement drops b's entry
    first): the read returns the version before or after the change, whole, and caches
    nothing of the old one; b's next read is of the new version."""
    a, b = pair
    for i in range(5):
        old, new = bytes([i]) * 8192, bytes([100 + i]) * 8192
        _warm_entry(a, b, "m/f", old)

        async def go(new: bytes) -> bytes:
            fut = b.read_async("m/f", 0, 8192, None, bytes)
            assert fut is not None
            a.put("m/f", new)  # on the loop's thread: the read's answer waits for it
            return await fut

        got = asyncio.run(go(new))
        assert got in (old, new)
        assert b.read("m/f", 0, 8192) == new
        assert b.read_cached("m/f", 0, 8192) in (None, new)


def test_a_removed_object_fails_the_read_as_missing(pair: Pair) -> None:
    a, b = pair
    _warm_entry(a, b, "m/r", b"x" * 8192)
    a.conn.ioctx().remove_object("m/r")  # librados directly: nothing announced
    errors = b.stats()["errors"].get("not_found", 0)
    with pytest.raises(NotFoundError, match="no object 'm/r'"):
        _aio(b, "m/r", 4096, 4096)
    assert b.stats()["errors"]["not_found"] == errors + 1
    assert _rados(b)["aio_in_flight"] == 0


def test_the_node_reads_a_rados_store_through_its_compiled_calls(pair: Pair) -> None:
    """A node's ``read`` over a RADOS store: the read lane's hit and the miss that
    ``Operation.start`` begins are :class:`InlineReads`' calls (compiled, no interpreted
    frame between the node's dispatch and librados), with no page-cache try between
    them (RADOS has no page cache to ask), limited to the node's inline reads."""
    a, b = pair
    registry = OperationRegistry()
    register_storage_ops(registry, b)
    op = registry.get("read")
    lane = op.read_lane
    assert lane is not None and op.start is not None
    assert isinstance(lane, InlineReads)  # a SpanReader: the protocol calls it natively
    assert op.read_miss is None
    data = secrets.token_bytes(16384)
    _warm_entry(a, b, "m/i", data)
    assert lane.lane_span("m/i", 0, 4096, None) == NO_SPAN  # not resident: the lane declines

    async def started(length: int) -> Any:
        fut = op.start({"key": "m/i", "offset": 0, "length": length}, b"")  # type: ignore[misc]
        return None if fut is None else await fut

    before = _rados(b)
    reply = asyncio.run(started(4096))
    assert isinstance(reply, Reply) and bytes(reply.payload) == data[:4096]
    assert _rados(b)["aio_reads"] == before["aio_reads"] + 1
    reads = b.stats()["ops"].get("read", 0)
    span = lane.lane_span("m/i", 0, 4096, None)  # resident now: the lane's hit, counted
    assert span != NO_SPAN and bytes(span[0][span[1] : span[2]]) == data[:4096]
    assert b.stats()["ops"]["read"] == reads + 1
    assert lane.lane_span("m/i", 0, INLINE_READ_BYTES_MAX + 1, None) == NO_SPAN
    assert asyncio.run(started(INLINE_READ_BYTES_MAX + 1)) is None  # the pool reads it


def test_read_errors_say_what_the_thread_path_says() -> None:
    assert isinstance(read_error("k", 2, 30), NotFoundError)
    timed_out = read_error("k", 110, 30)
    assert isinstance(timed_out, StorageIOError)
    assert "RADOS did not answer within 30 s" in str(timed_out)
    assert "ceph -s" in str(timed_out)
    other = read_error("k", 5, 30)
    assert isinstance(other, StorageIOError) and "read of 'k' failed in RADOS" in str(other)


def test_a_closed_store_starts_no_read(ceph: LocalCeph) -> None:
    info = ceph.info()
    opts = CephOptions(info.conf_path, info.keyring_path, op_timeout_s=20)
    s = RadosStore(info.pool, namespace=f"z{secrets.token_hex(6)}", config=SUITE_CONFIG, ceph=opts)
    assert s.aio is not None
    s.close()

    async def go() -> None:
        assert s.aio is not None
        assert not s.aio.read("k", 0, 10, lambda rv, v, d: None, asyncio.get_running_loop())

    asyncio.run(go())
