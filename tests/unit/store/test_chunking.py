"""Content-defined chunking: determinism, exact coverage, locality, incremental rechunk."""

from __future__ import annotations

import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.cdc import TIERS
from shuttle.store.chunking import (
    CHUNK_SIZE_BYTES_MAX,
    ChunkRef,
    RechunkStats,
    chunk_buffer,
    chunk_hash,
    chunking_for,
    object_hash,
    rechunk,
)


def _random(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _covers(data: bytes, chunks: list[ChunkRef]) -> None:
    chunking = chunking_for(len(data))
    pos = 0
    for c in chunks:
        assert c.offset == pos
        assert 0 < c.length <= chunking.max_bytes
        assert c.hash == chunk_hash(data[c.offset : c.end])
        pos = c.end
    assert pos == len(data)
    for c in chunks[:-1]:
        assert c.length >= chunking.min_bytes


# Sizes that cross the interesting thresholds (min, normal, max, the size classes'
# limits) several times.
_SIZES = st.integers(min_value=0, max_value=1_200_000)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), size=_SIZES)
def test_chunks_cover_the_object_exactly_and_deterministically(seed: int, size: int) -> None:
    data = _random(seed, size)
    first = chunk_buffer(data)
    _covers(data, first)
    assert chunk_buffer(bytes(data)) == first
    assert chunk_buffer(memoryview(data)) == first


def test_empty_object_has_no_chunks_and_the_blake3_of_nothing() -> None:
    assert chunk_buffer(b"") == []
    assert object_hash(b"").hex().startswith("af1349b9")


def test_the_mean_chunk_grows_with_the_object_from_1_to_64_kib() -> None:
    """Each size class's mean chunk is about 1.3 times its normal size (random data),
    from about 1 KiB for small files to about 64 KiB for objects past 32 MiB."""
    means = []
    for limit, chunking in TIERS:
        size = min(limit, 48 << 20)
        chunks = chunk_buffer(_random(7, size))
        mean = sum(c.length for c in chunks) / len(chunks)
        assert chunking.normal_bytes < mean < 2 * chunking.normal_bytes, (limit, mean)
        means.append(mean)
    assert means == sorted(means)
    assert means[0] < 2048 and 48 << 10 < means[-1] < 96 << 10


def test_small_objects_get_small_chunks_and_large_ones_few() -> None:
    assert len(chunk_buffer(_random(1, 10_000))) >= 5  # a source file: several chunks
    assert len(chunk_buffer(_random(1, 64 << 20))) < 1200  # a large object: few


def test_base_offset_shifts_offsets_only() -> None:
    data = _random(3, 300_000)
    shifted = chunk_buffer(data, base_offset=1000)
    assert [(c.offset - 1000, c.length, c.hash) for c in shifted] == [
        (c.offset, c.length, c.hash) for c in chunk_buffer(data)
    ]


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    at=st.integers(0, 100_000),
    insert=st.binary(min_size=1, max_size=5000),
)
def test_an_early_insertion_leaves_most_later_chunks_unchanged(
    seed: int, at: int, insert: bytes
) -> None:
    data = _random(seed, 2_000_000)
    before = {c.hash for c in chunk_buffer(data)}
    after = chunk_buffer(data[:at] + insert + data[at:])
    unchanged = sum(1 for c in after if c.hash in before)
    # The insertion disturbs the chunk it lands in and perhaps a neighbour or two;
    # the ~28 chunks after it re-synchronise.
    assert unchanged >= len(after) - 4


_EDITS = st.one_of(
    st.tuples(st.just("write"), st.integers(0, 700_000), st.binary(min_size=0, max_size=70_000)),
    st.tuples(st.just("truncate"), st.integers(0, 800_000), st.just(b"")),
)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), size=st.integers(0, 600_000), edits=st.lists(_EDITS, max_size=4))
def test_rechunk_equals_chunking_from_scratch(
    seed: int, size: int, edits: list[tuple[str, int, bytes]]
) -> None:
    data = bytearray(_random(seed, size))
    chunks = chunk_buffer(data)
    for kind, at, payload in edits:
        old_size = len(data)
        if kind == "write":
            if at > len(data):
                data.extend(bytes(at - len(data)))
            data[at : at + len(payload)] = payload
            start, end = min(at, old_size), at + len(payload)
        else:
            if at < len(data):
                del data[at:]
            else:
                data.extend(bytes(at - len(data)))
            start = end = min(at, old_size)
        chunks = rechunk(
            chunks, bytes(data), old_size=old_size, changed_start=start, changed_end=end
        )
        assert chunks == chunk_buffer(bytes(data))


def test_rechunk_after_a_small_write_redoes_only_nearby_chunks() -> None:
    data = bytearray(os.urandom(32 * 1024 * 1024))
    chunks = chunk_buffer(data)
    data[10_000_000:10_000_100] = b"x" * 100
    stats = RechunkStats()
    new = rechunk(
        chunks,
        bytes(data),
        old_size=len(data),
        changed_start=10_000_000,
        changed_end=10_000_100,
        stats=stats,
    )
    assert new == chunk_buffer(bytes(data))
    assert stats.chunks_rehashed <= 4
    assert stats.bytes_rechunked <= 4 * CHUNK_SIZE_BYTES_MAX
    assert stats.chunks_reused >= len(chunks) - 4


def test_compiled_chunker_agrees_with_the_pure_python_reference() -> None:
    """pyfastcdc ships its algorithm twice; the Cython build we use must cut exactly where
    the plain-Python one does with our parameters (including forced max-size cuts)."""
    from pyfastcdc.py import FastCDC as Reference

    from shuttle.store.chunking import cut_points

    for _limit, chunking in TIERS:
        ref = Reference(
            chunking.normal_bytes, min_size=chunking.min_bytes, max_size=chunking.max_bytes
        )
        for data in (_random(11, 300_000), bytes(200_000), b"ab" * 100_000):
            expected = [c.offset + c.length for c in ref.cut_buf(data)]
            assert cut_points(data, chunking) == expected
