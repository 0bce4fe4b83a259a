"""Durable objects, the host's side: a copy's state written to its home before a
changing call is answered (group commit, :meth:`DurableHost.persist`), and the lease
within which the copy may serve (granted with each write, renewed every quarter
lease, asked for again when a call finds it run out). A copy its home calls stale
stops. The home's side (records, grants, re-activation) is
:mod:`shuttle.runtime.durable`, which explains the three rules both sides keep.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from shuttle.errors import ObjectInDoubtError, ShuttleError
from shuttle.runtime import faultpoints, values
from shuttle.runtime.authority import acting_for
from shuttle.runtime.gate import GateState
from shuttle.runtime.peers import NotSent

if TYPE_CHECKING:
    from shuttle.runtime.binding import BindingManager
    from shuttle.runtime.durable import Durability
    from shuttle.runtime.hosted import Hosted

log = logging.getLogger("shuttle.runtime")

#: Renewals per lease (a host renews every quarter of it: three may be lost).
RENEWALS_PER_LEASE = 4
#: Longest a call waits for its change to be written at an unreachable home before
#: the caller is told it is in doubt.
PERSIST_WAIT_S = 30.0


class DurableHost:
    """The durable copies hosted by one run-time: their writes to their homes and
    the leases they hold. ``home`` is this run-time's own home side (a copy homed
    here writes to it directly; its lease setting is the default grant)."""

    def __init__(self, bm: BindingManager, home: Durability) -> None:
        self.bm = bm
        self.home = home

    @property
    def lease_s(self) -> float:
        """The lease this run-time grants as a home: what a host assumes where its
        home's answer does not say its own."""
        return self.home.lease_s

    def register(self, hosted: Hosted) -> None:
        """A durable object was made here: its home records it before it serves
        (executor thread)."""
        checkpoint = self.bm.hosting.checkpoint_of(hosted, durable_part=True)
        hosted.persist.last_hash = hashlib.blake2b(checkpoint).digest()
        rid = hosted.rid
        if rid.home == self.bm.id:
            self.home.recorded(
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
            reply = self.home.on_persist(rid, hosted.epoch, self.bm.id, data)
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

    async def renew_forever(self) -> None:
        """On the run-time's loop: renew the leases of the copies hosted here, a
        quarter lease apart."""
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
