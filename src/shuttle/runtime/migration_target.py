"""Moving a live object (ABACUS 5.2), the target's side: ``object.install`` restores
the checkpoint *staged* (behind a closed gate, it cannot serve), ``object.activate``
asks the object's home to commit the move and opens the stage only if it did, and
``object.abort`` drops a stage the source gave up on unless it serves. A stage its
source leaves is settled here too: once its commit is in doubt the target asks the
home until it hears, and a stage never asked about is dropped after
``staged_ttl_s``.

The source's side (the executor) is :mod:`shuttle.runtime.migration`, the home's
:mod:`shuttle.runtime.migration_home`; the messages are listed in the first.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    MigrationError,
    ObjectInDoubtError,
    ShuttleError,
)
from shuttle.net.addresses import parse_address
from shuttle.runtime import faultpoints, values
from shuttle.runtime.authority import acting_for
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.durable_host import granted_lease_s
from shuttle.runtime.gate import GateState
from shuttle.runtime.hosted import Hosted, Stage
from shuttle.runtime.hosting import POLICIES
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.migration_home import ask_home, commit_here, home_said
from shuttle.runtime.moves import MigrationEvent
from shuttle.runtime.peers import NotSent

log = logging.getLogger("shuttle.runtime")

#: How a target in doubt about its commit paces its questions to the home.
STAGE_ASK_PAUSE_S_MIN = 0.05
STAGE_ASK_PAUSE_S_MAX = 2.0


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
    # No boolean "ok" is not a refusal: the caller holds the stage in doubt and asks
    # the home (dropping it could drop the only copy).
    return home_said(reply.result, "ok", rid, "object.commit", stage.mid)


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
            answer = await ask_home(bm, hosted, stage.mid)
        except (ShuttleError, OSError) as exc:
            log.info("staged %s: its home cannot say yet (%s)", hosted.rid, exc)
            continue
        if answer.get("committed") and answer.get("location") == bm.id:
            lease_until = sent + granted_lease_s(answer, bm.durability.lease_s)
            _open(bm, hosted, int(answer.get("epoch", 0)), lease_until)
        else:
            await bm.in_control(drop_stage, bm, hosted)
        return
