"""grep's line matching and the line cursor against a plain line-by-line reference:
the same lines, numbers and text for any data, block size and pattern."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.objects.grep import compile_pattern, matching_lines
from shuttle.objects.lines import LineCursor


class FakeStorage:
    """Objects in a dict, read by range (the storage object's read contract)."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects

    def read(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        data = self.objects[key]
        end = len(data) if length is None else offset + length
        return data[offset:end]


def reference(objects: dict[str, bytes], keys: list[str], pattern: str) -> list[list[Any]]:
    """What ``grep -n`` prints, one line at a time."""
    regex = re.compile(pattern.encode())
    out = []
    for key in keys:
        lines = objects[key].split(b"\n")
        if objects[key].endswith(b"\n") or not objects[key]:
            lines.pop()  # a final newline ends a line; an empty object has no lines
        for n, line in enumerate(lines, 1):
            if regex.search(line):
                out.append([key, n, line])
    return out


def run(objects: dict[str, bytes], keys: list[str], pattern: str, block: int) -> list[list[Any]]:
    regex = compile_pattern(pattern, False)
    cursor = LineCursor(keys, block)
    storage = FakeStorage(objects)
    found: list[list[Any]] = []
    while (piece := cursor.next_piece(storage)) is not None:
        found += matching_lines(regex, piece)
        # Resume from plain state, as a migration would.
        cursor = LineCursor.from_state(cursor.state())
    return found


text = st.lists(st.sampled_from([b"a", b"b", b"ab", b"\n", b"\n\n", b" ", b"x"]), max_size=60).map(
    b"".join
)
patterns = st.sampled_from(["a", "ab", "^a", "b$", "^$", "a b", "x|b", "b\\s*a", "a*", "^x*$"])


@settings(max_examples=300, deadline=None)
@given(st.lists(text, min_size=1, max_size=3), patterns, st.integers(1, 9))
def test_matches_equal_a_line_by_line_grep(contents: list[bytes], pattern: str, block: int) -> None:
    objects = {f"k{i}": data for i, data in enumerate(contents)}
    keys = list(objects)
    assert run(objects, keys, pattern, block) == reference(objects, keys, pattern)


def test_a_match_across_a_line_break_counts_only_if_the_line_matches_alone() -> None:
    objects = {"k": b"foo\nbar\nfoo bar\n"}
    assert run(objects, ["k"], "foo\\s+bar", 64) == [["k", 3, b"foo bar"]]
