"""What one evaluation of the placement (ABACUS 5.4.3) considered and decided: the
candidates it scored, the moves it judged, and the decision log's JSON record of them.
Pure data, no I/O; :func:`~shuttle.runtime.placement_choice.choose` makes a
:class:`Plan`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from shuttle.runtime.placement_load import Prediction


@dataclass(frozen=True, slots=True)
class Candidate:
    """Stack ``stack_id`` split at ``split``: its benefit over keeping everything
    possible at the client, and what that costs the server."""

    stack_id: str
    split: int
    response_s: float
    benefit_s: float
    server_cpu_s: float
    memory_bytes: int

    @property
    def score(self) -> float:
        """Benefit per server CPU second (the greedy order)."""
        if self.server_cpu_s <= 0:
            return math.inf if self.benefit_s > 0 else 0.0
        return self.benefit_s / self.server_cpu_s


@dataclass(frozen=True, slots=True)
class Move:
    """One stack's change of split, with the arithmetic behind the verdict."""

    stack_id: str
    split_from: int
    split_to: int
    #: Objects (rids) that change side, in the order they should move.
    rids: tuple[str, ...]
    to_server: bool
    benefit_s: float
    cost_s: float
    execute: bool
    reason: str

    @property
    def net_s(self) -> float:
        return self.benefit_s - self.cost_s


@dataclass(frozen=True, slots=True)
class Plan:
    """The outcome of one evaluation: what was considered and what to do."""

    current: Prediction
    best: Prediction
    candidates: tuple[Candidate, ...]
    moves: tuple[Move, ...]
    threshold_s: float
    notes: tuple[str, ...] = field(default=())
    #: The servers whose budget the clients' saturation raised in this evaluation
    #: (read or held; many clients): the next evaluation's ``raised_before``.
    raised: frozenset[str] = field(default=frozenset())

    @property
    def executed(self) -> tuple[Move, ...]:
        return tuple(m for m in self.moves if m.execute)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready record of the evaluation (the decision log's body)."""
        return {
            "threshold_s": round(self.threshold_s, 6),
            "current": _prediction_json(self.current),
            "best": _prediction_json(self.best),
            "candidates": [
                {
                    "stack": c.stack_id,
                    "split": c.split,
                    "response_s": round(c.response_s, 6),
                    "benefit_s": round(c.benefit_s, 6),
                    "server_cpu_s": round(c.server_cpu_s, 6),
                    "memory_bytes": c.memory_bytes,
                    "score": None if math.isinf(c.score) else round(c.score, 4),
                }
                for c in self.candidates
            ],
            "moves": [
                {
                    "stack": m.stack_id,
                    "from_split": m.split_from,
                    "to_split": m.split_to,
                    "objects": list(m.rids),
                    "direction": "to_server" if m.to_server else "to_client",
                    "benefit_s": round(m.benefit_s, 6),
                    "cost_s": round(m.cost_s, 6),
                    "net_s": round(m.net_s, 6),
                    "execute": m.execute,
                    "reason": m.reason,
                }
                for m in self.moves
            ],
            "notes": list(self.notes),
        }


def _prediction_json(p: Prediction) -> dict[str, Any]:
    return {
        "splits": dict(p.placement),
        "response_s": {k: round(v, 6) for k, v in p.response_s.items()},
        "mean_response_s": round(p.mean_response_s, 6),
        "server_load": {k: round(v, 4) for k, v in p.server_load.items()},
        "converged": p.converged,
    }
