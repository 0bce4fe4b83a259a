"""The canonical CSV form: exact round trips and errors that name the line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import TraceFormatError, UsageError
from shuttle.traces import io
from shuttle.traces.record import CSV_COLUMNS, Op, TraceRecord

records_strategy = st.builds(
    TraceRecord,
    time=st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False),
    client=st.integers(min_value=0, max_value=2**31),
    op=st.sampled_from(list(Op)),
    file=st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
        min_size=1,
        max_size=30,
    ),
    offset=st.integers(min_value=0, max_value=2**62),
    size=st.integers(min_value=0, max_value=2**40),
)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(records_strategy, max_size=30), gz=st.booleans())
def test_write_then_read_is_exact(
    records: list[TraceRecord], gz: bool, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = tmp_path_factory.mktemp("rt") / ("t.csv.gz" if gz else "t.csv")
    assert io.write_csv(path, records) == len(records)
    assert list(io.read_csv(path)) == records


def test_header_is_the_contract(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    io.write_csv(path, [TraceRecord(0.25, 3, Op.READ, "a/b.py", 8192, 100)])
    assert path.read_text().splitlines() == [
        ",".join(CSV_COLUMNS),
        "0.25,3,read,a/b.py,8192,100",
    ]


def test_gzip_output_is_byte_identical_across_runs(tmp_path: Path) -> None:
    records = [TraceRecord(float(i), 0, Op.GETATTR, f"f{i}") for i in range(100)]
    a, b = tmp_path / "a.csv.gz", tmp_path / "b.csv.gz"
    io.write_csv(a, records)
    io.write_csv(b, records)
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty file"),
        ("time,client,op\n", "expected the header"),
        ("time,client,op,file,offset,size\n0,0,read,f,0\n", ":2: expected 6 fields"),
        ("time,client,op,file,offset,size\n0,0,read,f,0,1\n1,0,write,f,x,1\n", ":3: offset"),
        ("time,client,op,file,offset,size\nsoon,0,read,f,0,1\n", ":2: time"),
        ("time,client,op,file,offset,size\n0,0,read,f,-4,1\n", ":2: offset must be"),
        ("time,client,op,file,offset,size\n-1,0,read,f,4,1\n", ":2: time must be"),
        ("time,client,op,file,offset,size\n0,0,peek,f,4,1\n", ":2: unknown op 'peek'"),
    ],
)
def test_malformed_rows_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceFormatError, match=message):
        list(io.read_csv(path))


def test_records_before_a_bad_line_are_delivered(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("time,client,op,file,offset,size\n0,0,read,f,0,1\n1,0,nope,f,0,1\n")
    got: list[TraceRecord] = []
    with pytest.raises(TraceFormatError):
        for r in io.read_csv(path):
            got.append(r)
    assert got == [TraceRecord(0.0, 0, Op.READ, "f", 0, 1)]


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot open trace"):
        list(io.read_csv(tmp_path / "nope.csv"))


def test_corrupt_gzip_is_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "t.csv.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(TraceFormatError):
        list(io.read_csv(path))
