"""Moving a live object (ABACUS 5.2): the executor of the migration machine, and the
target's and the home's side of the protocol.

:class:`~shuttle.runtime.migration_machine.MigrationMachine` decides; this module
performs its instructions (the gate, the checkpoint, the messages) and feeds back
what happened. The messages:

==================  ==================================================================
``object.install``  source → target: the checkpoint; the target restores it *staged*
                    (behind a closed gate, it cannot serve), noting the move's id
``object.activate`` source → target: the target asks the home to commit the move and
                    opens only if it did; answers active (with the new epoch), refused
                    (never committed), or an error (in doubt: it could not tell)
``object.commit``   target → home: make the target the object's place, if the object
                    still runs at the source at the source's epoch and the move was not
                    given up (durable objects: written to disk first)
``object.abort``    source → target, in doubt: drop the stage unless you serve it;
                    answers active, aborted (never asked the home) or unknown
``object.resolve``  source (or target) → home, in doubt: was the move committed? If
                    not, the home fences it: it can never be committed later
==================  ==================================================================

The target also settles a stage nobody activates (its source died): once its commit
is in doubt it asks the home until it hears, and a stage never asked about is
dropped after ``staged_ttl_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections import deque
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    MigrationError,
    ObjectBusyError,
    ObjectInDoubtError,
    ShuttleError,
)
from shuttle.net.addresses import parse_address
from shuttle.runtime import faultpoints, values
from shuttle.runtime.authority import ACTING, acting_for
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.durable_host import granted_lease_s
from shuttle.runtime.gate import GateState
from shuttle.runtime.hosted import Hosted, Stage
from shuttle.runtime.hosting import POLICIES
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.migration_machine import (
    Abort,
    Activate,
    Activated,
    ActivationRefused,
    ActivationUnknown,
    AskHome,
    AskTarget,
    Cancelled,
    Checkpoint,
    Checkpointed,
    CheckpointFailed,
    Drained,
    DrainTimedOut,
    Drop,
    Event,
    Finish,
    HomeAnswered,
    HomeUnreachable,
    Install,
    Installed,
    InstallFailed,
    Instruction,
    Lose,
    MigrationMachine,
    Quiesce,
    Reopen,
    Switch,
    TargetAnswered,
    TargetUnreachable,
    Wait,
    WaitOver,
)
from shuttle.runtime.moves import MigrationEvent
from shuttle.runtime.peers import NotSent

log = logging.getLogger("shuttle.runtime")

#: How a target in doubt about its commit paces its questions to the home.
STAGE_ASK_PAUSE_S_MIN = 0.05
STAGE_ASK_PAUSE_S_MAX = 2.0


async def migrate_out(
    bm: BindingManager, rid: ObjectId, target: str, reason: str = "requested"
) -> MigrationEvent:
    """Move hosted object ``rid`` to run-time ``target``. Returns the event; raises
    :class:`MigrationError` (the object still runs here, state intact, unless the
    message says otherwise) on failure.

    The work runs as a task of its own: a caller that goes away (a dropped
    connection, Ctrl-C) cannot stop it half-way; the migration finishes, rolls back,
    or stays in doubt (its gate closed) until the object's home answers."""
    task = bm.spawn(_migrate(bm, rid, target, reason))
    return await asyncio.shield(task)


async def _migrate(bm: BindingManager, rid: ObjectId, target: str, reason: str) -> MigrationEvent:
    hosted = bm.table.hosted(rid)
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
    if hosted.gate.state is not GateState.OPEN or not bm.table.migration_started(rid):
        raise ObjectBusyError(
            f"object {rid} is already moving (or still arriving); try again once it has settled"
        )
    try:
        if bm.peers.address_of(target) is None:
            raise MigrationError(f"cannot move {rid} to {target}: no address known for it")
        return await _Executor(bm, hosted, target, reason).run()
    finally:
        bm.table.migration_ended(rid)


class _Executor:
    """Performs one migration's instructions and feeds back what happened."""

    def __init__(self, bm: BindingManager, hosted: Hosted, target: str, reason: str) -> None:
        self.bm = bm
        self.hosted = hosted
        self.rid = hosted.rid
        self.target = target
        self.reason = reason
        self.mid = secrets.token_hex(8)
        self.machine = MigrationMachine(
            str(hosted.rid),
            bm.id,
            target,
            hosted.epoch,
            drain_timeout_s=bm.config.drain_timeout_s,
        )
        self.state = b""
        self.started = time.monotonic()

    async def run(self) -> MigrationEvent:
        pending: deque[Instruction] = deque(self.machine.start())
        finish: Finish | None = None
        cancelled = False
        while pending:
            instruction = pending.popleft()
            if isinstance(instruction, Finish):
                finish = instruction
                continue
            try:
                event = await self._perform(instruction)
            except asyncio.CancelledError:
                if cancelled:
                    raise
                cancelled, event = True, Cancelled()
            if event is not None:
                pending.extend(self.machine.handle(event))
        assert finish is not None, "the machine always finishes"
        outcome = MigrationEvent(
            time.time(),
            str(self.rid),
            self.bm.id,
            self.target,
            finish.ok,
            self.reason,
            time.monotonic() - self.started,
            self.machine.quiesce_s,
            self.machine.checkpoint_bytes,
            finish.error,
            finish.epoch,
        )
        self.bm.history.record(outcome)
        if cancelled:
            raise asyncio.CancelledError
        if not finish.ok:
            raise MigrationError(finish.error)
        return outcome

    async def _perform(self, instruction: Instruction) -> Event | None:
        bm, hosted, rid = self.bm, self.hosted, str(self.rid)
        if isinstance(instruction, Quiesce):
            await faultpoints.areached("quiesce", rid)
            drained = await bm.in_control(hosted.gate.quiesce, instruction.timeout_s)
            return DrainTimedOut(instruction.timeout_s) if drained is None else Drained(drained)
        if isinstance(instruction, Checkpoint):
            await faultpoints.areached("checkpoint", rid)
            try:
                self.state = await bm.in_control(bm.hosting.checkpoint_of, hosted)
            except ShuttleError as exc:
                lost = hosted.manager is None and not hosted.impl.alive
                return CheckpointFailed(str(exc), lost)
            return Checkpointed(len(self.state))
        if isinstance(instruction, Install):
            await faultpoints.areached("install", rid)
            return await self._install()
        if isinstance(instruction, Activate):
            await faultpoints.areached("activate", rid)
            return await self._activate()
        if isinstance(instruction, AskTarget):
            await faultpoints.areached("in-doubt", rid)
            return await self._ask_target()
        if isinstance(instruction, AskHome):
            return await self._ask_home()
        if isinstance(instruction, Wait):
            await asyncio.sleep(instruction.seconds)
            return WaitOver()
        if isinstance(instruction, Abort):
            bm.spawn(self._abort_quietly())
            return None
        if isinstance(instruction, Reopen):
            await faultpoints.areached("reopen", rid)
            if hosted.gate.state is GateState.QUIESCING:
                hosted.gate.reopen()
            return None
        if isinstance(instruction, Switch):
            await faultpoints.areached("switch", rid)
            self._switch(instruction.epoch)
            return None
        if isinstance(instruction, Drop):
            log.warning("migration of %s: %s; the copy here ends", rid, instruction.reason)
            await bm.in_control(bm.retire, hosted)
            return None
        if isinstance(instruction, Lose):
            await self._lose()
            return None
        raise AssertionError(f"unknown instruction {instruction!r}")

    async def _install(self) -> Event:
        bm, hosted = self.bm, self.hosted
        payload = values.pack({"checkpoint": self.state, "code": hosted.code})
        try:
            await bm.peers.control(
                self.target,
                "object.install",
                {
                    "rid": str(self.rid),
                    "mid": self.mid,
                    "epoch": hosted.epoch,
                    "durable": hosted.durable,
                    "app": hosted.app,
                    "home_address": hosted.home_address,
                    "type": hosted.type_name,
                    "policy": hosted.policy,
                    "from": bm.id,
                    "from_address": bm.address,
                    "reason": self.reason,
                },
                payload,
            )
        except (ShuttleError, OSError) as exc:
            return InstallFailed(f"{type(exc).__name__}: {exc}")
        return Installed()

    async def _activate(self) -> Event:
        try:
            reply = await self.bm.peers.control(
                self.target, "object.activate", {"rid": str(self.rid), "mid": self.mid}
            )
        except (ShuttleError, OSError) as exc:
            return ActivationUnknown(f"{type(exc).__name__}: {exc}")
        result = reply.result if isinstance(reply.result, dict) else {}
        if result.get("active"):
            return Activated(int(result.get("epoch", 0)))
        if result.get("refused"):
            return ActivationRefused(
                str(result["refused"]),
                str(result.get("location", "")),
                int(result.get("epoch", 0)),
            )
        return ActivationUnknown(f"the target answered {result!r:.200}")

    async def _ask_target(self) -> Event:
        try:
            reply = await self.bm.peers.control(
                self.target, "object.abort", {"rid": str(self.rid), "mid": self.mid}
            )
        except (ShuttleError, OSError) as exc:
            return TargetUnreachable(str(exc))
        result = reply.result if isinstance(reply.result, dict) else {}
        return TargetAnswered(str(result.get("outcome", "unknown")), int(result.get("epoch", 0)))

    async def _ask_home(self) -> Event:
        bm, rid = self.bm, self.rid
        if rid.home == bm.id:
            answer = await bm.in_control(resolve_here, bm, rid, self.mid, bm.id)
        else:
            try:
                reply = await bm.peers.control(
                    rid.home,
                    "object.resolve",
                    {"rid": str(rid), "mid": self.mid, "from": bm.id},
                )
            except (ShuttleError, OSError) as exc:
                return HomeUnreachable(str(exc))
            answer = reply.result if isinstance(reply.result, dict) else {}
        return HomeAnswered(
            bool(answer.get("committed")),
            str(answer.get("location", "")),
            int(answer.get("epoch", 0)),
            bool(answer.get("known", True)),
        )

    async def _abort_quietly(self) -> None:
        try:
            await self.bm.peers.control(
                self.target, "object.abort", {"rid": str(self.rid), "mid": self.mid}
            )
        except (ShuttleError, OSError) as exc:  # a stage nobody activates settles itself
            log.info("abort of %s at %s: %s", self.rid, self.target, exc)

    def _switch(self, epoch: int) -> None:
        """The move took effect: our copy goes; calls held at its gate look again."""
        bm, hosted = self.bm, self.hosted
        # First out of the table, then wake the held calls: they go on (to the home,
        # which learnt first where it went; a source keeps no forwarding pointer).
        bm.table.moved_out(hosted, self.target, epoch)
        if hosted.gate.retire():
            bm.spawn(bm.in_control(bm.hosting.close, hosted))
        bm.monitor.forget(str(self.rid))
        bm.spawn(self._nudge_target())

    async def _nudge_target(self) -> None:
        """The move was committed but the target's answer was lost: tell it again
        (it opens at once; left alone it would ask the home itself)."""
        with contextlib.suppress(ShuttleError, OSError):
            await self.bm.peers.control(
                self.target, "object.activate", {"rid": str(self.rid), "mid": self.mid}
            )

    async def _lose(self) -> None:
        """The checkpoint took the object with it (a shipped object's worker was
        stopped): it is gone here. Its home forgets it, or (a durable object) brings
        it back from its last durable state."""
        bm, hosted, rid = self.bm, self.hosted, self.rid
        await bm.in_control(bm.retire, hosted)
        if hosted.durable:
            return
        if rid.home == bm.id:
            bm.table.forgotten(rid)
            return
        try:
            await bm.peers.control(
                rid.home, "object.moved", {"rid": str(rid), "location": "", "from": bm.id}
            )
        except (ShuttleError, OSError) as exc:
            log.warning("could not tell %s's home %s it was lost: %s", rid, rid.home, exc)


# --- the target's side ----------------------------------------------------------------


def install(
    bm: BindingManager, args: dict[str, Any], payload: bytes, principal: str | None = None
) -> None:
    """``object.install`` (control thread): restore a migrating object, staged, acting
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
    mid, epoch = args.get("mid"), args.get("epoch")
    if not isinstance(mid, str) or not mid or not isinstance(epoch, int) or epoch < 1:
        raise InvalidArgumentError(
            f"object.install of {rid}: needs the move's id (mid) and the source's epoch; "
            "is the source an older Shuttle?"
        )
    for name in ("from_address", "home_address"):
        if args.get(name):
            parse_address(str(args[name]), f"object.install {name}")
    source = str(args.get("from", ""))
    if args.get("from_address"):
        bm.peers.learn(source, str(args["from_address"]))
    if args.get("home_address") and rid.home != bm.id:
        bm.peers.learn(rid.home, str(args["home_address"]))
    old = bm.table.hosted(rid)
    if old is not None and not old.staged:
        raise InvalidArgumentError(f"object {rid} is already hosted here")
    hosted = bm.hosting.restore(
        rid,
        str(args.get("home_address", "")),
        str(args.get("type", "")),
        code,
        body["checkpoint"],
        policy,
        gate=GateState.STAGED,
        durable=bool(args.get("durable", False)),
        epoch=epoch,
        app=str(args.get("app", "")),
        arrived_from=source,
        stage=Stage(mid, source, epoch),
        principal=principal,
    )
    hosted.arrival_reason = str(args.get("reason", ""))
    if old is not None:
        drop_stage(bm, old)  # an older move's stage: that move was given up
    bm.table.staged(hosted)
    faultpoints.reached("staged", str(rid))
    loop = bm.loop
    if loop is not None:  # settle the stage if the source never does
        loop.call_soon_threadsafe(lambda: bm.spawn(_watch_stage(bm, hosted)))


def drop_stage(bm: BindingManager, hosted: Hosted) -> None:
    """A stage that will never serve goes (control thread)."""
    if bm.table.stage_dropped(hosted) and hosted.gate.retire():
        bm.hosting.close(hosted)


async def activate(bm: BindingManager, rid: ObjectId, mid: str) -> dict[str, Any]:
    """``object.activate``: the staged object serves here if its home commits the
    move. Raises :class:`ObjectInDoubtError` if the home could not say."""
    hosted = bm.table.hosted(rid)
    if hosted is not None and not hosted.staged and hosted.arrival_mid == mid:
        return {"active": True, "epoch": hosted.epoch}  # asked again: it serves
    stage = hosted.stage if hosted is not None else None
    if hosted is None or stage is None or stage.mid != mid or not hosted.staged:
        raise MigrationError(f"object {rid} is not staged on {bm.id} for this move")
    if stage.committing:
        raise ObjectInDoubtError(f"the commit of {rid}'s move to {bm.id} is already in doubt")
    await faultpoints.areached("commit", str(rid))
    stage.committing = True
    sent = time.monotonic()
    try:
        answer = await _commit(bm, hosted, stage)
    except NotSent as exc:
        # No connection to the home: the commit never left, and never will (the
        # stage is dropped), so this is a refusal the source can act on.
        stage.committing = False
        await bm.in_control(drop_stage, bm, hosted)
        return {"active": False, "refused": f"its home {rid.home} cannot be reached ({exc})"}
    except (ShuttleError, OSError) as exc:
        # It may or may not have reached the home: never guess; ask it until it says.
        bm.spawn(_watch_stage(bm, hosted))
        raise ObjectInDoubtError(
            f"object {rid}: the commit of its move to {bm.id} went unanswered by its home "
            f"{rid.home} ({exc}); the home settles it"
        ) from exc
    if answer.get("ok"):
        await faultpoints.areached("open", str(rid))
        _open(
            bm, hosted, int(answer["epoch"]), sent + granted_lease_s(answer, bm.durability.lease_s)
        )
        return {"active": True, "epoch": hosted.epoch}
    await bm.in_control(drop_stage, bm, hosted)
    return {
        "active": False,
        "refused": str(answer.get("reason", "refused by its home")),
        "location": str(answer.get("location", "")),
        "epoch": int(answer.get("epoch", 0)),
    }


async def _commit(bm: BindingManager, hosted: Hosted, stage: Stage) -> dict[str, Any]:
    rid = hosted.rid
    if rid.home == bm.id:
        result: dict[str, Any] = await bm.in_control(
            commit_here, bm, rid, stage.mid, stage.source, stage.from_epoch, bm.id
        )
        return result
    # As every message about the object, for its principal (the home checks it).
    with acting_for(hosted.principal):
        reply = await bm.peers.control(
            rid.home,
            "object.commit",
            {
                "rid": str(rid),
                "mid": stage.mid,
                "source": stage.source,
                "epoch": stage.from_epoch,
                "target": bm.id,
                "address": bm.address,
            },
        )
    return reply.result if isinstance(reply.result, dict) else {}


def _open(bm: BindingManager, hosted: Hosted, epoch: int, lease_until: float) -> None:
    """The home committed the move: the staged copy serves at ``epoch`` (a durable
    one of another home's, until ``lease_until``)."""
    if bm.table.hosted(hosted.rid) is not hosted or not hosted.staged:
        return
    assert hosted.stage is not None
    hosted.arrival_mid = hosted.stage.mid
    hosted.stage = None
    hosted.lease_until = lease_until if hosted.durable and hosted.rid.home != bm.id else math.inf
    bm.table.activated_here(hosted.rid, epoch)
    hosted.arrived_at = time.monotonic()
    hosted.gate.activate()
    bm.history.record(
        MigrationEvent(
            time.time(),
            str(hosted.rid),
            hosted.arrived_from or "?",
            bm.id,
            True,
            hosted.arrival_reason or "arrived",
            checkpoint_bytes=hosted.checkpoint_bytes,
            epoch=epoch,
        )
    )


def abort(bm: BindingManager, rid: ObjectId, mid: str) -> dict[str, Any]:
    """``object.abort`` (control thread): the source, in doubt, asks us to drop the
    stage of move ``mid`` unless it serves. ``active`` (it serves: the move took
    effect), ``aborted`` (dropped before its commit was asked for: it never will be),
    or ``unknown`` (its commit is in doubt, or there is no such stage here)."""
    hosted = bm.table.hosted(rid)
    if hosted is None:
        return {"outcome": "unknown"}
    if not hosted.staged:
        if hosted.arrival_mid == mid:
            return {"outcome": "active", "epoch": hosted.epoch}
        return {"outcome": "unknown"}
    stage = hosted.stage
    if stage is None or stage.mid != mid or stage.committing:
        return {"outcome": "unknown"}
    drop_stage(bm, hosted)
    return {"outcome": "aborted"}


async def _watch_stage(bm: BindingManager, hosted: Hosted) -> None:
    """Settle a stage its source leaves: one whose commit is in doubt asks the home
    until it answers; one never asked about goes after ``staged_ttl_s``."""
    stage = hosted.stage
    if stage is None:
        return
    pause = STAGE_ASK_PAUSE_S_MIN
    while bm.table.hosted(hosted.rid) is hosted and hosted.staged:
        if not stage.committing:
            left = stage.staged_at + bm.config.staged_ttl_s - time.monotonic()
            if left > 0:
                await asyncio.sleep(min(left, 1.0))
                continue
            log.warning("dropping staged object %s: its source never activated it", hosted.rid)
            await bm.in_control(drop_stage, bm, hosted)
            return
        await asyncio.sleep(pause)
        pause = min(pause * 2, STAGE_ASK_PAUSE_S_MAX)
        sent = time.monotonic()
        try:
            answer = await _resolve_at_home(bm, hosted, stage.mid)
        except (ShuttleError, OSError) as exc:
            log.info("staged %s: its home cannot say yet (%s)", hosted.rid, exc)
            continue
        if answer.get("committed") and answer.get("location") == bm.id:
            lease_until = sent + granted_lease_s(answer, bm.durability.lease_s)
            _open(bm, hosted, int(answer.get("epoch", 0)), lease_until)
        else:
            await bm.in_control(drop_stage, bm, hosted)
        return


async def _resolve_at_home(bm: BindingManager, hosted: Hosted, mid: str) -> dict[str, Any]:
    rid = hosted.rid
    if rid.home == bm.id:
        result: dict[str, Any] = await bm.in_control(resolve_here, bm, rid, mid, bm.id)
        return result
    with acting_for(hosted.principal):
        reply = await bm.peers.control(
            rid.home, "object.resolve", {"rid": str(rid), "mid": mid, "from": bm.id}
        )
    return reply.result if isinstance(reply.result, dict) else {}


# --- the home's side ------------------------------------------------------------------


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
