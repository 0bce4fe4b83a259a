"""The migration machine against every interleaving of replies, losses and timeouts,
drawn by hypothesis against a model of the target and the home: whatever happens, at
most one copy serves at any moment, the source reopens only when the move can never
take effect, and it switches only when it did.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.runtime.migration_machine import (
    Abort,
    Activate,
    Activated,
    ActivationRefused,
    ActivationUnknown,
    AskHome,
    AskTarget,
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
    Switch,
    TargetAnswered,
    TargetUnreachable,
    Wait,
    WaitOver,
)
from tests.unit.runtime.migration_steps import machine


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
