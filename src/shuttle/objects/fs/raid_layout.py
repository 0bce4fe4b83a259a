"""The RAID 5 layout: where a file's bytes and parity live (pure; no I/O).

N columns, one per node; N - 1 data units and one parity unit per stripe, in
left-symmetric rotation (Linux md's default): stripe ``s`` keeps its parity in column
``N - 1 - s mod N`` and its data units in the columns after it, wrapping. Column ``c``
keeps its unit of every stripe in one key, ``KEY.raid5/c`` (unit ``s`` at
``s * unit_bytes``); ``KEY.raid5/c.record`` holds what :mod:`shuttle.objects.fs.raid`
records about the stripes whose parity is in that column.
"""

from __future__ import annotations

from dataclasses import dataclass

from shuttle.errors import InvalidArgumentError

#: Stripe unit: ABACUS 6.2 used 32 KB.
UNIT_BYTES_DEFAULT = 32 * 1024
#: A disk sector: no RAID stripes finer than that.
UNIT_BYTES_MIN = 512
#: Linux md's largest chunk in common use; one storage call carries one unit or less.
UNIT_BYTES_MAX = 4 << 20
#: Fewer than three columns is mirroring, not RAID 5.
COLUMNS_MIN = 3
#: A reconstruction holds N - 1 units in memory and makes N calls; md allows more, but
#: past 16 a second failure during a rebuild becomes the likely way to lose data.
COLUMNS_MAX = 16


def column_key(key: str, column: int) -> str:
    """The storage key of ``key``'s column ``column``."""
    return f"{key}.raid5/{column}"


def record_key(key: str, column: int) -> str:
    """The storage key of ``key``'s record (size, intents) in column ``column``."""
    return f"{key}.raid5/{column}.record"


def check_geometry(columns: int, unit_bytes: int) -> None:
    """Raise :class:`InvalidArgumentError` unless ``columns`` and ``unit_bytes`` make a
    RAID 5 layout."""
    if isinstance(columns, bool) or not isinstance(columns, int):
        raise InvalidArgumentError(f"columns must be an integer, got {columns!r:.40}")
    if not COLUMNS_MIN <= columns <= COLUMNS_MAX:
        raise InvalidArgumentError(
            f"RAID 5 needs {COLUMNS_MIN}..{COLUMNS_MAX} storage objects (one per node), "
            f"got {columns}"
        )
    if (
        isinstance(unit_bytes, bool)
        or not isinstance(unit_bytes, int)
        or not UNIT_BYTES_MIN <= unit_bytes <= UNIT_BYTES_MAX
        or unit_bytes & (unit_bytes - 1)
    ):
        raise InvalidArgumentError(
            f"unit_bytes must be a power of two in {UNIT_BYTES_MIN}..{UNIT_BYTES_MAX}, "
            f"got {unit_bytes!r:.40}"
        )


@dataclass(frozen=True)
class Piece:
    """The part of a byte range that falls in one stripe unit."""

    stripe: int
    #: Which data unit of the stripe (0 .. N - 2).
    index: int
    column: int
    #: Offset inside the unit.
    within: int
    length: int
    #: Offset of the piece inside the range it was cut from.
    at: int


@dataclass(frozen=True)
class Raid5Layout:
    """Where each byte of a file lives: left-symmetric RAID 5 over ``columns``."""

    columns: int
    unit_bytes: int

    def __post_init__(self) -> None:
        check_geometry(self.columns, self.unit_bytes)

    @property
    def data_columns(self) -> int:
        return self.columns - 1

    @property
    def stripe_bytes(self) -> int:
        """Data bytes per stripe."""
        return self.data_columns * self.unit_bytes

    def parity_column(self, stripe: int) -> int:
        return (self.columns - 1 - stripe) % self.columns

    def data_column(self, stripe: int, index: int) -> int:
        """The column of data unit ``index`` of ``stripe``: the columns after the
        parity, wrapping (left-symmetric: a sequential read visits every column in
        turn)."""
        return (self.parity_column(stripe) + 1 + index) % self.columns

    def locate(self, offset: int) -> tuple[int, int, int, int]:
        """``(stripe, index, column, column offset)`` of file byte ``offset``."""
        stripe, rest = divmod(offset, self.stripe_bytes)
        index, within = divmod(rest, self.unit_bytes)
        return stripe, index, self.data_column(stripe, index), stripe * self.unit_bytes + within

    def logical(self, column: int, column_offset: int) -> int | None:
        """The file offset stored at ``column_offset`` of ``column`` (None: parity)."""
        stripe, within = divmod(column_offset, self.unit_bytes)
        parity = self.parity_column(stripe)
        if column == parity:
            return None
        index = (column - parity - 1) % self.columns
        return stripe * self.stripe_bytes + index * self.unit_bytes + within

    def pieces(self, offset: int, length: int) -> list[Piece]:
        """``offset .. offset + length`` cut at unit boundaries, in file order."""
        out = []
        pos, end = offset, offset + length
        while pos < end:
            stripe, rest = divmod(pos, self.stripe_bytes)
            index, within = divmod(rest, self.unit_bytes)
            n = min(self.unit_bytes - within, end - pos)
            column = self.data_column(stripe, index)
            out.append(Piece(stripe, index, column, within, n, pos - offset))
            pos += n
        return out

    def stripes(self, size: int) -> int:
        """Stripes a file of ``size`` bytes touches."""
        return -(-size // self.stripe_bytes)
