"""The recorded mobile application: committed trace, its contract, and a real re-recording."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import pytest

from shuttle.errors import UsageError
from shuttle.traces.agrep import (
    load_agrep_meta,
    load_agrep_trace,
    record_agrep,
    retime,
    sidecar_path,
    tree_files,
)
from shuttle.traces.record import Op, TraceRecord


def test_committed_trace_is_a_whole_sequential_search() -> None:
    records = load_agrep_trace()
    meta = load_agrep_meta()
    assert len(records) == meta["records"]
    assert 1_500 <= meta["tree_files"] <= 2_500  # the stdlib: ~1,800 files
    assert 20e6 <= meta["tree_bytes"] <= 45e6  # ~31 MB
    assert sum(r.size for r in records if r.op is Op.READ) == meta["tree_bytes"]
    # Each file: open, sequential reads from 0 with no gap or overlap, close.
    per_file: dict[str, list[TraceRecord]] = defaultdict(list)
    for r in records:
        per_file[r.file].append(r)
    assert len(per_file) == meta["tree_files"]
    for file, recs in per_file.items():
        assert recs[0].op is Op.OPEN and recs[-1].op is Op.CLOSE, file
        offset = 0
        for r in recs[1:-1]:
            assert r.op is Op.READ and r.offset == offset, file
            offset += r.size
    # Paper: 42% of agrep's requests are metadata; ours opens and closes every file.
    assert 0.35 < meta["metadata_fraction"] < 0.55


def test_committed_timeline_is_pure_think_time() -> None:
    records = load_agrep_trace()
    per_byte = load_agrep_meta()["cpu_s_per_byte"]
    assert 1e-10 < per_byte < 1e-6
    assert records[0].time == 0.0
    for a, b in itertools.pairwise(records):
        gap = b.time - a.time
        expected = a.size * per_byte if a.op is Op.READ else 0.0
        assert gap == pytest.approx(expected, abs=2e-9)


def test_retime_puts_gaps_after_reads_only() -> None:
    records = [
        TraceRecord(5.0, 0, Op.OPEN, "f"),
        TraceRecord(5.1, 0, Op.READ, "f", 0, 1000),
        TraceRecord(5.2, 0, Op.READ, "f", 1000, 500),
        TraceRecord(9.0, 0, Op.CLOSE, "f"),
        TraceRecord(9.5, 0, Op.OPEN, "g"),
    ]
    assert [r.time for r in retime(records, 1e-6)] == [0.0, 0.0, 0.001, 0.0015, 0.0015]


def test_record_agrep_on_a_small_tree(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    (tree / "pkg").mkdir(parents=True)
    (tree / "a.py").write_text("x = 1\n" * 5000)  # 30,000 bytes: several reads
    (tree / "pkg" / "b.py").write_text("file server\n")
    (tree / "pkg" / "notes.txt").write_text("not searched")
    (tree / "site-packages").mkdir()
    (tree / "site-packages" / "c.py").write_text("skipped")
    assert tree_files(tree) == ["a.py", "pkg/b.py"]
    out = tmp_path / "t.csv.gz"
    meta = record_agrep(out, tree=tree, runs=1)
    records = load_agrep_trace(out)
    assert sidecar_path(out).exists() and load_agrep_meta(out) == meta
    assert meta["tree_files"] == 2 and meta["tree_bytes"] == 30_012
    assert [r.op for r in records if r.file == "pkg/b.py"] == [Op.OPEN, Op.READ, Op.CLOSE]
    reads = [r for r in records if r.file == "a.py" and r.op is Op.READ]
    assert len(reads) >= 2 and sum(r.size for r in reads) == 30_000
    assert meta["cpu_s_per_byte"] >= 0.0 and meta["host"]["tre_agrep"].startswith("tre-agrep")


def test_missing_trace_says_how_to_regenerate(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="record-agrep"):
        load_agrep_trace(tmp_path / "nope.csv.gz")
