"""Leaving a program's start-up files out: path filters on ``trace info|convert``."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from shuttle.cli import app
from shuttle.traces import io
from shuttle.traces.pathfilter import PathFilter, path_filter
from shuttle.traces.record import Op, TraceRecord

RECORDS = [
    TraceRecord(0.0, 0, Op.OPEN, "/usr/lib/libc.so.6"),
    TraceRecord(0.5, 0, Op.READ, "/usr/lib/libc.so.6", 0, 832),
    TraceRecord(1.0, 0, Op.OPEN, "/data/a.txt"),
    TraceRecord(1.5, 0, Op.READ, "/data/a.txt", 0, 100),
    TraceRecord(2.0, 0, Op.OPEN, "/data/b.txt"),
    TraceRecord(2.5, 0, Op.READ, "/etc/locale.alias", 0, 10),
]


def files(records: list[TraceRecord]) -> list[str]:
    return [r.file for r in records]


def test_include_and_exclude_prefixes() -> None:
    keep = PathFilter(include_prefixes=("/data/",), exclude_prefixes=("/data/b",))
    kept = list(keep.apply(RECORDS))
    assert files(kept) == ["/data/a.txt", "/data/a.txt"]
    assert keep.dropped == 4
    # The first kept record is at 0 s, the canonical form.
    assert [r.time for r in kept] == [0.0, 0.5]


def test_file_lists(tmp_path: Path) -> None:
    listed = tmp_path / "startup.txt"
    listed.write_text("# the loader's files\n/usr/lib/libc.so.6\n\n/etc/locale.alias\n")
    kept = list(path_filter(exclude_from=listed).apply(RECORDS))
    assert files(kept) == ["/data/a.txt", "/data/a.txt", "/data/b.txt"]
    only = list(path_filter(include_from=listed).apply(RECORDS))
    assert set(files(only)) == {"/usr/lib/libc.so.6", "/etc/locale.alias"}


def test_no_options_keep_everything() -> None:
    keep = path_filter()
    assert list(keep.apply(RECORDS)) == RECORDS and keep.dropped == 0


def test_info_and_convert_filter_and_report(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    io.write_csv(trace, RECORDS)
    out = tmp_path / "data.csv"
    result = CliRunner().invoke(
        app, ["trace", "convert", str(trace), str(out), "--exclude", "/usr/", "--exclude", "/etc"]
    )
    assert result.exit_code == 0, result.output
    assert files(list(io.read_csv(out))) == ["/data/a.txt", "/data/a.txt", "/data/b.txt"]
    assert "path filter: 3" in result.output
    summary = tmp_path / "info.json"
    result = CliRunner().invoke(
        app, ["trace", "info", str(trace), "--include", "/data/", "--json-out", str(summary)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(summary.read_text())
    assert data["records"] == 3 and data["skipped"] == {"path filter": 3}
