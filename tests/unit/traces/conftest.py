"""Shared fixtures for the trace tests: real sample traces and where they live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: The real sample traces (a copy of ../shared/traces kept in data/traces/shared, so a
#: fresh clone tests the same data), or wherever SHUTTLE_SHARED_TRACES points.
SHARED_TRACES = Path(
    os.environ.get(
        "SHUTTLE_SHARED_TRACES", Path(__file__).resolve().parents[3] / "data" / "traces" / "shared"
    )
)
CLOUDPHYSICS_VSCSI = SHARED_TRACES / "cloudphysics" / "cloudPhysicsIO.vscsi"
CLOUDPHYSICS_CSV = SHARED_TRACES / "cloudphysics" / "cloudPhysicsIO.csv"
NFS_LAIR = SHARED_TRACES / "nfs-samples" / "ellard_lair62_sample_synoptic_small.txt"
NFS_HOME = SHARED_TRACES / "nfs-samples" / "ellard_home04_011119_subset_dataseries.txt"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not CLOUDPHYSICS_VSCSI.exists():
        pytest.fail(f"the shared traces are missing: {SHARED_TRACES}")
    return SHARED_TRACES
