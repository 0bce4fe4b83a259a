"""Block traces: the vSCSI and CSV forms agree, and agree with libCacheSim's reader."""

from __future__ import annotations

import struct
from pathlib import Path

import libcachesim as lcs
import pytest

from shuttle.errors import TraceFormatError
from shuttle.traces.block import DISK_FILE, SECTOR_BYTES, VscsiReader, command_op
from shuttle.traces.formats import read_trace
from shuttle.traces.record import Op

from .conftest import CLOUDPHYSICS_CSV, CLOUDPHYSICS_VSCSI


def test_vscsi_and_csv_forms_hold_the_same_requests() -> None:
    binary = list(read_trace(CLOUDPHYSICS_VSCSI, "vscsi"))
    text = list(read_trace(CLOUDPHYSICS_CSV, "blockcsv"))
    assert len(binary) == len(text) == 113_872
    assert [(r.op, r.offset, r.size) for r in binary] == [(r.op, r.offset, r.size) for r in text]
    # The CSV keeps whole seconds only.
    assert all(abs(b.time - c.time) < 1.0 for b, c in zip(binary, text, strict=True))
    assert sum(r.op is Op.WRITE for r in binary) == 66_898
    assert sum(r.op is Op.READ for r in binary) == 46_974
    assert len({r.offset for r in binary}) == 48_974
    assert {r.file for r in binary} == {DISK_FILE}


def test_vscsi_reader_matches_libcachesim_request_by_request() -> None:
    """libCacheSim reads a vSCSI record as one request: obj_id = lbn, size = bytes."""
    reader = lcs.TraceReader(str(CLOUDPHYSICS_VSCSI), lcs.TraceType.VSCSI_TRACE)
    theirs = [(req.obj_id, req.obj_size, req.op) for req in reader]
    ours = list(read_trace(CLOUDPHYSICS_VSCSI, "vscsi"))
    lcs_op = {Op.READ: lcs.ReqOp.OP_READ, Op.WRITE: lcs.ReqOp.OP_WRITE}
    assert theirs == [(r.offset // SECTOR_BYTES, r.size, lcs_op[r.op]) for r in ours]


def test_vscsi_v2_records_are_read(tmp_path: Path) -> None:
    path = tmp_path / "v2.vscsi"
    rec = struct.Struct("<HHIIIQQQ")
    path.write_bytes(
        rec.pack(0x2A, 0x0200, 1, 4096, 1, 10, 1_000_000, 5)
        + rec.pack(0x28, 0x0200, 2, 512, 1, 20, 1_500_000, 5)
    )
    got = [(r.time, r.op, r.offset, r.size) for r in read_trace(path)]
    assert got == [(0.0, Op.WRITE, 10 * 512, 4096), (0.5, Op.READ, 20 * 512, 512)]


def test_a_record_with_another_version_is_named_by_byte(tmp_path: Path) -> None:
    path = tmp_path / "mixed.vscsi"
    rec = struct.Struct("<IIIHHQQ")
    good = rec.pack(1, 512, 1, 0x28, 0x0100, 1, 1)
    path.write_bytes(good * 3 + rec.pack(1, 512, 1, 0x28, 0x0300, 1, 1))
    with pytest.raises(TraceFormatError, match="byte 96"):
        list(VscsiReader().records(path))


def test_scsi_commands() -> None:
    assert command_op(0x28) is Op.READ and command_op(0x88) is Op.READ
    assert command_op(0x2A) is Op.WRITE and command_op(0x0A) is Op.WRITE
    assert command_op(0x35) is Op.OTHER  # SYNCHRONIZE CACHE
