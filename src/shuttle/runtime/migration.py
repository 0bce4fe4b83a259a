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
    ShuttleError,
)
from shuttle.runtime import values
from shuttle.runtime.binding import BindingManager, MigrationEvent
from shuttle.runtime.gate import GateState
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
    :class:`MigrationError` (the object still runs here, state intact) on failure."""
    hosted = bm.hosted.get(rid)
    if hosted is None:
        raise MigrationError(f"object {rid} is not hosted on {bm.id}; ask where it runs")
    if target == bm.id:
        raise InvalidArgumentError(f"object {rid} already runs on {target}")
    if not hosted.migratable:
        raise MigrationError(f"object {rid} ({hosted.type_label}) is not migratable")
    if rid in bm.migrating:
        raise MigrationError(f"object {rid} is already being moved")
    if bm.peers.address_of(target) is None:
        raise MigrationError(f"cannot move {rid} to {target}: no address known for it")
    m = Migration(rid, bm.id, target, reason)
    loop = asyncio.get_running_loop()
    bm.migrating.add(rid)
    try:
        drained = await loop.run_in_executor(
            bm.executor, hosted.gate.quiesce, bm.config.drain_timeout_s
        )
        if drained is None:
            m.step("fail")
            raise MigrationError(
                f"migration of {rid} cancelled: its active calls did not drain within "
                f"{bm.config.drain_timeout_s:g} s; it keeps running on {bm.id}"
            )
        m.step("quiesce")
        m.quiesce_s = drained
        try:
            state = await loop.run_in_executor(bm.executor, bm.checkpoint_of, hosted)
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
            await bm.peers.call(target, "object.activate", {"rid": str(rid)})
            m.step("activate")
        except (ShuttleError, OSError) as exc:
            where = m.state
            m.step("fail")
            if where in (CHECKPOINTED, STAGED):
                await _abort_at(bm, target, rid)
            hosted.gate.reopen()
            raise MigrationError(
                f"migration of {rid} to {target} failed after {where} "
                f"({type(exc).__name__}: {exc}); it keeps running on {bm.id} with its state"
            ) from exc
        # The target serves it now: switch our tables, release our copy.
        with bm._lock:
            bm.forwarding[rid] = target
            bm.hints[rid] = target
            if rid.home == bm.id and rid in bm.homed:
                bm.homed[rid].location = target
        bm.release(rid)
        hosted.gate.retire()
        bm.note_move(rid, bm.id)
        m.step("switch")
        await _inform_home(bm, rid, target)
        m.step("inform")
        event = m.event(True)
        bm.record(event)
        return event
    except MigrationError as exc:
        bm.record(m.event(False, str(exc)))
        raise
    finally:
        bm.migrating.discard(rid)


async def _abort_at(bm: BindingManager, target: str, rid: ObjectId) -> None:
    try:
        await bm.peers.call(target, "object.abort", {"rid": str(rid)})
    except (ShuttleError, OSError) as exc:  # the target is gone: its stage went with it
        log.info("abort of %s at %s: %s (its staged copy expires)", rid, target, exc)


async def _inform_home(bm: BindingManager, rid: ObjectId, target: str) -> None:
    """Tell ``rid``'s home where it went (a no-op when we or the target are home).

    Once the home knows, the source keeps no pointer to the object (ABACUS 5.2: old
    hosts are not required to forward): a caller with a stale hint is sent home."""
    if rid.home in (bm.id, target):
        bm.forwarding.pop(rid, None)
        if rid.home != bm.id:
            bm.hints.pop(rid, None)
        return
    try:
        await bm.peers.call(
            rid.home,
            "object.moved",
            {"rid": str(rid), "location": target, "address": bm.peers.address_of(target) or ""},
        )
    except (ShuttleError, OSError) as exc:
        # The move happened; the home keeps a stale entry, which our forwarding
        # entry corrects for anyone who asks us.
        log.warning("could not tell %s's home %s that it moved: %s", rid, rid.home, exc)
        return
    bm.forwarding.pop(rid, None)
    bm.hints.pop(rid, None)


# --- the target's side -------------------------------------------------------------------


def install(bm: BindingManager, args: dict[str, Any], payload: bytes) -> None:
    """``object.install`` (executor thread): restore a migrating object, staged."""
    rid = ObjectId.parse(str(args.get("rid", "")))
    body = values.unpack(payload)
    if not isinstance(body, dict) or not isinstance(body.get("checkpoint"), bytes):
        raise InvalidArgumentError(f"object.install of {rid}: payload must hold a checkpoint")
    source = str(args.get("from", ""))
    if args.get("from_address"):
        bm.peers.learn(source, str(args["from_address"]))
    if args.get("home_address") and rid.home != bm.id:
        bm.peers.learn(rid.home, str(args["home_address"]))
    hosted = bm.host_arrival(
        rid,
        str(args.get("home_address", "")),
        str(args.get("type", "")),
        body.get("code"),
        body["checkpoint"],
        str(args.get("policy", "auto")),
        source,
    )
    hosted.arrival_reason = str(args.get("reason", ""))
    loop = bm.loop
    if loop is not None:  # drop the stage if the source never activates it
        loop.call_soon_threadsafe(loop.call_later, bm.config.staged_ttl_s, _expire_stage, bm, rid)


def _expire_stage(bm: BindingManager, rid: ObjectId) -> None:
    hosted = bm.hosted.get(rid)
    if hosted is not None and hosted.gate.state is GateState.STAGED:
        log.warning("dropping staged object %s: its source never activated it", rid)
        abort(bm, rid)


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


def abort(bm: BindingManager, rid: ObjectId) -> None:
    """``object.abort``: drop a staged object (its migration failed at the source)."""
    hosted = bm.hosted.get(rid)
    if hosted is None:
        return
    if hosted.gate.state is not GateState.STAGED:
        raise MigrationError(f"object {rid} is already active on {bm.id}; cannot abort it")
    bm.release(rid)
    hosted.gate.retire()
