"""A migration as a state machine with no I/O (the source's side; ABACUS 5.2).

Events in (what a step's reply, loss or timeout turned out to be), instructions out
(what to do next); :mod:`shuttle.runtime.migration` performs the instructions and
feeds back what happened, as dask's worker state machine and our ``wire`` package
do. Nothing here reads a clock, sleeps or sends: the machine can be driven by
tests through every interleaving of replies, losses and timeouts.

The protocol (docs/runtime.md, "Fencing"): the source closes its gate and drains,
checkpoints, installs the state at the target (staged: it cannot serve), and asks it
to activate. The target asks the object's *home* to commit the move (the home takes
it only if the object still runs at the source, at the epoch the source holds), and
opens only if it did. So the move takes effect at one place, the home, and at one
moment. Until the source knows the outcome it keeps its gate closed:

    START --Quiesce--> QUIESCING --Drained--> CHECKPOINTING --Checkpointed--> INSTALLING
    INSTALLING --Installed--> ACTIVATING --Activated--> DONE           (Switch)
    ACTIVATING --ActivationUnknown--> IN_DOUBT                         (AskTarget)
    IN_DOUBT: target says active --> DONE (Switch); target says it never asked the
              home --> FAILED (Reopen); target cannot say --> AskHome; the home says
              committed --> DONE (Switch), not committed --> FAILED (Reopen; the home
              fenced the move, so it can never be committed later); nobody answers
              --> Wait, and ask again. Never a guess.
    any failure before ACTIVATING --> FAILED (Abort the stage, Reopen)

A refusal or a "not committed" that shows the object's current activation is not
the source's (its home brought it back elsewhere from its durable state) ends with
Drop instead of Reopen: the source's copy is stale and must not serve.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from shuttle.errors import LocalProtocolError

#: First pause between two rounds of questions while in doubt; it doubles up to
#: the maximum, so a home that is back is heard within about that long.
IN_DOUBT_PAUSE_S_MIN = 0.05
IN_DOUBT_PAUSE_S_MAX = 2.0


class State(Enum):
    START = "start"
    QUIESCING = "quiescing"
    CHECKPOINTING = "checkpointing"
    INSTALLING = "installing"
    ACTIVATING = "activating"
    IN_DOUBT = "in_doubt"
    DONE = "done"
    FAILED = "failed"


# --- events (what happened) -------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    pass


@dataclass(frozen=True)
class Drained(Event):
    quiesce_s: float


@dataclass(frozen=True)
class DrainTimedOut(Event):
    timeout_s: float


@dataclass(frozen=True)
class Checkpointed(Event):
    nbytes: int


@dataclass(frozen=True)
class CheckpointFailed(Event):
    error: str
    #: The checkpoint took the object with it (a shipped object's worker was stopped).
    object_lost: bool = False


@dataclass(frozen=True)
class Installed(Event):
    pass


@dataclass(frozen=True)
class InstallFailed(Event):
    """Whatever became of the stage, it cannot serve: only our Activate opens it."""

    error: str


@dataclass(frozen=True)
class Activated(Event):
    epoch: int


@dataclass(frozen=True)
class ActivationRefused(Event):
    """The target did not activate and never will; ``location``/``epoch``: what the
    home holds if it was the home that refused ("" when the home was not asked)."""

    reason: str
    location: str = ""
    epoch: int = 0


@dataclass(frozen=True)
class ActivationUnknown(Event):
    """No answer (lost reply, unreachable target, timeout), or the target itself does
    not know whether its commit reached the home."""

    error: str


@dataclass(frozen=True)
class TargetAnswered(Event):
    """The target's answer to "abort, unless you serve it": ``active`` (at
    ``epoch``), ``aborted`` (it dropped the stage without asking the home to commit:
    it never will), or ``unknown`` (its commit is in doubt, or it has no stage)."""

    outcome: str
    epoch: int = 0


@dataclass(frozen=True)
class TargetUnreachable(Event):
    error: str


@dataclass(frozen=True)
class HomeAnswered(Event):
    """The home's resolution of the move: committed at ``epoch``, or not (then fenced:
    never later); ``location``/``epoch`` are its entry; ``known`` False: the home has
    no such object (destroyed, or forgotten as lost)."""

    committed: bool
    location: str
    epoch: int
    known: bool = True


@dataclass(frozen=True)
class HomeUnreachable(Event):
    error: str


@dataclass(frozen=True)
class WaitOver(Event):
    pass


@dataclass(frozen=True)
class Cancelled(Event):
    """The run-time is closing (a migration's task is never cancelled otherwise)."""


# --- instructions (what to do) ------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    pass


@dataclass(frozen=True)
class Quiesce(Instruction):
    """Close the gate and drain the active calls (it reopens itself on a timeout)."""

    timeout_s: float


@dataclass(frozen=True)
class Checkpoint(Instruction):
    pass


@dataclass(frozen=True)
class Install(Instruction):
    pass


@dataclass(frozen=True)
class Activate(Instruction):
    pass


@dataclass(frozen=True)
class AskTarget(Instruction):
    pass


@dataclass(frozen=True)
class AskHome(Instruction):
    pass


@dataclass(frozen=True)
class Wait(Instruction):
    seconds: float


@dataclass(frozen=True)
class Abort(Instruction):
    """Tell the target to drop its stage (best effort: a stage never activated expires)."""


@dataclass(frozen=True)
class Reopen(Instruction):
    """The move did not happen and never will: the source serves again."""


@dataclass(frozen=True)
class Switch(Instruction):
    """The move happened (at ``epoch``): release the source's copy; held calls go on."""

    epoch: int


@dataclass(frozen=True)
class Drop(Instruction):
    """The source's copy is stale (another activation is current): end it unserved."""

    reason: str


@dataclass(frozen=True)
class Lose(Instruction):
    """The object died with its checkpoint: end it and tell its home it is lost."""

    error: str


@dataclass(frozen=True)
class Finish(Instruction):
    ok: bool
    error: str = ""
    epoch: int = 0


# --- the machine ----------------------------------------------------------------------------


class MigrationMachine:
    """The source's side of moving object ``rid`` from ``source`` (where it runs at
    ``epoch``) to ``target``."""

    def __init__(
        self, rid: str, source: str, target: str, epoch: int, *, drain_timeout_s: float
    ) -> None:
        self.rid = rid
        self.source = source
        self.target = target
        self.epoch = epoch
        self.drain_timeout_s = drain_timeout_s
        self.state = State.START
        self.quiesce_s = 0.0
        self.checkpoint_bytes = 0
        #: Where it was when it failed (for the error message).
        self.failed_after = ""
        self._pause_s = IN_DOUBT_PAUSE_S_MIN
        self._table: dict[tuple[State, type[Event]], Callable[[Event], list[Instruction]]] = {
            (State.QUIESCING, Drained): self._drained,
            (State.QUIESCING, DrainTimedOut): self._drain_timed_out,
            (State.CHECKPOINTING, Checkpointed): self._checkpointed,
            (State.CHECKPOINTING, CheckpointFailed): self._checkpoint_failed,
            (State.INSTALLING, Installed): self._installed,
            (State.INSTALLING, InstallFailed): self._install_failed,
            (State.ACTIVATING, Activated): self._activated,
            (State.ACTIVATING, ActivationRefused): self._refused,
            (State.ACTIVATING, ActivationUnknown): self._unknown,
            (State.IN_DOUBT, TargetAnswered): self._target_answered,
            (State.IN_DOUBT, TargetUnreachable): self._target_unreachable,
            (State.IN_DOUBT, HomeAnswered): self._home_answered,
            (State.IN_DOUBT, HomeUnreachable): self._home_unreachable,
            (State.IN_DOUBT, WaitOver): self._wait_over,
        }
        for state in (State.QUIESCING, State.CHECKPOINTING, State.INSTALLING):
            self._table[(state, Cancelled)] = self._cancelled_before_activation
        for state in (State.ACTIVATING, State.IN_DOUBT):
            self._table[(state, Cancelled)] = self._cancelled_in_doubt

    @property
    def finished(self) -> bool:
        return self.state in (State.DONE, State.FAILED)

    @property
    def in_doubt(self) -> bool:
        return self.state is State.IN_DOUBT

    def start(self) -> list[Instruction]:
        if self.state is not State.START:
            raise LocalProtocolError(f"migration of {self.rid} started twice")
        self.state = State.QUIESCING
        return [Quiesce(self.drain_timeout_s)]

    def handle(self, event: Event) -> list[Instruction]:
        """What to do after ``event``; :class:`LocalProtocolError` if it cannot happen
        in this state (an executor's bug, not a network's)."""
        step = self._table.get((self.state, type(event)))
        if step is None:
            raise LocalProtocolError(
                f"migration of {self.rid}: {type(event).__name__} cannot happen when "
                f"{self.state.value}"
            )
        return step(event)

    # --- before the target could serve: failures roll back --------------------------------

    def _fail(self, error: str, *instructions: Instruction) -> list[Instruction]:
        self.failed_after = self.state.value
        self.state = State.FAILED
        return [*instructions, Finish(False, error)]

    def _drained(self, event: Event) -> list[Instruction]:
        assert isinstance(event, Drained)
        self.quiesce_s = event.quiesce_s
        self.state = State.CHECKPOINTING
        return [Checkpoint()]

    def _drain_timed_out(self, event: Event) -> list[Instruction]:
        assert isinstance(event, DrainTimedOut)
        return self._fail(
            f"migration of {self.rid} cancelled: its active calls did not drain within "
            f"{event.timeout_s:g} s; it keeps running on {self.source}"
        )  # the gate reopened itself

    def _checkpointed(self, event: Event) -> list[Instruction]:
        assert isinstance(event, Checkpointed)
        self.checkpoint_bytes = event.nbytes
        self.state = State.INSTALLING
        return [Install()]

    def _checkpoint_failed(self, event: Event) -> list[Instruction]:
        assert isinstance(event, CheckpointFailed)
        if event.object_lost:
            return self._fail(
                f"object {self.rid} was lost while it was checkpointed for migration to "
                f"{self.target}: {event.error}; create it again (with less state, or "
                "larger sandbox limits)",
                Lose(event.error),
            )
        return self._fail(self._kept(event.error), Reopen())

    def _installed(self, event: Event) -> list[Instruction]:
        self.state = State.ACTIVATING
        return [Activate()]

    def _install_failed(self, event: Event) -> list[Instruction]:
        assert isinstance(event, InstallFailed)
        return self._fail(self._kept(event.error), Abort(), Reopen())

    def _cancelled_before_activation(self, event: Event) -> list[Instruction]:
        extra: list[Instruction] = [Abort()] if self.state is State.INSTALLING else []
        if self.state is not State.QUIESCING:
            extra.append(Reopen())
        return self._fail(f"migration of {self.rid} cancelled: the run-time is closing", *extra)

    def _kept(self, error: str) -> str:
        return (
            f"migration of {self.rid} to {self.target} failed after {self.state.value} "
            f"({error}); it keeps running on {self.source} with its state"
        )

    # --- activation: the outcome is the home's --------------------------------------------

    def _activated(self, event: Event) -> list[Instruction]:
        assert isinstance(event, (Activated, TargetAnswered, HomeAnswered))
        self.state = State.DONE
        return [Switch(event.epoch), Finish(True, epoch=event.epoch)]

    def _refused(self, event: Event) -> list[Instruction]:
        assert isinstance(event, ActivationRefused)
        return self._not_committed(event.reason, event.location, event.epoch)

    def _not_committed(self, reason: str, location: str, epoch: int) -> list[Instruction]:
        current = not location or (location == self.source and epoch == self.epoch)
        if current:
            return self._fail(self._kept(reason), Abort(), Reopen())
        stale = (
            f"object {self.rid}'s copy on {self.source} (epoch {self.epoch}) is stale: its "
            f"home holds it on {location or 'nowhere'} at epoch {epoch}"
        )
        return self._fail(f"migration of {self.rid} failed: {stale}", Abort(), Drop(stale))

    def _unknown(self, event: Event) -> list[Instruction]:
        self.state = State.IN_DOUBT
        return [AskTarget()]

    def _target_answered(self, event: Event) -> list[Instruction]:
        assert isinstance(event, TargetAnswered)
        if event.outcome == "active":
            return self._activated(event)
        if event.outcome == "aborted":
            return self._fail(
                self._kept("the target dropped the object before activating it"), Reopen()
            )
        return [AskHome()]

    def _target_unreachable(self, event: Event) -> list[Instruction]:
        return [AskHome()]

    def _home_answered(self, event: Event) -> list[Instruction]:
        assert isinstance(event, HomeAnswered)
        if event.committed:
            return self._activated(event)
        if not event.known:
            gone = f"its home no longer knows object {self.rid} (destroyed or lost)"
            return self._fail(f"migration of {self.rid} failed: {gone}", Abort(), Drop(gone))
        return self._not_committed(
            "its home says the move did not happen", event.location, event.epoch
        )

    def _home_unreachable(self, event: Event) -> list[Instruction]:
        pause = self._pause_s
        self._pause_s = min(self._pause_s * 2, IN_DOUBT_PAUSE_S_MAX)
        return [Wait(pause)]

    def _wait_over(self, event: Event) -> list[Instruction]:
        return [AskTarget()]

    def _cancelled_in_doubt(self, event: Event) -> list[Instruction]:
        # Never a guess: the gate stays closed; the object's home or the target
        # settles it (a staged copy asks the home itself).
        self.failed_after = self.state.value
        self.state = State.FAILED
        return [
            Finish(
                False,
                f"migration of {self.rid} to {self.target} was left in doubt when the "
                f"run-time closed; its home {self.rid.rpartition('/')[0]} settles where it runs",
            )
        ]
