"""What the fault tier counts (``Report``, written as JSON with ``--json``): the three
figures that must stay at zero (two live copies, lost acknowledged calls, unclear
errors) and everything else reported for reading.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.faults.plan import DURABLE_LEASE_S, NODES


@dataclass
class Report:
    """The tier's figures (``--json``)."""

    points: int = 0
    planned: int = 0
    not_reached: int = 0
    migrations: int = 0
    migrations_ok: int = 0
    two_live_copies: int = 0
    lost_acknowledged_calls: int = 0
    unclear_errors: int = 0
    durable_objects_lost: int = 0
    duplicated_appends: int = 0
    acknowledged_calls: int = 0
    failed_calls: int = 0
    not_settled: int = 0
    non_durable_lost: int = 0
    restarts: int = 0
    #: Node starts that timed out on a loaded machine and were tried again.
    slow_starts: int = 0
    cuts: int = 0
    probes: int = 0
    errors_by_type: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    nodes: int = NODES
    durable_lease_s: float = DURABLE_LEASE_S
    seed: int = 0
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.two_live_copies == 0
            and self.lost_acknowledged_calls == 0
            and self.unclear_errors == 0
            and self.durable_objects_lost == 0
            and self.duplicated_appends == 0
            and self.not_settled == 0
        )

    def problem(self, text: str) -> None:
        if len(self.problems) < 200:
            self.problems.append(text)


def write_json(report: Report, path: Path) -> None:
    path.write_text(json.dumps({**asdict(report), "ok": report.ok}, indent=2) + "\n")
