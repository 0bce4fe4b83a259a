"""Test hooks: pause a run-time at a named step of a migration (the fault tier).

When the environment variable :data:`FAULT_DIR_ENV` names a directory, every step
of the migration protocol (:data:`POINTS`) checks for a file ``POINT.arm`` there
before it is performed (the variable is read at each check, so a process may set
it while it runs). If one exists (naming no object, or this one), the step is
*reached*: the file is taken, ``POINT.hit`` is written (the object's id and this
process's id) and the step waits until ``POINT.go`` appears (or
:data:`HOLD_S_MAX` passes), so that the tier (``tests/faults``) can kill or cut
off a process at exactly that moment. Without the variable, a check is one
attribute read. The same pattern as the atomicity object's crash points.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

#: The directory of arm/hit/go files; unset (the default) turns the hooks off.
FAULT_DIR_ENV = "SHUTTLE_TEST_FAULT_DIR"
#: Longest a reached step waits for its go (the tier always says go sooner, or kills).
HOLD_S_MAX = 60.0
#: How often a held step looks for its go file.
POLL_S = 0.005

#: The protocol's steps, by who performs them (docs/runtime.md, "Fencing").
POINTS = (
    # the source
    "quiesce",
    "checkpoint",
    "install",
    "activate",
    "in-doubt",
    "switch",
    "reopen",
    # the target
    "staged",
    "commit",
    "open",
    # the home
    "home-commit",
    "home-committed",
    "home-reactivate",
    # any host of a durable object
    "persist",
)


def _directory() -> Path | None:
    value = os.environ.get(FAULT_DIR_ENV)
    return Path(value) if value else None


def _take(directory: Path, point: str, rid: str) -> Path | None:
    arm = directory / f"{point}.arm"
    try:
        wanted = arm.read_text().strip()
    except FileNotFoundError:
        return None
    if wanted and wanted != rid:
        return None
    try:
        arm.unlink()
    except FileNotFoundError:
        return None  # another thread took it
    (directory / f"{point}.hit").write_text(f"{rid} {os.getpid()}\n")
    return directory / f"{point}.go"


def reached(point: str, rid: str) -> None:
    """Step ``point`` of object ``rid``'s migration is about to happen (a thread)."""
    directory = _directory()
    if directory is None:
        return
    go = _take(directory, point, rid)
    deadline = time.monotonic() + HOLD_S_MAX
    while go is not None and not go.exists() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    if go is not None:
        go.unlink(missing_ok=True)


async def areached(point: str, rid: str) -> None:
    """:func:`reached`, on the event loop (waiting does not block it)."""
    directory = _directory()
    if directory is None:
        return
    go = _take(directory, point, rid)
    deadline = time.monotonic() + HOLD_S_MAX
    while go is not None and not go.exists() and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    if go is not None:
        go.unlink(missing_ok=True)
