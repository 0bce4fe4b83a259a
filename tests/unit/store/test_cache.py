"""The block cache against a dict-based model, and its counters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shuttle.blockcache import NO_SPAN
from shuttle.errors import InvalidArgumentError
from shuttle.store.cache import BlockCache
from tests.examples import examples

KEYS = ["a", "b"]


class Disk:
    """The backing store: objects as bytearrays; counts fetches."""

    def __init__(self) -> None:
        self.objects: dict[str, bytearray] = {}
        self.fetched = 0

    def fetcher(self, key: str):  # type: ignore[no-untyped-def]
        def fetch(start: int, end: int) -> bytes:
            self.fetched += end - start
            return bytes(self.objects[key][start:end])

        return fetch


class CacheModel(RuleBasedStateMachine):
    """Every read through the cache must equal the disk; writes go to disk first, then
    update the cache, exactly as the store does."""

    def __init__(self) -> None:
        super().__init__()
        self.disk = Disk()
        # Small blocks, so that short operations cross block boundaries and the end of
        # objects often; capacity for 12 blocks and a bit, so that evictions happen.
        self.cache = BlockCache(capacity_bytes=12 * 512 + 100, block_size_bytes=512)
        for k in KEYS:
            self.disk.objects[k] = bytearray()

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 3000), length=st.integers(0, 2000))
    def read(self, key: str, offset: int, length: int) -> None:
        obj = self.disk.objects[key]
        got = self.cache.read(key, offset, length, len(obj), self.disk.fetcher(key))
        assert got == bytes(obj[offset : offset + length])

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 3000), length=st.integers(1, 2000))
    def read_hit(self, key: str, offset: int, length: int) -> None:
        """The event loop's read: the right bytes when every block is cached, else None,
        and never a fetch."""
        obj = self.disk.objects[key]
        end = min(len(obj), offset + length)
        if offset >= end:
            return
        fetched = self.disk.fetched
        got = self.cache.read_hit(key, offset, end)
        assert got is None or got == bytes(obj[offset:end])
        assert self.disk.fetched == fetched
        if got is None:  # the long way caches it: the same read now hits
            self.cache.read(key, offset, end - offset, len(obj), self.disk.fetcher(key))
            if end - offset <= 12 * 512 - 2 * 512:  # fits in the cache with room to spare
                assert self.cache.read_hit(key, offset, end) == bytes(obj[offset:end])

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 3000), length=st.integers(1, 2000))
    def span_hit(self, key: str, offset: int, length: int) -> None:
        """The read lane's read: read_hit's answer as a range of a buffer, with the
        same counts; within one block the buffer is the cached block itself (no copy),
        the whole block, so the range sits at the read's offset in it."""
        obj = self.disk.objects[key]
        end = min(len(obj), offset + length)
        if offset >= end:
            return
        before = self.cache.stats()
        span = self.cache.span_hit(key, offset, end)
        after = self.cache.stats()
        if span == NO_SPAN:
            assert self.cache.read_hit(key, offset, end) is None
            assert (after.hits, after.bytes_from_cache) == (before.hits, before.bytes_from_cache)
            return
        buffer, start, stop = span
        assert buffer[start:stop] == bytes(obj[offset:end])
        assert after.bytes_from_cache - before.bytes_from_cache == end - offset
        assert after.hits - before.hits == (end - 1) // 512 - offset // 512 + 1
        if offset // 512 == (end - 1) // 512:  # one block: the block, not a slice of it
            base = offset // 512 * 512
            assert (start, stop) == (offset - base, end - base)
            assert buffer == bytes(obj[base : min(base + 512, len(obj))])

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 3000), length=st.integers(1, 600))
    def fill(self, key: str, offset: int, length: int) -> None:
        """The event loop's miss: read_hit misses, the caller reads the whole block that
        holds the range and hands it to fill (a node's miss on its loop)."""
        obj = self.disk.objects[key]
        end = min(len(obj), offset + length, (offset // 512 + 1) * 512)  # within one block
        if offset >= end or self.cache.read_hit(key, offset, end) is not None:
            return
        base = offset // 512 * 512
        block = self.disk.fetcher(key)(base, min(base + 512, len(obj)))
        assert self.cache.fill(key, offset, end, block) == bytes(obj[offset:end])
        assert self.cache.read_hit(key, offset, end) == bytes(obj[offset:end])

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 3000), data=st.binary(max_size=700))
    def write(self, key: str, offset: int, data: bytes) -> None:
        obj = self.disk.objects[key]
        old_size = len(obj)
        if data and offset > len(obj):  # like pwrite: writing nothing extends nothing
            obj.extend(bytes(offset - len(obj)))
        obj[offset : offset + len(data)] = data
        self.cache.write(key, offset, data, old_size)

    @rule(key=st.sampled_from(KEYS), size=st.integers(0, 3000))
    def truncate(self, key: str, size: int) -> None:
        obj = self.disk.objects[key]
        old_size = len(obj)
        if size < len(obj):
            del obj[size:]
        else:
            obj.extend(bytes(size - len(obj)))
        self.cache.truncate(key, old_size, size)

    @rule(key=st.sampled_from(KEYS), data=st.binary(max_size=2000))
    def replace(self, key: str, data: bytes) -> None:
        self.disk.objects[key] = bytearray(data)
        self.cache.invalidate(key)

    @rule()
    def clear(self) -> None:
        self.cache.clear()

    @invariant()
    def every_object_reads_back_whole(self) -> None:
        # Reading everything also fills the cache, so the next change meets cached
        # blocks (including short last blocks) that it must patch or drop.
        for key, obj in self.disk.objects.items():
            got = self.cache.read(key, 0, len(obj), len(obj), self.disk.fetcher(key))
            assert got == bytes(obj)

    @invariant()
    def within_capacity(self) -> None:
        s = self.cache.stats()
        assert s.bytes_cached <= s.capacity_bytes
        assert s.bytes_from_disk == self.disk.fetched


TestCacheAgainstModel = CacheModel.TestCase
TestCacheAgainstModel.settings = settings(
    max_examples=examples(300), stateful_step_count=30, deadline=None
)


def test_counters_count_blocks_and_bytes() -> None:
    disk = Disk()
    disk.objects["k"] = bytearray(range(256)) * 16  # 4096 bytes = 4 blocks of 1 KiB
    cache = BlockCache(capacity_bytes=8 * 1024, block_size_bytes=1024)
    fetch = disk.fetcher("k")
    assert cache.read("k", 100, 200, 4096, fetch) == bytes(disk.objects["k"][100:300])
    s = cache.stats()
    assert (s.hits, s.misses, s.bytes_from_disk, s.bytes_from_cache) == (0, 1, 1024, 0)
    cache.read("k", 0, 2048, 4096, fetch)  # block 0 hit, block 1 miss
    s = cache.stats()
    assert (s.hits, s.misses, s.bytes_from_disk, s.bytes_from_cache) == (1, 2, 2048, 1024)
    assert (s.blocks_cached, s.bytes_cached) == (2, 2048)


@pytest.mark.parametrize(
    ("offset", "length"), [(100, 200), (1024, 1024), (3000, 72), (4096 + 10, 50), (0, 1)]
)
def test_fill_is_read_with_its_fetch_done(offset: int, length: int) -> None:
    """The same miss through read (with a fetch) and through fill (the block read by
    the caller): the same bytes, counters and cached blocks, a cold cache and a warm."""
    size = 4096 + 100  # a short last block too
    data = bytes(range(256)) * 16 + bytes(100)
    disk = Disk()
    disk.objects["k"] = bytearray(data)
    by_read = BlockCache(capacity_bytes=3 * 1024, block_size_bytes=1024)
    by_fill = BlockCache(capacity_bytes=3 * 1024, block_size_bytes=1024)
    end = min(offset + length, size)
    base = offset // 1024 * 1024
    block = data[base : min(base + 1024, size)]
    for warm in (False, True):  # a miss, then the same range again: a hit in both
        assert by_read.read("k", offset, length, size, disk.fetcher("k")) == data[offset:end]
        assert by_fill.fill("k", offset, end, block) == data[offset:end], warm
        assert by_read.stats() == by_fill.stats()
    for other in range(4):  # evictions alike (three blocks fit)
        lo = other * 1024
        by_read.read("k", lo, 10, size, disk.fetcher("k"))
        by_fill.fill("k", lo, lo + 10, data[lo : lo + 1024])
        assert by_read.stats() == by_fill.stats()


def test_fill_refuses_a_range_outside_its_block() -> None:
    cache = BlockCache(capacity_bytes=1 << 20, block_size_bytes=1024)
    with pytest.raises(ValueError, match="not within the 1024-byte block at 1024"):
        cache.fill("k", 2000, 2100, bytes(1024))  # crosses into the next block
    with pytest.raises(ValueError, match="not within the 100-byte block at 0"):
        cache.fill("k", 50, 150, bytes(100))  # past a short block's end
    assert cache.stats().blocks_cached == 0


def test_runs_of_missing_blocks_are_fetched_in_one_call() -> None:
    calls: list[tuple[int, int]] = []

    def fetch(start: int, end: int) -> bytes:
        calls.append((start, end))
        return bytes(end - start)

    cache = BlockCache(capacity_bytes=1 << 20, block_size_bytes=1024)
    cache.read("k", 1024, 1024, 10_000, fetch)  # cache block 1
    cache.read("k", 0, 10_000, 10_000, fetch)
    assert calls == [(1024, 2048), (0, 1024), (2048, 10_000)]


def test_a_block_read_again_is_kept_over_one_that_was_not() -> None:
    disk = Disk()
    disk.objects["k"] = bytearray(4096)
    cache = BlockCache(capacity_bytes=2048, block_size_bytes=1024)
    f = disk.fetcher("k")
    cache.read("k", 0, 1, 4096, f)  # block 0
    cache.read("k", 1024, 1, 4096, f)  # block 1
    cache.read("k", 0, 1, 4096, f)  # touch block 0
    cache.read("k", 2048, 1, 4096, f)  # block 2 evicts block 1
    assert cache.stats().evictions == 1
    before = cache.stats().misses
    cache.read("k", 0, 1, 4096, f)
    assert cache.stats().misses == before
    cache.read("k", 1024, 1, 4096, f)
    assert cache.stats().misses == before + 1


def test_clear_empties_but_keeps_counters() -> None:
    disk = Disk()
    disk.objects["k"] = bytearray(b"x" * 3000)
    cache = BlockCache(capacity_bytes=1 << 20, block_size_bytes=1024)
    cache.read("k", 0, 3000, 3000, disk.fetcher("k"))
    cache.clear()
    s = cache.stats()
    assert (s.blocks_cached, s.bytes_cached, s.misses) == (0, 0, 3)
    cache.reset_counters()
    assert cache.stats().misses == 0


def test_zero_capacity_caches_nothing() -> None:
    disk = Disk()
    disk.objects["k"] = bytearray(b"y" * 100)
    cache = BlockCache(capacity_bytes=0, block_size_bytes=1024)
    assert cache.read("k", 0, 100, 100, disk.fetcher("k")) == b"y" * 100
    assert cache.read("k", 0, 100, 100, disk.fetcher("k")) == b"y" * 100
    assert cache.stats().blocks_cached == 0
    assert disk.fetched == 200


@pytest.mark.parametrize(("capacity", "block"), [(-1, 1024), (1024, 100)])
def test_bad_configuration_is_refused(capacity: int, block: int) -> None:
    with pytest.raises(InvalidArgumentError, match="must be"):
        BlockCache(capacity_bytes=capacity, block_size_bytes=block)


def test_short_fetch_is_an_error() -> None:
    cache = BlockCache(capacity_bytes=1 << 20, block_size_bytes=1024)
    with pytest.raises(OSError, match="short read"):
        cache.read("k", 0, 100, 100, lambda s, e: b"abc")


@settings(max_examples=examples(50), deadline=None)
@given(
    data=st.binary(min_size=0, max_size=5000),
    reads=st.lists(st.tuples(st.integers(0, 6000), st.integers(0, 6000)), max_size=10),
)
def test_reads_match_a_plain_slice(data: bytes, reads: list[tuple[int, int]]) -> None:
    cache = BlockCache(capacity_bytes=3000, block_size_bytes=512)
    for off, n in reads:
        assert cache.read("k", off, n, len(data), lambda s, e: data[s:e]) == data[off : off + n]


def test_growing_a_short_last_block_drops_it() -> None:
    disk = Disk()
    disk.objects["k"] = bytearray(b"a" * 600)
    cache = BlockCache(capacity_bytes=1 << 20, block_size_bytes=512)
    cache.read("k", 0, 600, 600, disk.fetcher("k"))
    disk.objects["k"].extend(bytes(600))  # truncate up to 1200
    cache.truncate("k", 600, 1200)
    assert cache.read("k", 0, 1200, 1200, disk.fetcher("k")) == bytes(disk.objects["k"])
    disk.objects["k"] += b"z"  # a write past the short last block's own range
    cache.read("k", 0, 1200, 1200, disk.fetcher("k"))
    disk.objects["k"][1100:1101] = b"q"
    cache.write("k", 1100, b"q", 1201)
    cache.write("k", 1200, b"", 1201)
    assert cache.read("k", 0, 1201, 1201, disk.fetcher("k")) == bytes(disk.objects["k"])


def test_write_beyond_a_cached_short_block_drops_it() -> None:
    disk = Disk()
    disk.objects["k"] = bytearray(b"a" * 100)
    cache = BlockCache(capacity_bytes=1 << 20, block_size_bytes=512)
    cache.read("k", 0, 100, 100, disk.fetcher("k"))
    disk.objects["k"] += bytes(600 - 100) + b"tail"
    cache.write("k", 600, b"tail", 100)
    assert cache.read("k", 0, 604, 604, disk.fetcher("k")) == bytes(disk.objects["k"])
