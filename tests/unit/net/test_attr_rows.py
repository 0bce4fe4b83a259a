"""The rows form of many objects' attributes: lossless both ways, the map list still
read, malformed rows refused, and several times smaller than the maps."""

from __future__ import annotations

from typing import Any

import blake3
import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.net.attr_rows import (
    EMPTY_HASH,
    ROWS_FORM,
    decode_rows,
    encode_rows,
    wants_rows,
)

hashes = st.binary(min_size=32, max_size=32)


@st.composite
def attrs(draw: st.DrawFn, *, promises: bool) -> dict[str, Any]:
    """A stat answer as the node gives it: contiguous chunks from 0, maybe a first page
    only, a whole-object hash that is or is not implied by the chunks."""
    lengths = draw(st.lists(st.integers(1, 1 << 20), max_size=5))
    listed = draw(st.integers(0, len(lengths)))
    chunks, offset = [], 0
    for length in lengths[:listed]:
        chunks.append([offset, length, draw(hashes)])
        offset += length
    size = sum(lengths)
    if len(lengths) == 1 == listed and draw(st.booleans()):
        whole = chunks[0][2]  # a one-chunk object: its chunk's hash
    elif size == 0 and draw(st.booleans()):
        whole = EMPTY_HASH
    else:
        whole = draw(hashes)
    out: dict[str, Any] = {
        "key": "",
        "size": size,
        "version": draw(st.integers(0, 2**63)),
        "mtime_ns": draw(st.integers(0, 2**63)),
        "hash": whole,
        "chunks": chunks,
        "chunks_total": len(lengths),
    }
    if promises:
        grant = draw(
            st.none()
            | st.fixed_dictionaries(
                {"seq": st.integers(1, 2**40), "term_s": st.sampled_from([30.0, 30.0, 2.5])}
            )
        )
        out["promise"] = grant
    return out


@settings(max_examples=300, deadline=None)
@given(st.data(), st.booleans())
def test_rows_give_back_exactly_the_maps(data: st.DataObject, promises: bool) -> None:
    entries = data.draw(st.lists(st.none() | attrs(promises=promises), max_size=8))
    keys = [f"dir/file-{i}.py" for i in range(len(entries))]
    for key, entry in zip(keys, entries, strict=True):
        if entry is not None:
            entry["key"] = key
    wire = msgpack.unpackb(msgpack.packb(encode_rows(entries, promises=promises)))
    assert decode_rows(wire, keys) == entries


def test_the_map_list_of_an_older_node_is_read_as_it_is() -> None:
    old = [{"key": "a", "size": 0}, None]
    assert decode_rows(old, ["a", "b"]) == old
    with pytest.raises(ValueError, match="2 entries answered for 3 keys"):
        decode_rows(old, ["a", "b", "c"])
    with pytest.raises(ValueError, match="not a map"):
        decode_rows([{"key": "a"}, 7], ["a", "b"])


def _one_chunk(key: str, data: bytes, seq: int) -> dict[str, Any]:
    h = blake3.blake3(data).digest()
    return {
        "key": key,
        "size": len(data),
        "version": 3,
        "mtime_ns": 1795528094956084780,
        "hash": h,
        "chunks": [[0, len(data), h]],
        "chunks_total": 1,
        "promise": {"seq": seq, "term_s": 30.0},
    }


def test_a_small_file_costs_a_quarter_of_its_map() -> None:
    keys = [f"django/contrib/admin/file_{i}.py" for i in range(20)]
    entries: list[dict[str, Any] | None] = [
        _one_chunk(k, k.encode() * 80, i + 1) for i, k in enumerate(keys)
    ]
    maps = len(msgpack.packb(entries))
    rows = msgpack.packb(encode_rows(entries, promises=True))
    assert len(rows) * 3 < maps  # ~50 bytes a file against ~200
    row = msgpack.unpackb(rows)["rows"][0]
    assert row[3:] == [[], entries[0]["hash"], None, None, 1]  # type: ignore[index]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([1, 2, 3, [], b"x" * 31], "do not agree"),  # not whole hashes
        ([5, 2, 3, [1, 2, 3], b"x" * 32], "do not agree"),  # more lengths than chunks
        ([5, 2, 3, [], b"x" * 64], "do not agree"),  # two chunks, no length
        ([5, 2, 3, [5], b""], "do not agree"),
        ([5, 2, 3, [2, 3], b"x" * 64, None, 3], "none implied"),  # a page: no implied hash
        ([5, 2, 3, [2], b"x" * 64, b"h" * 32, 3], "missing from a partial list"),
        ([1, 2], "malformed attribute row"),
        ("row", "malformed attribute row"),
    ],
)
def test_malformed_rows_are_refused(row: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_rows({"form": ROWS_FORM, "rows": [row]}, ["k"])


def test_answers_in_no_known_form_are_refused() -> None:
    with pytest.raises(ValueError, match="nor the rows1 form"):
        decode_rows({"form": "rows9", "rows": []}, [])
    with pytest.raises(ValueError, match="1 rows answered for 2 keys"):
        decode_rows({"form": ROWS_FORM, "rows": [None]}, ["a", "b"])


def test_only_the_known_form_may_be_asked_for() -> None:
    assert wants_rows({"form": ROWS_FORM}) and not wants_rows({})
    with pytest.raises(ValueError, match="form must be 'rows1' or absent"):
        wants_rows({"form": "columns"})


def test_chunks_that_are_not_contiguous_cannot_be_encoded() -> None:
    entry = _one_chunk("k", b"abc", 1)
    entry["chunks"] = [[1, 3, entry["hash"]]]
    with pytest.raises(ValueError, match="not contiguous"):
        encode_rows([entry], promises=True)


@pytest.mark.parametrize(
    "row",
    [
        [1, 2, 3, [], b"x" * 32, None, None, []],  # a grant with no seq
        [1, 2, 3, [], b"x" * 32, None, None, [7]],  # nor a term
        [1, 2, 3, [], b"x" * 32, None, None, {"seq": 7}],
        [1, 2, 3, [], b"x" * 32, None, None, [7, "30"]],
        [1, 2, 3, [], b"x" * 32, None, None, "7"],
        ["1", 2, 3, [], b"x" * 32],
        [1, None, 3, [], b"x" * 32],
        [1, 2, 3, ["a"], b"x" * 64],
        [1, 2, 3, {}, b"x" * 32],
        [1, 2, 3, [], "x" * 32],
        [1, 2, 3, [], b"x" * 32, b"short"],
        [1, 2, 3, [], b"x" * 32, None, "1"],
        [1, 2, 3, [-1], b"x" * 64],
    ],
)
def test_rows_of_the_wrong_types_are_refused_with_a_value_error(row: Any) -> None:
    """Whatever a (broken or hostile) node sends, the client gets a ValueError (made a
    RemoteProtocolError by the client), never another exception, nor a promise whose
    seq or term it cannot compare."""
    with pytest.raises(ValueError, match="malformed attribute row"):
        decode_rows({"form": ROWS_FORM, "rows": [row], "term_s": 30.0}, ["k"])


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([5, 2, 3, [9], b"x" * 64], "exceed its size"),  # the implied last length < 0
        ([5, 2, 3, [2, 3], b"x" * 64, b"h" * 32, 1], "more chunks than"),
    ],
)
def test_rows_that_do_not_add_up_are_refused(row: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_rows({"form": ROWS_FORM, "rows": [row]}, ["k"])


def test_a_term_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(ValueError, match="term_s must be a number"):
        decode_rows({"form": ROWS_FORM, "rows": [[0, 1, 2, [], b""]], "term_s": "x"}, ["k"])
