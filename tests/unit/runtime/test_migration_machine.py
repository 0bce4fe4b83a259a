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
