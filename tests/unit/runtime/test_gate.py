"""The gate's hold on the event loop and on threads, on a fake clock where time matters.

``wait_open`` is what every call on a node passes before it runs: it must return at
once at an open gate, wait without blocking the loop while the gate is closed (staged
or quiescing), back off its polling, and give up with a clear error at its deadline.
The clock is the gate module's ``time`` (replaced here by a fake that only moves when
the fake ``asyncio.sleep`` sleeps), so no test depends on how loaded the machine is.
Each test names, in a comment, the mutants of ``runtime/gate.py`` it was seen to fail
against (docs/testing.md).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from shuttle.errors import LocalProtocolError, RequestTimeoutError
from shuttle.runtime import gate as gate_mod
from shuttle.runtime.gate import HOLD_S_MAX, TRANSITIONS, Gate, GateState

#: Longest a test waits for another thread before failing (not a timing assumption: the
#: threads involved are released by events).
WAIT_S = 10.0
#: Far more clock readings than any wait makes between two sleeps.
SPIN_READS_MAX = 1000


@dataclass
class FakeLoopTime:
    """A fake clock for the gate (``gate_mod.time``) and a fake ``asyncio.sleep`` that
    advances it, recording each delay; ``on_sleep`` runs after each sleep (to open the
    gate at a chosen point)."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)
    on_sleep: Callable[[int], None] | None = None
    #: Clock readings since the last sleep: a wait that reads the clock over and over
    #: without sleeping is spinning on the event loop (and on this clock, forever).
    reads: int = 0

    def monotonic(self) -> float:
        self.reads += 1
        if self.reads > SPIN_READS_MAX:
            raise AssertionError("the clock was read again and again without a sleep: a spin")
        return self.now

    async def sleep(self, delay: float) -> None:
        self.reads = 0
        self.sleeps.append(delay)
        self.now += delay
        if self.on_sleep is not None:
            self.on_sleep(len(self.sleeps))
        await _real_sleep(0)  # still yield to the loop, as a real sleep does


_real_sleep = asyncio.sleep


def stuck(hold_s: float) -> str:
    """The whole error a held call gets at its deadline, as a pattern."""
    return (
        "^"
        + re.escape(
            f"a call waited {hold_s:g} s for an object that is moving; "
            "its migration seems stuck (see the node's log)"
        )
        + "$"
    )


class FakeTimeCondition(threading.Condition):
    """The gate's condition variable on the fake clock: ``wait(t)`` does not block, it
    records ``t``, runs ``on_wait`` (standing for what another thread does meanwhile:
    a call leaves, the gate opens) and moves the clock by ``t`` if nothing notified."""

    def __init__(self, clock: FakeLoopTime) -> None:
        super().__init__()
        self.clock = clock
        self.waits: list[float] = []
        self.on_wait: Callable[[int], None] | None = None
        self._notified = False

    def notify_all(self) -> None:
        self._notified = True
        super().notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None, "every wait at the gate is bounded"
        # A wait of no time would spin on this clock: the deadline was already spent.
        assert timeout > 0, f"a wait of {timeout} s: the deadline test let a spent deadline by"
        self.waits.append(timeout)
        self._notified = False
        if self.on_wait is not None:
            self.on_wait(len(self.waits))
        if not self._notified:
            self.clock.now += timeout
        return self._notified


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLoopTime]:
    fake = FakeLoopTime()
    monkeypatch.setattr(gate_mod, "time", fake)
    monkeypatch.setattr(gate_mod.asyncio, "sleep", fake.sleep)
    yield fake


class SignallingCondition(threading.Condition):
    """The gate's condition variable, telling the test when a thread starts waiting on it
    (and so has released the gate's lock): threads are ordered by events, not sleeps."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def _watched(gate: Gate) -> SignallingCondition:
    cond = SignallingCondition()
    gate._cond = cond
    return cond


def _quiescing(*, draining: bool) -> tuple[Gate, Callable[[], None]]:
    """A gate quiescing on another thread: with an active call still draining, or
    drained (before the checkpoint). Returns the gate and a function that ends it."""
    gate = Gate()
    cond = _watched(gate)
    assert gate.enter()
    drained = threading.Event()

    def quiesce() -> None:
        gate.quiesce(timeout_s=WAIT_S)
        drained.set()

    mover = threading.Thread(target=quiesce, daemon=True)
    mover.start()
    assert cond.waiting.wait(WAIT_S)  # quiesce() is waiting for the active call to leave
    assert gate.state is GateState.QUIESCING
    if not draining:
        gate.leave()
        assert drained.wait(WAIT_S)

    def finish() -> None:
        if draining:
            gate.leave()
        mover.join(WAIT_S)
        assert not mover.is_alive()

    return gate, finish


# --- wait_open --------------------------------------------------------------------------


def test_wait_open_returns_at_once_at_an_open_or_retired_gate(clock: FakeLoopTime) -> None:
    # Mutants: _held returning True for OPEN or RETIRED (the state tuple changed).
    for state in (GateState.OPEN, GateState.RETIRED):
        asyncio.run(Gate(state).wait_open())
    assert clock.sleeps == []


def test_wait_open_holds_a_call_until_the_gate_opens_backing_off(clock: FakeLoopTime) -> None:
    """A staged object (arriving) holds its calls until its source says go; the waiting
    call polls at 1, 2, 4, 8, 16 ms, then every 20 ms, on the loop (never a thread)."""
    # Mutants: the wait deleted (the loop spins and the gate is never opened: fails at the
    # deadline); delay = 0.001 changed; delay * 2 changed; min(..., 0.02) changed or made
    # max; the while condition inverted.
    gate = Gate(GateState.STAGED)
    clock.on_sleep = lambda n: gate.activate() if n == 8 else None
    asyncio.run(gate.wait_open(hold_s=30.0))
    assert clock.sleeps == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.016, 0.02, 0.02, 0.02])
    assert gate.state is GateState.OPEN


def test_wait_open_gives_up_at_its_deadline_with_a_clear_error(clock: FakeLoopTime) -> None:
    # Mutants: the deadline (monotonic() + hold_s) changed, the deadline check deleted or
    # turned, the error's message replaced.
    gate = Gate(GateState.STAGED)
    with pytest.raises(RequestTimeoutError, match=stuck(0.1)):
        asyncio.run(gate.wait_open(hold_s=0.1))
    # It slept until just past the deadline, not longer, not shorter.
    assert sum(clock.sleeps[:-1]) <= 0.1 < sum(clock.sleeps)
    assert clock.sleeps == pytest.approx(
        [0.001, 0.002, 0.004, 0.008, 0.016, 0.02, 0.02, 0.02, 0.02]
    )


def test_wait_open_at_exactly_its_deadline_looks_once_more(clock: FakeLoopTime) -> None:
    """A call is held for at least ``hold_s``: reaching the deadline exactly is not yet
    past it (one more poll, then the error)."""
    # Mutant: `time.monotonic() > deadline` turned into >=.
    clock.now = 0.0
    hold_s = 0.0
    for delay in (0.001, 0.002, 0.004, 0.008, 0.016):  # the clock's own sums, exactly
        hold_s += delay
    gate = Gate(GateState.STAGED)
    with pytest.raises(RequestTimeoutError):
        asyncio.run(gate.wait_open(hold_s=hold_s))
    assert clock.sleeps == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.016, 0.02])


def test_wait_open_holds_for_two_minutes_by_default(clock: FakeLoopTime) -> None:
    # Mutant: the default hold_s changed.
    assert HOLD_S_MAX == 120.0
    gate = Gate(GateState.QUIESCING)
    with pytest.raises(RequestTimeoutError, match=stuck(120)):
        asyncio.run(gate.wait_open())
    assert 120.0 < sum(clock.sleeps) <= 120.0 + 0.02 + 1e-9


def test_wait_open_lets_an_admitted_call_in_only_while_active_calls_drain(
    clock: FakeLoopTime,
) -> None:
    """``admit`` (a callback an active call may be waiting for) goes in while the drain
    runs; once drained, before the checkpoint, it waits like any call; at a staged gate
    (nothing active, nothing to wait for) it waits too."""
    # Mutants: `admit and self._draining` made `or` / either operand dropped; the draining
    # flag never set or cleared in quiesce.
    gate, finish = _quiescing(draining=True)
    asyncio.run(gate.wait_open(admit=True))
    assert clock.sleeps == []
    with pytest.raises(RequestTimeoutError):
        asyncio.run(gate.wait_open(hold_s=0.01))  # a call that is not admitted waits
    finish()

    gate, finish = _quiescing(draining=False)
    assert gate.state is GateState.QUIESCING and not gate._draining
    with pytest.raises(RequestTimeoutError):
        asyncio.run(gate.wait_open(hold_s=0.01, admit=True))
    finish()

    staged = Gate(GateState.STAGED)
    with pytest.raises(RequestTimeoutError):
        asyncio.run(staged.wait_open(hold_s=0.01, admit=True))


# --- enter, quiesce, closed ---------------------------------------------------------------


def test_an_admitted_call_waits_at_a_staged_gate() -> None:
    # Mutant: _held's `if admit and self._draining` made `if admit` (the admitted call
    # went straight into an object that has not arrived yet).
    gate = Gate(GateState.STAGED)
    with pytest.raises(RequestTimeoutError, match=stuck(0.01)):
        gate.enter(hold_s=0.01, admit=True)
    assert gate.active == 0


def test_an_admitted_call_enters_while_active_calls_drain() -> None:
    gate, finish = _quiescing(draining=True)
    assert gate.enter(hold_s=0.01, admit=True)
    assert gate.active == 2
    gate.leave()
    with pytest.raises(RequestTimeoutError):
        gate.enter(hold_s=0.01)  # not admitted: held
    finish()


def test_enter_counts_active_calls_and_refuses_a_retired_gate() -> None:
    # Mutants: self._active += 1 changed, the RETIRED check deleted or returning True.
    gate = Gate()
    assert gate.enter() and gate.enter()
    assert gate.active == 2
    gate.leave()
    gate.leave()
    assert gate.active == 0
    assert Gate(GateState.RETIRED).enter() is False
    assert Gate(GateState.RETIRED).active == 0


def test_closed_is_true_exactly_while_calls_would_be_held() -> None:
    # Mutants: the state tuple in `closed` changed (the node would answer calls for an
    # object that is arriving, or hold calls for one that is open).
    assert Gate(GateState.STAGED).closed
    assert not Gate(GateState.OPEN).closed
    assert Gate(GateState.QUIESCING).closed
    assert not Gate(GateState.RETIRED).closed
    gate, finish = _quiescing(draining=True)
    assert gate.closed  # even while admitted calls may still go in
    finish()
    assert gate.closed  # drained: held until the move ends one way or the other
    gate.reopen()
    assert not gate.closed


def test_quiesce_reports_the_seconds_the_drain_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Mutants: time.monotonic() - start turned into + or swapped.
    fake = FakeLoopTime(now=500.0)
    monkeypatch.setattr(gate_mod, "time", fake)
    gate = Gate()
    assert gate.quiesce(timeout_s=1.0) == 0.0  # nothing active: drained at once
    assert gate.state is GateState.QUIESCING


def test_quiesce_that_times_out_reopens_and_answers_none() -> None:
    # Mutants: `left <= 0` turned, the reopen deleted, the draining flag left set.
    gate = Gate()
    assert gate.enter()
    assert gate.quiesce(timeout_s=0.01) is None
    assert gate.state is GateState.OPEN and not gate._draining
    assert gate.enter()  # a new call goes straight in
    gate.leave()
    gate.leave()


def test_leaving_the_last_call_wakes_the_drain() -> None:
    # Mutants: `if self._active == 0` turned, notify_all deleted (the drain then waits its
    # whole timeout and the move is cancelled).
    gate = Gate()
    cond = _watched(gate)
    assert gate.enter()
    result: list[float | None] = []
    mover = threading.Thread(
        target=lambda: result.append(gate.quiesce(timeout_s=60.0)), daemon=True
    )
    mover.start()
    assert cond.waiting.wait(WAIT_S)
    gate.leave()
    mover.join(WAIT_S)
    assert not mover.is_alive(), "the drain did not notice the last call leave"
    assert result and result[0] is not None


def test_every_transition_in_the_table_and_no_other() -> None:
    # Mutants: _apply's refusal deleted, notify_all in _apply deleted, the message changed.
    assert TRANSITIONS == {
        (GateState.STAGED, "activate"): GateState.OPEN,
        (GateState.STAGED, "retire"): GateState.RETIRED,
        (GateState.OPEN, "quiesce"): GateState.QUIESCING,
        (GateState.QUIESCING, "reopen"): GateState.OPEN,
        (GateState.QUIESCING, "retire"): GateState.RETIRED,
        # A stale copy told to stop (fencing: its home holds a newer activation).
        (GateState.OPEN, "retire"): GateState.RETIRED,
    }
    events: dict[str, Callable[[Gate], object]] = {
        "activate": Gate.activate,
        "retire": Gate.retire,
        "reopen": Gate.reopen,
        "quiesce": lambda g: g.quiesce(1.0),
    }
    for state in GateState:
        for event, apply in events.items():
            gate = Gate(state)
            expected = TRANSITIONS.get((state, event))
            if state is GateState.RETIRED and event == "retire":
                # Two parts of the run-time may find out at once; the second does nothing.
                assert gate.retire() is False
                assert gate.state is state
            elif expected is None:
                with pytest.raises(
                    LocalProtocolError, match=f"gate: cannot {event} in state {state.value}"
                ):
                    apply(gate)
                assert gate.state is state
            else:
                apply(gate)
                assert gate.state is expected


def test_a_held_thread_wakes_when_the_gate_opens() -> None:
    # Mutant: notify_all in _apply deleted (a call held by enter() would sleep until its
    # deadline instead of going on when the object arrives).
    gate = Gate(GateState.STAGED)
    cond = _watched(gate)
    outcome: list[bool] = []
    held = threading.Thread(target=lambda: outcome.append(gate.enter(hold_s=60.0)), daemon=True)
    held.start()
    assert cond.waiting.wait(WAIT_S)  # the call is held
    gate.activate()
    held.join(WAIT_S)
    assert not held.is_alive(), "the held call did not wake when the gate opened"
    assert outcome == [True]


# --- enter and quiesce on the fake clock ----------------------------------------------------


@pytest.fixture
def fake_cond(monkeypatch: pytest.MonkeyPatch) -> Callable[[Gate], FakeTimeCondition]:
    clock = FakeLoopTime()
    monkeypatch.setattr(gate_mod, "time", clock)

    def install(gate: Gate) -> FakeTimeCondition:
        gate._cond = FakeTimeCondition(clock)
        return gate._cond

    return install


def test_enter_waits_out_its_whole_hold_then_gives_up(
    fake_cond: Callable[[Gate], FakeTimeCondition],
) -> None:
    # Mutants: `left <= 0` turned into `left <= 1` (a short hold gave up without waiting),
    # the deadline changed, the message replaced.
    gate = Gate(GateState.QUIESCING)
    cond = fake_cond(gate)
    with pytest.raises(RequestTimeoutError, match=stuck(0.5)):
        gate.enter(hold_s=0.5)
    assert cond.waits == [0.5]
    assert gate.active == 0


def test_enter_held_briefly_goes_in_when_the_object_arrives(
    fake_cond: Callable[[Gate], FakeTimeCondition],
) -> None:
    gate = Gate(GateState.STAGED)
    cond = fake_cond(gate)
    cond.on_wait = lambda n: gate.activate()
    assert gate.enter(hold_s=0.5) is True
    assert cond.waits == [0.5] and gate.active == 1


def test_quiesce_waits_for_a_call_that_leaves_within_its_timeout(
    fake_cond: Callable[[Gate], FakeTimeCondition],
) -> None:
    # Mutants: `left <= 0` turned into `left <= 1` (a drain of under a second was cancelled
    # at once), the deadline changed.
    gate = Gate()
    cond = fake_cond(gate)
    assert gate.enter()
    cond.on_wait = lambda n: gate.leave()
    assert gate.quiesce(timeout_s=0.5) == 0.0
    assert cond.waits == [0.5] and gate.state is GateState.QUIESCING


def test_quiesce_gives_up_after_its_timeout(
    fake_cond: Callable[[Gate], FakeTimeCondition],
) -> None:
    gate = Gate()
    cond = fake_cond(gate)
    assert gate.enter()
    assert gate.quiesce(timeout_s=0.5) is None
    assert cond.waits == [0.5] and gate.state is GateState.OPEN
