"""A full disk refuses what does not fit and nothing else: admission before the journal,
the reserve for removes, checkpoints and recovery, no latch on ENOSPC; and the store's
maximum object size. (tests/integration/test_disk_full.py does it on a real small file
system with a real node.)"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from shuttle.errors import DiskFullError, InvalidArgumentError, LimitExceededError
from shuttle.store import ObjectStore, StoreConfig
from shuttle.store import objects as objects_mod
from shuttle.store import recovery as recovery_mod
from shuttle.store.core import StoreCore
from shuttle.store.space import SpaceGuard, footprint_bytes


def enospc(*args: object, **kwargs: object) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def fail_once(real: object) -> object:
    """``real`` with its first call failing with ENOSPC."""
    calls = []

    def wrapper(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            enospc()
        return real(*args, **kwargs)  # type: ignore[operator]

    return wrapper


def test_a_change_that_does_not_fit_is_refused_before_the_journal(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put("a", b"kept")
    records = store.journal.records_appended
    monkeypatch.setattr(store.space, "free_bytes", lambda: 1000)
    with pytest.raises(DiskFullError, match="Nothing was changed") as refused:
        store.put("b", b"x" * 5000)
    assert "Remove objects" in str(refused.value)
    with pytest.raises(DiskFullError):
        store.write("a", 0, b"y" * 5000)
    with pytest.raises(DiskFullError):
        store.truncate("a", 1 << 30)
    assert store.journal.records_appended == records  # nothing journaled
    store.truncate("a", 2)  # shrinking frees space: never refused
    store.remove("a")  # nor is a remove
    monkeypatch.undo()
    store.put("b", b"fits now")  # no latch: the store carries on
    assert store.read("b") == b"fits now"
    assert store.stats()["space"]["refused"] == 3


def test_a_remove_whose_record_meets_enospc_uses_the_reserve(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put("a", b"x")
    assert store.space.reserve_held_bytes > 0
    monkeypatch.setattr(store.journal, "append", fail_once(store.journal.append))
    store.remove("a")
    assert store.stat_many(["a"]) == [None]
    assert store.space.reserve_held_bytes == 0 and store.space.reserve_releases == 1
    monkeypatch.undo()
    store.checkpoint()  # with room again, the reserve is set aside again
    assert store.space.reserve_held_bytes == store.space.reserve_target_bytes


def test_a_put_whose_record_meets_enospc_is_refused_and_nothing_latches(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store.journal, "append", fail_once(store.journal.append))
    with pytest.raises(DiskFullError, match="disk is full"):
        store.put("a", b"x")
    assert store.space.reserve_releases == 0  # the reserve is not for puts
    store.put("a", b"y")
    assert store.read("a") == b"y"


def test_enospc_after_journaling_uses_the_reserve_and_does_not_latch(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.put("k", b"before")
    real = recovery_mod.overwrite_object
    monkeypatch.setattr(objects_mod, "overwrite_object", fail_once(real))
    store.put("k", b"after")
    assert store.read("k") == b"after"
    monkeypatch.undo()
    store.put("other", b"x")  # not refused: no latch
    assert store.space.reserve_releases == 1


def test_a_checkpoint_on_a_full_disk_is_postponed_and_loses_nothing(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ObjectStore(root, StoreConfig(reserve_bytes=0))
    store.put("k", b"journaled")
    monkeypatch.setattr(store.attrs, "write_file", enospc)
    with pytest.raises(DiskFullError, match="postponed"):
        store.checkpoint()
    assert store.journal.size_bytes > 0  # kept: it is the only durable copy of attrs
    store.put("k2", b"still works")
    monkeypatch.undo()
    store.close(checkpoint=False)
    with ObjectStore(root) as again:
        assert again.read("k") == b"journaled" and again.read("k2") == b"still works"


def test_recovery_that_cannot_checkpoint_still_opens(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ObjectStore(root, StoreConfig(reserve_bytes=0))
    store.put("k", b"journaled")
    store.truncate("k", 4)
    store.close(checkpoint=False)
    monkeypatch.setattr(StoreCore, "_checkpoint", enospc)
    with ObjectStore(root) as again:  # the attributes stay in memory, the journal on disk
        assert again.read("k") == b"jour"
        assert again.journal.size_bytes > 0
        monkeypatch.undo()
    with ObjectStore(root) as again:
        assert again.read("k") == b"jour" and again.journal.size_bytes == 0


def test_the_reserve_is_a_bounded_share_of_the_file_system(tmp_path: Path) -> None:
    guard = SpaceGuard(str(tmp_path), str(tmp_path / "reserve"), 1 << 40)
    assert 0 < guard.reserve_target_bytes <= guard.total_bytes() / 16
    assert guard.restore_reserve()
    assert os.stat(tmp_path / "reserve").st_blocks * 512 >= guard.reserve_target_bytes
    assert guard.release_reserve() and not guard.release_reserve()
    assert footprint_bytes(data_bytes=10, journal_bytes=10, size_bytes=0) > 20


def test_the_maximum_object_size_is_refused_naming_the_limit_and_the_flag(root: Path) -> None:
    limit = 1 << 20
    with ObjectStore(root, StoreConfig(object_bytes_max=limit)) as store:
        store.put("fits", bytes(limit))
        for attempt in (
            lambda: store.put("big", bytes(limit + 1)),
            lambda: store.put("big", iter([bytes(limit), b"x"])),
            lambda: store.write("fits", limit, b"x"),
            lambda: store.truncate("fits", limit + 1),
            lambda: store.upload_write(store.begin_upload("up"), limit, b"x"),
        ):
            with pytest.raises(LimitExceededError, match="--object-bytes-max") as refused:
                attempt()
            assert str(limit) in str(refused.value)
        assert store.stat("fits").size == limit
    with pytest.raises(InvalidArgumentError, match="object_bytes_max"):
        StoreConfig(object_bytes_max=(1 << 40) + 1)
