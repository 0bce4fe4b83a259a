"""Exactly what each step of the migration machine says (the mutation run's survivors,
issue 27).

Each test pins an outcome the stories (``test_migration_machine.py``) only sampled: the
whole instruction list, the whole error message (it says what happened and what to
do), the state and what the machine recorded on the way.
"""

from __future__ import annotations

import pytest

from shuttle.errors import LocalProtocolError
from shuttle.runtime.migration_machine import (
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
    Event,
    Finish,
    HomeAnswered,
    HomeUnreachable,
    Install,
    InstallFailed,
    Instruction,
    Lose,
    MigrationMachine,
    Quiesce,
    Reopen,
    State,
    Switch,
    TargetAnswered,
    TargetUnreachable,
    Wait,
    WaitOver,
)
from tests.unit.runtime.migration_steps import machine, to_activating


def test_a_new_machine_is_not_finished_nor_in_doubt_and_quiesces_with_its_timeout() -> None:
    m = MigrationMachine("c1/7", "c1", "n1", 3, drain_timeout_s=7.5)
    assert m.state is State.START and not m.finished and not m.in_doubt
    assert m.quiesce_s == 0.0 and m.checkpoint_bytes == 0 and m.failed_after == ""
    assert m.start() == [Quiesce(7.5)]
    assert m.state is State.QUIESCING and not m.finished and not m.in_doubt


def test_a_drain_timeout_fails_with_the_timeout_and_where_it_keeps_running() -> None:
    m = machine()
    m.start()
    assert m.handle(DrainTimedOut(2.5)) == [
        Finish(
            False,
            "migration of c1/7 cancelled: its active calls did not drain within 2.5 s; "
            "it keeps running on c1",
        )
    ]
    assert m.state is State.FAILED and m.finished and m.failed_after == "quiescing"


def test_a_failed_checkpoint_reopens_the_source_and_says_it_keeps_its_state() -> None:
    m = machine()
    m.start()
    m.handle(Drained(0.25))
    assert m.quiesce_s == 0.25 and m.state is State.CHECKPOINTING
    assert m.handle(CheckpointFailed("disk full")) == [
        Reopen(),
        Finish(
            False,
            "migration of c1/7 to n1 failed after checkpointing (disk full); "
            "it keeps running on c1 with its state",
        ),
    ]
    assert m.state is State.FAILED and m.failed_after == "checkpointing"


def test_an_object_lost_with_its_checkpoint_is_lost_not_reopened() -> None:
    m = machine()
    m.start()
    m.handle(Drained(0.0))
    assert m.handle(CheckpointFailed("worker killed", object_lost=True)) == [
        Lose("worker killed"),
        Finish(
            False,
            "object c1/7 was lost while it was checkpointed for migration to n1: worker "
            "killed; create it again (with less state, or larger sandbox limits)",
        ),
    ]
    assert m.state is State.FAILED and m.failed_after == "checkpointing"


def test_a_failed_install_aborts_the_stage_and_reopens() -> None:
    m = machine()
    m.start()
    m.handle(Drained(0.0))
    assert m.handle(Checkpointed(64)) == [Install()]
    assert m.checkpoint_bytes == 64 and m.state is State.INSTALLING
    assert m.handle(InstallFailed("target died")) == [
        Abort(),
        Reopen(),
        Finish(
            False,
            "migration of c1/7 to n1 failed after installing (target died); "
            "it keeps running on c1 with its state",
        ),
    ]
    assert m.failed_after == "installing"


def test_a_refusal_at_the_source_s_own_activation_rolls_back_with_the_reason() -> None:
    m = machine()
    to_activating(m)
    assert m.state is State.ACTIVATING and not m.in_doubt
    assert m.handle(ActivationRefused("restore failed", "c1", 3)) == [
        Abort(),
        Reopen(),
        Finish(
            False,
            "migration of c1/7 to n1 failed after activating (restore failed); "
            "it keeps running on c1 with its state",
        ),
    ]
    assert m.state is State.FAILED and m.failed_after == "activating"


@pytest.mark.parametrize(
    ("location", "epoch"),
    [("c1", 5), ("n2", 3), ("n2", 5)],
    ids=["same-place-later-epoch", "elsewhere-same-epoch", "elsewhere-later-epoch"],
)
def test_a_refusal_showing_another_activation_drops_the_stale_copy(
    location: str, epoch: int
) -> None:
    """Either a different place or a different epoch makes the source's copy stale."""
    m = machine()
    to_activating(m)
    stale = (
        f"object c1/7's copy on c1 (epoch 3) is stale: its home holds it on {location} "
        f"at epoch {epoch}"
    )
    assert m.handle(ActivationRefused("fenced", location, epoch)) == [
        Abort(),
        Drop(stale),
        Finish(False, f"migration of c1/7 failed: {stale}"),
    ]
    assert m.state is State.FAILED and m.failed_after == "activating"


def test_a_target_that_dropped_its_stage_reopens_the_source_with_why() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("timeout"))
    assert m.state is State.IN_DOUBT
    assert m.handle(TargetAnswered("aborted")) == [
        Reopen(),
        Finish(
            False,
            "migration of c1/7 to n1 failed after in_doubt (the target dropped the object "
            "before activating it); it keeps running on c1 with its state",
        ),
    ]
    assert m.state is State.FAILED and m.failed_after == "in_doubt"


def test_the_home_saying_committed_switches_at_the_home_s_epoch() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("timeout"))
    assert m.handle(TargetUnreachable("down")) == [AskHome()]
    assert m.handle(HomeAnswered(True, "n1", 4)) == [Switch(4), Finish(True, epoch=4)]
    assert m.state is State.DONE and m.finished and not m.in_doubt


def test_the_home_saying_not_committed_elsewhere_drops_the_stale_copy() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("timeout"))
    m.handle(TargetAnswered("unknown"))
    stale = "object c1/7's copy on c1 (epoch 3) is stale: its home holds it on n2 at epoch 6"
    assert m.handle(HomeAnswered(False, "n2", 6)) == [
        Abort(),
        Drop(stale),
        Finish(False, f"migration of c1/7 failed: {stale}"),
    ]


def test_the_home_saying_not_committed_here_reopens_with_its_reason() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("timeout"))
    m.handle(TargetUnreachable("down"))
    assert m.handle(HomeAnswered(False, "c1", 3)) == [
        Abort(),
        Reopen(),
        Finish(
            False,
            "migration of c1/7 to n1 failed after in_doubt (its home says the move did not "
            "happen); it keeps running on c1 with its state",
        ),
    ]


def test_a_home_that_forgot_the_object_says_so_and_drops_the_copy() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("timeout"))
    m.handle(TargetUnreachable("x"))
    gone = "its home no longer knows object c1/7 (destroyed or lost)"
    assert m.handle(HomeAnswered(False, "c1", 3, known=False)) == [
        Abort(),
        Drop(gone),
        Finish(False, f"migration of c1/7 failed: {gone}"),
    ]
    assert m.state is State.FAILED and m.failed_after == "in_doubt"


def test_the_pause_in_doubt_doubles_from_its_minimum_to_its_maximum() -> None:
    m = machine()
    to_activating(m)
    m.handle(ActivationUnknown("lost"))
    pauses = []
    for _ in range(8):
        assert m.handle(TargetUnreachable("down")) == [AskHome()]
        (wait,) = m.handle(HomeUnreachable("down"))
        assert isinstance(wait, Wait)
        pauses.append(wait.seconds)
        assert m.handle(WaitOver()) == [AskTarget()]
    assert pauses == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])


@pytest.mark.parametrize(
    ("steps", "state", "expected"),
    [
        (0, "quiescing", []),  # the gate drains or reopens itself
        (1, "checkpointing", [Reopen()]),
        (2, "installing", [Abort(), Reopen()]),
    ],
)
def test_closing_before_activation_undoes_exactly_what_was_done(
    steps: int, state: str, expected: list[Instruction]
) -> None:
    m = machine()
    m.start()
    events: list[Event] = [Drained(0.0), Checkpointed(1)]
    for event in events[:steps]:
        m.handle(event)
    assert m.handle(Cancelled()) == [
        *expected,
        Finish(False, "migration of c1/7 cancelled: the run-time is closing"),
    ]
    assert m.state is State.FAILED and m.failed_after == state


@pytest.mark.parametrize("in_doubt", [False, True], ids=["activating", "in_doubt"])
def test_closing_after_activation_leaves_the_outcome_to_the_home(in_doubt: bool) -> None:
    # An id's home may hold the separator (its local part may not: ids.ObjectId), so
    # the home is everything before the last one.
    m = MigrationMachine("site/home9/7", "c1", "n1", 3, drain_timeout_s=5.0)
    to_activating(m)
    if in_doubt:
        m.handle(ActivationUnknown("lost"))
    assert m.handle(Cancelled()) == [
        Finish(
            False,
            "migration of site/home9/7 to n1 was left in doubt when the run-time closed; "
            "its home site/home9 settles where it runs",
        )
    ]
    assert m.state is State.FAILED and m.finished
    assert m.failed_after == ("in_doubt" if in_doubt else "activating")


def test_an_event_out_of_place_names_the_object_the_event_and_the_state() -> None:
    m = machine()
    with pytest.raises(
        LocalProtocolError, match=r"^migration of c1/7: Drained cannot happen when start$"
    ):
        m.handle(Drained(0.0))
    m.start()
    with pytest.raises(LocalProtocolError, match=r"^migration of c1/7 started twice$"):
        m.start()
    to_done = machine()
    to_activating(to_done)
    to_done.handle(Activated(4))
    with pytest.raises(LocalProtocolError, match=r"^migration of c1/7: Cancelled cannot"):
        to_done.handle(Cancelled())
