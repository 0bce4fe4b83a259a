"""The RAID 5 layout, pure: where each file byte lives, and back; the parity rotates."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import InvalidArgumentError
from shuttle.objects.fs.raid_layout import (
    COLUMNS_MAX,
    COLUMNS_MIN,
    UNIT_BYTES_MAX,
    UNIT_BYTES_MIN,
    Raid5Layout,
    check_geometry,
)

LAYOUTS = st.builds(
    Raid5Layout,
    columns=st.integers(COLUMNS_MIN, 8),
    unit_bytes=st.sampled_from([512, 1024, 4096, 32768]),
)


@settings(max_examples=300, deadline=None)
@given(layout=LAYOUTS, offset=st.integers(0, 1 << 40))
def test_a_file_offset_maps_to_a_data_unit_and_back(layout: Raid5Layout, offset: int) -> None:
    stripe, index, column, column_offset = layout.locate(offset)
    assert 0 <= index < layout.data_columns
    assert column != layout.parity_column(stripe)
    assert column_offset // layout.unit_bytes == stripe  # unit s of a column is stripe s
    assert layout.logical(column, column_offset) == offset


@settings(max_examples=100, deadline=None)
@given(layout=LAYOUTS, stripes=st.integers(1, 12))
def test_the_mapping_is_a_bijection_onto_the_data_units(layout: Raid5Layout, stripes: int) -> None:
    """Over whole stripes, file bytes and non-parity column bytes pair up one to one.
    Checked at a stride of a few bytes per unit (every unit, both of its ends)."""
    u = layout.unit_bytes
    probes = [0, 1, u // 2, u - 1]
    seen = set()
    for column in range(layout.columns):
        for stripe in range(stripes):
            for w in probes:
                logical = layout.logical(column, stripe * u + w)
                if column == layout.parity_column(stripe):
                    assert logical is None
                    continue
                assert logical is not None
                assert layout.locate(logical)[2:] == (column, stripe * u + w)
                seen.add(logical)
    expected = {
        s * layout.stripe_bytes + i * u + w
        for s in range(stripes)
        for i in range(layout.data_columns)
        for w in probes
    }
    assert seen == expected


@settings(max_examples=100, deadline=None)
@given(layout=LAYOUTS, start=st.integers(0, 1 << 20))
def test_parity_rotates_through_every_column_left_symmetric(
    layout: Raid5Layout, start: int
) -> None:
    n = layout.columns
    parities = [layout.parity_column(s) for s in range(start, start + n)]
    assert sorted(parities) == list(range(n))  # each column holds parity once per N stripes
    for s in range(start, start + n):
        # left-symmetric: parity moves one column left each stripe, data starts after it
        assert layout.parity_column(s + 1) == (layout.parity_column(s) - 1) % n
        assert layout.data_column(s, 0) == (layout.parity_column(s) + 1) % n
        assert sorted(
            [layout.parity_column(s)] + [layout.data_column(s, i) for i in range(n - 1)]
        ) == list(range(n))


@settings(max_examples=300, deadline=None)
@given(layout=LAYOUTS, offset=st.integers(0, 1 << 30), length=st.integers(0, 300_000))
def test_pieces_tile_a_range_unit_by_unit(layout: Raid5Layout, offset: int, length: int) -> None:
    pieces = layout.pieces(offset, length)
    assert sum(p.length for p in pieces) == length
    at = 0
    for p in pieces:
        assert p.at == at and p.length > 0
        assert p.within >= 0 and p.within + p.length <= layout.unit_bytes
        assert layout.locate(offset + p.at) == (
            p.stripe,
            p.index,
            p.column,
            p.stripe * layout.unit_bytes + p.within,
        )
        at += p.length


def test_stripes_counts_partial_stripes() -> None:
    layout = Raid5Layout(5, 512)
    assert [layout.stripes(n) for n in (0, 1, 2048, 2049)] == [0, 1, 1, 2]


@pytest.mark.parametrize(
    ("columns", "unit_bytes", "says"),
    [
        (2, 32768, "needs 3..16"),
        (COLUMNS_MAX + 1, 32768, "needs 3..16"),
        (5, 3000, "power of two"),
        (5, UNIT_BYTES_MIN // 2, "power of two"),
        (5, UNIT_BYTES_MAX * 2, "power of two"),
        (5, True, "power of two"),
    ],
)
def test_bad_geometry_is_refused_naming_the_rule(columns: int, unit_bytes: int, says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        check_geometry(columns, unit_bytes)
