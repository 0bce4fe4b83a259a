"""``count``: lines, words and bytes of objects (``wc``), and optionally the lines
that match a pattern (``grep -c``). An aggregation: it reads everything and returns
a few numbers, so next to the data it moves almost nothing over the network.
"""

from __future__ import annotations

from typing import Any

from shuttle.objects.grep import BATCH_BYTES_DEFAULT, compile_pattern, matching_lines
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT, LineCursor
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.runtime.refs import Ref


@builtin("count")
class CountObject(MobileObject):
    """Count the lines, words, bytes (and pattern matches) of ``keys``."""

    def __init__(
        self,
        storage: Ref,
        keys: list[str],
        *,
        pattern: str | None = None,
        ignore_case: bool = False,
        block_bytes: int = BLOCK_BYTES_DEFAULT,
        batch_bytes: int = BATCH_BYTES_DEFAULT,
    ) -> None:
        self.pattern = pattern
        self.ignore_case = ignore_case
        self._regex = compile_pattern(pattern, ignore_case) if pattern is not None else None
        self.storage = storage
        self.cursor = LineCursor(keys, block_bytes).state()
        self.batch_bytes = batch_bytes
        self.totals = {"lines": 0, "words": 0, "bytes": 0, "matches": 0}

    def restore(self, data: bytes) -> None:
        super().restore(data)
        if self.pattern is not None:
            self._regex = compile_pattern(self.pattern, self.ignore_case)

    def next(self) -> list[Any]:
        """``[done, totals]`` after counting the next batch."""
        cursor = LineCursor.from_state(self.cursor)
        read = 0
        totals = dict(self.totals)  # committed with the cursor, so a failed read counts nothing
        while read < self.batch_bytes:
            piece = cursor.next_piece(self.storage)
            if piece is None:
                break
            read += piece.read_bytes
            data = piece.data
            totals["bytes"] += len(data)
            totals["lines"] += data.count(b"\n")
            totals["words"] += len(data.split())
            if self._regex is not None:
                totals["matches"] += len(matching_lines(self._regex, piece))
        self.cursor = cursor.state()
        self.totals = totals
        return [cursor.done, dict(totals)]
