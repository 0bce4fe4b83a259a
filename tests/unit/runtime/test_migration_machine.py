"""The migration machine as a pure function: events in, instructions out, told as
stories, one per way a step can end.

Hypothesis over every interleaving of replies, losses and timeouts is in
``test_migration_interleavings.py``; exactly what each step says (its whole
instruction list and message) in ``test_migration_machine_exact.py``.
"""

from __future__ import annotations

import pytest

from shuttle.errors import LocalProtocolError
from shuttle.runtime.migration_machine import (
    IN_DOUBT_PAUSE_S_MAX,
    Abort,
    Activated,
    ActivationRefused,
    ActivationUnknown,
    AskHome,
    AskTarget,
    Cancelled,
    Checkpointed,
    CheckpointFailed,
    Drained,
    DrainTimedOut,
    Drop,
    Finish,
    HomeAnswered,
    HomeUnreachable,
    InstallFailed,
    Lose,
    Reopen,
    State,
    Switch,
    TargetAnswered,
    TargetUnreachable,
    Wait,
    WaitOver,
)
from tests.unit.runtime.migration_steps import machine, to_activating


def test_a_move_that_goes_well_switches_at_the_new_epoch() -> None:
    m = machine()
    to_activating(m)
    assert m.handle(Activated(4)) == [Switch(4), Finish(True, epoch=4)]
    assert m.state is State.DONE and m.quiesce_s == 0.01 and m.checkpoint_bytes == 100


def test_failures_before_activation_roll_back_and_abort_the_stage() -> None:
    m = machine()
    m.start()
    (finish,) = m.handle(DrainTimedOut(5.0))
    assert isinstance(finish, Finish) and "did not drain" in finish.error  # gate reopened itself
    m = machine()
    m.start()
    m.handle(Drained(0.0))
    assert m.handle(CheckpointFailed("boom"))[:1] == [Reopen()]
    m = machine()
    m.start()
    m.handle(Drained(0.0))
    out = m.handle(CheckpointFailed("killed", object_lost=True))
    assert isinstance(out[0], Lose) and "was lost" in out[1].error  # type: ignore[attr-defined]
    m = machine()
    m.start()
    m.handle(Drained(0.0))
    m.handle(Checkpointed(1))
    out = m.handle(InstallFailed("target died"))
    assert out[:2] == [Abort(), Reopen()] and "keeps running on c1" in out[2].error  # type: ignore[attr-defined]


def test_a_refusal_rolls_back_unless_the_home_holds_another_activation() -> None:
    m = machine()
    to_activating(m)
    assert m.handle(ActivationRefused("restore failed"))[:2] == [Abort(), Reopen()]
    m = machine()
    to_activating(m)
    assert m.handle(ActivationRefused("fenced", "c1", 3))[:2] == [Abort(), Reopen()]
    m = machine()
    to_activating(m)
    out = m.handle(ActivationRefused("runs elsewhere", "n2", 5))
    assert out[0] == Abort() and isinstance(out[1], Drop)  # our copy is stale: it must not serve


def test_a_lost_answer_is_in_doubt_until_the_target_or_the_home_says() -> None:
    m = machine()
    to_activating(m)
    assert m.handle(ActivationUnknown("lost")) == [AskTarget()]
    assert m.in_doubt
    assert m.handle(TargetAnswered("active", 4)) == [Switch(4), Finish(True, epoch=4)]

    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("lost"))
    assert m.handle(TargetUnreachable("down")) == [AskHome()]
    assert m.handle(HomeUnreachable("down")) == [Wait(0.05)]
    assert m.handle(WaitOver()) == [AskTarget()]
    assert m.handle(TargetAnswered("unknown")) == [AskHome()]
    assert m.handle(HomeAnswered(False, "c1", 3))[:2] == [Abort(), Reopen()]


def test_waiting_in_doubt_backs_off_up_to_a_bound_and_never_gives_up() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("lost"))
    pauses = []
    for _ in range(20):
        m.handle(TargetUnreachable("down"))
        (wait,) = m.handle(HomeUnreachable("down"))
        assert isinstance(wait, Wait)
        pauses.append(wait.seconds)
        m.handle(WaitOver())
    assert pauses == sorted(pauses) and pauses[-1] == IN_DOUBT_PAUSE_S_MAX
    assert m.in_doubt  # twenty rounds of silence: still no guess
    assert m.handle(HomeAnswered(True, "n1", 4)) == [Switch(4), Finish(True, epoch=4)]


def test_the_target_saying_aborted_is_enough_to_reopen() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("timeout"))
    assert m.handle(TargetAnswered("aborted"))[0] == Reopen()


def test_a_home_that_forgot_the_object_ends_the_source_copy() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("timeout"))
    m.handle(TargetUnreachable("x"))
    assert isinstance(m.handle(HomeAnswered(False, "", 0, known=False))[1], Drop)


def test_closing_the_run_time_rolls_back_before_activation_but_never_guesses_after() -> None:
    m = machine()
    m.start()
    m.handle(Drained(0.0))
    m.handle(Checkpointed(1))
    assert m.handle(Cancelled())[:2] == [Abort(), Reopen()]
    m = machine()
    to_activating(m)
    (finish,) = m.handle(Cancelled())
    assert isinstance(finish, Finish) and not finish.ok and "in doubt" in finish.error


def test_events_that_cannot_happen_are_refused() -> None:
    m = machine()
    with pytest.raises(LocalProtocolError, match="Drained cannot happen when start"):
        m.handle(Drained(0.0))
    m.start()
    with pytest.raises(LocalProtocolError, match="Activated cannot happen when quiescing"):
        m.handle(Activated(4))
    with pytest.raises(LocalProtocolError, match="started twice"):
        m.start()
