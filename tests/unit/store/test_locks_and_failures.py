"""Reader/writer locks, automatic checkpoints, and what happens when the disk fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shuttle.errors import StorageIOError
from shuttle.store import ObjectStore, StoreConfig
from shuttle.store import objects as objects_mod
from shuttle.store.keys import KEY_BYTES_MAX
from shuttle.store.locks import STRIPE_MEMO_KEYS_MAX, KeyLocks, RWLock


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Block until ``condition()`` holds: the moment another thread is parked in the
    lock, not a guess at how long it takes to get there."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.0005)


def test_readers_share_and_writers_exclude() -> None:
    lock = RWLock()
    log: list[str] = []
    lock.acquire_read()
    lock.acquire_read()  # a second reader gets in at once
    wrote = threading.Event()

    def writer() -> None:
        with lock.write():
            log.append("writer")
        wrote.set()

    t = threading.Thread(target=writer, daemon=True)  # a failure must not hang the run
    t.start()
    wait_until(lambda: lock.writers_waiting == 1, "the writer waits")
    assert log == []  # the writer waits for both readers
    lock.release_read()
    assert not wrote.wait(0.01) and log == []  # one reader still holds it
    lock.release_read()
    assert wrote.wait(timeout=10)
    t.join(timeout=10)
    assert log == ["writer"]


def test_waiting_writer_blocks_new_readers() -> None:
    lock = RWLock()
    order: list[str] = []
    lock.acquire_read()

    def writer() -> None:
        with lock.write():
            order.append("writer")

    def reader() -> None:
        with lock.read():
            order.append("late reader")

    w = threading.Thread(target=writer, daemon=True)
    w.start()
    wait_until(lambda: lock.writers_waiting == 1, "the writer waits")
    r = threading.Thread(target=reader, daemon=True)
    r.start()
    wait_until(lambda: lock.readers_waiting == 1, "the late reader waits behind the writer")
    lock.release_read()
    w.join(timeout=10)
    r.join(timeout=10)
    assert order == ["writer", "late reader"]


def test_key_locks_map_a_key_to_one_lock() -> None:
    locks = KeyLocks(stripes=8)
    assert locks.lock_for("a") is locks.lock_for("a")
    other = next(k for k in map(str, range(100)) if locks.lock_for(k) is not locks.lock_for("a"))
    with locks.write("a"), locks.read(other):  # different stripes do not block each other
        pass


def test_remembered_stripes_are_the_hashed_ones_and_bounded() -> None:
    """The memo of keys' stripes (the hash is costly compiled) gives each key the stripe
    ``hash(k) % stripes`` gives, first time or remembered, and holds at most its bound
    of keys, forgetting the oldest when full; a key too long to be valid (the read lane
    asks before the key is checked) is never kept."""
    locks = KeyLocks(stripes=8)
    stripes = [locks.lock_for(k) for k in ("a", "a")]
    assert stripes[0] is stripes[1]
    keys = [f"key/{n}" for n in range(STRIPE_MEMO_KEYS_MAX + 100)]
    for _ in range(2):
        for k in keys:
            assert locks.lock_for(k) is locks._stripes[hash(k) % 8]
            assert len(locks._memo) <= STRIPE_MEMO_KEYS_MAX
    assert len(locks._memo) == STRIPE_MEMO_KEYS_MAX
    assert keys[-1] in locks._memo and keys[0] not in locks._memo  # the oldest went
    huge = "k" * (KEY_BYTES_MAX + 1)
    assert locks.lock_for(huge) is locks._stripes[hash(huge) % 8]
    assert huge not in locks._memo


def test_checkpoint_runs_when_the_journal_passes_its_bound(root: Path) -> None:
    with ObjectStore(root, StoreConfig(journal_records_max=10)) as store:
        for i in range(25):
            store.put(f"k{i}", b"x")
        stats = store.stats()
        assert stats["checkpoints"] >= 2
        assert stats["journal"]["pending_bytes"] < 10 * 200
    with ObjectStore(root) as store:
        assert store.recovery.records == 0  # close checkpointed the rest
        assert len(store.list().keys) == 25


def test_disk_error_after_journaling_stops_changes_until_reopen(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ObjectStore(root)
    store.put("k", b"before")

    def failing(*args: object) -> None:
        raise OSError(5, "Input/output error")  # a full disk does not latch: see test_space

    monkeypatch.setattr(objects_mod, "overwrite_object", failing)
    with pytest.raises(StorageIOError, match="Input/output error"):
        store.put("k", b"after")
    monkeypatch.undo()
    with pytest.raises(StorageIOError, match="Restart the node"):
        store.put("other", b"x")
    assert store.read("k") == b"before"  # reads still work
    store.checkpoint()  # must not empty the journal that holds the unapplied put
    assert store.journal.size_bytes > 0
    store.close()
    with ObjectStore(root) as store:  # recovery finishes the journaled put
        assert store.read("k") == b"after"
        assert store.stat("k").size == 5
