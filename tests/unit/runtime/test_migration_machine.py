"""The migration machine as a pure function: events in, instructions out.

Stories first (one per way a step can end), then hypothesis over every interleaving
of replies, losses and timeouts against a model of the target and the home: whatever
happens, at most one copy serves at any moment, the source reopens only when the move
can never take effect, and it switches only when it did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import LocalProtocolError
from shuttle.runtime.migration_machine import (
    IN_DOUBT_PAUSE_S_MAX,
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
    State,
    Switch,
    TargetAnswered,
    TargetUnreachable,
    Wait,
    WaitOver,
)


def machine(epoch: int = 3) -> MigrationMachine:
    return MigrationMachine("c1/7", "c1", "n1", epoch, drain_timeout_s=5.0)


def to_activating(m: MigrationMachine) -> None:
    assert m.start() == [Quiesce(5.0)]
    assert m.handle(Drained(0.01)) == [Checkpoint()]
    assert m.handle(Checkpointed(100)) == [Install()]
    assert m.handle(Installed()) == [Activate()]


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


# --- every interleaving, against a model of the world ----------------------------------


@dataclass
class World:
    """The target and the home as the machine cannot see them.

    The home holds the object at (location, epoch); a commit of this move makes it
    (n1, 4) unless the move was fenced. The target's stage: none, staged, committing
    (its commit sent, outcome unknown to it), active, dropped."""

    home_location: str = "c1"
    home_epoch: int = 3
    fenced: bool = False
    committed: bool = False
    stage: str = "none"
    source_open: bool = True
    source_gone: bool = False
    history: list[str] = field(default_factory=list)

    def serving(self) -> int:
        return int(self.source_open and not self.source_gone) + int(self.stage == "active")

    def commit(self) -> bool:
        if self.fenced or self.committed:
            return self.committed
        self.committed = True
        self.home_location, self.home_epoch = "n1", 4
        return True

    def resolve(self) -> bool:
        if not self.committed:
            self.fenced = True
        return self.committed


def run(choices: st.DataObject, world: World) -> MigrationMachine:
    m = machine()
    pending: list[Instruction] = list(m.start())
    world.source_open = True
    steps = 0
    silences = 0
    finish: Finish | None = None
    while pending:
        steps += 1
        assert steps < 500, "the machine did not finish"
        # Any time, a target whose commit is in doubt may hear from the home itself.
        if world.stage == "committing" and choices.draw(st.booleans(), "target asks home"):
            world.stage = "active" if world.resolve() else "dropped"
        instruction = pending.pop(0)
        world.history.append(type(instruction).__name__)
        event: Event | None = None
        if isinstance(instruction, Quiesce):
            world.source_open = False
            if choices.draw(st.booleans(), "drains"):
                event = Drained(0.01)
            else:
                world.source_open = True  # the gate reopened itself
                event = DrainTimedOut(5.0)
        elif isinstance(instruction, Checkpoint):
            event = (
                Checkpointed(10) if choices.draw(st.booleans(), "ckpt") else CheckpointFailed("x")
            )
        elif isinstance(instruction, Install):
            fate = choices.draw(st.sampled_from(["ok", "lost_reply", "dropped"]), "install")
            if fate != "dropped":
                world.stage = "staged"
            event = Installed() if fate == "ok" else InstallFailed(fate)
        elif isinstance(instruction, Activate):
            fate = choices.draw(
                st.sampled_from(["ok", "lost_reply", "dropped", "home_refuses", "home_silent"]),
                "activate",
            )
            if fate == "dropped" or world.stage != "staged":
                event = ActivationUnknown("no answer")
            elif fate == "home_refuses":
                world.fenced = True
                world.stage = "dropped"
                event = ActivationRefused("fenced", world.home_location, world.home_epoch)
            elif fate == "home_silent":
                world.stage = "committing"
                if choices.draw(st.booleans(), "commit arrived"):
                    world.commit()
                event = ActivationUnknown("home silent")
            else:
                ok = world.commit()
                world.stage = "active" if ok else "dropped"
                if fate == "lost_reply":
                    event = ActivationUnknown("lost")
                elif ok:
                    event = Activated(4)
                else:
                    event = ActivationRefused("fenced", world.home_location, world.home_epoch)
        elif isinstance(instruction, AskTarget):
            if choices.draw(st.booleans(), "target reachable"):
                if world.stage == "active":
                    event = TargetAnswered("active", 4)
                elif world.stage == "staged":
                    world.stage = "dropped"
                    event = TargetAnswered("aborted")
                else:
                    event = TargetAnswered("unknown")
            else:
                event = TargetUnreachable("down")
        elif isinstance(instruction, AskHome):
            # The home is silent for a while, but not for ever (or nothing could end).
            if silences < 6 and choices.draw(st.booleans(), "home silent"):
                silences += 1
                event = HomeUnreachable("down")
            else:
                committed = world.resolve()
                event = HomeAnswered(committed, world.home_location, world.home_epoch)
        elif isinstance(instruction, Wait):
            event = WaitOver()
        elif isinstance(instruction, Abort):
            if world.stage == "staged":
                world.stage = "dropped"
        elif isinstance(instruction, Reopen):
            assert not world.committed, "reopened although the move took effect"
            world.source_open = True
        elif isinstance(instruction, Switch):
            assert world.committed, "switched although the move did not take effect"
            world.source_gone = True
        elif isinstance(instruction, (Drop, Lose)):
            world.source_gone = True
        elif isinstance(instruction, Finish):
            finish = instruction
        assert world.serving() <= 1, f"two copies serve after {world.history}"
        if event is not None:
            pending.extend(m.handle(event))
    assert finish is not None and m.finished
    assert finish.ok == world.committed
    return m


@settings(max_examples=600, deadline=None)
@given(st.data())
def test_any_interleaving_leaves_at_most_one_serving_copy(data: st.DataObject) -> None:
    world = World()
    run(data, world)
    if world.committed:
        # The move took effect: the source's copy is gone, the target serves or will
        # (a stage in doubt asks the home, which says committed).
        assert world.source_gone and world.stage in ("active", "committing")
    else:
        assert world.source_open and not world.source_gone
        assert world.stage != "active"


# --- exactly what each step says (the mutation run's survivors, issue 27) ---------------
# Each test below pins an outcome the stories above only sampled: the whole instruction
# list, the whole error message (it says what happened and what to do), the state and
# what the machine recorded on the way.


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
