"""Invoking an object wherever it runs, and asking its home where that is.

Concepts: the caller's side of a call (ABACUS 5.1): a plain call when the object is
hosted here, an ``object.invoke`` RPC to where this run-time thinks it runs
otherwise, carrying the newest epoch the caller has heard of; the chase when it is
not there (a node that no longer hosts it answers "moved" with what it knows; with
nothing better the caller asks the object's home, which always knows, and retries
there, up to :data:`REDIRECTS_MAX` times); and the home's answer to "where is it?"
(:func:`locate`), which waits while the home brings a durable object back. Entering
the object once it is found is :mod:`shuttle.runtime.hosted_calls`.

Functions over the binding manager (:mod:`shuttle.runtime.binding`), which calls
them from its methods of the same names. :func:`invoke` blocks (application and
executor threads); :func:`locate` is a coroutine on the run-time's loop.
"""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

from shuttle.errors import (
    ObjectInDoubtError,
    ObjectNotFoundError,
    RequestTimeoutError,
    UnreachableError,
)
from shuttle.runtime import budget, hosted_calls, values
from shuttle.runtime.gate import GateState
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.peers import NotSent
from shuttle.runtime.refs import Ref

if TYPE_CHECKING:
    from shuttle.runtime.binding import BindingManager

#: Redirects one invocation follows (moved → ask home → retry) before giving up: an
#: object can be moving while we chase it, but not that many times in one call.
REDIRECTS_MAX = 8
#: Longest a call waits for an object whose home is bringing it back from its
#: durable state (its node died): a lease and a node's restart, with room to spare.
RECOVERY_WAIT_S_MAX = 60.0


class Recovering(Exception):
    """The home is bringing a durable object back; ask again in ``retry_after_s``."""

    def __init__(self, rid: ObjectId, home: str, where: str, retry_after_s: float = 0.5) -> None:
        super().__init__(f"{rid} is being recovered by {home}")
        self.home = home
        self.where = where
        self.retry_after_s = max(0.05, min(retry_after_s, 5.0))


async def locate(bm: BindingManager, rid: ObjectId, failed_at: str = "") -> str:
    """:meth:`BindingManager.locate`: where ``rid``'s home says it runs. Raises
    :class:`Recovering` while the home brings a durable object back."""
    if rid.home == bm.id:
        if failed_at:
            await bm.durability.suspect(rid, failed_at)
        where, _, _ = bm.table.locate_here(rid)
        if where is None:
            raise ObjectNotFoundError(
                f"no object {rid}: this run-time is its home and never created it "
                "(or it was destroyed)"
            )
        if bm.durability.recovering(rid):
            raise Recovering(rid, bm.id, where)
        return where
    args: dict[str, Any] = {"rid": str(rid)}
    if failed_at:
        args["failed_at"] = failed_at
    reply = (await bm.peers.call(rid.home, "object.locate", args)).result
    where = reply.get("location")
    if not isinstance(where, str):
        raise ObjectNotFoundError(f"no object {rid}: its home {rid.home} does not know it")
    if reply.get("address"):
        bm.peers.learn(where, reply["address"])
    if reply.get("recovering"):
        raise Recovering(rid, rid.home, where, float(reply.get("retry_after_s", 0.5)))
    epoch = reply.get("epoch", 0)
    bm.table.heard(rid, where, epoch if isinstance(epoch, int) else 0)
    return where


def invoke(
    bm: BindingManager, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """:meth:`BindingManager.invoke`: call ``method`` on the object ``ref`` names,
    wherever it runs (blocking), as the calling object's edge if one is running."""
    budget.check()  # a call out of a budgeted built-in call is one of its checkpoints
    bm.learn_home(ref)
    caller = bm.monitor.current()
    outer = getattr(bm.chain, "id", None)
    if outer is None:
        bm.chain.id = secrets.token_hex(6)  # a new chain of calls starts here
    # In flight: the monitor shows the edge, and counts a remote call's stall as
    # it accrues, before the call returns.
    token = None if caller is None else bm.monitor.begin_call(caller, str(ref.rid))
    try:
        return _invoke(bm, ref, method, args, kwargs, caller)
    finally:
        if token is not None:
            bm.monitor.end_call(token)
        if outer is None:
            bm.chain.id = None


def _locate(bm: BindingManager, rid: ObjectId, failed_at: str, deadline: float) -> str:
    """:func:`locate`, waiting (up to ``deadline``) while the home recovers it."""
    while True:
        try:
            return bm.run(locate(bm, rid, failed_at))
        except Recovering as exc:
            if time.monotonic() + exc.retry_after_s > deadline:
                raise RequestTimeoutError(
                    f"object {rid} is being brought back by its home {exc.home} after "
                    f"{exc.where or 'its node'} failed, and it is taking longer than "
                    f"{RECOVERY_WAIT_S_MAX:g} s; try again (see {exc.home}'s log)"
                ) from None
            time.sleep(exc.retry_after_s)


def _invoke(
    bm: BindingManager,
    ref: Ref,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    caller: str | None,
) -> Any:
    rid = ref.rid
    #: Where the home said the object is (authoritative), if we asked.
    home_says: str | None = None
    deadline = time.monotonic() + RECOVERY_WAIT_S_MAX
    for _ in range(REDIRECTS_MAX):
        hosted = bm.table.hosted(rid)
        if hosted is not None and hosted.gate.state is not GateState.RETIRED:
            try:
                return hosted_calls.call(bm, hosted, method, args, kwargs, caller)[0]
            except hosted_calls.Retired:
                continue
        where = bm.table.where(rid)
        if where is None or where == bm.id:
            home_says = _locate(bm, rid, bm.id if where == bm.id else "", deadline)
            if home_says == bm.id and bm.table.hosted(rid) is None:
                raise ObjectNotFoundError(
                    f"object {rid} was lost: its home says it runs here, but it does "
                    "not (was this run-time restarted?)"
                )
            continue
        try:
            status, value = _invoke_remote(bm, where, rid, method, args, kwargs, caller)
        except NotSent:
            # Ask the home, saying where the call failed: it knows better, or (a
            # durable object whose node died) brings it back elsewhere.
            before = bm.table.known_epoch(rid)
            bm.table.hint_failed(rid)
            home_says = _locate(bm, rid, where, deadline)
            if home_says == where and bm.table.known_epoch(rid) <= before:
                raise
            continue
        except UnreachableError as exc:
            # It left, and no answer came: it may have run. Never run it twice.
            raise ObjectInDoubtError(
                f"the call {method} of object {rid} on {where} got no answer ({exc}); "
                "it may or may not have taken effect: check before repeating it"
            ) from exc
        if status == "ok":
            return value
        moved_to = value.get("to")
        if isinstance(moved_to, str) and moved_to != where:
            if value.get("address"):
                bm.peers.learn(moved_to, value["address"])
            bm.table.heard(rid, moved_to, int(value.get("e", 0) or 0))
            continue
        entry = bm.table.home_entry(rid)
        if home_says == where or (entry is not None and entry.location == where):
            # The home itself sent us to ``where``, which does not have it: tell
            # the home (a durable object is brought back: a newer epoch), or it
            # was lost.
            before = bm.table.known_epoch(rid)
            home_says = _locate(bm, rid, where, deadline)
            if home_says == where and bm.table.known_epoch(rid) <= before:
                raise ObjectNotFoundError(
                    f"object {rid} was lost: its home says it runs on {where}, but "
                    f"{where} does not host it (did {where} restart?); create it again"
                )
            continue
        bm.table.hint_failed(rid)
        home_says = _locate(bm, rid, "", deadline)
    raise ObjectNotFoundError(
        f"could not reach object {rid}: it moved {REDIRECTS_MAX} times while being "
        "called; try again"
    )


def _invoke_remote(
    bm: BindingManager,
    where: str,
    rid: ObjectId,
    method: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    caller: str | None,
) -> tuple[str, Any]:
    packed = values.pack([list(args), kwargs])
    start = time.monotonic()
    status, value, far_s = bm.run(_call_remote(bm, where, rid, method, packed, bm.current_chain()))
    if status == "ok" and caller is not None:
        bm.monitor.record_edge(
            caller,
            str(rid),
            bytes_down=values.byte_size(args) + values.byte_size(kwargs),
            bytes_up=values.byte_size(value),
            stall_s=time.monotonic() - start,
            remote=True,
            far_s=far_s,
        )
    return status, value


async def _call_remote(
    bm: BindingManager, where: str, rid: ObjectId, method: str, packed: bytes, chain: str = ""
) -> tuple[str, Any, float]:
    """``(status, value, the callee's own seconds in the call as it reported)``."""
    args: dict[str, Any] = {
        "rid": str(rid),
        "method": method,
        "from": bm.id,
        "from_address": bm.address,
        "chain": chain,
    }
    epoch = bm.table.known_epoch(rid)
    if epoch:
        args["epoch"] = epoch
    resp = await bm.peers.call_or_not_sent(where, "object.invoke", args, packed)
    result = resp.result if isinstance(resp.result, dict) else {}
    if result.get("s") == "moved":
        return "moved", result, 0.0
    served_epoch = result.get("e")
    if isinstance(served_epoch, int) and served_epoch:
        bm.table.heard(rid, where, served_epoch)
    served = result.get("t", 0.0)
    far_s = float(served) if isinstance(served, int | float) and served > 0 else 0.0
    payload = resp.payload
    if result.get("raw"):
        return "ok", payload if type(payload) is bytes else bytes(payload), far_s
    return "ok", values.unpack(payload, bm), far_s
