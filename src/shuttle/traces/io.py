"""Reading and writing the canonical trace form: CSV ``time,client,op,file,offset,size``.

A path ending in ``.gz`` is read and written through gzip (the committed traces are
compressed); ``-`` means standard input or output. Reading is strict: a wrong header,
a row with the wrong number of fields, an unknown operation or a number that does not
parse raises :class:`~shuttle.errors.TraceFormatError` naming the file and line, so a
damaged trace never silently becomes a different workload.

Why CSV and not Parquet: the traces Shuttle reads in bulk are either generated in
memory (the background workload, :mod:`shuttle.traces.background`) or small (the
recorded mobile application, ~10,000 records). ``benchmarks/README.md`` gives the
measured CSV read and write rates; at those rates no trace we use spends more than a
second in I/O, so a columnar format would add a dependency without paying for it.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import sys
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, TextIO, cast

from shuttle.errors import InvalidArgumentError, TraceFormatError, UsageError
from shuttle.traces.record import CSV_COLUMNS, Op, TraceRecord

#: Operation names as they appear in the CSV ``op`` column.
OPS_BY_NAME: dict[str, Op] = {op.value: op for op in Op}

#: Floats are written with ``repr``: the shortest text that reads back to the same
#: float, so a write-read round trip is exact (the tests check it).
_format_time = repr


@contextmanager
def open_text(path: str | Path, mode: str) -> Iterator[TextIO]:
    """Open ``path`` for text reading (``"r"``) or writing (``"w"``).

    ``.gz`` paths go through gzip; ``-`` is stdin/stdout (left open afterwards).
    Raises :class:`~shuttle.errors.UsageError` if the file cannot be opened.
    """
    if mode not in ("r", "w"):
        raise InvalidArgumentError(f"mode must be 'r' or 'w', not {mode!r}")
    if str(path) == "-":
        yield sys.stdin if mode == "r" else sys.stdout
        return
    p = Path(path)
    with ExitStack() as stack:
        try:
            raw: IO[bytes] = stack.enter_context(open(p, mode + "b"))
            if p.suffix == ".gz":
                # mtime=0 keeps compressed output byte-identical across runs.
                gz = gzip.GzipFile(filename="", fileobj=raw, mode=mode + "b", mtime=0)
                raw = cast(IO[bytes], stack.enter_context(gz))
        except OSError as exc:
            raise UsageError(f"cannot open trace {str(p)!r}: {exc.strerror or exc}") from exc
        with io.TextIOWrapper(raw, encoding="utf-8", newline="") as stream:
            yield stream


def read_csv(path: str | Path) -> Iterator[TraceRecord]:
    """Yield the records of a canonical CSV trace in file order.

    Raises :class:`~shuttle.errors.TraceFormatError` (with the line number) on a
    malformed header or row; records before the bad line have already been yielded.
    """
    with open_text(path, "r") as stream:
        yield from parse_csv(stream, name=str(path))


def parse_csv(stream: Iterable[str], name: str = "<trace>") -> Iterator[TraceRecord]:
    """Parse canonical CSV text (header first) from any iterable of lines."""
    rows = csv.reader(stream)
    try:
        header = next(rows)
    except StopIteration:
        raise TraceFormatError(
            f"{name}: empty file; expected the header {','.join(CSV_COLUMNS)}"
        ) from None
    except (csv.Error, UnicodeDecodeError, EOFError, OSError) as exc:
        raise TraceFormatError(f"{name}:1: unreadable header ({exc})") from exc
    if tuple(header) != CSV_COLUMNS:
        raise TraceFormatError(
            f"{name}:1: expected the header {','.join(CSV_COLUMNS)}, got {','.join(header)!r}"
            " (convert other formats with `shuttle trace convert`)"
        )
    ops = OPS_BY_NAME
    record = TraceRecord
    line = 1
    try:
        for line, row in enumerate(rows, start=2):
            try:
                time_s, client, op, file, offset, size = row
                rec = record(float(time_s), int(client), ops[op], file, int(offset), int(size))
            except (ValueError, KeyError) as exc:
                raise TraceFormatError(_explain_row(name, line, row)) from exc
            if rec.offset < 0 or rec.size < 0 or not 0.0 <= rec.time < math.inf:
                raise TraceFormatError(_explain_row(name, line, row))
            yield rec
    except (csv.Error, UnicodeDecodeError, EOFError, OSError) as exc:
        raise TraceFormatError(f"{name}:{line + 1}: unreadable data ({exc})") from exc


def _explain_row(name: str, line: int, row: list[str]) -> str:
    where = f"{name}:{line}"
    if len(row) != len(CSV_COLUMNS):
        return f"{where}: expected {len(CSV_COLUMNS)} fields ({','.join(CSV_COLUMNS)}), got {row!r}"
    time_s, client, op, _file, offset, size = row
    if op not in OPS_BY_NAME:
        return f"{where}: unknown op {op!r}; expected one of {', '.join(OPS_BY_NAME)}"
    for field, text in (("time", time_s), ("client", client), ("offset", offset), ("size", size)):
        try:
            value = float(text) if field == "time" else int(text)
        except ValueError:
            kind = "a number of seconds" if field == "time" else "an integer"
            return f"{where}: {field} must be {kind}, got {text!r}"
        if not 0 <= value < math.inf:
            return f"{where}: {field} must be finite and not negative, got {text!r}"
    return f"{where}: malformed row {row!r}"


def write_csv(path: str | Path, records: Iterable[TraceRecord]) -> int:
    """Write ``records`` as canonical CSV (header first); return how many were written.

    The file is written in full or, if ``records`` raises, left truncated at the
    last complete row (the exception propagates).
    """
    with open_text(path, "w") as stream:
        return format_csv(stream, records)


def format_csv(stream: TextIO, records: Iterable[TraceRecord]) -> int:
    """Write the header and ``records`` to an open text stream."""
    stream.write(",".join(CSV_COLUMNS) + "\n")
    count = 0
    write = stream.write
    fmt = _format_time
    for r in records:
        file = r.file
        if "," in file or '"' in file or "\n" in file or "\r" in file:
            file = '"' + file.replace('"', '""') + '"'
        write(f"{fmt(r.time)},{r.client},{r.op.value},{file},{r.offset},{r.size}\n")
        count += 1
    return count
