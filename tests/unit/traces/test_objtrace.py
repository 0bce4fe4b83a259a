"""The trace of one mobile object: records, think time on a fake CPU clock, the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shuttle.errors import ConfigError
from shuttle.sim.sources import load_background, load_mobile
from shuttle.sim.workload import CALL, RETURN, Columns, kind_of
from shuttle.traces import io
from shuttle.traces.objtrace import (
    CONSOLE_FILE,
    ObjectTraceRecorder,
    RecordingStorage,
    read_sidecar,
    write_object_trace,
)
from shuttle.traces.record import Op, TraceRecord


class CpuClock:
    """A thread CPU clock the test moves."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Store:
    """A storage reference that burns fake CPU inside each call (not think time)."""

    def __init__(self, clock: CpuClock) -> None:
        self.clock = clock
        self.data = {"a": b"x" * 10_000, "b": b"y" * 10}

    def read(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        self.clock.t += 0.5  # the call's own CPU: not the program's think time
        end = None if length is None else offset + length
        return self.data[key][offset:end]

    def size(self, key: str) -> int:
        self.clock.t += 0.5
        return len(self.data[key])


def test_the_recorder_keeps_the_cpu_between_calls_and_the_bytes_of_each() -> None:
    clock = CpuClock()
    rec = ObjectTraceRecorder(clock)
    storage: Any = RecordingStorage(Store(clock), rec)
    clock.t += 0.25  # the console before its call
    rec.call(3)
    clock.t += 0.125  # the object thinks
    assert storage.read("a", 0, 8192) == b"x" * 8192
    clock.t += 0.0625
    assert storage.read("a", 8192, 8192) == b"x" * 1808
    assert storage.size("b") == 10
    clock.t += 0.03125
    rec.answer(40)
    assert rec.records == [
        TraceRecord(0.25, 0, Op.CALL, CONSOLE_FILE, 0, 3),
        TraceRecord(0.375, 0, Op.READ, "a", 0, 8192),
        TraceRecord(0.4375, 0, Op.READ, "a", 8192, 1808),
        TraceRecord(0.4375, 0, Op.GETATTR, "b", 0, 0),
        TraceRecord(0.46875, 0, Op.RETURN, CONSOLE_FILE, 0, 40),
    ]
    assert (rec.storage_calls, rec.bytes_read, rec.console_calls) == (3, 10_000, 1)


def test_stacks_are_numbered_in_the_client_column() -> None:
    clock = CpuClock()
    rec = ObjectTraceRecorder(clock)
    rec.call(1)
    rec.stack = 1
    rec.call(1)
    assert [r.client for r in rec.records] == [0, 1]


def test_console_operations_are_neither_blocks_nor_metadata() -> None:
    assert Op.CALL.is_console and Op.RETURN.is_console
    assert not Op.CALL.is_metadata and not Op.CALL.is_block and not Op.RETURN.is_write
    assert not Op.READ.is_console and Op.GETATTR.is_metadata
    assert (kind_of(Op.CALL), kind_of(Op.RETURN)) == (CALL, RETURN)


def test_the_trace_and_its_sidecar_round_trip(tmp_path: Path) -> None:
    clock = CpuClock()
    rec = ObjectTraceRecorder(clock)
    rec.call(3)
    clock.t += 0.5
    rec.answer(7)
    path = tmp_path / "grep.csv.gz"
    side = write_object_trace(path, rec, {"name": "grep", "params": {"pattern": "x"}})
    assert list(io.read_csv(path)) == rec.records
    assert read_sidecar(path) == side == json.loads((tmp_path / "grep.json").read_text())
    assert side["records"] == 2 and side["think_s_total"] == 0.5
    assert side["host"]["cpu_mhz"] >= 0 and side["host"]["hostname"]
    # The simulator reads it as a mobile application, named and timed by its sidecar.
    columns, description = load_mobile(path)
    assert columns.kind.tolist() == [CALL, RETURN]
    assert description["name"] == "grep"


def test_a_trace_of_one_object_cannot_be_the_background(tmp_path: Path) -> None:
    path = tmp_path / "obj.csv"
    io.write_csv(path, [TraceRecord(0.0, 0, Op.CALL, CONSOLE_FILE, 0, 3)])
    with pytest.raises(ConfigError, match="mobile application"):
        load_background(path, {}, 0)
    # Ordinary traces still load.
    io.write_csv(path, [TraceRecord(0.0, 0, Op.READ, "f", 0, 3)])
    source, _ = load_background(path, {}, 0)
    assert sum(len(c) for c in source(0.0, float("inf"))) == 1


def test_columns_of_a_mixed_trace_keep_console_records_out_of_block_accesses() -> None:
    from shuttle.sim.workload import block_accesses

    columns = Columns.from_records(
        [
            TraceRecord(0.0, 0, Op.CALL, CONSOLE_FILE, 0, 100_000),
            TraceRecord(0.0, 0, Op.READ, "f", 0, 8192),
            TraceRecord(0.0, 0, Op.RETURN, CONSOLE_FILE, 0, 100_000),
        ]
    )
    files, _ = block_accesses(columns, 8192)
    assert len(files) == 1
