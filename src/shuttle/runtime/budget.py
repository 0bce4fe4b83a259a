"""CPU and wall budgets of a built-in object's call at a node.

Built-in objects run in the node's process, on its executor threads (never on the
event loop), for any client a node admits (a keyless node admits everyone). A call
that ran without bound would hold a thread of the node's small pool, and with the
GIL its share of the interpreter, for as long as it liked. So every built-in call at
a node runs under a budget: :data:`CPU_S_PER_CALL` seconds of its thread's CPU and
:data:`WALL_S_PER_CALL` seconds of wall time. Python cannot stop a thread, so the
budget is checked at the call's checkpoints: every call it makes through a reference
(a grep reading its next block from the storage object is one; every built-in that
reads data reads it so) and wherever an object calls :func:`check` in a loop of its
own. Past the budget the call fails with :class:`ObjectLimitError` naming which
budget; the object lives on.

What makes a checkpoint-only budget enough: the built-ins' work between two
checkpoints is bounded by their own design (one block of at most a few MiB, matched
by RE2 in linear time with the GIL released: :mod:`shuttle.runtime.patterns`). A
shipped object, whose code is not ours, runs in a worker the kernel limits instead
(:mod:`shuttle.runtime.sandbox`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from shuttle.errors import ObjectLimitError

#: CPU seconds one built-in call may use. grep, count and the filters answer after a
#: batch of 256 KiB to a few MiB, milliseconds of CPU; ten seconds is a thousand
#: times that, and frees a stuck thread within seconds.
CPU_S_PER_CALL = 10.0
#: Wall seconds one built-in call may take, waits on other nodes and on its own locks
#: included: a directory's commit waits for callbacks (three tries of 150 ms), a RAID
#: write for four other nodes. A minute is far past any of those.
WALL_S_PER_CALL = 60.0


@dataclass(frozen=True, slots=True)
class Budget:
    """What one call may use (seconds of its thread's CPU, seconds of wall time)."""

    cpu_s: float = CPU_S_PER_CALL
    wall_s: float = WALL_S_PER_CALL


class _Running:
    __slots__ = ("budget", "cpu_start_s", "wall_start_s", "who")

    def __init__(self, budget: Budget, who: Callable[[], str]) -> None:
        self.budget = budget
        self.who = who
        self.cpu_start_s = time.thread_time()
        self.wall_start_s = time.monotonic()


_local = threading.local()


@contextmanager
def running(budget: Budget, who: Callable[[], str]) -> Iterator[None]:
    """Run the block under ``budget``; ``who()`` names the call in an error (``object
    n1/7 (grep).next``), made only then.
    A call inside another on the same thread (an object calling another in-process)
    runs under the outer call's budget, which covers the whole chain."""
    if getattr(_local, "call", None) is not None:
        yield
        return
    _local.call = _Running(budget, who)
    try:
        yield
    finally:
        _local.call = None


def check() -> None:
    """Raise :class:`ObjectLimitError` if this thread's call is over its budget; a
    no-op outside a budgeted call."""
    call: _Running | None = getattr(_local, "call", None)
    if call is None:
        return
    cpu_s = time.thread_time() - call.cpu_start_s
    if cpu_s > call.budget.cpu_s:
        _local.call = None  # the error unwinds the call; its callees are not charged
        raise ObjectLimitError(
            f"{call.who()} used more than its CPU budget of {call.budget.cpu_s:g} s in one call "
            "(a built-in object's calls are bounded so no client can hold the node); ask "
            "for less per call"
        )
    wall_s = time.monotonic() - call.wall_start_s
    if wall_s > call.budget.wall_s:
        _local.call = None
        raise ObjectLimitError(
            f"{call.who()} took more than its wall budget of {call.budget.wall_s:g} s in one "
            "call (a built-in object's calls are bounded so no client can hold the node); "
            "ask for less per call"
        )
