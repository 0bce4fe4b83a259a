"""Moving a live object (ABACUS 5.2), driven by the run-time that hosts it (the source).

The steps, as a lifecycle table applied in one place (:class:`Migration`):

    START --quiesce------> QUIESCED      block new calls, let active calls drain
                                         (cancelled if that takes drain_timeout_s)
    QUIESCED --checkpoint-> CHECKPOINTED the object's state, with no call active
    CHECKPOINTED --install-> STAGED      the target restores it behind a closed gate
    STAGED --activate----> ACTIVE        the target opens its gate and serves it
    ACTIVE --switch------> SWITCHED      source tables point to the target; the source
                                         copy is released; calls held at the source
                                         re-resolve and go to the target
    SWITCHED --inform-----> DONE         the home's table is updated (if the home is
                                         neither source nor target)
    any state before ACTIVE --fail--> FAILED
                                         the source reopens its gate: the object runs
                                         where it was, with its state intact (the target
                                         drops whatever it staged)

A failure at any step before the target serves the object (target dies, transfer
breaks, restore raises, activation is refused) leaves the object at the source.
After ACTIVE the move has happened; a failure to inform the home only leaves a
stale entry there, which the source's forwarding entry corrects until it succeeds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    LocalProtocolError,
    MigrationError,
    ObjectBusyError,
    ShuttleError,
)
from shuttle.net.addresses import parse_address
from shuttle.runtime import values
from shuttle.runtime.authority import ACTING
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.gate import GateState
from shuttle.runtime.hosting import POLICIES, Hosted, MigrationEvent
from shuttle.runtime.ids import ObjectId

log = logging.getLogger("shuttle.runtime")

START, QUIESCED, CHECKPOINTED, STAGED, ACTIVE, SWITCHED, DONE, FAILED = (
    "start",
    "quiesced",
    "checkpointed",
    "staged",
    "active",
    "switched",
    "done",
    "failed",
)

TRANSITIONS: dict[tuple[str, str], str] = {
    (START, "quiesce"): QUIESCED,
    (QUIESCED, "checkpoint"): CHECKPOINTED,
    (CHECKPOINTED, "install"): STAGED,
    (STAGED, "activate"): ACTIVE,
    (ACTIVE, "switch"): SWITCHED,
    (SWITCHED, "inform"): DONE,
}
for _state in (START, QUIESCED, CHECKPOINTED, STAGED):
    TRANSITIONS[(_state, "fail")] = FAILED


class Migration:
    """The source side's record of one migration and its state."""

    def __init__(self, rid: ObjectId, source: str, target: str, reason: str) -> None:
        self.rid = rid
        self.source = source
        self.target = target
        self.reason = reason
        self.state = START
        self.started = time.monotonic()
        self.quiesce_s = 0.0
        self.checkpoint_bytes = 0

    def step(self, event: str) -> None:
        new = TRANSITIONS.get((self.state, event))
        if new is None:
            raise LocalProtocolError(f"migration of {self.rid}: cannot {event} when {self.state}")
        self.state = new

    def event(self, ok: bool, error: str = "") -> MigrationEvent:
        return MigrationEvent(
            time.time(),
            str(self.rid),
            self.source,
            self.target,
            ok,
            self.reason,
            time.monotonic() - self.started,
            self.quiesce_s,
            self.checkpoint_bytes,
            error,
        )


async def migrate_out(
    bm: BindingManager, rid: ObjectId, target: str, reason: str = "requested"
) -> MigrationEvent:
    """Move hosted object ``rid`` to run-time ``target``. Returns the event; raises
    :class:`MigrationError` (the object still runs here, state intact) on failure.

    The work runs as a task of its own: a caller that goes away (a dropped
    connection, Ctrl-C) cannot stop it half-way; the migration finishes or rolls
    back whatever happens to whoever asked for it."""
    task = asyncio.get_running_loop().create_task(_migrate(bm, rid, target, reason))
    bm.tasks.add(task)
    task.add_done_callback(bm.tasks.discard)
    return await asyncio.shield(task)


async def _migrate(bm: BindingManager, rid: ObjectId, target: str, reason: str) -> MigrationEvent:
    hosted = bm.hosted.get(rid)
    if hosted is None:
        raise MigrationError(f"object {rid} is not hosted on {bm.id}; ask where it runs")
    # Every call of the move (install, activate, abort, inform the home) acts for the
    # object's principal: the target then records it as the one that brought the object
    # (runtime/authority.py). This task's own context: nothing else sees it.
    ACTING.set(hosted.principal)
    if target == bm.id:
        raise InvalidArgumentError(f"object {rid} already runs on {target}")
    if not hosted.migratable:
        raise MigrationError(f"object {rid} ({hosted.type_label}) is not migratable")
    if rid in bm.migrating or hosted.gate.state is not GateState.OPEN:
        raise ObjectBusyError(
            f"object {rid} is already moving (or still arriving); try again once it has settled"
        )
    if bm.peers.address_of(target) is None:
        raise MigrationError(f"cannot move {rid} to {target}: no address known for it")
    m = Migration(rid, bm.id, target, reason)
    loop = asyncio.get_running_loop()
    bm.migrating.add(rid)
    try:
        try:
            drained = await loop.run_in_executor(
                bm.control, hosted.gate.quiesce, bm.config.drain_timeout_s
            )
            if drained is None:
                raise MigrationError(
                    f"migration of {rid} cancelled: its active calls did not drain within "
                    f"{bm.config.drain_timeout_s:g} s; it keeps running on {bm.id}"
                )
            m.step("quiesce")
            m.quiesce_s = drained
            state = await loop.run_in_executor(bm.control, bm.checkpoint_of, hosted)
            m.step("checkpoint")
            m.checkpoint_bytes = len(state)
            await bm.peers.call(
                target,
                "object.install",
                {
                    "rid": str(rid),
                    "home_address": hosted.home_address,
                    "type": hosted.type_name,
                    "policy": hosted.policy,
                    "from": bm.id,
                    "from_address": bm.address,
                    "reason": reason,
                },
                values.pack({"checkpoint": state, "code": hosted.code}),
            )
            m.step("install")
            try:
                await bm.peers.call(target, "object.activate", {"rid": str(rid)})
            except (ShuttleError, OSError):
                # The answer is lost, not necessarily the activation: ask the target.
                if await _abort_at(bm, target, rid) != "active":
                    raise
            m.step("activate")
        except BaseException as exc:  # cancellation too: nothing may stay half done
            await _roll_back(bm, hosted, m, exc)
            raise AssertionError("unreachable: _roll_back raises") from exc
        # The target serves it now: switch our tables, release our copy.
        with bm._lock:
            bm.forwarding[rid] = target
            bm.hints[rid] = target
            if rid.home == bm.id and rid in bm.homed:
                bm.homed[rid].location = target
        bm.unhost(rid)  # first out of the table, then wake held calls: they go on
        hosted.gate.retire()
        await loop.run_in_executor(bm.control, bm.close_impl, hosted)
        bm.monitor.forget(str(rid))
        bm.note_move(rid, bm.id)
        m.step("switch")
        if not await _inform_home(bm, rid, target, attempts=1):
            _spawn(bm, _inform_home(bm, rid, target))  # keep trying in the background
        m.step("inform")
        event = m.event(True)
        bm.record(event)
        return event
    finally:
        bm.migrating.discard(rid)


async def _roll_back(bm: BindingManager, hosted: Hosted, m: Migration, exc: BaseException) -> None:
    """Undo a migration that failed before the target served the object; raise the
    error the caller should see."""
    where = m.state
    rid = m.rid
    m.step("fail")
    if where in (CHECKPOINTED, STAGED):
        await _abort_at(bm, m.target, rid)
    error: ShuttleError
    if hosted.manager is None and not hosted.impl.alive:
        # The checkpoint itself went over the sandbox's limits: the worker is gone,
        # and the object with it. Say so, and make the home forget it.
        bm.unhost(rid)
        hosted.gate.retire()
        bm.close_impl(hosted)
        with bm._lock:
            if rid.home == bm.id:
                bm.homed.pop(rid, None)
        _spawn(bm, _inform_home(bm, rid, ""))
        error = MigrationError(
            f"object {rid} was lost while it was checkpointed for migration to {m.target}: "
            f"{exc}; create it again (with less state, or larger sandbox limits)"
        )
    else:
        if hosted.gate.state is GateState.QUIESCING:
            hosted.gate.reopen()
        error = (
            exc
            if isinstance(exc, MigrationError)
            else MigrationError(
                f"migration of {rid} to {m.target} failed after {where} "
                f"({type(exc).__name__}: {exc}); it keeps running on {bm.id} with its state"
            )
        )
    bm.record(m.event(False, str(error)))
    if isinstance(exc, asyncio.CancelledError):
        raise exc
    raise error from exc


def _spawn(bm: BindingManager, coro: Any) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    bm.tasks.add(task)
    task.add_done_callback(bm.tasks.discard)


async def _abort_at(bm: BindingManager, target: str, rid: ObjectId) -> str:
    """Ask ``target`` to drop its staged copy: ``"aborted"``, ``"active"`` (too late:
    it serves the object), or ``"gone"`` (unreachable: whatever it staged died with
    it, or expires on its own)."""
    try:
        reply = await bm.peers.call(target, "object.abort", {"rid": str(rid)})
    except (ShuttleError, OSError) as exc:
        log.info("abort of %s at %s: %s (its staged copy expires)", rid, target, exc)
        return "gone"
    result = reply.result if isinstance(reply.result, dict) else {}
    return "active" if result.get("active") else "aborted"


#: Attempts to tell an object's home where it went (with a growing pause between).
INFORM_ATTEMPTS = 5


async def _inform_home(
    bm: BindingManager, rid: ObjectId, target: str, attempts: int = INFORM_ATTEMPTS
) -> bool:
    """Tell ``rid``'s home where it went ("" for lost); a no-op when we or the target
    are home. True once the home knows.

    Once the home knows, the source keeps no pointer to the object (ABACUS 5.2: old
    hosts are not required to forward): a caller with a stale hint is sent home.
    Until then the forwarding entry sends callers on to the target."""
    if rid.home in (bm.id, target):
        bm.forwarding.pop(rid, None)
        if rid.home != bm.id:
            bm.hints.pop(rid, None)
        return True
    address = (bm.peers.address_of(target) or "") if target else ""
    delay = 0.1
    for attempt in range(attempts):
        try:
            await bm.peers.call(
                rid.home, "object.moved", {"rid": str(rid), "location": target, "address": address}
            )
            break
        except (ShuttleError, OSError) as exc:
            if attempt == attempts - 1:
                if attempts > 1:
                    log.warning("could not tell %s's home %s that it moved: %s", rid, rid.home, exc)
                return False  # the forwarding entry stays and keeps callers on track
            await asyncio.sleep(delay)
            delay *= 4
    bm.forwarding.pop(rid, None)
    bm.hints.pop(rid, None)
    return True


# --- the target's side -------------------------------------------------------------------


def install(
    bm: BindingManager, args: dict[str, Any], payload: bytes, principal: str | None = None
) -> None:
    """``object.install`` (executor thread): restore a migrating object, staged, acting
    for ``principal`` (whom the source's connection authenticated as)."""
    rid = ObjectId.parse(str(args.get("rid", "")))
    body = values.unpack(payload)
    if not isinstance(body, dict) or not isinstance(body.get("checkpoint"), bytes):
        raise InvalidArgumentError(f"object.install of {rid}: payload must hold a checkpoint")
    code = body.get("code")
    if code is not None and not isinstance(code, bytes):
        raise InvalidArgumentError(f"object.install of {rid}: code must be bytes or nil")
    policy = str(args.get("policy", "auto"))
    if policy not in POLICIES:
        raise InvalidArgumentError(f"object.install of {rid}: policy must be one of {POLICIES}")
    for name in ("from_address", "home_address"):
        if args.get(name):
            parse_address(str(args[name]), f"object.install {name}")
    source = str(args.get("from", ""))
    if args.get("from_address"):
        bm.peers.learn(source, str(args["from_address"]))
    if args.get("home_address") and rid.home != bm.id:
        bm.peers.learn(rid.home, str(args["home_address"]))
    hosted = bm.host_arrival(
        rid,
        str(args.get("home_address", "")),
        str(args.get("type", "")),
        code,
        body["checkpoint"],
        policy,
        source,
        principal=principal,
    )
    hosted.arrival_reason = str(args.get("reason", ""))
    loop = bm.loop
    if loop is not None:  # drop the stage if the source never activates it
        loop.call_soon_threadsafe(
            loop.call_later, bm.config.staged_ttl_s, _expire_stage, bm, hosted
        )


def _expire_stage(bm: BindingManager, staged: Hosted) -> None:
    """The TTL of one staged arrival (a newer stage of the same id is not this one)."""
    if bm.hosted.get(staged.rid) is staged and staged.gate.state is GateState.STAGED:
        log.warning("dropping staged object %s: its source never activated it", staged.rid)
        asyncio.get_running_loop().run_in_executor(bm.control, abort, bm, staged.rid)


def activate(bm: BindingManager, rid: ObjectId) -> None:
    """``object.activate``: the staged object starts serving here."""
    hosted = bm.hosted.get(rid)
    if hosted is None or hosted.gate.state is not GateState.STAGED:
        raise MigrationError(f"object {rid} is not staged on {bm.id}; nothing to activate")
    with bm._lock:
        if rid.home == bm.id and rid in bm.homed:
            bm.homed[rid].location = bm.id
        bm.hints.pop(rid, None)
        bm.forwarding.pop(rid, None)
    hosted.arrived_at = time.monotonic()
    bm.note_move(rid, hosted.arrived_from or "")
    hosted.gate.activate()
    bm.record(
        MigrationEvent(
            time.time(),
            str(rid),
            hosted.arrived_from or "?",
            bm.id,
            True,
            hosted.arrival_reason or "arrived",
            checkpoint_bytes=hosted.checkpoint_bytes,
        )
    )


def abort(bm: BindingManager, rid: ObjectId) -> dict[str, bool]:
    """``object.abort``: drop a staged object (its migration failed at the source).
    ``{"active": True}`` if it already serves here: the source then completes the
    move instead of rolling back, so that there are never two live copies."""
    hosted = bm.hosted.get(rid)
    if hosted is None:
        return {"aborted": False, "active": False}
    if hosted.gate.state is not GateState.STAGED:
        return {"aborted": False, "active": True}
    bm.unhost(rid)
    hosted.gate.retire()
    bm.close_impl(hosted)
    return {"aborted": True, "active": False}
