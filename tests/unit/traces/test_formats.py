"""One test suite for every registered trace reader (a new format must add samples here)."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from shuttle.errors import TraceFormatError, UsageError
from shuttle.traces import io
from shuttle.traces.formats import (
    detect_format,
    format_names,
    get_reader,
    in_time_order,
    read_trace,
)
from shuttle.traces.record import Op, TraceRecord

from .conftest import CLOUDPHYSICS_CSV, CLOUDPHYSICS_VSCSI, NFS_LAIR

STRACE_SAMPLE = """\
4242  10:00:00.000100 execve("/bin/cat", ["cat", "a.txt"], 0x7ffd /* 20 vars */) = 0 <0.000300>
4242  10:00:00.000500 openat(AT_FDCWD, "a.txt", O_RDONLY) = 3 <0.000020>
4242  10:00:00.000600 read(3, ""..., 131072) = 5000 <0.000010>
4242  10:00:00.000700 read(3, ""..., 131072) = 0 <0.000005>
4242  10:00:00.000800 close(3) = 0 <0.000004>
4242  10:00:00.000900 +++ exited with 0 +++
"""


def _vscsi(tmp: Path) -> Path:
    path = tmp / "head.vscsi"
    path.write_bytes(CLOUDPHYSICS_VSCSI.read_bytes()[: 200 * 32])
    return path


def _blockcsv(tmp: Path) -> Path:
    path = tmp / "head.csv"
    lines = CLOUDPHYSICS_CSV.read_text().splitlines()[:201]
    path.write_text("\n".join(lines) + "\n")
    return path


def _strace(tmp: Path) -> Path:
    path = tmp / "cat.strace"
    path.write_text(STRACE_SAMPLE)
    return path


def _nfsdump(tmp: Path) -> Path:
    return NFS_LAIR


def _csv(tmp: Path) -> Path:
    path = tmp / "trace.csv"
    records = [
        TraceRecord(0.0, 0, Op.OPEN, "f", 0, 0),
        TraceRecord(0.5, 1, Op.READ, "f", 8192, 8192),
        TraceRecord(1.25, 0, Op.CLOSE, "f", 0, 0),
    ]
    io.write_csv(path, records)
    return path


def _bad_vscsi(tmp: Path) -> tuple[Path, str]:
    path = tmp / "bad.vscsi"
    # Two good v1 records, then a truncated third.
    rec = struct.pack("<IIIHHQQ", 1, 4096, 1, 0x28, 0x0100, 100, 5_000_000)
    path.write_bytes(rec * 2 + rec[:20])
    return path, "byte 64"


def _bad_blockcsv(tmp: Path) -> tuple[Path, str]:
    path = tmp / "bad.csv"
    path.write_text("version,time,op,size,lbn\n1,5,28,4096,100\n1,6,zz,4096,101\n")
    return path, ":3:"


def _bad_strace(tmp: Path) -> tuple[Path, str]:
    path = tmp / "bad.strace"
    path.write_text(STRACE_SAMPLE.replace("4242  10:00:00.000700 read", "garbage read", 1))
    return path, ":4:"


def _bad_nfsdump(tmp: Path) -> tuple[Path, str]:
    path = tmp / "bad.txt"
    lines = NFS_LAIR.read_text().splitlines()[:10]
    lines[6] = "999316802.6 31.03f2 30.0801 U C3 b4dc4183 1"  # cut off before the name
    path.write_text("\n".join(lines) + "\n")
    return path, ":7:"


def _bad_csv(tmp: Path) -> tuple[Path, str]:
    path = tmp / "bad.csv"
    path.write_text("time,client,op,file,offset,size\n0.0,0,read,f,0,10\n0.1,0,frobnicate,f,0,0\n")
    return path, ":3:"


SAMPLES: dict[str, Callable[[Path], Path]] = {
    "vscsi": _vscsi,
    "blockcsv": _blockcsv,
    "strace": _strace,
    "nfsdump": _nfsdump,
    "csv": _csv,
}
MALFORMED: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "vscsi": _bad_vscsi,
    "blockcsv": _bad_blockcsv,
    "strace": _bad_strace,
    "nfsdump": _bad_nfsdump,
    "csv": _bad_csv,
}


@pytest.fixture(params=format_names())
def fmt(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_format_has_samples(fmt: str) -> None:
    assert fmt in SAMPLES and fmt in MALFORMED, f"add a sample and a malformed {fmt} trace"


def test_detects_its_own_sample_and_no_other(fmt: str, tmp_path: Path) -> None:
    assert detect_format(SAMPLES[fmt](tmp_path)) == fmt
    for other, make in SAMPLES.items():
        if other != fmt:
            assert not get_reader(fmt).sniff(make(tmp_path).read_bytes()[:4096]), other


def test_records_are_time_ordered_from_zero_with_valid_fields(fmt: str, tmp_path: Path) -> None:
    records = list(read_trace(SAMPLES[fmt](tmp_path), fmt))
    assert records
    assert records[0].time == 0.0
    assert all(a.time <= b.time for a, b in itertools.pairwise(records))
    for r in records:
        assert isinstance(r.op, Op)
        assert r.offset >= 0 and r.size >= 0 and r.client >= 0 and r.file


def test_canonical_round_trip_keeps_every_record(fmt: str, tmp_path: Path) -> None:
    records = list(read_trace(SAMPLES[fmt](tmp_path), fmt))
    out = tmp_path / "round.csv.gz"
    assert io.write_csv(out, records) == len(records)
    assert list(io.read_csv(out)) == records


def test_malformed_input_names_where(fmt: str, tmp_path: Path) -> None:
    path, where = MALFORMED[fmt](tmp_path)
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path, fmt))
    assert where in str(info.value)
    assert str(path) in str(info.value)


def test_empty_file_is_an_error_or_empty(fmt: str, tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    try:
        assert list(read_trace(path, fmt)) == []
    except TraceFormatError as exc:
        assert str(path) in str(exc)


def test_unknown_format_lists_the_names() -> None:
    with pytest.raises(UsageError, match="strace"):
        get_reader("nope")


def test_undetectable_file_says_pass_format(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(b"\x00\x01\x02hello")
    with pytest.raises(TraceFormatError, match="--format"):
        detect_format(path)


def _rec(t: float) -> TraceRecord:
    return TraceRecord(t, 0, Op.GETATTR, "f")


def test_reorder_window_puts_nearly_ordered_records_in_order() -> None:
    times = [0.0, 0.3, 0.1, 0.2, 1.5, 1.4, 3.0]
    out = [r.time for r in in_time_order(iter(_rec(t) for t in times), window_s=1.0)]
    assert out == sorted(times)


def test_reorder_window_keeps_input_order_of_equal_times() -> None:
    records = [TraceRecord(1.0, c, Op.GETATTR, "f") for c in range(5)]
    assert [r.client for r in in_time_order(iter(records))] == [0, 1, 2, 3, 4]


def test_record_older_than_the_window_is_an_error() -> None:
    with pytest.raises(TraceFormatError, match="--sort"):
        list(in_time_order(iter(_rec(t) for t in [0.0, 5.0, 1.0]), window_s=1.0))


def test_sort_reads_a_concatenated_trace(shared_traces: Path) -> None:
    path = shared_traces / "nfs-samples" / "ellard_home04_011119_subset_dataseries.txt"
    with pytest.raises(TraceFormatError):
        list(read_trace(path))
    records = list(read_trace(path, sort=True))
    assert records[0].time == 0.0
    assert [r.time for r in records] == sorted(r.time for r in records)
