"""A short run of the fault tier inside ``make test``: a few faults at steps of the
migration protocol, no two live copies, nothing acknowledged lost, no unclear error.

The full tier is ``make test-faults`` (1,000 faults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.net.netns import netns_unavailable_reason
from tests.faults.harness import run_points

pytestmark = pytest.mark.netns

#: Four faults take under a minute here (four nodes started, a lease waited out now
#: and then); the rotation's first four with seed 1 cut a target at activate, kill a
#: source at install, cut a target at the home's commit and a source at quiesce.
POINTS = 4


@pytest.mark.timeout(600)
def test_faults_at_protocol_steps_leave_one_copy_and_lose_nothing(tmp_path: Path) -> None:
    reason = netns_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    report = run_points(tmp_path, POINTS, seed=1)
    assert report.problems == []
    assert report.points == POINTS and report.migrations >= POINTS - 1
    assert report.two_live_copies == 0
    assert report.lost_acknowledged_calls == 0
    assert report.unclear_errors == 0
    assert report.ok and report.acknowledged_calls > 0
