"""Moving a live object (ABACUS 5.2), the source's side: the executor of the
migration machine.

:class:`~shuttle.runtime.migration_machine.MigrationMachine` decides; this module
performs its instructions (the gate, the checkpoint, the messages) and feeds back
what happened. The target's side of the protocol is
:mod:`shuttle.runtime.migration_target`, the home's
:mod:`shuttle.runtime.migration_home`. The messages:

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
import secrets
import time
from collections import deque

from shuttle.errors import (
    InvalidArgumentError,
    MigrationError,
    ObjectBusyError,
    ShuttleError,
)
from shuttle.runtime import faultpoints, values
from shuttle.runtime.authority import ACTING
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.gate import GateState
from shuttle.runtime.hosted import Hosted
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.migration_home import ask_home
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

log = logging.getLogger("shuttle.runtime")


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
        try:
            answer = await ask_home(self.bm, self.hosted, self.mid)
        except (ShuttleError, OSError) as exc:  # the home cannot say: the machine waits
            return HomeUnreachable(str(exc))
        return HomeAnswered(
            answer["committed"],
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
