"""Moving a live object (ABACUS 5.2), the home's side: the object's home is where a
move takes effect. ``object.commit`` makes the target the object's place if the
object still runs at the source at the source's epoch and the move was not given up
(a durable object's record written first); ``object.resolve`` answers whether a move
was committed and, if not, fences it so that it never can be. Both run on a control
thread under the object's durability lock, over the location table
(:mod:`shuttle.runtime.locations`).

The source's side (the executor) is :mod:`shuttle.runtime.migration`, the target's
:mod:`shuttle.runtime.migration_target`.
"""

from __future__ import annotations

from typing import Any

from shuttle.runtime import faultpoints
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.ids import ObjectId


def commit_here(
    bm: BindingManager, rid: ObjectId, mid: str, source: str, from_epoch: int, target: str
) -> dict[str, Any]:
    """``object.commit`` at ``rid``'s home (control thread; see :mod:`.locations`)."""
    faultpoints.reached("home-commit", str(rid))
    with bm.durability.lock_for(rid):
        done = bm.durability.commit(rid, mid, source, from_epoch, target)
    faultpoints.reached("home-committed", str(rid))
    return {
        "ok": done.ok,
        "epoch": done.epoch,
        "location": done.location,
        "reason": done.reason,
        "lease_s": bm.durability.lease_s,
    }


def resolve_here(bm: BindingManager, rid: ObjectId, mid: str, asker: str) -> dict[str, Any]:
    """``object.resolve`` at ``rid``'s home: was move ``mid`` committed? If not it is
    fenced (never later). A durable object's lease counts from now for the asker if
    the answer makes it the place the object runs."""
    with bm.durability.lock_for(rid):
        answer = bm.table.resolve_move(rid, mid)
        if answer.committed and answer.location == asker:
            bm.durability.granted(rid)
    return {
        "committed": answer.committed,
        "location": answer.location,
        "epoch": answer.epoch,
        "known": answer.known,
        "lease_s": bm.durability.lease_s,
    }
