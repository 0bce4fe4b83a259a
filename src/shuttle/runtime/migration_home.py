"""Moving a live object (ABACUS 5.2), the home's side: the object's home is where a
move takes effect. ``object.commit`` makes the target the object's place if the
object still runs at the source at the source's epoch and the move was not given up
(a durable object's record written first); ``object.resolve`` answers whether a move
was committed and, if not, fences it so that it never can be. Both run on a control
thread under the object's durability lock, over the location table
(:mod:`shuttle.runtime.locations`). :func:`ask_home` is the question ``object.resolve``
answers, as both ends of a move in doubt ask it.

The source's side (the executor) is :mod:`shuttle.runtime.migration`, the target's
:mod:`shuttle.runtime.migration_target`.
"""

from __future__ import annotations

from typing import Any

from shuttle.errors import RemoteProtocolError
from shuttle.runtime import faultpoints
from shuttle.runtime.authority import acting_for
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.hosted import Hosted
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


async def ask_home(bm: BindingManager, hosted: Hosted, mid: str) -> dict[str, Any]:
    """Ask ``hosted``'s home whether move ``mid`` was committed (``object.resolve``, or
    :func:`resolve_here` when the home is this run-time), for the object's principal:
    the source of a move in doubt asks it, and so does a target whose commit went
    unanswered. The answer is :func:`resolve_here`'s.

    Raises :class:`~shuttle.errors.ShuttleError` or :class:`OSError` when the home
    cannot say: not reached, no answer in time, or an answer that does not say whether
    the move was committed (:class:`~shuttle.errors.RemoteProtocolError`). Neither
    caller may take that for "not committed" (a source would reopen beside the target
    its home made the object's place, and a target would drop the only copy the home
    knows): both ask again."""
    rid = hosted.rid
    if rid.home == bm.id:
        answer = await bm.in_control(resolve_here, bm, rid, mid, bm.id)
    else:
        with acting_for(hosted.principal):  # as every message about the object
            reply = await bm.peers.control(
                rid.home, "object.resolve", {"rid": str(rid), "mid": mid, "from": bm.id}
            )
        answer = reply.result
    return home_said(answer, "committed", rid, "object.resolve", mid)


def home_said(answer: Any, flag: str, rid: ObjectId, op: str, mid: str) -> dict[str, Any]:
    """The home's ``answer`` to ``op`` about move ``mid``, if it says yes or no in its
    boolean ``flag``. Anything else raises :class:`~shuttle.errors.RemoteProtocolError`:
    the home may have committed, so it is never taken for "no" (the caller holds what it
    has and asks again, as for a lost answer)."""
    if not isinstance(answer, dict) or not isinstance(answer.get(flag), bool):
        raise RemoteProtocolError(
            f"{rid}'s home {rid.home} answered {op} with {answer!r:.200}, which does not "
            f"say whether move {mid} was committed: it is asked again"
        )
    return answer
