"""An object manager holds each object's latest activation until every activation it
was given has been released: an object that left and came back (or whose in-doubt
move resolved late) can arrive again before its old activation is closed, and that
late close must not take the new one away. In the mix benchmark a client's call to
its own heavy filter, back from the node, failed with "manager of SyntheticFilter does
not hold ..." (benchmarks/README.md, "Placement for aggregate throughput")."""

from __future__ import annotations

from typing import Any

import pytest

from shuttle.errors import InvalidArgumentError
from shuttle.objects.fs.cache import CacheManager, CacheObject
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject, ObjectManager


class Counter(MobileObject):
    def __init__(self, start: int = 0) -> None:
        self.n = start

    def bump(self) -> int:
        self.n += 1
        return self.n


RID = ObjectId("c-a", "counter-1")
NO_INVOKER: Any = None  # these objects make no calls


def test_a_late_close_of_an_old_activation_leaves_the_new_one() -> None:
    manager = ObjectManager(Counter, "c-a")
    old = manager.create(RID, NO_INVOKER, {"start": 5})
    # It left (its checkpoint went) and came back before the old activation closed.
    new = manager.adopt(RID, NO_INVOKER, old.checkpoint())
    assert manager.release(RID) is None  # the old one's close
    assert manager.get(RID) is new
    assert manager.invoke(RID, "bump", (), {}) == 6
    assert manager.release(RID) is new  # the new one's close: gone
    with pytest.raises(InvalidArgumentError, match="does not hold"):
        manager.invoke(RID, "bump", (), {})
    assert manager.release(RID) is None and len(manager) == 0


def test_one_activation_is_released_by_one_close() -> None:
    manager = ObjectManager(Counter, "c-a")
    obj = manager.create(RID, NO_INVOKER, {})
    assert manager.release(RID) is obj and manager.get(RID) is None


def test_a_cache_keeps_its_blocks_while_an_activation_holds_them() -> None:
    manager = CacheManager(CacheObject, "c-a")
    owner = str(RID)
    manager.shared.put(owner, 0, b"x" * 10)
    manager._hold(RID, CacheObject.__new__(CacheObject))
    manager._hold(RID, CacheObject.__new__(CacheObject))
    manager.release(RID)
    assert manager.shared.used_bytes == 10
    manager.release(RID)
    assert manager.shared.used_bytes == 0
