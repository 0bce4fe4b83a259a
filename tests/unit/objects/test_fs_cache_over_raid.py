"""The cache object over a RAID stand-in, in one process: a write's bytes land and its
change is reported to the isolation object in two steps, and another write can come
between them. Whatever the order, no cache keeps bytes the file no longer holds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import UnreachableError
from shuttle.objects.fs.cache import CacheObject, SharedBlockCache
from shuttle.objects.fs.isolation import IsolationObject
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.refs import Ref
from tests.unit.objects.test_fs_directory_format import (
    LocalRuntime,
    MemoryAtomicity,
    MemoryStore,
)

KEY = "vol/.files/striped"
BLOCK = 512


class RaidStandIn:
    """What a cache uses of a raid5 object: the file's bytes (shared by every
    client's stand-in, as the columns are), each write reported to the isolation
    object with ``changed``, and ``between``: run once after a write's bytes land and
    before its report (where another write can overtake it)."""

    def __init__(self, disk: bytearray, isolation: Ref) -> None:
        self.disk = disk
        self.isolation = isolation
        self.between: Callable[[], None] | None = None

    def attach(self, rid: ObjectId, invoker: Any) -> None:
        pass

    def read(self, offset: int, length: int) -> bytes:
        return bytes(self.disk[offset : offset + length])

    def write(self, offset: int, data: bytes, holder: Ref | None = None) -> dict[str, Any]:
        if len(self.disk) < offset:
            self.disk.extend(bytes(offset - len(self.disk)))
        self.disk[offset : offset + len(data)] = data
        hook, self.between = self.between, None
        if hook is not None:
            hook()
        ts = self.isolation.changed(KEY, offset, len(data), holder)
        return {"size": len(self.disk), "bytes": len(data), "stripes": 1, "timestamp": ts}

    def size(self) -> int:
        return len(self.disk)

    def stats(self) -> dict[str, Any]:
        return {"callbacks": True}


class DownIsolation:
    """An isolation object whose node does not answer."""

    def attach(self, rid: ObjectId, invoker: Any) -> None:
        pass

    def promise(self, *args: Any) -> int:
        raise UnreachableError("node n1 is down")

    def release(self, *args: Any) -> None:
        raise UnreachableError("node n1 is down")


def setup(clients: int) -> tuple[LocalRuntime, list[CacheObject], list[RaidStandIn], bytearray]:
    rt = LocalRuntime()
    store = MemoryStore()
    iso = rt.add(
        ObjectId("n1", "isolation"),
        IsolationObject(store, MemoryAtomicity(store)),  # type: ignore[arg-type]
    )
    disk = bytearray()
    caches, raids = [], []
    for c in range(clients):
        raid = RaidStandIn(disk, iso)
        raid_ref = rt.add(ObjectId(f"c{c}", "raid"), raid)
        cache = CacheObject.__new__(CacheObject)
        cache.attach(ObjectId(f"c{c}", "cache"), rt)
        cache.__init__(iso, KEY, block_bytes=BLOCK, data=raid_ref)  # type: ignore[misc]
        cache._shared = SharedBlockCache()
        rt.add(ObjectId(f"c{c}", "cache"), cache)
        caches.append(cache)
        raids.append(raid)
    return rt, caches, raids, disk


def test_a_write_whose_report_is_overtaken_does_not_cache_its_bytes_over_the_newer() -> None:
    _, (a, b), (raid_a, _), disk = setup(2)
    # A's bytes land, then B writes the whole block (bytes and report), then A's
    # report comes: the file holds B's bytes, and so must both caches.
    raid_a.between = lambda: b.write(0, b"B" * BLOCK)
    a.write(0, b"A" * BLOCK)
    assert bytes(disk) == b"B" * BLOCK
    assert a.read(0, BLOCK) == b"B" * BLOCK
    assert b.read(0, BLOCK) == b"B" * BLOCK


def test_one_cache_s_own_two_writes_of_a_block_leave_the_later_cached() -> None:
    _, (a,), (raid,), disk = setup(1)
    landed = threading.Event()
    second = threading.Thread(target=lambda: (a.write(0, b"2" * BLOCK), landed.set()))

    def overtake() -> None:  # the second write starts after the first's bytes land
        second.start()
        landed.wait(timeout=0.5)  # it cannot finish before us if writes are ordered

    raid.between = overtake
    a.write(0, b"1" * BLOCK)
    second.join(timeout=10)
    assert bytes(disk) == b"2" * BLOCK
    assert a.read(0, BLOCK) == b"2" * BLOCK


class LateReplyIsolation:
    """A plain file's isolation object whose write, once applied, runs ``after_write``
    before it answers (as if its reply were slow)."""

    def __init__(self, iso: Ref) -> None:
        self.iso = iso
        self.after_write: Callable[[], None] | None = None

    def attach(self, rid: ObjectId, invoker: Any) -> None:
        pass

    def read(self, key: str, offset: int, length: int, holder: Ref | None = None) -> Any:
        return self.iso.read(key, offset, length, holder)

    def write(self, key: str, offset: int, data: bytes, writer: Ref | None = None) -> int:
        ts = int(self.iso.write(key, offset, data, writer))
        hook, self.after_write = self.after_write, None
        if hook is not None:
            hook()
        return ts


def test_a_plain_file_s_older_write_answered_late_does_not_replace_the_newer_copy() -> None:
    rt, (a,), _, _ = setup(1)
    late = LateReplyIsolation(a.isolation)
    a.isolation = rt.add(ObjectId("n1", "late"), late)
    a.data = None  # a plain file: the isolation object stores it
    late.after_write = lambda: a.write(0, b"2" * BLOCK)  # applied and answered first
    a.write(0, b"1" * BLOCK)
    assert a.read(0, BLOCK) == b"2" * BLOCK
    assert late.iso.read(KEY, 0, BLOCK)[0] == b"2" * BLOCK


def test_a_read_with_its_home_node_down_goes_through_uncached_and_drops_the_rest() -> None:
    rt, (a,), _, disk = setup(1)
    a.write(0, b"x" * (2 * BLOCK))  # a run: not cached
    assert a.read(0, 10) == b"x" * 10  # a miss, then cached under a promise
    assert a.stats()["cached_blocks"] == 1
    down = rt.add(ObjectId("n1", "down"), DownIsolation())
    a.isolation = down
    disk[BLOCK : BLOCK + 3] = b"new"  # another client's write (the home cannot tell us)
    assert a.read(BLOCK, 3) == b"new"  # read through the RAID object, not cached
    assert a.stats()["cached_blocks"] == 0  # and the promises held there are gone


# --- any interleaving ---------------------------------------------------------------

BLOCKS = 4
ops = st.lists(
    st.tuples(
        st.integers(0, 2),  # the client
        st.sampled_from(["read", "write", "run", "overtaken"]),
        st.integers(0, BLOCKS - 1),  # the block (where a write starts)
        st.integers(0, 2),  # the overtaking client
        st.integers(0, BLOCKS - 1),  # the block it writes
        # A write's length: a whole block, or part of one (read first, which takes a
        # promise: the overtaken write of a whole block is the case that needs one).
        st.sampled_from([BLOCK, BLOCK, BLOCK // 3, 7]),
    ),
    max_size=25,
)


@settings(max_examples=80, deadline=None)
@given(ops)
def test_every_cached_block_equals_the_file_after_any_interleaving(
    steps: list[tuple[int, str, int, int, int, int]],
) -> None:
    _, caches, raids, disk = setup(3)
    for n, (c, kind, block, other, other_block, length) in enumerate(steps):
        data = bytes([n % 251 + 1]) * length
        offset = block * BLOCK
        if kind == "read":
            got = caches[c].read(offset, BLOCK)
            assert got == bytes(disk[offset : offset + BLOCK])
        elif kind == "run":  # whole blocks, written below in one call
            caches[c].write(offset, bytes([n % 251 + 1]) * (2 * BLOCK))
        else:
            if kind == "overtaken":  # by another client (one cache's writes are ordered)
                other = other if other != c else (c + 1) % len(caches)
                theirs = bytes([(n + 128) % 251 + 1]) * BLOCK
                raids[c].between = lambda o=other, b=other_block, d=theirs: caches[o].write(
                    b * BLOCK, d
                )
            caches[c].write(offset, data)
        for cache in caches:  # no write in flight: every cached block is the file's
            for start in cache._promises.names():
                held = cache._shared.get(str(cache.rid), start)
                assert held is None or held == bytes(disk[start : start + BLOCK]), (
                    f"step {n}: {cache.rid} holds a stale block {start}"
                )


def test_a_lapsed_promise_is_renewed_and_a_node_restart_is_found_out() -> None:
    rt, (a, b), _, disk = setup(2)
    a.write(0, b"x" * BLOCK)  # cached by a, under a promise
    later = [0.0]
    a._promises.clock = lambda: later[0]
    later[0] = 1e9  # long past the promise's lifetime: still the same block
    assert a.read(0, 4) == b"xxxx"
    assert a.stats()["revalidations"] == 1 and a.stats()["installation_reads"] == 0
    # The node restarts: a new isolation object under the same id, which knows no
    # promises; b's write then calls no one back.
    store = MemoryStore()
    rt.objects[ObjectId("n1", "isolation")] = IsolationObject(store, MemoryAtomicity(store))  # type: ignore[arg-type]
    b.write(0, b"y" * BLOCK)
    assert bytes(disk[:4]) == b"yyyy"
    assert a.read(0, 4) == b"xxxx"  # within the renewed lifetime a cannot know
    later[0] = 2e9
    assert a.read(0, 4) == b"yyyy"  # lapsed: the timestamp is the new node's
    assert a.stats()["installation_reads"] == 1


def test_with_its_promise_log_a_restarted_node_tells_every_cache_at_once(tmp_path: Any) -> None:
    """The same restart, but the isolation object keeps its holders on disk (as a
    node's does): the new one calls a back before b's write, so a never serves the
    stale block, not even within its promise's lifetime."""
    from shuttle.objects.fs.holders import HolderLog

    rt, (a, b), _, disk = setup(2)
    store = MemoryStore()
    log = tmp_path / "promises.log"
    iso = IsolationObject(store, MemoryAtomicity(store), HolderLog(log))  # type: ignore[arg-type]
    rt.add(ObjectId("n1", "isolation"), iso)
    a.write(0, b"x" * BLOCK)
    assert a.read(0, 4) == b"xxxx" and a.stats()["cached_blocks"] == 1
    again = IsolationObject(store, MemoryAtomicity(store), HolderLog(log))  # type: ignore[arg-type]
    rt.add(ObjectId("n1", "isolation"), again)  # the node restarts on the same data
    again.recover()
    assert a.stats()["cached_blocks"] == 0  # told: every block of the file is stale
    b.write(0, b"y" * BLOCK)
    assert bytes(disk[:4]) == b"yyyy"
    assert a.read(0, 4) == b"yyyy"
