"""nfsdump text: NFS procedures become operations, calls only, hex offsets and counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.errors import TraceFormatError
from shuttle.traces.formats import read_trace
from shuttle.traces.nfsdump import NfsdumpReader
from shuttle.traces.record import Op, TraceRecord
from shuttle.traces.summary import summarize

from .conftest import NFS_HOME, NFS_LAIR

FH = "6189010057570100200000000051d7318acc2b03d24400006189010057570100"


def parse(*lines: str) -> list[TraceRecord]:
    return list(NfsdumpReader().parse(lines))


def test_read_and_write_calls_carry_hex_offset_and_count() -> None:
    records = parse(
        f"999316802.638172 31.03f8 30.0801 U C3 b6dc4183 6 read fh {FH} off 3f0000 count 2000 "
        "con = XXX len = XXX",
        "999316802.638338 30.0801 31.03f8 U R3 b6dc4183 6 read OK ftype 1 count 0 eof 1",
        f"999316802.639497 31.03f5 30.0801 U C3 b8dc4183 7 write fh {FH} off 3ee000 count 4e4 "
        "stable U con = XXX len = XXX",
        f"1037649546.0 33.0370 30.0801 U C2 72cd8ac 8 write fh {FH} begoff 0 offset 2000 "
        "tcount bba con = XXX len = XXX",
    )
    assert [(r.op, r.file, r.offset, r.size, r.client) for r in records] == [
        (Op.READ, FH, 0x3F0000, 0x2000, 0),
        (Op.WRITE, FH, 0x3EE000, 0x4E4, 0),  # same host 31, another port
        (Op.WRITE, FH, 0x2000, 0xBBA, 1),
    ]
    assert records[1].time == pytest.approx(0.001325)


def test_metadata_procedures_map_to_operations() -> None:
    names = {
        "getattr": Op.GETATTR,
        "lookup": Op.LOOKUP,
        "access": Op.ACCESS,
        "readdirp": Op.READDIR,
        "setattr": Op.SETATTR,
        "remove": Op.REMOVE,
        "fsstat": Op.FSSTAT,
    }
    lines = [
        f"1.{i:06d} 31.03f2 30.0801 T C3 {i:x} 1 {name} fh {FH} con = XXX len = XXX"
        for i, name in enumerate(names)
    ]
    assert [r.op for r in parse(*lines)] == list(names.values())


def test_commit_names_its_handle_file_and_null_and_short_packets_are_skipped() -> None:
    reader = NfsdumpReader()
    records = list(
        reader.parse(
            [
                f"1.0 31.03f7 30.0801 T C3 d3 15 commit file {FH} off 0 count 0 con = XXX",
                "2.0 75.9c8b 30.0801 U C3 3e 0 null con = 82 len = 97 con = XXX len = XXX",
                "3.0 116.0320 30.0801 U C3 38 e rename SHORT PACKETcon = 130 len = 400",
            ]
        )
    )
    assert [(r.op, r.file) for r in records] == [(Op.COMMIT, FH)]
    assert reader.skipped == {"null": 1, "short packet": 1}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("hello world", ":1: expected 'TIME SRC DST"),
        ("1.0 31.03f7 30.0801 T C3 d3 99 frobnicate fh ab", "unknown NFS procedure 'frobnicate'"),
        ("1.0 31.03f7 30.0801 T C3 d3 1 getattr con = XXX", "no file handle"),
        ("1.0 31.03f7 30.0801 T C3 d3 6 read fh ab off zz count 1", "hex numbers"),
    ],
)
def test_malformed_lines_name_the_line(line: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        parse(line)


def test_lair_sample_is_mostly_access_and_lookup() -> None:
    reader = NfsdumpReader()
    summary = summarize(read_trace(NFS_LAIR, reader=reader))
    assert summary.records == 159  # every call line, replies skipped
    assert reader.skipped["reply"] == 159
    assert summary.ops[Op.ACCESS] == 79
    assert summary.metadata_fraction > 0.8
    assert 8.0 < summary.duration_s < 9.0


def test_home_sample_reads_when_sorted(tmp_path: Path) -> None:
    summary = summarize(read_trace(NFS_HOME, sort=True))
    assert summary.ops[Op.READ] == 6 and summary.ops[Op.WRITE] == 7
    assert summary.out_of_order == 0
