"""A hosted object's record: one object running (or staged, arriving) on this
run-time (:class:`Hosted`), with how a staged arrival came (:class:`Stage`) and a
durable copy's writes (:class:`PersistState`); and which calls its gate admits while
it quiesces. :mod:`shuttle.runtime.hosting` is the one place a record is built;
:mod:`shuttle.runtime.locations` keeps where the records are.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from shuttle.runtime.gate import Gate, GateState
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.locations import FIRST_EPOCH
from shuttle.runtime.mobile import ObjectManager


@dataclass
class Stage:
    """How a staged arrival came: the move that brought it, from where, at which
    epoch the source held it; and whether its commit at the home was asked for."""

    mid: str
    source: str
    from_epoch: int
    staged_at: float = field(default_factory=time.monotonic)
    #: The commit went out: the outcome is the home's to say, never ours to guess.
    committing: bool = False


@dataclass
class PersistState:
    """A durable copy's writes (group commit: a call is answered once a checkpoint
    taken after it ended is on its home's disk; one write may cover several calls)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    counts: threading.Lock = field(default_factory=threading.Lock)
    #: Calls ended, and the count covered by the last checkpoint written.
    ended: int = 0
    written: int = 0
    #: Hash of the last checkpoint written (an unchanged state is not written again).
    last_hash: bytes = b""
    #: Calls covered by a write whose answer was lost: it may have reached the home.
    #: If the copy then turns out stale, those calls are in doubt, never run again.
    doubtful: int = 0


@dataclass
class Hosted:
    """An object running (or staged, arriving) on this run-time."""

    rid: ObjectId
    home_address: str
    #: A MobileObject (in this process) or a SandboxedObject (a worker process).
    impl: Any
    manager: ObjectManager | None
    type_label: str
    #: Built-in type name, or "" for a shipped class.
    type_name: str
    #: The shipped class (cloudpickle), or None for a built-in.
    code: bytes | None
    migratable: bool
    policy: str
    gate: Gate
    #: Thread-safe objects (the storage object) take calls concurrently.
    concurrent: bool = False
    #: Written to its home's disk before a changing call is answered.
    durable: bool = False
    #: Methods that change nothing a durable object writes.
    readonly: frozenset[str] = frozenset()
    #: The activation this copy belongs to (see docs/runtime.md, "Fencing").
    epoch: int = FIRST_EPOCH
    #: Until when (monotonic) this copy may serve without hearing from its home: a
    #: durable object's lease; infinite where no one else can bring it back.
    lease_until: float = math.inf
    #: The application run-time the object belongs to (whose silence ends it).
    app: str = ""
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: The call chain inside the object now (calls of the same chain re-enter), and
    #: the thread it entered on.
    owner: str | None = None
    owner_thread: int | None = None
    arrived_at: float = field(default_factory=time.monotonic)
    arrived_from: str | None = None
    #: Why it migrated here (the source's reason), for the arrival's event.
    arrival_reason: str = ""
    checkpoint_bytes: int = 0
    #: The principal it acts for: the one whose connection created or brought it (None:
    #: unrestricted). Kept across migrations: it is the identity the source's run-time
    #: authenticates as when it installs the object at the target.
    principal: str | None = None
    #: A staged arrival's move (None once it serves), and the move that brought the
    #: copy that serves (a repeated activate is answered from it).
    stage: Stage | None = None
    arrival_mid: str = ""
    persist: PersistState = field(default_factory=PersistState)

    @property
    def sandboxed(self) -> bool:
        return self.manager is None

    @property
    def movable(self) -> bool:
        return self.migratable and self.policy == "auto"

    @property
    def staged(self) -> bool:
        return self.gate.state is GateState.STAGED

    def serving(self, now: float) -> bool:
        """Whether this copy takes calls now: open, and (durable) within its lease."""
        return self.gate.state is GateState.OPEN and now < self.lease_until

    def memory_bytes(self) -> int:
        try:
            return int(self.impl.memory_bytes())
        except Exception:  # a user object's memory_bytes may fail; it is only a hint
            return 0


def admitted_while_quiescing(hosted: Hosted, method: str) -> bool:
    """Whether a call of ``method`` may enter ``hosted`` while its active calls drain
    (a concurrent built-in object's ``quiesce_admits``; see :mod:`shuttle.runtime.gate`)."""
    if hosted.manager is None or not hosted.concurrent:
        return False
    return method in getattr(type(hosted.impl), "quiesce_admits", frozenset())
