"""What the migration machine's tests share: a machine for one move of ``c1/7`` from
``c1`` to ``n1`` (drain timeout 5 s), and the steps that take it to activating."""

from __future__ import annotations

from shuttle.runtime.migration_machine import (
    Activate,
    Checkpoint,
    Checkpointed,
    Drained,
    Install,
    Installed,
    MigrationMachine,
    Quiesce,
)


def machine(epoch: int = 3) -> MigrationMachine:
    return MigrationMachine("c1/7", "c1", "n1", epoch, drain_timeout_s=5.0)


def to_activating(m: MigrationMachine) -> None:
    assert m.start() == [Quiesce(5.0)]
    assert m.handle(Drained(0.01)) == [Checkpoint()]
    assert m.handle(Checkpointed(100)) == [Install()]
    assert m.handle(Installed()) == [Activate()]
