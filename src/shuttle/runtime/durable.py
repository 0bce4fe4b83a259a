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
an unacknowledged call may or may not be there. This module is the home's side; the
host's (writes, leases held) is :mod:`shuttle.runtime.durable_host`, the records on
disk :mod:`shuttle.runtime.durable_records`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shuttle.errors import InvalidArgumentError, ShuttleError
from shuttle.runtime import faultpoints
from shuttle.runtime.authority import acting_for
from shuttle.runtime.durable_host import DurableHost
from shuttle.runtime.durable_records import Record, RecordFiles
from shuttle.runtime.gate import GateState
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.locations import FIRST_EPOCH, HomeEntry

if TYPE_CHECKING:
    from shuttle.runtime.binding import BindingManager

log = logging.getLogger("shuttle.runtime")

#: What the home adds to a lease before it brings an object back elsewhere: two
#: machines' clocks may run at slightly different rates over a lease.
REACTIVATE_MARGIN_S = 1.0
#: How often a home looks for durable objects to bring back.
HOME_CHECK_EVERY_S = 0.5
#: After a re-activation fails (the home cannot make the object: shipped code on a
#: node without a key, say), it is not tried again for this long.
REACTIVATE_RETRY_S = 10.0


class Durability:
    """Durable objects of one run-time: as their home (records, leases granted,
    re-activation); as their host (writes, leases held) through :attr:`host`."""

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
        #: The host's side: the durable copies that run here.
        self.host = DurableHost(bm, self)

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
        self.bm.spawn(self.host.renew_forever())

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
