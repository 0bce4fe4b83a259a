"""The node services in-process: the atomicity object refuses updates after a block
write failed half-way (recovery finishes it), and the isolation object's callbacks,
timestamps and commit check."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from shuttle.errors import (
    InvalidArgumentError,
    NotFoundError,
    ObjectNotFoundError,
    ShuttleError,
    StorageIOError,
)
from shuttle.objects.fs.atomicity import AtomicityObject
from shuttle.objects.fs.isolation import IsolationObject
from shuttle.runtime.ids import ObjectId
from shuttle.store import ObjectStore, StoreConfig


@pytest.fixture
def store(tmp_path: Path) -> Any:
    s = ObjectStore(tmp_path / "data", StoreConfig())
    yield s
    s.close()


def test_a_write_failing_half_way_refuses_later_updates_and_recovery_completes_it(
    store: ObjectStore, tmp_path: Path
) -> None:
    log = tmp_path / "data" / ".shuttle" / "fs" / "atomicity.log"
    atom = AtomicityObject(store, log)
    real, calls = store.write, []

    def failing(key: str, offset: int, data: bytes, **kw: Any) -> Any:
        calls.append(key)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(key, offset, data, **kw)

    store.write = failing  # type: ignore[method-assign]
    with pytest.raises(StorageIOError, match="completed when the node restarts"):
        atom.apply([["a", 0, b"A" * 8], ["b", 0, b"B" * 8]])
    store.write = real  # type: ignore[method-assign]
    with pytest.raises(StorageIOError, match="restart the node"):
        atom.apply([["c", 0, b"C"]])  # even one block: it could be overtaken by a replay
    with pytest.raises(NotFoundError):
        store.stat("c")
    again = AtomicityObject(store, log)  # the node restarts
    assert again.recovered == 1
    assert store.read("a", 0, 8) == b"A" * 8 and store.read("b", 0, 8) == b"B" * 8
    assert log.stat().st_size == 0


class Holder:
    """A callback holder that records what it was told (stands in for a cache)."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.rid = ObjectId("c1", name)
        self.told: list[tuple[str, list[int]]] = []
        self.fail = fail

    def invalidate(self, key: str, offsets: list[int]) -> None:
        if self.fail:
            raise ShuttleError("unreachable")
        self.told.append((key, offsets))


def test_callbacks_timestamps_and_the_commit_check(store: ObjectStore, tmp_path: Path) -> None:
    iso = IsolationObject(store, AtomicityObject(store, tmp_path / "log"))
    a, b = Holder("a"), Holder("b")
    data, ts0 = iso.read("k", 0, 4096, a)  # type: ignore[arg-type]
    assert data == b""
    iso.read("k", 4096, 4096, b)  # type: ignore[arg-type]
    # b writes 5000 bytes at 0: a's block 0 is stale, and so is b's own block 4096
    # (b holds the new copy of the block it wrote, named (k, 0), only).
    ts1 = iso.write("k", 0, b"x" * 5000, b)  # type: ignore[arg-type]
    assert a.told == [("k", [0])] and b.told == [("k", [4096])]
    assert ts1 > ts0
    # A commit over a stale read set changes nothing and names the block.
    out = iso.commit([["k", 0, ts0]], [["k", 0, b"y"]], a)  # type: ignore[arg-type]
    assert out["ok"] is False and out["conflicts"][0][:2] == ["k", 0]
    assert store.read("k", 0, 1) == b"x"
    out = iso.commit([["k", 0, ts1]], [["k", 0, b"y"], ["j", 0, b"z"]], a)  # type: ignore[arg-type]
    assert out["ok"] and store.read("k", 0, 1) == b"y" and store.read("j", 0, 1) == b"z"


def test_remove_takes_the_object_away_and_calls_back_every_holder_of_its_blocks(
    store: ObjectStore, tmp_path: Path
) -> None:
    """What a volume's rm does at a file's home: the object goes, every holder of any
    of its blocks (the writer's too: nobody holds the new, empty file) is told before
    remove returns, and the blocks' timestamps move on, so a copy cached before can
    never pass a revalidation after. Other keys' holders hear nothing."""
    iso = IsolationObject(store, AtomicityObject(store, tmp_path / "log"))
    a, b, other = Holder("a"), Holder("b"), Holder("other")
    iso.write("k", 0, b"x" * 5000, a)  # type: ignore[arg-type]
    _, ts0 = iso.read("k", 4096, 4096, b)  # type: ignore[arg-type]
    iso.read("j", 0, 10, other)  # type: ignore[arg-type]
    assert iso.remove("k") is True
    assert a.told == [("k", [0])] and b.told == [("k", [4096])] and other.told == []
    with pytest.raises(NotFoundError):
        store.stat("k")
    assert iso.read("k", 4096, 4096)[1] > ts0
    assert iso.remove("k") is False  # again: nothing there, nobody to tell
    assert iso.stats()["callbacks_held"] == 1  # other's, on j
    with pytest.raises(InvalidArgumentError, match="remove: key must be a non-empty string"):
        iso.remove("")


def test_a_holder_that_cannot_be_told_loses_its_promises(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("shuttle.objects.fs.isolation.CALLBACK_RETRY_S", 0.0)
    iso = IsolationObject(store, AtomicityObject(store, tmp_path / "log"))
    dead = Holder("dead", fail=True)
    iso.read("k", 0, 10, dead)  # type: ignore[arg-type]
    iso.write("k", 0, b"new")
    assert iso.stats()["callbacks_held"] == 0


class GoneHolder(Holder):
    """A holder the run-time no longer knows (destroyed): every call says so."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls = 0

    def invalidate(self, key: str, offsets: list[int]) -> None:
        self.calls += 1
        raise ObjectNotFoundError(f"no object {self.rid}: its home c1 does not know it")


def test_a_holder_that_no_longer_exists_loses_its_promises_without_being_asked_again(
    store: ObjectStore, tmp_path: Path
) -> None:
    # Retrying a definite "no such object" only made the writer wait: in ABACUS 6.5
    # the last client's commits stalled on the objects of the clients that were done.
    iso = IsolationObject(store, AtomicityObject(store, tmp_path / "log"))
    gone, live = GoneHolder("gone"), Holder("live")
    for key in ("k", "j"):
        iso.read(key, 0, 10, gone)  # type: ignore[arg-type]
        iso.read(key, 0, 10, live)  # type: ignore[arg-type]
    iso.commit([], [["k", 0, b"x"], ["j", 0, b"y"]])
    assert gone.calls == 1  # not retried, and not asked again about its other key
    assert sorted(live.told) == [("j", [0]), ("k", [0])]
    assert iso.stats()["callbacks_held"] == 0


def test_promises_on_data_stored_elsewhere_and_the_changes_that_break_them(
    store: ObjectStore, tmp_path: Path
) -> None:
    # A RAID 5 file's blocks: the isolation object keeps promises and timestamps for
    # them under the file's key, and learns of changes from the RAID object.
    iso = IsolationObject(store, AtomicityObject(store, tmp_path / "log"))
    a, b = Holder("a"), Holder("b")
    ts0 = iso.promise("f", 0, 1024, a)  # type: ignore[arg-type]
    iso.promise("f", 1024, 1024, b)  # type: ignore[arg-type]
    # b's write of its block 1024 breaks nobody else's and keeps its own promise.
    ts1 = iso.changed("f", 1024, 1024, b)  # type: ignore[arg-type]
    assert a.told == b.told == [] and ts1 > ts0
    # A long write with no writer (a bare RAID object) breaks both, b's too.
    ts2 = iso.changed("f", 0, 64 << 10)
    assert a.told == [("f", [0])] and b.told == [("f", [1024])] and ts2 > ts1
    assert iso.timestamps([["f", 0], ["f", 1024]]) == [ts2, ts2]
    assert iso.stats()["callbacks_held"] == 0
    # ... and it named no block of its own: a later write elsewhere in its range
    # breaks only the promises that overlap it.
    iso.promise("f", 0, 1024, a)  # type: ignore[arg-type]
    iso.changed("f", 4096, 1024)
    assert a.told == [("f", [0])]
    with pytest.raises(NotFoundError):
        store.stat("f")  # nothing is stored under the file's key here
    with pytest.raises(InvalidArgumentError, match="changed: length must be in 1"):
        iso.changed("f", 0, 0)
    with pytest.raises(InvalidArgumentError, match="promise: offset must be an integer"):
        iso.promise("f", -1, 10, a)  # type: ignore[arg-type]


class Told:
    """An invoker that records the calls made through its references."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []

    def invoke(self, ref: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls.append((str(ref.rid), method, args))
        return None


def test_a_restarted_node_calls_back_every_holder_before_it_takes_a_write(
    store: ObjectStore, tmp_path: Path
) -> None:
    """Promises live in memory, their holders and keys on disk: after a restart the
    isolation object tells every holder from before that all its blocks of each key
    are stale, and a write waits until it has."""
    from shuttle.objects.fs.holders import HolderLog
    from shuttle.runtime.refs import Ref

    path = tmp_path / "promises.log"
    told = Told()
    iso = IsolationObject(store, AtomicityObject(store, tmp_path / "log"), HolderLog(path))
    iso.attach(ObjectId("n1", "isolation"), told)
    cache = Ref(ObjectId("c1", "cache-1"), "127.0.0.1:9", told)
    directory = Ref(ObjectId("c2", "dir-1"), "127.0.0.1:8", told)
    iso.read("f", 0, 4096, cache)
    iso.read("f", 4096, 4096, cache)  # the same key: no second record
    iso.promise("g", 0, 4096, cache)
    iso.read("vol/.dirs/root", 0, 4096, directory)
    size = path.stat().st_size
    assert size > 0
    # The node restarts: nothing in memory, the log read back.
    again = IsolationObject(store, AtomicityObject(store, tmp_path / "log"), HolderLog(path))
    again.attach(ObjectId("n1", "isolation"), told)
    writer = __import__("threading").Thread(target=lambda: again.write("f", 0, b"new"))
    writer.start()
    writer.join(0.2)
    assert writer.is_alive()  # held until the holders are told
    again.recover()
    writer.join(10)
    assert sorted(told.calls) == [
        ("c1/cache-1", "invalidate", ("f", [])),
        ("c1/cache-1", "invalidate", ("g", [])),
        ("c2/dir-1", "invalidate", ("vol/.dirs/root", [])),
    ]
    assert path.stat().st_size == 0  # a fresh log: those promises are gone


def test_callbacks_after_a_restart_act_for_the_principal_each_promise_was_made_for(
    store: ObjectStore, tmp_path: Path
) -> None:
    """A principal's cache is reached only as that principal (its run-time serves no one
    else): the log keeps whom each holder's promises were made for, and the calls back
    after a restart act for it, as they would have before."""
    from shuttle.objects.fs.holders import HolderLog
    from shuttle.runtime.authority import acting, acting_for
    from shuttle.runtime.refs import Ref

    class ToldAs(Told):
        def invoke(
            self, ref: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            self.calls.append((str(ref.rid), method, (acting(),)))
            return None

    path = tmp_path / "promises.log"
    told = ToldAs()
    iso = IsolationObject(store, AtomicityObject(store, tmp_path / "log"), HolderLog(path))
    iso.attach(ObjectId("n1", "isolation"), told)
    with acting_for("alice"):
        iso.read("f", 0, 4096, Ref(ObjectId("c1", "cache-1"), "127.0.0.1:9", told))
    iso.read("g", 0, 4096, Ref(ObjectId("c2", "cache-2"), "127.0.0.1:8", told))  # unrestricted
    again = IsolationObject(store, AtomicityObject(store, tmp_path / "log"), HolderLog(path))
    again.attach(ObjectId("n1", "isolation"), told)
    again.recover()
    assert sorted(told.calls) == [
        ("c1/cache-1", "invalidate", ("alice",)),
        ("c2/cache-2", "invalidate", (None,)),
    ]
