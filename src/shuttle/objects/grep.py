"""``grep``: a regular-expression search returning the matching lines (``grep -n``).

The console calls :meth:`GrepObject.next` until it says it is done; each call reads
about ``batch_bytes`` through the storage reference and returns the lines that match,
as ``[key, line number, line]`` (the line without its newline). Matches are the
lines in which the pattern matches (Python ``re`` syntax run by the linear-time RE2
engine, :mod:`shuttle.runtime.patterns`, so no pattern can freeze a node; multiline,
so ``^`` and ``$`` anchor at lines); a match found across a line break is re-checked
within its line, as grep sees lines one at a time.

A selective pattern returns far fewer bytes than it reads, so it pays to run next to
the data; a pattern that matches most lines does not. The run-time learns which.
"""

from __future__ import annotations

from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT, LineCursor, Piece
from shuttle.runtime import patterns
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.runtime.refs import Ref

#: Bytes one call reads before it answers (several small objects, or one block).
BATCH_BYTES_DEFAULT = 256 << 10


def compile_pattern(pattern: str, ignore_case: bool) -> Any:
    """``pattern`` for RE2 (:func:`shuttle.runtime.patterns.compile_pattern`)."""
    return patterns.compile_pattern(pattern, ignore_case=ignore_case)


def matching_lines(regex: Any, piece: Piece) -> list[list[Any]]:
    """``[key, line number, line]`` for each line of ``piece`` the pattern matches."""
    data = piece.data
    out: list[list[Any]] = []
    end = len(data)
    pos = 0
    counted_pos, counted_lines = 0, piece.first_line
    while pos < end:
        m = regex.search(data, pos)
        if m is None:
            break
        start = m.start()
        if start >= end:
            break
        line_start = data.rfind(b"\n", 0, start) + 1
        line_end = data.find(b"\n", start)
        if line_end < 0:
            line_end = end
        line = data[line_start:line_end]
        if m.end() <= line_end or regex.search(line) is not None:
            counted_lines += data.count(b"\n", counted_pos, line_start)
            counted_pos = line_start
            out.append([piece.key, counted_lines + 1, line])
        pos = line_end + 1
    return out


@builtin("grep")
class GrepObject(MobileObject):
    """Search ``keys`` (read through ``storage``) for ``pattern``."""

    def __init__(
        self,
        pattern: str,
        storage: Ref,
        keys: list[str],
        *,
        ignore_case: bool = False,
        block_bytes: int = BLOCK_BYTES_DEFAULT,
        batch_bytes: int = BATCH_BYTES_DEFAULT,
    ) -> None:
        if not isinstance(pattern, str):
            raise InvalidArgumentError("pattern must be a string")
        self._regex = compile_pattern(pattern, ignore_case)
        self.pattern = pattern
        self.ignore_case = ignore_case
        self.storage = storage
        self.cursor = LineCursor(keys, block_bytes).state()
        self.batch_bytes = batch_bytes
        self.scanned_bytes = 0
        self.matches = 0

    def restore(self, data: bytes) -> None:
        super().restore(data)
        self._regex = compile_pattern(self.pattern, self.ignore_case)

    def next(self) -> list[Any]:
        """``[done, matches]``: the matching lines of the next batch of input."""
        cursor = LineCursor.from_state(self.cursor)
        found: list[list[Any]] = []
        read = 0
        while read < self.batch_bytes:
            piece = cursor.next_piece(self.storage)
            if piece is None:
                break
            read += piece.read_bytes
            found += matching_lines(self._regex, piece)
        self.cursor = cursor.state()
        self.scanned_bytes += read
        self.matches += len(found)
        return [cursor.done, found]

    def progress(self) -> dict[str, Any]:
        return {
            "keys": len(self.cursor["keys"]),
            "key_index": self.cursor["index"],
            "scanned_bytes": self.scanned_bytes,
            "matches": self.matches,
        }

    def memory_bytes(self) -> int:
        return 2 * int(self.cursor["block_bytes"]) + len(self.cursor["carry"])
