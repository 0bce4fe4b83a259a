"""The block cache's eviction order (CLOCK) against reference models, and its hit
without a lock beside fills and evictions in other threads."""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shuttle.blockcache import BlockCache
from shuttle.sim.policies import Clock
from tests.examples import examples

BSZ = 512
KEYS = ["a", "b"]


def _key_id(key: str, idx: int) -> int:
    return KEYS.index(key) * 1000 + idx


@settings(max_examples=examples(200), deadline=None)
@given(
    capacity=st.integers(1, 6),
    accesses=st.lists(
        st.tuples(st.sampled_from(KEYS), st.integers(0, 9), st.booleans()), max_size=60
    ),
)
def test_whole_blocks_are_kept_as_the_simulators_clock_keeps_them(
    capacity: int, accesses: list[tuple[str, int, bool]]
) -> None:
    """Blocks of one size, each access one block, by the thread path (``read`` with a
    fetch) or by the event loop's (``read_hit``, then ``fill`` on a miss): every access
    hits or misses as in :class:`shuttle.sim.policies.Clock` (a ring and a hand,
    tested against libCacheSim's CLOCK), and the cached blocks are the same, in the
    order the hand will meet them."""
    objects = {key: bytes([n]) * (10 * BSZ) for n, key in enumerate(KEYS)}
    cache = BlockCache(capacity_bytes=capacity * BSZ, block_size_bytes=BSZ)
    model = Clock(capacity)
    for key, idx, by_loop in accesses:
        data = objects[key]
        expected_hit = model.access(_key_id(key, idx))
        hits = cache.stats().hits
        lo = idx * BSZ
        if by_loop:
            got = cache.read_hit(key, lo + 10, lo + 20)
            if got is None:
                got = cache.fill(key, lo + 10, lo + 20, data[lo : lo + BSZ])
        else:
            got = cache.read(key, lo + 10, 10, len(data), lambda s, e, d=data: d[s:e])
        assert got == data[lo + 10 : lo + 20]
        assert (cache.stats().hits == hits + 1) == expected_hit
        assert [_key_id(k, i) for k, i, _ in cache.blocks()] == model.contents()


class ClockModel(RuleBasedStateMachine):
    """Reads of any range (several blocks, short last blocks), writes, truncates,
    invalidations and clears against a plain model of CLOCK over blocks of any size:
    a list, oldest first, of ``[key, index, size, bit]``."""

    CAPACITY = 5 * BSZ + 300

    def __init__(self) -> None:
        super().__init__()
        self.cache = BlockCache(capacity_bytes=self.CAPACITY, block_size_bytes=BSZ)
        self.objects: dict[str, bytearray] = {key: bytearray() for key in KEYS}
        self.order: list[list[object]] = []

    # --- the model -------------------------------------------------------------------

    def _find(self, key: str, idx: int) -> list[object] | None:
        return next((e for e in self.order if e[0] == key and e[1] == idx), None)

    def _insert(self, key: str, idx: int, size: int) -> None:
        if size > self.CAPACITY:
            return
        while sum(int(e[2]) for e in self.order) + size > self.CAPACITY:  # type: ignore[call-overload]
            head = self.order.pop(0)
            if head[3]:
                head[3] = False
                self.order.append(head)
        self.order.append([key, idx, size, False])

    def _drop_where(self, key: str, pred: object) -> None:
        self.order = [e for e in self.order if not (e[0] == key and pred(e))]  # type: ignore[operator]

    def _fetch(self, key: str):  # type: ignore[no-untyped-def]
        obj = self.objects[key]
        return lambda s, e: bytes(obj[s:e])

    # --- rules -----------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 3000), length=st.integers(0, 1600))
    def read(self, key: str, offset: int, length: int) -> None:
        obj = self.objects[key]
        got = self.cache.read(key, offset, length, len(obj), self._fetch(key))
        assert got == bytes(obj[offset : offset + length])
        end = min(offset + length, len(obj))
        if offset >= end:
            return
        idxs = range(offset // BSZ, (end - 1) // BSZ + 1)
        missing = []
        for idx in idxs:
            found = self._find(key, idx)
            if found is None:
                missing.append(idx)
            else:
                found[3] = True
        for idx in missing:  # fetched in runs, inserted in order
            self._insert(key, idx, min(BSZ, len(obj) - idx * BSZ))

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 3000), length=st.integers(1, 1600))
    def read_hit(self, key: str, offset: int, length: int) -> None:
        obj = self.objects[key]
        end = min(len(obj), offset + length)
        if offset >= end:
            return
        got = self.cache.read_hit(key, offset, end)
        entries = [self._find(key, i) for i in range(offset // BSZ, (end - 1) // BSZ + 1)]
        whole = all(e is not None for e in entries)
        assert (got is not None) == whole
        if got is not None:
            assert got == bytes(obj[offset:end])
            for e in entries:
                e[3] = True  # type: ignore[index]

    @rule(key=st.sampled_from(KEYS), offset=st.integers(0, 3000), data=st.binary(max_size=700))
    def write(self, key: str, offset: int, data: bytes) -> None:
        obj = self.objects[key]
        old_size = len(obj)
        if data and offset > len(obj):
            obj.extend(bytes(offset - len(obj)))
        obj[offset : offset + len(data)] = data
        self.cache.write(key, offset, data, old_size)
        if not data:
            return
        end = offset + len(data)
        grown = old_size // BSZ if end > old_size and old_size % BSZ else -1

        def touched_short(e: list[object]) -> bool:
            i = int(e[1])  # type: ignore[call-overload]
            hit = i * BSZ < end and (i + 1) * BSZ > offset
            return (hit or i == grown) and int(e[2]) < BSZ  # type: ignore[call-overload]

        self._drop_where(key, touched_short)  # full blocks are patched in place

    @rule(key=st.sampled_from(KEYS), size=st.integers(0, 3000))
    def truncate(self, key: str, size: int) -> None:
        obj = self.objects[key]
        old_size = len(obj)
        if size < len(obj):
            del obj[size:]
        else:
            obj.extend(bytes(size - len(obj)))
        self.cache.truncate(key, old_size, size)
        keep_below = min(old_size, size) // BSZ
        self._drop_where(key, lambda e: int(e[1]) >= keep_below)

    @rule(key=st.sampled_from(KEYS), data=st.binary(max_size=2000))
    def replace(self, key: str, data: bytes) -> None:
        self.objects[key] = bytearray(data)
        self.cache.invalidate(key)
        self._drop_where(key, lambda e: True)

    @rule()
    def clear(self) -> None:
        self.cache.clear()
        self.order = []

    @invariant()
    def the_same_blocks_in_the_same_order(self) -> None:
        assert self.cache.blocks() == [(e[0], e[1], e[3]) for e in self.order]
        assert self.cache.stats().bytes_cached == sum(int(e[2]) for e in self.order)  # type: ignore[call-overload]


TestClockAgainstModel = ClockModel.TestCase
TestClockAgainstModel.settings = settings(
    max_examples=examples(200), stateful_step_count=40, deadline=None
)


def test_a_hit_takes_no_lock() -> None:
    """With the cache's mutex held elsewhere (a fill or an eviction under way in the
    I/O pool), a read whose block is cached still answers at once."""
    cache = BlockCache(capacity_bytes=4 * BSZ, block_size_bytes=BSZ)
    data = bytes(range(256)) * 8
    cache.read("k", 0, 4 * BSZ, len(data), lambda s, e: data[s:e])
    got: list[bytes | None] = []
    assert cache._lock.acquire(blocking=False)
    try:
        reader = threading.Thread(
            target=lambda: got.extend(
                [cache.read_hit("k", 10, 100), cache.read_hit("k", BSZ - 10, 2 * BSZ + 10)]
            ),
            daemon=True,
        )
        reader.start()
        reader.join(timeout=30)  # a bound, not an order: a hit that waits never ends
        assert not reader.is_alive(), "read_hit waited for the cache's mutex"
    finally:
        cache._lock.release()
    assert got == [data[10:100], data[BSZ - 10 : 2 * BSZ + 10]]
    assert [used for _, _, used in cache.blocks()] == [True, True, True, False]


def test_hits_without_the_lock_beside_fills_and_evictions() -> None:
    """Two threads read through a cache of three blocks over an object of twelve (every
    read a miss that fills and evicts, under the mutex) while a third reads by
    ``read_hit``: every answer is the object's bytes, and what the cache holds stays
    within its capacity and agrees with its index."""
    data = bytes(i % 251 for i in range(12 * BSZ))
    cache = BlockCache(capacity_bytes=3 * BSZ, block_size_bytes=BSZ)
    stop = threading.Event()
    errors: list[str] = []

    def filler(start: int) -> None:
        n = start
        while not stop.is_set():
            lo = (n % 12) * BSZ
            if cache.read("k", lo, BSZ, len(data), lambda s, e: data[s:e]) != data[lo : lo + BSZ]:
                errors.append(f"read at {lo}")
            n += 5

    def hitter() -> None:
        served = 0
        for n in range(20_000):
            lo = (n % 12) * BSZ + 7
            got = cache.read_hit("k", lo, lo + 100)
            if got is not None:
                served += 1
                if got != data[lo : lo + 100]:
                    errors.append(f"hit at {lo}")
        if not served:
            errors.append("no hit at all: the test did not exercise the lock-free path")
        stop.set()

    threads = [threading.Thread(target=filler, args=(s,)) for s in (0, 7)]
    threads.append(threading.Thread(target=hitter))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    s = cache.stats()
    assert s.bytes_cached <= s.capacity_bytes
    assert s.blocks_cached == len(cache.blocks()) <= 3
