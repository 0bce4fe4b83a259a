"""A cursor over the lines of a list of objects, read block by block through a
storage reference: what ``grep`` and ``count`` share.

State is plain data (keys, position, the partial line carried between blocks, the
line count), so the objects that hold a cursor checkpoint it with their own state
and resume mid-object after a migration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shuttle.errors import InvalidArgumentError

#: A line longer than this is cut (as if it ended there) so that a file with no
#: newlines cannot make the carry grow without bound. grep has no such limit; no
#: text file comes near it.
LINE_BYTES_MAX = 4 << 20
#: Block read per storage call by default: large enough that per-call overhead is
#: small on a LAN, small enough that a migration waits for at most one block.
BLOCK_BYTES_DEFAULT = 64 << 10


@dataclass(frozen=True, slots=True)
class Piece:
    """Whole lines of one object: ``data`` ends with a newline unless ``final``."""

    key: str
    data: bytes
    #: Lines of ``key`` before ``data`` (so its first line is number ``first_line``+1).
    first_line: int
    final: bool
    #: Bytes read from storage for this piece.
    read_bytes: int


def check_block_bytes(block_bytes: int) -> int:
    if not isinstance(block_bytes, int) or not 1 <= block_bytes <= 16 << 20:
        raise InvalidArgumentError(f"block_bytes must be in 1..16 MiB, got {block_bytes!r}")
    return block_bytes


class LineCursor:
    """Position in ``keys``; a dict of plain values (see :meth:`state`)."""

    def __init__(self, keys: list[str], block_bytes: int = BLOCK_BYTES_DEFAULT) -> None:
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise InvalidArgumentError("keys must be a list of object keys")
        self.keys = keys
        self.block_bytes = check_block_bytes(block_bytes)
        self.index = 0
        self.offset = 0
        self.carry = b""
        self.lines = 0

    @property
    def done(self) -> bool:
        return self.index >= len(self.keys)

    def state(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "block_bytes": self.block_bytes,
            "index": self.index,
            "offset": self.offset,
            "carry": self.carry,
            "lines": self.lines,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LineCursor:
        cursor = cls(list(state["keys"]), int(state["block_bytes"]))
        cursor.index = int(state["index"])
        cursor.offset = int(state["offset"])
        cursor.carry = bytes(state["carry"])
        cursor.lines = int(state["lines"])
        return cursor

    def next_piece(self, storage: Any) -> Piece | None:
        """Read the next block of the current object and return its whole lines (the
        last line is carried to the next block), or None when every key is done."""
        if self.done:
            return None
        key = self.keys[self.index]
        data = storage.read(key, self.offset, self.block_bytes)
        self.offset += len(data)
        final = len(data) < self.block_bytes
        buf = self.carry + data if self.carry else data
        if final:
            whole, self.carry = buf, b""
        else:
            cut = buf.rfind(b"\n")
            if cut < 0 and len(buf) < LINE_BYTES_MAX:
                self.carry = buf
                return Piece(key, b"", self.lines, False, len(data))
            cut = len(buf) - 1 if cut < 0 else cut
            whole, self.carry = buf[: cut + 1], buf[cut + 1 :]
        piece = Piece(key, whole, self.lines, final, len(data))
        if final:
            self.index += 1
            self.offset = 0
            self.lines = 0
        else:
            self.lines += whole.count(b"\n")
        return piece
