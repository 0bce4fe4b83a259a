"""The lock-free read of a block-cache hit (the fast path of ``ObjectStore.read``): it
answers what the locked read would, it steps aside whenever a change overlaps it, and
with writers hammering the same blocks no reader ever gets a torn block or stale bytes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from shuttle import compiled
from shuttle.errors import NotFoundError, VersionMismatchError
from shuttle.store import ObjectStore, StoreConfig

BLOCK = 4096
ROOT = Path(__file__).resolve().parents[3]


def fill(value: int, nbytes: int = BLOCK) -> bytes:
    return bytes([value % 256]) * nbytes


class LongWay:
    """Stands in for the key locks: counts the reads that take the long (locked) way."""

    def __init__(self, store: ObjectStore) -> None:
        self.locks = store._locks
        self.taken = 0

    def read(self, key: str) -> object:
        self.taken += 1
        return self.locks.read(key)

    def __getattr__(self, name: str) -> object:
        return getattr(self.locks, name)


def long_way(store: ObjectStore) -> LongWay:
    spy = LongWay(store)
    store._locks = spy  # type: ignore[assignment]
    return spy


def test_a_cached_read_is_served_without_the_key_lock(store: ObjectStore) -> None:
    store.put("k", b"".join(fill(i) for i in range(4)))
    spy = long_way(store)
    assert store.read("k", BLOCK, BLOCK) == fill(1)  # a miss: the long way caches it
    assert spy.taken == 1
    hits = store.cache.stats().hits
    assert store.read("k", BLOCK + 100, 200) == fill(1, 200)
    assert spy.taken == 1  # a hit: no lock taken
    assert store.cache.stats().hits == hits + 1
    assert store.stats()["ops"]["read"] == 2
    assert store.stats()["bytes_read"] == BLOCK + 200


def test_the_lane_gets_the_cached_block_and_the_range_not_a_copy(store: ObjectStore) -> None:
    """``CachedReads.span``, the node's read lane: the block the cache holds and where
    the read's bytes sit in it (the reply packs them from there, copied once); what
    ``read`` answers is that range; a read over two blocks gets them joined."""
    content = b"".join(fill(i) for i in range(3))
    store.put("k", content)
    store.read("k", 0, 3 * BLOCK)  # every block cached
    reads = store.cached_reads
    span = reads.span("k", BLOCK + 100, 200, None)
    assert span is not None
    buffer, start, stop = span
    assert (start, stop) == (100, 300) and buffer == fill(1)
    assert buffer is reads.span("k", BLOCK, BLOCK, None)[0]  # type: ignore[index]
    assert reads.read("k", BLOCK + 100, 200, None) == content[BLOCK + 100 : BLOCK + 300]
    two = reads.span("k", BLOCK - 10, 20, None)
    assert two is not None and two[0][two[1] : two[2]] == content[BLOCK - 10 : BLOCK + 10]
    clipped = reads.span("k", 3 * BLOCK - 5, 100, None)  # clipped at the object's end
    assert clipped is not None and clipped[1:] == (BLOCK - 5, BLOCK)
    version = store.stat("k").version
    assert reads.span("k", 0, 10, version + 1) is None  # another version: the long way
    assert reads.span("k", 0, 10, version) is not None
    bytes_read = store.stats()["bytes_read"]
    reads.span("k", 0, 10, None)
    assert store.stats()["bytes_read"] == bytes_read + 10


def test_the_fast_path_steps_aside_for_what_it_cannot_answer(store: ObjectStore) -> None:
    store.put("k", fill(7, BLOCK + 10))
    store.read("k", 0, BLOCK)
    store.read("k", BLOCK, 10)
    spy = long_way(store)
    assert store.read("k", BLOCK, 100) == fill(7, 10)  # clipped at the end: still fast
    assert spy.taken == 0
    assert store.read("k", 0, 2 * BLOCK) == fill(7, BLOCK + 10)  # two cached blocks: fast
    assert spy.taken == 0
    store.cache.clear()
    assert store.read("k", BLOCK - 10, 20) == fill(7, 20)  # two blocks, none cached
    assert spy.taken == 1
    assert store.read("k", 2 * BLOCK, 1) == b""  # past the end
    with pytest.raises(VersionMismatchError):
        store.read("k", 0, 1, expected_version=12345)
    with pytest.raises(NotFoundError):
        store.read("missing", 0, 1)
    assert spy.taken == 4
    assert store.read("k", BLOCK - 10, 20) == fill(7, 20)  # cached by the miss above
    assert spy.taken == 4


def test_a_change_during_the_lookup_sends_the_read_the_long_way(store: ObjectStore) -> None:
    """A writer that slips in between the reader's look at the attributes and block
    and its second look at the generation moves the generation on: the reader must
    not return the old block.

    The change lands from a stand-in for the block cache, right after its hit found the
    old block: compiled, the reader's parts are native fields that only take the real
    types, so the stand-in runs on the pure modules (the same source), in a process of
    their own when this one runs the compiled ones."""
    if compiled.active().compiled:
        env = {**os.environ, compiled.PURE_ENV: "1"}
        test = f"{__file__}::test_a_change_during_the_lookup_sends_the_read_the_long_way"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p",
             "no:randomly", test],
            cwd=ROOT, env=env, capture_output=True, timeout=300, check=False,
        )  # fmt: skip
        out = done.stdout.decode(errors="replace")
        assert done.returncode == 0 and "1 passed" in out, out[-3000:]
        return
    store.put("k", fill(1, 2 * BLOCK))
    store.read("k", 0, BLOCK)
    reads = store.cached_reads
    cache = reads.view.cache
    raced = []

    class RacingCache:
        """The block cache as the reader asks it for the block: the hit, then a change
        that lands right after it (before the reader's second look at the generation)."""

        def span_hit(self, key: str, offset: int, end: int) -> tuple[bytes, int, int]:
            span = cache.span_hit(key, offset, end)
            if not raced:
                raced.append(span[0][span[1] : span[2]])
                store.write("k", 0, fill(2))  # a change lands right after the look
            return span

    reads.view.cache = RacingCache()  # type: ignore[assignment]
    try:
        assert store.read("k", 0, BLOCK) == fill(2)
    finally:
        reads.view.cache = cache
    assert raced == [fill(1)]  # the reader had found the old block


def test_a_change_under_way_is_seen_by_the_generation(store: ObjectStore) -> None:
    store.put("k", fill(1))
    store.read("k", 0, BLOCK)
    lock = store._locks.lock_for("k")
    before = lock.generation
    spy = long_way(store)
    lock.acquire_write()
    assert lock.generation % 2 == 1
    done = threading.Event()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: (got.append(store.read("k", 0, BLOCK)), done.set()))
    reader.start()
    assert not done.wait(0.2)  # the reader took the long way and waits for the writer
    lock.release_write()
    reader.join()
    assert got == [fill(1)] and spy.taken == 1
    assert lock.generation == before + 2
    assert store.read("k", 0, BLOCK) == fill(1) and spy.taken == 1


def test_concurrent_writers_never_produce_a_torn_or_stale_read(root: Path) -> None:
    """Writers overwrite whole blocks (each block uniform, one value per write) and
    replace or truncate the whole object; readers read pieces of single blocks,
    mostly as cache hits. Every piece must be uniform (one write's bytes, never a
    mix), and once the writers stop every read must see the final contents."""
    blocks = 8
    store = ObjectStore(
        root, StoreConfig(cache_capacity_bytes=1 << 20, cache_block_size_bytes=BLOCK)
    )
    try:
        store.put("k", fill(0, blocks * BLOCK))
        stop = threading.Event()
        failures: list[str] = []
        reads = [0]

        def writer(seed: int) -> None:
            rng = random.Random(seed)
            value = seed * 1000
            while not stop.is_set():
                value += 1
                roll = rng.random()
                if roll < 0.8:
                    store.write("k", rng.randrange(blocks) * BLOCK, fill(value))
                elif roll < 0.9:
                    store.put("k", fill(value, blocks * BLOCK))
                else:
                    store.truncate("k", rng.randrange(1, blocks + 1) * BLOCK)
                    store.write("k", 0, fill(value, blocks * BLOCK))
                # A change holds the key's lock through its fsync: leave readers room
                # between changes (as a real workload does) so that both paths run.
                stop.wait(rng.random() * 0.002)

        def reader(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                idx = rng.randrange(blocks)
                lo = rng.randrange(BLOCK)
                n = rng.randrange(1, BLOCK - lo + 1)
                data = store.read("k", idx * BLOCK + lo, n)
                if data and data.count(data[0]) != len(data):
                    failures.append(f"torn read of block {idx} at {lo}+{n}")
                reads[0] += 1

        threads = [threading.Thread(target=writer, args=(s,)) for s in (1, 2)]
        threads += [threading.Thread(target=reader, args=(s,)) for s in (3, 4, 5)]
        for t in threads:
            t.start()
        stop.wait(1.5)
        stop.set()
        for t in threads:
            t.join()
        assert not failures, failures[:5]
        assert reads[0] > 200
        assert store.cache.stats().hits > 0
        final = store.read("k", 0, blocks * BLOCK, use_cache=False)
        for idx in range(blocks):
            assert store.read("k", idx * BLOCK, BLOCK) == final[idx * BLOCK : (idx + 1) * BLOCK]
    finally:
        store.close()


def test_a_closed_store_answers_no_cached_read(store: ObjectStore) -> None:
    """Once the store is closed, the lock-free read (a node's read lane) answers
    nothing, though its block cache still holds the bytes."""
    store.put("k", fill(3, 2 * BLOCK))
    assert store.read("k", 0, BLOCK) == fill(3)  # cached
    assert store.cached_reads.span("k", 0, 100, None) is not None
    store.close()
    assert store.cached_reads.span("k", 0, 100, None) is None
    assert store.cached_reads.read("k", 0, 100, None) is None
