"""Durable objects: state on the home's disk, leases, and coming back after a crash.

An object created ``durable=True`` (and the built-in directory object) has a storage
node as its *home*. The home keeps a :class:`Record` of it on disk
(``DATA/.shuttle/runtime/objects``): how to make it, where it runs, at which epoch,
and its last durable checkpoint. Three rules make it survive its node:

* **Written before answered.** After a call that may have changed it (any method not
  in its class's ``readonly``), its host takes :meth:`MobileObject.durable_checkpoint`
  and, if it differs from the last one written, has the home write it (``fdatasync``)
  before the call is answered. Calls running side by side share one write (group
  commit). The home takes a write only from the current activation: a stale copy's
  write is refused, and its call goes to the current one instead.
* **Leases.** A host other than the home serves the object only within a lease
  (``durable_lease_s``, 4 s, as the home says in every grant) from the last time its
  home confirmed it (a write, a commit of a move to it, or a renewal every quarter
  lease); past it, calls wait while it asks again. The home waits the lease out (and
  :data:`REACTIVATE_MARGIN_S`) after its last confirmation before it brings the object
  back anywhere else. So a host cut off from its home has stopped serving before a
  new activation starts: never two.
* **Re-activation.** When a host dies (a probe finds the object gone there, or its
  lease runs out) the home makes the object again *on itself*, from the last
  checkpoint, at a new epoch, same id; callers that found it gone ask the home and
  wait meanwhile. A home that restarts reads its records back and brings back at
  once the objects that ran on itself.

An acknowledged call's change is on the home's disk, so no re-activation loses it;
an unacknowledged call may or may not be there. The records on disk:
:mod:`shuttle.runtime.durable_records`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shuttle.errors import (
    InvalidArgumentError,
    ObjectInDoubtError,
    ShuttleError,
)
from shuttle.runtime import faultpoints, values
from shuttle.runtime.authority import acting_for
from shuttle.runtime.durable_records import Record, RecordFiles
from shuttle.runtime.gate import GateState
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.locations import FIRST_EPOCH, HomeEntry
from shuttle.runtime.peers import NotSent

if TYPE_CHECKING:
    from shuttle.runtime.binding import BindingManager
    from shuttle.runtime.hosting import Hosted

log = logging.getLogger("shuttle.runtime")

#: Renewals per lease (a host renews every quarter of it: three may be lost).
RENEWALS_PER_LEASE = 4
#: What the home adds to a lease before it brings an object back elsewhere: two
#: machines' clocks may run at slightly different rates over a lease.
REACTIVATE_MARGIN_S = 1.0
#: How often a home looks for durable objects to bring back.
HOME_CHECK_EVERY_S = 0.5
#: Longest a call waits for its change to be written at an unreachable home before
#: the caller is told it is in doubt.
PERSIST_WAIT_S = 30.0
#: After a re-activation fails (the home cannot make the object: shipped code on a
#: node without a key, say), it is not tried again for this long.
REACTIVATE_RETRY_S = 10.0


class Durability:
    """Durable objects of one run-time: as their home (records, leases granted,
    re-activation) and as their host (writes, leases held)."""

    def __init__(self, bm: BindingManager, directory: Path | None) -> None:
        self.bm = bm
        self.files = RecordFiles(directory) if directory is not None else None
        self._records: dict[ObjectId, Record] = {}
        #: When (monotonic, here) each durable object's lease was last granted.
        self._granted: dict[ObjectId, float] = {}
        #: Objects whose host failed and whose lease still runs (callers wait).
        self._suspect: dict[ObjectId, float] = {}
        self._failed: dict[ObjectId, float] = {}
        self._locks: dict[ObjectId, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._started = time.monotonic()
        #: The lease this run-time grants as a home (a host uses what its home says).
        self.lease_s = bm.config.durable_lease_s

    # --- shared -------------------------------------------------------------------------

    def lock_for(self, rid: ObjectId) -> threading.Lock:
        """Orders one object's changes at its home: writes, commits, resolutions."""
        with self._locks_lock:
            lock = self._locks.get(rid)
            if lock is None:
                lock = self._locks[rid] = threading.Lock()
            return lock

    @property
    def is_home(self) -> bool:
        return self.files is not None

    def start(self) -> None:
        """On the run-time's loop: read the records back and start the periodic work."""
        if self.files is not None:
            for record in self.files.load_all():
                rid = ObjectId.parse(record.rid)
                self._records[rid] = record
                entry = HomeEntry(
                    record.location,
                    record.type_label,
                    record.epoch,
                    True,
                    principal=record.principal,
                )
                entry.last_commit = record.last_commit
                self.bm.table.restored_home(rid, entry)
                # What ran elsewhere may run on: count its lease from now.
                self._granted[rid] = time.monotonic()
            if self._records:
                log.info("home of %d durable object(s), read back", len(self._records))
            self.bm.spawn(self._home_forever())
        self.bm.spawn(self._renew_forever())

    # --- the home's side ------------------------------------------------------------------

    def _write(self, rid: ObjectId, **changes: Any) -> Record:
        assert self.files is not None
        record = self._records[rid]
        fresh = Record(**{**asdict(record), **changes, "seq": record.seq + 1})
        self.files.write(fresh)
        self._records[rid] = fresh
        return fresh

    def granted(self, rid: ObjectId) -> None:
        """At the home: the object's lease counts from now (its host heard from us)."""
        if rid in self._records:
            self._granted[rid] = time.monotonic()

    def recorded(
        self,
        rid: ObjectId,
        *,
        type_name: str,
        type_label: str,
        code: bytes | None,
        policy: str,
        home_address: str,
        app: str,
        location: str,
        checkpoint: bytes,
        principal: str | None = None,
    ) -> None:
        """At the home: durable object ``rid`` (made here, or described by its host)
        now exists at ``location``, epoch 1, acting for ``principal`` (its creator):
        on disk before this returns."""
        if self.files is None:
            raise InvalidArgumentError(
                f"{self.bm.id} keeps no durable objects (it has no data directory); a "
                "durable object's home must be a storage node"
            )
        record = Record(
            str(rid),
            type_name,
            type_label,
            code,
            policy,
            home_address,
            app,
            location,
            FIRST_EPOCH,
            "",
            checkpoint,
            principal=principal,
        )
        with self.lock_for(rid):
            self._records[rid] = record
            self._write(rid)
            if location != self.bm.id:
                self._granted[rid] = time.monotonic()

    def forget(self, rid: ObjectId) -> None:
        """At the home: the object ended for good."""
        with self.lock_for(rid):
            if self._records.pop(rid, None) is not None and self.files is not None:
                self.files.delete(str(rid))
            self._granted.pop(rid, None)
            self._suspect.pop(rid, None)

    def commit(self, rid: ObjectId, mid: str, source: str, from_epoch: int, target: str) -> Any:
        """At the home: the commit of a move (see :meth:`LocationTable.commit_move`);
        a durable object's record is on disk with the new place before it takes
        effect. The caller holds :meth:`lock_for` ``(rid)``."""
        table = self.bm.table
        entry = table.home_entry(rid)
        if entry is None or not entry.durable or rid not in self._records:
            return table.commit_move(rid, mid, source, from_epoch, target)
        if entry.last_commit != mid and (
            mid in entry.fenced or entry.location != source or entry.epoch != from_epoch
        ):
            return table.commit_move(rid, mid, source, from_epoch, target)  # its refusal
        if entry.last_commit != mid:
            self._write(rid, location=target, epoch=entry.epoch + 1, last_commit=mid)
        done = table.commit_move(rid, mid, source, from_epoch, target)
        if done.ok:
            self._granted[rid] = time.monotonic()
            self._suspect.pop(rid, None)
        return done

    def on_persist(
        self, rid: ObjectId, epoch: int, sender: str, checkpoint: bytes
    ) -> dict[str, Any]:
        """At the home: a host's write of its durable object's state."""
        with self.lock_for(rid):
            entry = self.bm.table.home_entry(rid)
            stale = self._stale(rid, entry, epoch, sender)
            if stale is not None:
                return stale
            self._write(rid, checkpoint=checkpoint)
            self._granted[rid] = time.monotonic()
        return {"ok": True, "lease_s": self.lease_s}

    def on_renew(self, items: list[tuple[ObjectId, int]], sender: str) -> dict[str, Any]:
        """At the home: a host asks to keep serving these copies."""
        out: dict[str, Any] = {}
        for rid, epoch in items:
            # Under the object's lock: a re-activation decided meanwhile either sees
            # this grant (and does not happen) or happened (and this says stale).
            with self.lock_for(rid):
                stale = self._stale(rid, self.bm.table.home_entry(rid), epoch, sender)
                if stale is None:
                    self._granted[rid] = time.monotonic()
                    out[str(rid)] = {"ok": True, "lease_s": self.lease_s}
                else:
                    out[str(rid)] = stale
        return out

    def _stale(
        self, rid: ObjectId, entry: HomeEntry | None, epoch: int, sender: str
    ) -> dict[str, Any] | None:
        if entry is None or rid not in self._records:
            return {"stale": True, "location": "", "epoch": 0}
        if entry.location != sender or entry.epoch != epoch:
            return {"stale": True, "location": entry.location, "epoch": entry.epoch}
        return None

    def recovering(self, rid: ObjectId) -> bool:
        """At the home: callers must wait (its host failed, its lease still runs)."""
        return rid in self._suspect

    def retry_after_s(self, rid: ObjectId) -> float:
        granted = self._granted.get(rid, self._started)
        left = granted + self.lease_s + REACTIVATE_MARGIN_S - time.monotonic()
        return max(0.1, min(left, 2.0))

    async def suspect(self, rid: ObjectId, failed_at: str) -> None:
        """At the home: a caller found ``rid`` unreachable or gone at ``failed_at``.
        A durable object is brought back at once if its host no longer has it, once
        its lease runs out if the host cannot be reached."""
        entry = self.bm.table.home_entry(rid)
        if entry is None or not entry.durable or rid not in self._records:
            return
        location, epoch = entry.location, entry.epoch
        if location != failed_at:
            return  # it moved on since
        if location == self.bm.id:
            if self.bm.table.hosted(rid) is None:
                await self._reactivate(rid, location, epoch)
            return
        if self._lease_over(rid):
            await self._reactivate(rid, location, epoch, lease_over=True)
            return
        try:
            reply = await self.bm.peers.control(location, "object.probe", {"rid": str(rid)})
            probe = reply.result if isinstance(reply.result, dict) else {}
        except (ShuttleError, OSError):
            self._suspect[rid] = time.monotonic()  # unreachable: wait out its lease
            return
        if not probe.get("hosted"):
            await self._reactivate(rid, location, epoch)  # it restarted without it
        else:
            # Something is there (a stage about to open, say): only its lease can
            # tell, so the caller waits for it.
            self._suspect.pop(rid, None)

    def _lease_over(self, rid: ObjectId) -> bool:
        granted = self._granted.get(rid, self._started)
        return time.monotonic() > granted + self.lease_s + REACTIVATE_MARGIN_S

    async def _home_forever(self) -> None:
        while True:
            await asyncio.sleep(HOME_CHECK_EVERY_S)
            try:
                await self._check_homed()
            except Exception:  # a bug here must not end the home's duties
                log.exception("durable objects' check failed")

    async def _check_homed(self) -> None:
        now = time.monotonic()
        for rid, entry in self.bm.table.homed_items():
            if not entry.durable or rid not in self._records:
                continue
            if now < self._failed.get(rid, 0.0):
                continue
            if entry.location == self.bm.id:
                if self.bm.table.hosted(rid) is None:
                    await self._reactivate(rid, entry.location, entry.epoch)
            elif self._lease_over(rid):
                await self._reactivate(rid, entry.location, entry.epoch, lease_over=True)

    async def _reactivate(
        self, rid: ObjectId, location: str, epoch: int, *, lease_over: bool = False
    ) -> None:
        try:
            await self.bm.in_control(self._reactivate_here, rid, location, epoch, lease_over)
        except ShuttleError as exc:
            self._failed[rid] = time.monotonic() + REACTIVATE_RETRY_S
            log.error("cannot bring durable object %s back here: %s", rid, exc)
            return
        if location != self.bm.id:
            self.bm.spawn(self._fence(location, rid))

    def _reactivate_here(
        self, rid: ObjectId, location: str, epoch: int, lease_over: bool = False
    ) -> None:
        """Make ``rid`` again here from its record, at a new epoch (control thread).
        ``lease_over``: decided because the host's lease ran out, which is checked
        again under the object's lock (a renewal may have come meanwhile)."""
        bm = self.bm
        faultpoints.reached("home-reactivate", str(rid))
        with self.lock_for(rid):
            entry = bm.table.home_entry(rid)
            record = self._records.get(rid)
            if (
                entry is None
                or record is None
                or (entry.location, entry.epoch)
                != (
                    location,
                    epoch,
                )
            ):
                return  # someone else moved it meanwhile
            if location == bm.id and bm.table.hosted(rid) is not None:
                return
            if lease_over and not self._lease_over(rid):
                return  # renewed meanwhile: it serves there
            new_epoch = epoch + 1
            self._write(rid, location=bm.id, epoch=new_epoch, last_commit="")
            hosted = bm.hosting.restore(
                rid,
                record.home_address,
                record.type_name,
                record.code,
                record.checkpoint,
                record.policy,
                gate=GateState.OPEN,
                durable=True,
                epoch=new_epoch,
                app=record.app,
                arrived_from=location,
                principal=record.principal,
            )
            hosted.persist.last_hash = hashlib.blake2b(record.checkpoint).digest()
            old = bm.table.hosted(rid)
            if old is not None:  # a stale stage of it: this activation replaces it
                bm.retire(old)
            bm.table.reactivation(rid, bm.id)
            bm.table.reactivated_here(hosted)
            self._suspect.pop(rid, None)
            self._granted.pop(rid, None)
        log.warning(
            "durable object %s brought back on %s at epoch %d from its last checkpoint "
            "(it ran on %s at epoch %d)",
            rid,
            bm.id,
            new_epoch,
            location,
            epoch,
        )

    async def _fence(self, location: str, rid: ObjectId) -> None:
        """Tell the old host to stop its copy (it has stopped serving already, its
        lease having run out; this only tidies up)."""
        epoch = self.bm.table.known_epoch(rid)
        record = self._records.get(rid)
        principal = record.principal if record is not None else None
        # It learns at its next renewal if this does not arrive.
        with contextlib.suppress(ShuttleError, OSError), acting_for(principal):
            await self.bm.peers.control(location, "object.fence", {"rid": str(rid), "epoch": epoch})

    def app_of(self, rid: ObjectId) -> str:
        record = self._records.get(rid)
        return record.app if record is not None else ""

    # --- the host's side ------------------------------------------------------------------

    def register(self, hosted: Hosted) -> None:
        """A durable object was made here: its home records it before it serves
        (executor thread)."""
        checkpoint = self.bm.hosting.checkpoint_of(hosted, durable_part=True)
        hosted.persist.last_hash = hashlib.blake2b(checkpoint).digest()
        rid = hosted.rid
        if rid.home == self.bm.id:
            self.recorded(
                rid,
                type_name=hosted.type_name,
                type_label=hosted.type_label,
                code=hosted.code,
                policy=hosted.policy,
                home_address=hosted.home_address,
                app=hosted.app,
                location=self.bm.id,
                checkpoint=checkpoint,
                principal=hosted.principal,
            )
            return
        sent = time.monotonic()
        # For its creator: the home records whom the call authenticated as.
        with acting_for(hosted.principal):
            reply = self._register_at_home(hosted, checkpoint)
        hosted.lease_until = sent + granted_lease_s(reply.result, self.lease_s)

    def _register_at_home(self, hosted: Hosted, checkpoint: bytes) -> Any:
        rid = hosted.rid
        return self.bm.run(
            self.bm.peers.control(
                rid.home,
                "object.register",
                {
                    "rid": str(rid),
                    "type": hosted.type_name,
                    "label": hosted.type_label,
                    "policy": hosted.policy,
                    "home_address": hosted.home_address,
                    "app": hosted.app,
                    "from": self.bm.id,
                    "from_address": self.bm.address,
                },
                values.pack({"code": hosted.code, "checkpoint": checkpoint}),
            )
        )

    def persist(self, hosted: Hosted) -> bool:
        """After a call that may have changed durable ``hosted``: its state is on its
        home's disk when this returns True; False: the copy is stale (its home holds
        another activation), it ended, and the call never reached the home: it may
        run on the current copy. Raises :class:`ObjectInDoubtError` if the home
        cannot be reached for :data:`PERSIST_WAIT_S`, or if the copy turned out stale
        after a write whose answer was lost (the call may be in the home's record)."""
        state = hosted.persist
        with state.counts:
            state.ended += 1
            mine = state.ended
        with state.lock:
            if state.written >= mine:
                return True  # a write that began after this call ended covers it
            with state.counts:
                covered = state.ended
            data = self.bm.hosting.checkpoint_of(hosted, durable_part=True)
            digest = hashlib.blake2b(data).digest()
            if digest != state.last_hash:
                faultpoints.reached("persist", str(hosted.rid))
                try:
                    written = self._write_state(hosted, data)
                except _LostAnswer as lost:
                    state.doubtful = covered
                    raise lost.error from None
                if not written:
                    self.bm.retire(hosted)
                    if mine <= state.doubtful:
                        raise ObjectInDoubtError(
                            f"durable object {hosted.rid}: this copy turned out stale after "
                            "a write of its state whose answer was lost; the call may or may "
                            "not have taken effect: check before repeating it"
                        )
                    return False
                state.last_hash = digest
            state.written = covered
            return True

    def _write_state(self, hosted: Hosted, data: bytes) -> bool:
        """One durable state at the home: True written, False stale. Raises
        :class:`_LostAnswer` (wrapping the caller's error) when the home cannot be
        reached in time, or answered "stale" after an attempt that may have landed."""
        rid = hosted.rid
        if rid.home == self.bm.id:
            reply = self.on_persist(rid, hosted.epoch, self.bm.id, data)
            return bool(reply.get("ok"))
        deadline = time.monotonic() + PERSIST_WAIT_S
        pause = 0.05
        uncertain = False
        while True:
            sent = time.monotonic()
            try:
                with acting_for(hosted.principal):
                    resp = self.bm.run(
                        self.bm.peers.control(
                            rid.home,
                            "object.persist",
                            {"rid": str(rid), "epoch": hosted.epoch, "from": self.bm.id},
                            data,
                        )
                    )
            except (ShuttleError, OSError) as exc:
                # Refused (a bad request, or the home will not take this principal's
                # write): it never will, so waiting for the home would not help.
                if isinstance(exc, ShuttleError) and exc.code in REFUSALS:
                    raise
                # Not NotSent: the write may have landed and its answer been lost.
                uncertain = uncertain or not isinstance(exc, NotSent)
                if time.monotonic() + pause > deadline:
                    raise _LostAnswer(
                        ObjectInDoubtError(
                            f"durable object {rid} could not write its state at its home "
                            f"{rid.home} for {PERSIST_WAIT_S:g} s ({exc}); the call may or "
                            "may not have taken effect; try again once the home is reachable"
                        )
                    ) from exc
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
                continue
            result = resp.result if isinstance(resp.result, dict) else {}
            if result.get("ok"):
                hosted.lease_until = sent + granted_lease_s(result, self.lease_s)
                return True
            if uncertain:
                self.bm.retire(hosted)
                raise _LostAnswer(
                    ObjectInDoubtError(
                        f"durable object {rid}: its home holds another activation, and an "
                        "earlier write of this copy's state went unanswered; the call may "
                        "or may not have taken effect: check before repeating it"
                    )
                )
            return False

    def renew_now(self, hosted: Hosted) -> bool:
        """A call found ``hosted``'s lease run out: ask its home now (executor thread).
        True: it serves again; False: it is stale and ended."""
        deadline = time.monotonic() + PERSIST_WAIT_S
        pause = 0.05
        while time.monotonic() >= hosted.lease_until:
            if self.bm.table.hosted(hosted.rid) is not hosted:
                return False
            try:
                with acting_for(hosted.principal):
                    self.bm.run(self._renew(hosted.rid.home, [hosted]))
            except (ShuttleError, OSError) as exc:
                if time.monotonic() + pause > deadline:
                    raise ObjectInDoubtError(
                        f"durable object {hosted.rid} has not heard from its home "
                        f"{hosted.rid.home} for {self.lease_s + PERSIST_WAIT_S:g} s ({exc}); it "
                        "serves no calls until it does; try again once the home is reachable"
                    ) from exc
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
        return self.bm.table.hosted(hosted.rid) is hosted

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / RENEWALS_PER_LEASE)
            # One renewal per home and principal: each acts for the objects' creator,
            # whose own objects only it may renew.
            by_home: dict[tuple[str, str | None], list[Hosted]] = {}
            for rid, hosted in self.bm.table.hosted_items():
                if hosted.durable and rid.home != self.bm.id and not hosted.staged:
                    by_home.setdefault((rid.home, hosted.principal), []).append(hosted)
            if by_home:
                await asyncio.gather(
                    *(
                        self._renew_quietly(home, principal, copies)
                        for (home, principal), copies in by_home.items()
                    )
                )

    async def _renew_quietly(self, home: str, principal: str | None, copies: list[Hosted]) -> None:
        try:
            with acting_for(principal):
                await self._renew(home, copies)
        except (ShuttleError, OSError) as exc:
            log.info("lease renewal at %s failed: %s", home, exc)

    async def _renew(self, home: str, copies: list[Hosted]) -> None:
        sent = time.monotonic()
        reply = await self.bm.peers.control(
            home,
            "object.renew",
            {"items": [[str(h.rid), h.epoch] for h in copies], "from": self.bm.id},
            timeout_s=min(self.lease_s / 2, self.bm.peers.control_timeout_s(home, 0)),
        )
        answers = reply.result if isinstance(reply.result, dict) else {}
        for hosted in copies:
            answer = answers.get(str(hosted.rid), {})
            if isinstance(answer, dict) and answer.get("ok"):
                lease_s = granted_lease_s(answer, self.lease_s)
                hosted.lease_until = max(hosted.lease_until, sent + lease_s)
            elif isinstance(answer, dict) and answer.get("stale"):
                self._stop_stale(hosted, answer)

    def _stop_stale(self, hosted: Hosted, answer: dict[str, Any]) -> None:
        """The home says another activation is current: this copy stops."""
        if self.bm.table.hosted(hosted.rid) is not hosted:
            return
        log.warning(
            "durable object %s: this copy (epoch %d) is stale, its home holds it on %s at "
            "epoch %s; it stops",
            hosted.rid,
            hosted.epoch,
            answer.get("location") or "nowhere",
            answer.get("epoch"),
        )
        if hosted.gate.state is GateState.QUIESCING:
            return  # a migration in doubt settles it with the home itself
        self.bm.retire(hosted)
        if answer.get("location"):
            self.bm.table.heard(hosted.rid, str(answer["location"]), int(answer.get("epoch", 0)))

    def tell_home_ended(self, hosted: Hosted) -> None:
        """A durable object hosted here was destroyed: its home forgets it."""
        try:
            with acting_for(hosted.principal):
                self.bm.run(
                    self.bm.peers.control(
                        hosted.rid.home,
                        "object.ended",
                        {"rid": str(hosted.rid), "epoch": hosted.epoch},
                    )
                )
        except (ShuttleError, OSError) as exc:
            log.info("could not tell %s's home it ended (%s); it forgets it later", hosted.rid, exc)

    def lease_left_s(self, hosted: Hosted) -> float | None:
        if math.isinf(hosted.lease_until):
            return None
        return round(hosted.lease_until - time.monotonic(), 3)


#: Error codes with which a home refuses a write for good (no retry changes them).
REFUSALS = frozenset({"invalid_argument", "not_permitted"})


class _LostAnswer(Exception):
    """A durable write's outcome is unknown; ``error`` is what the caller gets."""

    def __init__(self, error: ObjectInDoubtError) -> None:
        super().__init__(str(error))
        self.error = error


def granted_lease_s(answer: Any, default: float) -> float:
    """The lease a home's answer grants (its own setting), or ``default``."""
    lease = answer.get("lease_s") if isinstance(answer, dict) else None
    if isinstance(lease, int | float) and not isinstance(lease, bool) and 0 < lease < math.inf:
        return float(lease)
    return default
