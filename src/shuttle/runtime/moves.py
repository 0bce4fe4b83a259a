"""The record of migrations one run-time took part in: events, last moves, failures.

Three small tables that only ever change together, when a migration ends (or an
arrival is activated): the recent :class:`MigrationEvent` list (``shuttle objects
--watch``, ``Runtime.events``, the quiesce history the placement model reads), when
each object last moved to or from here (the residence rule), and the failed attempts
in a row per object (the back-off). One owner, :class:`MoveHistory`, changed through
:meth:`MoveHistory.record` and :meth:`MoveHistory.arrived` only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("shuttle.runtime")

#: Recent migrations kept for ``shuttle objects --watch`` and the decision log; also
#: the bound on the per-object tables below (an object not seen for this many moves
#: has no residence or back-off left worth keeping).
EVENTS_MAX = 1000
#: Migrations whose quiesce times make the model's history (ABACUS 5.4: "quiesce
#: time history"): recent enough to describe the objects that move now.
QUIESCE_HISTORY = 20


@dataclass(frozen=True)
class MigrationEvent:
    """One migration that happened (or failed), for logs, ``--watch`` and ``--json``."""

    t: float
    rid: str
    source: str
    target: str
    ok: bool
    reason: str
    elapsed_s: float = 0.0
    quiesce_s: float = 0.0
    checkpoint_bytes: int = 0
    error: str = ""
    #: The activation's epoch where the move took effect (0: it did not).
    epoch: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 6),
            "rid": self.rid,
            "from": self.source,
            "to": self.target,
            "ok": self.ok,
            "reason": self.reason,
            "elapsed_s": round(self.elapsed_s, 6),
            "quiesce_s": round(self.quiesce_s, 6),
            "checkpoint_bytes": self.checkpoint_bytes,
            "error": self.error,
            "epoch": self.epoch,
        }


class MoveHistory:
    """Run-time ``runtime_id``'s migrations: events, last moves, failures in a row."""

    def __init__(self, runtime_id: str) -> None:
        self.runtime_id = runtime_id
        self._lock = threading.Lock()
        self._events: deque[MigrationEvent] = deque(maxlen=EVENTS_MAX)
        #: rid -> (monotonic time of the last move to or from here, where it came from)
        self._moves: dict[str, tuple[float, str]] = {}
        #: rid -> (monotonic time of the last failure, failures in a row)
        self._failures: dict[str, tuple[float, int]] = {}

    def record(self, event: MigrationEvent) -> None:
        """A migration this run-time drove (as source) ended, or one arrived here."""
        with self._lock:
            self._events.append(event)
            if event.source == self.runtime_id:
                if event.ok:
                    self._failures.pop(event.rid, None)
                    self._moves[event.rid] = (time.monotonic(), self.runtime_id)
                else:
                    _, count = self._failures.get(event.rid, (0.0, 0))
                    self._failures[event.rid] = (time.monotonic(), count + 1)
            elif event.ok and event.target == self.runtime_id:
                self._moves[event.rid] = (time.monotonic(), event.source)
            for table in (self._moves, self._failures):
                while len(table) > EVENTS_MAX:
                    table.pop(next(iter(table)))  # type: ignore[arg-type]
        level = logging.INFO if event.ok else logging.WARNING
        log.log(
            level,
            "migration %s %s -> %s %s (%.3f s%s)",
            event.rid,
            event.source,
            event.target,
            "done" if event.ok else "failed",
            event.elapsed_s,
            f": {event.error}" if event.error else f"; {event.reason}",
        )

    def events(self) -> list[MigrationEvent]:
        """Oldest first."""
        with self._lock:
            return list(self._events)

    def moved_age_s(self, rid: str, now: float) -> float | None:
        """Seconds since ``rid`` last moved to or from here (None: not recently)."""
        moved = self._moves.get(rid)
        return None if moved is None else now - moved[0]

    def failures(self, rid: str, now: float) -> tuple[float | None, int]:
        """(seconds since the last failed move of ``rid`` from here, failures in a row)."""
        failed = self._failures.get(rid)
        return (None, 0) if failed is None else (now - failed[0], failed[1])

    def mean_quiesce_s(self) -> float | None:
        """Mean quiesce time of this run-time's recent migrations (the model's history)."""
        with self._lock:
            times = [e.quiesce_s for e in self._events if e.ok and e.source == self.runtime_id]
        recent = times[-QUIESCE_HISTORY:]
        return sum(recent) / len(recent) if recent else None
