"""The node's storage handlers, called directly (no sockets): argument checking and
the paging of long chunk lists."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from shuttle.blockcache import NO_SPAN, BytesSpans
from shuttle.errors import ConfigError, InvalidArgumentError, UnknownOperationError
from shuttle.net.registry import Mode, OperationRegistry, Reply
from shuttle.node import handlers
from shuttle.store import ObjectStore
from shuttle.store.fastread import CachedReads
from shuttle.store.missread import MissReads
from shuttle.store.nowait import NowaitReads


@pytest.fixture
def registry(tmp_path: Path) -> OperationRegistry:
    reg = OperationRegistry()
    handlers.register_storage_ops(reg, ObjectStore(tmp_path / "data"))
    return reg


def call(reg: OperationRegistry, op: str, args: dict[str, object], payload: bytes = b"") -> object:
    out = reg.get(op).handler(args, payload)
    assert not isinstance(out, Reply) or op == "read"
    return out


def test_long_chunk_lists_are_paged(
    registry: OperationRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers, "STAT_CHUNKS_MAX", 5)
    call(registry, "put", {"key": "big"}, os.urandom(3 << 20))
    attrs = call(registry, "stat", {"key": "big"})
    assert isinstance(attrs, dict)
    total = attrs["chunks_total"]
    assert total > 5 and len(attrs["chunks"]) == 5
    collected, start = [], 0
    while start is not None:
        page = call(registry, "chunks", {"key": "big", "start": start})
        assert isinstance(page, dict)
        collected += page["chunks"]
        start = page["next"]
    assert len(collected) == total
    assert sum(length for _, length, _ in collected) == 3 << 20
    assert collected[:5] == attrs["chunks"]


def test_arguments_are_checked_by_name(registry: OperationRegistry) -> None:
    with pytest.raises(InvalidArgumentError, match="'key'"):
        call(registry, "stat", {})
    with pytest.raises(InvalidArgumentError, match="length"):
        call(registry, "read", {"key": "a", "length": -1})
    with pytest.raises(InvalidArgumentError, match="expected_version"):
        call(registry, "remove", {"key": "a", "expected_version": "new"})
    with pytest.raises(InvalidArgumentError, match="keys"):
        call(registry, "stat_many", {"keys": ["a", 3]})
    with pytest.raises(UnknownOperationError, match=r"serves: cache\.drop, chunks"):
        registry.get("nope")


def test_small_reads_and_cached_stats_run_inline(registry: OperationRegistry) -> None:
    call(registry, "put", {"key": "k"}, b"x" * 10)
    read, stat = registry.get("read"), registry.get("stat")
    assert read.mode is Mode.THREAD and stat.mode is Mode.THREAD
    assert stat.inline_when is not None and stat.inline_when({"key": "k"})
    assert not stat.inline_when({"key": "../bad"})
    assert stat.inline is not None and stat.inline({"key": "../bad"}, b"") is None


def would_block(fd: int, length: int, offset: int) -> bytes:
    """RWF_NOWAIT's answer when the blocks are not in the page cache."""
    raise BlockingIOError(errno.EAGAIN, "would block")


def _paged_store(tmp_path: Path) -> tuple[ObjectStore, OperationRegistry, bytes]:
    """A store with its storage ops registered and a 300 KiB object ``k`` in the page
    cache but not in the block cache."""
    store = ObjectStore(tmp_path / "data")
    reg = OperationRegistry()
    handlers.register_storage_ops(reg, store)
    data = os.urandom(300 << 10)
    store.put("k", data)
    store.read("k", 0, len(data), use_cache=False)  # in the page cache
    store.cache.clear()
    return store, reg, data


def test_a_miss_the_page_cache_holds_is_answered_inline(tmp_path: Path) -> None:
    store, reg, data = _paged_store(tmp_path)
    inline = reg.get("read").inline
    assert inline is not None
    args = {"key": "k", "offset": 60 << 10, "length": 8 << 10}  # spans two blocks
    out = inline(args, b"")
    assert isinstance(out, Reply) and out.payload == data[60 << 10 : 68 << 10]
    assert store.nowait.served == 1 and store.cache.stats().bytes_from_disk == 128 << 10
    assert inline({"key": "k", "offset": 0, "length": 128 << 10}, b"") is None  # over 64 KiB


def test_the_read_lanes_miss_call_is_the_stores_compiled_miss_read(tmp_path: Path) -> None:
    """A local store's miss read takes the lane's calls itself (no interpreted frame in
    between), within the node's inline limit, and answers as ``read_nowait`` does."""
    store, reg, data = _paged_store(tmp_path)
    miss = reg.get("read").read_miss
    assert miss is not None and isinstance(getattr(miss, "__self__", None), MissReads)
    assert miss("k", 0, 128 << 10, None) is None  # over the inline limit: the pool's
    for offset, length in ((5, 100), (60 << 10, 8 << 10), (len(data) - 10, 100)):
        store.cache.clear()
        got = miss("k", offset, length, None)
        store.cache.clear()
        assert got == store.read_nowait("k", offset, length) == data[offset : offset + length]
    store.close()


def test_the_read_lane_is_the_stores_compiled_cached_read_itself(tmp_path: Path) -> None:
    """A local store's lock-free cache-hit read is the lane's :class:`SpanReader` itself
    (the protocol calls it natively), within the node's inline limit: the cached block
    and the range of the read in it, or NO_SPAN for what the usual way answers."""
    store = ObjectStore(tmp_path / "data")
    reg = OperationRegistry()
    handlers.register_storage_ops(reg, store)
    data = os.urandom(300 << 10)
    store.put("k", data)
    lane = reg.get("read").read_lane
    assert isinstance(lane, CachedReads) and lane.max_bytes == handlers.INLINE_READ_BYTES_MAX
    assert lane.lane_span("k", 70_000, 4096, None) == NO_SPAN  # not cached yet
    assert store.read("k", 65536, 65536) == data[65536:131072]  # caches the block
    buffer, start, stop = lane.lane_span("k", 70_000, 4096, None)
    assert len(buffer) == 65536 and (start, stop) == (70_000 - 65536, 74_096 - 65536)
    assert buffer[start:stop] == data[70_000:74_096]
    assert lane.lane_span("k", 65536, 128 << 10, None) == NO_SPAN  # over the inline limit
    assert lane.lane_span("nope", 0, 10, None) == NO_SPAN
    store.close()


def test_a_read_that_answers_bytes_is_a_span_of_all_of_them() -> None:
    """``BytesSpans``: the read lane of a store without cached spans (a RADOS gateway, a
    worker): the span of what its read answers; None, or nothing, is NO_SPAN."""
    answers: dict[str, bytes | None] = {"a": b"abc", "none": None, "empty": b""}
    asked: list[tuple[str, int, int, int | None]] = []

    def read(key: str, offset: int, length: int, version: int | None) -> bytes | None:
        asked.append((key, offset, length, version))
        return answers[key]

    lane = BytesSpans(read)
    assert lane.lane_span("a", 5, 3, 7) == (b"abc", 0, 3)
    assert lane.lane_span("none", 0, 1, None) == NO_SPAN
    assert lane.lane_span("empty", 0, 1, None) == NO_SPAN
    assert asked == [("a", 5, 3, 7), ("none", 0, 1, None), ("empty", 0, 1, None)]


def test_a_read_that_would_block_is_not_answered_inline(tmp_path: Path) -> None:
    """A miss the kernel would read from the disk must not be read on the event loop:
    the inline call answers None (the node then sends the read to its thread pool) and
    reads nothing."""
    store = ObjectStore(tmp_path / "data")
    store.nowait = NowaitReads(would_block)
    reg = OperationRegistry()
    handlers.register_storage_ops(reg, store)
    data = os.urandom(300 << 10)  # several 64 KiB blocks
    store.put("k", data)
    store.cache.clear()
    inline = reg.get("read").inline
    assert inline is not None
    args = {"key": "k", "offset": 60 << 10, "length": 8 << 10}  # spans two blocks
    disk_before = store.cache.stats().bytes_from_disk
    assert inline(args, b"") is None  # cold: not answered on the loop...
    assert store.cache.stats().bytes_from_disk == disk_before  # ...and no disk read there
    reply = reg.get("read").handler(args, b"")  # the pool's call reads the disk
    assert isinstance(reply, Reply) and reply.payload == data[60 << 10 : 68 << 10]
    assert store.cache.stats().bytes_from_disk > disk_before
    hit = inline(args, b"")  # now resident (both blocks): answered inline
    assert isinstance(hit, Reply) and hit.payload == data[60 << 10 : 68 << 10]
    assert store.cache.stats().bytes_from_disk == disk_before + (128 << 10)
    assert inline({"key": "k", "offset": 0, "length": 1 << 20}, b"") is None  # too big
    assert inline({"key": "k", "offset": -1, "length": 10}, b"") is None  # the pool says why
    assert inline({"key": "nope", "offset": 0, "length": 10}, b"") is None


def test_a_read_miss_call_needs_the_read_lane() -> None:
    reg = OperationRegistry()

    def nothing(key: str, offset: int, length: int, version: int | None) -> bytes | None:
        return None

    with pytest.raises(ConfigError, match="a read_miss call needs a read lane"):
        reg.add(
            "read",
            lambda args, payload: Reply(None, b""),
            Mode.THREAD,
            inline_try=lambda args, payload: None,
            read_miss=nothing,
        )


def test_a_start_call_applies_to_thread_operations_only() -> None:
    reg = OperationRegistry()

    async def handler(args: dict[str, object], payload: bytes) -> None:
        return None

    with pytest.raises(ConfigError, match="a start call only applies to THREAD mode"):
        reg.add("op", handler, Mode.ASYNC, start=lambda args, payload: None)


def test_a_local_stores_read_has_no_start_call(registry: OperationRegistry) -> None:
    """Only a store that can complete a read on the event loop without a thread (a
    RADOS store's ``read_async``) gives ``read`` a start call: a local store's misses
    the page cache cannot answer go to the pool."""
    assert registry.get("read").start is None
