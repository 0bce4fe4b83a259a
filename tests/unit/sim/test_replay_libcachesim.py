"""LRU (and FIFO, CLOCK) hit counts equal libCacheSim's on the CloudPhysics trace, exactly.

libCacheSim reads a vSCSI record as one object (id = lbn, size = bytes) and does not
split requests into blocks; so both sides are handed the same block accesses: our
split of every request into 4 KB blocks, written as a libCacheSim oracleGeneral
trace (object = block, size 1) and read back by libCacheSim's own C reader. A cache
of N bytes of size-1 objects is a cache of N blocks.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shuttle.sim.replay import (
    BlockAccesses,
    libcachesim_replay,
    replay_accesses,
    split_accesses,
    write_oracle_general,
)
from shuttle.traces.formats import read_trace

SHARED = Path(
    os.environ.get(
        "SHUTTLE_SHARED_TRACES", Path(__file__).resolve().parents[3] / "data" / "traces" / "shared"
    )
)
VSCSI = SHARED / "cloudphysics" / "cloudPhysicsIO.vscsi"


@pytest.fixture(scope="module")
def accesses() -> BlockAccesses:
    return split_accesses(read_trace(VSCSI), 4096)


@pytest.fixture(scope="module")
def oracle_trace(accesses: BlockAccesses, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("lcs") / "blocks.oracleGeneral")
    write_oracle_general(accesses, path)
    return path


def test_the_split_trace_is_the_documented_size(accesses: BlockAccesses) -> None:
    assert accesses.requests == 113_872
    assert len(accesses.keys) == 1_141_869  # 4 KB blocks covered by the requests


@pytest.mark.parametrize("size_blocks", [64, 4096, 262_144])
def test_lru_hit_counts_equal_libcachesim(
    accesses: BlockAccesses, oracle_trace: str, size_blocks: int
) -> None:
    ours = replay_accesses(accesses, "lru", size_blocks, 4096)
    theirs = libcachesim_replay(oracle_trace, len(accesses.keys), "lru", size_blocks)
    assert ours.misses == theirs.misses
    assert ours.hits > 0


@pytest.mark.parametrize("policy", ["fifo", "clock"])
def test_fifo_and_clock_hit_counts_equal_libcachesim(
    accesses: BlockAccesses, oracle_trace: str, policy: str
) -> None:
    ours = replay_accesses(accesses, policy, 4096, 4096)
    theirs = libcachesim_replay(oracle_trace, len(accesses.keys), policy, 4096)
    assert ours.misses == theirs.misses
