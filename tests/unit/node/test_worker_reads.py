"""A worker's own reads (shuttle.node.worker_reads) over a real store whose change hook
keeps the shared change generations, as a primary's does: what the worker answers
is always what the store holds, and anything it cannot check is declined."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuttle.errors import ConfigError
from shuttle.node.handlers import STAT_CHUNKS_MAX, attrs_reply
from shuttle.node.worker_pool import GenerationHook
from shuttle.node.worker_reads import LEARNT_CHUNKS_MAX, WORKER_READ_BYTES_MAX, WorkerReads
from shuttle.store import ObjectStore, StoreConfig
from shuttle.store.generations import SLOTS, TABLE_BYTES, ChangeGenerations, slot_of
from shuttle.store.nowait import NowaitReads


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[tuple[ObjectStore, ChangeGenerations]]:
    gens = ChangeGenerations.create()
    store = ObjectStore(tmp_path / "data", StoreConfig(cache_capacity_bytes=1 << 20))
    store.change_hook = GenerationHook(store.change_hook, gens)
    yield store, gens
    store.close()
    gens.close()


def _worker(store: ObjectStore, gens: ChangeGenerations, **kw: Any) -> WorkerReads:
    """A worker's reads: its own read-only view of the table, ``stat`` from the store."""
    view = ChangeGenerations(os.dup(gens.fd), writer=False)

    async def stat(key: str, chunks_max: int) -> dict[str, Any]:
        return attrs_reply(store.stat(key), chunks_max)  # what the primary answers

    return WorkerReads(store.layout.root, view, stat, **kw)


def _run(fn: Any) -> Any:
    async def main() -> Any:
        return await fn()

    return asyncio.run(main())


def test_a_change_holds_its_slot_odd_until_the_last_change_of_the_slot_ends() -> None:
    gens = ChangeGenerations.create()
    try:
        a = "a"
        b = next(f"k{i}" for i in range(10 * SLOTS) if slot_of(f"k{i}") == slot_of(a))
        slot = slot_of(a)
        assert gens.read(slot) == 0
        with gens.changing(a):
            assert gens.read(slot) == 1
            with gens.changing(b):  # same slot, at once (two threads of the primary)
                assert gens.read(slot) == 1
            assert gens.read(slot) == 1  # a's change still runs: still odd
        assert gens.read(slot) == 2
        assert gens.changes == 2
    finally:
        gens.close()


def test_a_workers_view_is_read_only_and_must_be_the_tables_size() -> None:
    gens = ChangeGenerations.create()
    view = ChangeGenerations(os.dup(gens.fd), writer=False)
    try:
        with pytest.raises(ConfigError, match="read-only"), view.changing("k"):
            pass
        with gens.changing("k"):
            assert view.read(slot_of("k")) == 1  # one table, two mappings
    finally:
        view.close()
        gens.close()
    fd = os.memfd_create("short")
    os.ftruncate(fd, TABLE_BYTES // 2)
    with pytest.raises(ConfigError, match="not 524288"):
        ChangeGenerations(fd, writer=False)
    os.close(fd)


def test_the_worker_answers_what_the_store_holds_across_every_kind_of_change(
    primary: tuple[ObjectStore, ChangeGenerations],
) -> None:
    store, gens = primary
    reads = _worker(store, gens)

    async def story() -> None:
        store.put("k", b"one" * 100)
        assert reads.read("k", 0, 30, None) is None  # not known yet: the primary answers
        await reads.learn("k")
        assert reads.read("k", 3, 6, None) == b"oneone"
        assert reads.read("k", 290, 100, None) == (b"one" * 100)[290:]  # to its end
        store.put("k", b"two" * 10)  # replaced (a new file): the old one must not answer
        assert reads.read("k", 0, 6, None) is None
        await reads.learn("k")
        assert reads.read("k", 0, 100, None) == b"two" * 10  # the new size, too
        store.write("k", 3, b"TWO")  # in place
        assert reads.read("k", 0, 9, None) is None
        await reads.learn("k")
        assert reads.read("k", 0, 9, None) == b"twoTWOtwo"
        store.truncate("k", 4)
        assert reads.read("k", 0, 9, None) is None
        await reads.learn("k")
        assert reads.read("k", 0, 9, None) == b"twoT"
        store.remove("k")
        assert reads.read("k", 0, 9, None) is None
        await reads.learn("k")  # not an object now: remembered as such
        learnt = reads.learnt
        assert reads.read("k", 0, 9, None) is None
        assert reads.learnt == learnt and reads.served == 5

    _run(story)
    reads.close()


def test_reads_it_cannot_check_are_declined(
    primary: tuple[ObjectStore, ChangeGenerations],
) -> None:
    store, gens = primary
    reads = _worker(store, gens)
    big = os.urandom(2 * WORKER_READ_BYTES_MAX)

    async def story() -> None:
        version = store.put("k", big).version
        await reads.learn("k")
        assert reads.read("k", 0, 10, version) == big[:10]
        assert reads.read("k", 0, 10, version + 1) is None  # the primary says mismatch
        assert reads.read("k", len(big), 10, None) is None  # at the end
        assert reads.read("k", -1, 10, None) is None
        assert reads.read("k", 0, 0, None) is None
        assert reads.read("k", 0, WORKER_READ_BYTES_MAX + 1, None) is None  # a stream
        assert reads.read("k", 0, WORKER_READ_BYTES_MAX, None) == big[:WORKER_READ_BYTES_MAX]

    _run(story)
    reads.close()


def test_a_change_that_starts_during_a_read_voids_it(
    primary: tuple[ObjectStore, ChangeGenerations],
) -> None:
    store, gens = primary
    changed: list[bool] = []

    def pread_then_change(fd: int, length: int, offset: int) -> bytes:
        got = os.pread(fd, length, offset)
        if not changed:  # the primary changes the object while the worker reads it
            changed.append(True)
            store.write("k", 0, b"NEW")
        return got

    reads = _worker(store, gens, nowait=NowaitReads(pread_then_change))

    async def story() -> None:
        store.put("k", b"old" * 10)
        await reads.learn("k")
        assert reads.read("k", 0, 3, None) is None  # read "old", but the slot moved
        await reads.learn("k")
        assert reads.read("k", 0, 3, None) == b"NEW"

    _run(story)
    reads.close()


def test_a_change_during_learning_keeps_nothing(
    primary: tuple[ObjectStore, ChangeGenerations],
) -> None:
    store, gens = primary
    changes = [b"second"]

    async def stat_then_change(key: str, chunks_max: int) -> dict[str, Any]:
        a = store.stat(key)
        if changes:  # the change lands between the stat's answer and the worker's check
            store.put(key, changes.pop())
        return attrs_reply(a, chunks_max)

    view = ChangeGenerations(os.dup(gens.fd), writer=False)
    reads = WorkerReads(store.layout.root, view, stat_then_change)

    async def story() -> None:
        store.put("k", b"first, and longer")
        await reads.learn("k")
        assert reads.stats()["known"] == 0  # nothing kept (the read would decline it too)
        assert reads.read("k", 0, 100, None) is None
        await reads.learn("k")
        assert reads.read("k", 0, 100, None) == b"second"
        with gens.changing("k"):  # a change running: nothing learnt meanwhile
            store_slot = slot_of("k")
            assert view.read(store_slot) & 1
            assert reads.read("k", 0, 100, None) is None
            await reads.learn("k")
            assert reads.stats()["known"] == 0
        assert reads.read("k", 0, 100, None) is None
        await reads.learn("k")
        assert reads.read("k", 0, 100, None) == b"second"

    _run(story)
    reads.close()


def test_keys_sharing_a_slot_only_cost_a_question(
    primary: tuple[ObjectStore, ChangeGenerations],
) -> None:
    store, gens = primary
    reads = _worker(store, gens)
    other = next(f"k{i}" for i in range(10 * SLOTS) if slot_of(f"k{i}") == slot_of("a"))

    async def story() -> None:
        store.put("a", b"aaaa")
        store.put(other, b"bbbb")
        await reads.learn("a")
        assert reads.read("a", 0, 4, None) == b"aaaa"
        store.put(other, b"cccc")  # another key of a's slot
        assert reads.read("a", 0, 4, None) is None  # asked again...
        await reads.learn("a")
        assert reads.read("a", 0, 4, None) == b"aaaa"  # ...and a is unchanged

    _run(story)
    reads.close()


def test_a_stat_the_worker_answers_is_the_primarys_answer_of_now(
    primary: tuple[ObjectStore, ChangeGenerations],
) -> None:
    store, gens = primary
    reads = _worker(store, gens)
    many = os.urandom(8 << 20)

    def primary_stat(key: str, chunks_max: int) -> dict[str, Any]:
        return attrs_reply(store.stat(key), chunks_max)

    async def story() -> None:
        store.put("k", b"small")
        assert reads.stat("k", 0, None) is None  # not known yet: the primary answers
        await reads.learn("k")
        for chunks_max in (0, 1, STAT_CHUNKS_MAX):
            assert reads.stat("k", chunks_max, None) == primary_stat("k", chunks_max)
        version = store.stat("k").version
        assert reads.stat("k", 0, version) == primary_stat("k", 0)
        assert reads.stat("k", 0, version + 1) is None  # the primary says mismatch
        store.write("k", 0, b"S")  # changed in place: the old answer is never given again
        assert reads.stat("k", 0, None) is None
        await reads.learn("k")
        assert reads.stat("k", STAT_CHUNKS_MAX, None) == primary_stat("k", STAT_CHUNKS_MAX)
        store.put("big", many)
        assert len(store.stat("big").chunks) > LEARNT_CHUNKS_MAX, "the test needs a long list"
        await reads.learn("big")
        assert reads.stat("big", 0, None) == primary_stat("big", 0)
        assert reads.stat("big", LEARNT_CHUNKS_MAX, None) == primary_stat("big", LEARNT_CHUNKS_MAX)
        assert reads.stat("big", LEARNT_CHUNKS_MAX + 1, None) is None  # longer than learnt
        store.remove("k")
        assert reads.stat("k", 0, None) is None
        await reads.learn("k")
        assert reads.stat("k", 0, None) is None  # not an object: the primary says so

    _run(story)
    assert (reads.stats_served, reads.stats_declined) == (7, 6)
    reads.close()


def _open_files(root: str) -> tuple[int, int]:
    """Descriptors of this process open on files under ``root``: (all, removed ones)."""
    files = removed = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root + "/") and "/.shuttle/" not in target:  # objects only
            files += 1
            removed += target.endswith(" (deleted)")
    return files, removed


def test_the_worker_keeps_its_files_in_the_stores_descriptor_cache_by_its_rules(
    primary: tuple[ObjectStore, ChangeGenerations],
) -> None:
    """Bounded (the oldest known object dropped, its file closed, before one more is
    learnt), and a changed object's file closed as soon as the worker sees the change:
    a removed object's space is not held by a worker."""
    store, gens = primary
    reads = _worker(store, gens, known_max=2)
    root = str(store.layout.root)

    async def story() -> None:
        for k in "abc":
            store.put(k, k.encode() * 10)
            await reads.learn(k)
        assert reads.stats()["known"] == 2 and reads.stats()["open_files"]["open"] == 2
        assert _open_files(root) == (2, 0)
        assert reads.read("a", 0, 10, None) is None  # dropped: the primary answers...
        await reads.learn("a")  # ...and the worker learns it again (dropping b)
        assert [reads.read(k, 0, 10, None) for k in "ac"] == [b"a" * 10, b"c" * 10]
        assert _open_files(root) == (2, 0)
        store.remove("c")
        assert _open_files(root) == (2, 1)  # the worker has not looked yet
        assert reads.read("c", 0, 10, None) is None  # it sees the slot move...
        assert _open_files(root) == (1, 0)  # ...and closes the file at once
        assert reads.stats()["open_files"]["forgotten"] >= 1

    _run(story)
    reads.close()
    assert _open_files(root) == (0, 0)
