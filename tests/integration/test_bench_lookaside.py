"""``shuttle bench lookaside --smoke``: the whole experiment on a generated project at
one bandwidth, through a real node and a real FUSE mount. It runs end to end and
writes the table, JSON and PNG; the figures are the benchmark's, never asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shuttle.faces.mount import fuse_unavailable_reason
from tests.integration.nodeproc import shuttle_cli

_REASON = fuse_unavailable_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=f"no FUSE here: {_REASON}")


@pytest.mark.timeout(180)
def test_lookaside_smoke_builds_over_the_mount_with_each_store(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = shuttle_cli(
        "bench", "lookaside", "--smoke", "--bandwidths", "1Gbit", "--out", str(out), timeout=170
    )
    assert result.returncode == 0, result.stderr.decode() + result.stdout.decode()
    report = json.loads((out / "lookaside.json").read_text())
    assert report["columns"] == ["none", "3", "2", "1"]
    row = report["rows"]["1Gbit"]
    for store in ("none", "3", "2", "1"):
        run = row[store]["runs"][0]
        assert run["seconds"] > 0 and run["counters"]["pyc_files"] == 24  # every module built
    assert "lookaside" not in row["none"]["runs"][0]["counters"]
    current = row["3"]["runs"][0]["counters"]["lookaside"]
    # The store holding the current release supplies every byte: nothing from the node.
    assert current["bytes_from_node"] == 0 and current["verify_failures"] == 0
    assert current["bytes_from_stores"] == report["trees"]["1Gbit"]["bytes"]
    assert (out / "lookaside.png").stat().st_size > 0
    assert "no store" in result.stdout.decode()
