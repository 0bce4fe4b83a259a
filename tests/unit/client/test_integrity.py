"""End-to-end content checks without a node: reads checked chunk by chunk as pieces
arrive (in any sizes), nothing handed on before its chunk matched, and writes checked
against what the node reports."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.cdc import chunk_buffer, object_hash
from shuttle.client.integrity import (
    CheckedPieces,
    RangeVerifier,
    UploadHasher,
    check_written,
    payload_hash,
)
from shuttle.client.model import Chunk, ObjectInfo
from shuttle.errors import IntegrityError

DATA = random.Random(7).randbytes(600_000)
CHUNKS = [Chunk(c.offset, c.length, c.hash) for c in chunk_buffer(DATA)]


def pieces_of(data: bytes, sizes: list[int]) -> list[bytes]:
    out, at, i = [], 0, 0
    while at < len(data):
        n = sizes[i % len(sizes)]
        out.append(data[at : at + n])
        at += n
        i += 1
    return out


def feed_all(verifier: RangeVerifier, pieces: list[bytes]) -> list[int]:
    return [verifier.feed(p) for p in pieces]


def test_the_object_has_several_chunks() -> None:
    assert len(CHUNKS) > 4  # else the tests below would prove little


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, len(DATA) - 1),
    span=st.integers(1, len(DATA)),
    sizes=st.lists(st.integers(1, 200_000), min_size=1, max_size=5),
)
def test_a_clean_range_passes_whatever_the_piece_sizes(
    start: int, span: int, sizes: list[int]
) -> None:
    end = min(len(DATA), start + span)
    verifier = RangeVerifier("k", CHUNKS, start, end)
    safes = feed_all(verifier, pieces_of(DATA[start:end], sizes))
    assert safes == sorted(safes)
    assert verifier.finish() == end
    whole = [c for c in CHUNKS if c.offset >= start and c.offset + c.length <= end]
    assert verifier.checked == len(whole)


@settings(max_examples=60, deadline=None)
@given(
    flip=st.integers(0, len(DATA) - 1),
    sizes=st.lists(st.integers(1, 300_000), min_size=1, max_size=4),
)
def test_a_changed_byte_is_caught_before_any_byte_of_its_chunk_is_safe(
    flip: int, sizes: list[int]
) -> None:
    """Over a whole object every byte is in a chunk: a changed one raises, and until it
    does the safe offset never passed the start of the chunk that holds it."""
    changed = bytearray(DATA)
    changed[flip] ^= 0x40
    chunk = next(c for c in CHUNKS if c.offset <= flip < c.offset + c.length)
    verifier = RangeVerifier("k", CHUNKS, 0, len(DATA))
    with pytest.raises(IntegrityError, match="do not match their chunk's hash"):
        for piece in pieces_of(bytes(changed), sizes):
            assert verifier.feed(piece) <= chunk.offset
        verifier.finish()


def test_the_ragged_ends_of_a_range_cannot_be_checked_and_pass() -> None:
    """Bytes outside every whole chunk of the range have no hash to be checked against."""
    first = CHUNKS[1]
    start, end = first.offset + 10, CHUNKS[3].offset + 5  # inside chunk 1 .. inside chunk 3
    changed = bytearray(DATA)
    changed[start] ^= 1  # in the ragged start
    changed[end - 1] ^= 1  # in the ragged end
    verifier = RangeVerifier("k", CHUNKS, start, end)
    assert verifier.feed(bytes(changed[start:end])) == end
    assert verifier.finish() == end and verifier.checked == 1  # chunk 2, whole


def test_a_short_or_long_reply_is_an_error() -> None:
    verifier = RangeVerifier("k", CHUNKS, 0, 1000)
    verifier.feed(DATA[:999])
    with pytest.raises(IntegrityError, match="sent 999 bytes"):
        verifier.finish()
    with pytest.raises(IntegrityError, match="sent 1001 bytes for a range of 1000"):
        RangeVerifier("k", CHUNKS, 0, 1000).feed(DATA[:1001])


def test_a_range_without_chunks_listed_is_safe_at_once() -> None:
    verifier = RangeVerifier("k", [], 0, 100)
    assert verifier.feed(b"x" * 60) == 60
    assert verifier.feed(b"x" * 40) == 100


@settings(max_examples=40, deadline=None)
@given(
    flip=st.integers(0, len(DATA) - 1),
    sizes=st.lists(st.integers(1, 300_000), min_size=1, max_size=4),
)
def test_a_whole_object_without_its_chunk_list_is_checked_against_its_hash(
    flip: int, sizes: list[int]
) -> None:
    """What a client without lookaside stores reads whole: its stat lists no chunk, and
    the object's hash decides at the end (a clean read passes, a changed byte raises)."""
    info = ObjectInfo("k", len(DATA), 1, 0, object_hash(DATA), (), len(CHUNKS))
    clean = RangeVerifier.for_object(info, 0, len(DATA))
    for piece in pieces_of(DATA, sizes):
        clean.feed(piece)
    assert clean.finish() == len(DATA)
    changed = bytearray(DATA)
    changed[flip] ^= 0x10
    verifier = RangeVerifier.for_object(info, 0, len(DATA))
    for piece in pieces_of(bytes(changed), sizes):
        verifier.feed(piece)
    with pytest.raises(IntegrityError, match="do not match the object's hash"):
        verifier.finish()


def test_a_part_of_an_object_without_its_chunk_list_is_not_checked() -> None:
    info = ObjectInfo("k", len(DATA), 1, 0, object_hash(DATA), (), len(CHUNKS))
    verifier = RangeVerifier.for_object(info, 10, 1000)
    verifier.feed(b"\0" * 990)  # nothing to check it against
    assert verifier.finish() == 1000


def test_a_written_object_must_be_the_one_sent() -> None:
    data = os.urandom(1000)
    info = ObjectInfo("k", 1000, 3, 0, object_hash(data))
    assert check_written(info, "k", 1000, payload_hash(data)) is info
    for key, size, digest in (
        ("other", 1000, payload_hash(data)),
        ("k", 999, payload_hash(data)),
        ("k", 1000, payload_hash(data + b"!")),
    ):
        with pytest.raises(IntegrityError, match="where this client sent"):
            check_written(info, key, size, digest)


def test_an_upload_hashes_as_the_whole_object() -> None:
    hasher = UploadHasher()
    for piece in pieces_of(DATA, [100_000, 7]):
        hasher.update(piece)
    assert hasher.size == len(DATA) and hasher.digest() == object_hash(DATA)


@settings(max_examples=40, deadline=None)
@given(
    flip=st.integers(-1, len(DATA) - 1),
    sizes=st.lists(st.integers(1, 200_000), min_size=1, max_size=4),
)
def test_checked_pieces_hand_on_only_checked_pieces_uncopied_and_in_order(
    flip: int, sizes: list[int]
) -> None:
    """What both clients' streams yield: the pieces received (not copies), in order,
    each once every byte of it is checked; with a byte changed (``flip`` >= 0) the
    check raises before a piece that holds any byte of its chunk was handed on."""
    data = bytearray(DATA)
    if flip >= 0:
        data[flip] ^= 0x40
    pieces = pieces_of(bytes(data), sizes)
    checked = CheckedPieces(RangeVerifier("k", CHUNKS, 0, len(DATA)))
    handed: list[bytes | bytearray] = []
    try:
        for piece in pieces:
            handed += checked.add(piece)
        handed += checked.finish()
    except IntegrityError:
        chunk = next(c for c in CHUNKS if c.offset <= flip < c.offset + c.length)
        assert flip >= 0 and sum(map(len, handed)) <= chunk.offset
    else:
        assert flip < 0 and b"".join(handed) == DATA
    assert all(h is p for h, p in zip(handed, pieces, strict=False))
