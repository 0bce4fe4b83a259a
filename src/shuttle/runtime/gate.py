"""The gate in front of a hosted object: how calls are let in, held and redirected.

Migration (ABACUS 5.2) first blocks new calls to the object, then waits until the
active ones drain. The gate does both, and remembers what became of the object so
that held calls know whether to go on (the migration was cancelled) or to find the
object elsewhere (it left). Its lifecycle is a table, applied in one place:

    STAGED --activate--> OPEN            (an object arriving: held until its source says go)
    STAGED --retire----> RETIRED         (the arrival was aborted)
    OPEN --quiesce-----> QUIESCING       (block new calls, drain active ones)
    QUIESCING --reopen-> OPEN            (cancelled: drain too slow, or the move failed)
    QUIESCING --retire-> RETIRED         (the object left; held calls re-resolve)
    OPEN --retire------> RETIRED         (a stale copy told to stop, or the object
                                          ended: calls inside finish, new ones look
                                          elsewhere)

While QUIESCING drains active calls, a call that says it is *admitted* (a method the
object lists in ``quiesce_admits``: a callback an active call may be waiting for, via
another object) still goes in; once the drain ends, before the checkpoint, nothing
does. Without that, two objects that call back into each other and quiesce at once
hold each other's callbacks at their gates and neither drains.

Thread-safe; waits are on a condition variable, bounded by the caller's timeout.
"""

from __future__ import annotations

import asyncio
import threading
import time
from enum import Enum

from shuttle.errors import LocalProtocolError, RequestTimeoutError


class GateState(Enum):
    STAGED = "staged"
    OPEN = "open"
    QUIESCING = "quiescing"
    RETIRED = "retired"


TRANSITIONS: dict[tuple[GateState, str], GateState] = {
    (GateState.STAGED, "activate"): GateState.OPEN,
    (GateState.STAGED, "retire"): GateState.RETIRED,
    (GateState.OPEN, "quiesce"): GateState.QUIESCING,
    (GateState.QUIESCING, "reopen"): GateState.OPEN,
    (GateState.QUIESCING, "retire"): GateState.RETIRED,
    (GateState.OPEN, "retire"): GateState.RETIRED,
}

#: Longest a call waits at a closed gate (a migration's drain, transfer and restore
#: together stay far below it; past it something is stuck, and the caller hears so).
HOLD_S_MAX = 120.0


class Gate:
    """Admission control for one hosted object."""

    def __init__(self, state: GateState = GateState.OPEN) -> None:
        self._state = state
        self._active = 0
        #: True while quiesce() waits for active calls (admitted calls may enter).
        self._draining = False
        self._cond = threading.Condition()

    @property
    def state(self) -> GateState:
        return self._state

    @property
    def active(self) -> int:
        return self._active

    def _apply(self, event: str) -> None:
        new = TRANSITIONS.get((self._state, event))
        if new is None:
            raise LocalProtocolError(f"gate: cannot {event} in state {self._state.value}")
        self._state = new
        self._cond.notify_all()

    @property
    def closed(self) -> bool:
        """True while calls would be held (the object is arriving or moving)."""
        return self._state in (GateState.STAGED, GateState.QUIESCING)

    def _held(self, admit: bool) -> bool:
        if admit and self._draining:
            return False
        return self._state in (GateState.STAGED, GateState.QUIESCING)

    async def wait_open(self, hold_s: float = HOLD_S_MAX, *, admit: bool = False) -> None:
        """Wait on the event loop (not on a thread) while the gate is closed, so that
        calls held during a migration do not occupy the threads the migration needs.
        ``admit``: the call may go in while active calls drain (see the module doc)."""
        deadline = time.monotonic() + hold_s
        delay = 0.001
        while self._held(admit):
            if time.monotonic() > deadline:
                raise RequestTimeoutError(
                    f"a call waited {hold_s:g} s for an object that is moving; "
                    "its migration seems stuck (see the node's log)"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)

    def enter(self, hold_s: float = HOLD_S_MAX, *, admit: bool = False) -> bool:
        """Let a call in (waiting while the object is staged or quiescing; an
        ``admit`` call goes in while active calls drain). False if the object is gone:
        the caller must find where it went."""
        deadline = time.monotonic() + hold_s
        with self._cond:
            while self._held(admit):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeoutError(
                        f"a call waited {hold_s:g} s for an object that is moving; "
                        "its migration seems stuck (see the node's log)"
                    )
                self._cond.wait(left)
            if self._state is GateState.RETIRED:
                return False
            self._active += 1
            return True

    def leave(self) -> None:
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._cond.notify_all()

    def quiesce(self, timeout_s: float) -> float | None:
        """Block new calls and wait for active ones to return. The seconds it took, or
        None if they did not drain within ``timeout_s`` (the gate is open again)."""
        start = time.monotonic()
        deadline = start + timeout_s
        with self._cond:
            self._apply("quiesce")
            self._draining = True
            try:
                while self._active:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._apply("reopen")
                        return None
                    self._cond.wait(left)
            finally:
                self._draining = False
        return time.monotonic() - start

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no call is inside (after the gate retired: before what ran the
        object is closed under them). False if some still were after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._active:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def reopen(self) -> None:
        with self._cond:
            self._apply("reopen")

    def activate(self) -> None:
        with self._cond:
            self._apply("activate")

    def retire(self) -> bool:
        """The object is gone from here (held calls look elsewhere). False if it was
        already: two parts of the run-time may find out at once (a stale copy told to
        stop while its move settles), and the second has nothing to do."""
        with self._cond:
            if self._state is GateState.RETIRED:
                return False
            self._apply("retire")
            return True
