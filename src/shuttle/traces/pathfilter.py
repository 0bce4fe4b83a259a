"""Keep or drop a trace's records by the file they name: prefixes and file lists.

A recorded program touches files that are not its work: the interpreter, shared
libraries, locale data, its own start-up files. ``shuttle trace info|convert``
take a :class:`PathFilter` so such records can be left out:

* ``--include PREFIX`` (repeatable): keep only records whose file starts with one
  of the prefixes;
* ``--exclude PREFIX`` (repeatable): drop records whose file starts with one;
* ``--include-from LIST`` / ``--exclude-from LIST``: the same with the exact files
  named in a text file, one per line (blank lines and ``#`` comments ignored).

A record is kept if it passes the includes (when any are given) and matches no
exclude. The kept records keep their order, with the clock rebased so the first
kept record is at 0 s (the canonical form). What the filter drops is counted
(``PathFilter.dropped``), and the command reports it with the reader's own skips.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from shuttle.errors import ConfigError
from shuttle.traces.record import TraceRecord


@dataclass(slots=True)
class PathFilter:
    """Which files' records to keep (see the module docstring)."""

    include_prefixes: tuple[str, ...] = ()
    exclude_prefixes: tuple[str, ...] = ()
    include_files: frozenset[str] | None = None
    exclude_files: frozenset[str] = frozenset()
    #: Records dropped so far.
    dropped: int = field(default=0)

    @property
    def active(self) -> bool:
        """False if the filter keeps everything."""
        return bool(
            self.include_prefixes
            or self.exclude_prefixes
            or self.include_files is not None
            or self.exclude_files
        )

    def keeps(self, file: str) -> bool:
        """True if records of ``file`` pass the filter."""
        if self.include_prefixes or self.include_files is not None:
            included = file.startswith(self.include_prefixes) or (
                self.include_files is not None and file in self.include_files
            )
            if not included:
                return False
        return not (file.startswith(self.exclude_prefixes) or file in self.exclude_files)

    def apply(self, records: Iterable[TraceRecord]) -> Iterator[TraceRecord]:
        """The records that pass, in order, the first at 0 s; counts the others in ``dropped``."""
        if not self.active:
            yield from records
            return
        verdict: dict[str, bool] = {}  # a trace names few files many times
        origin: float | None = None
        for record in records:
            keep = verdict.get(record.file)
            if keep is None:
                keep = verdict[record.file] = self.keeps(record.file)
            if not keep:
                self.dropped += 1
                continue
            if origin is None:
                origin = record.time
            if origin:
                record = dataclasses.replace(record, time=record.time - origin)
            yield record


def read_file_list(path: Path) -> frozenset[str]:
    """The files named in ``path``, one per line (blank lines and ``#`` comments skipped).

    Raises :class:`~shuttle.errors.ConfigError` if the list cannot be read.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read file list {str(path)!r}: {exc.strerror or exc}") from exc
    names = (line.strip() for line in text.splitlines())
    return frozenset(name for name in names if name and not name.startswith("#"))


def path_filter(
    include: Iterable[str] = (),
    exclude: Iterable[str] = (),
    include_from: Path | None = None,
    exclude_from: Path | None = None,
) -> PathFilter:
    """A filter from the command line's options (see the module docstring)."""
    return PathFilter(
        include_prefixes=tuple(include),
        exclude_prefixes=tuple(exclude),
        include_files=read_file_list(include_from) if include_from is not None else None,
        exclude_files=read_file_list(exclude_from) if exclude_from is not None else frozenset(),
    )
