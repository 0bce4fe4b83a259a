"""Runs of zeros are chunked without reading or hashing them, with the same result as
chunking every byte; sparse files hash correctly; extending truncates and writes past
the end, and their recovery, cost what their non-zero bytes cost."""

from __future__ import annotations

import os
import random
from pathlib import Path

import blake3
import pytest

from shuttle import cdc
from shuttle.store import ObjectStore, StoreConfig, chunk_buffer, chunking, object_hash
from shuttle.store.chunking import (
    CHUNK_SIZE_BYTES_MAX,
    ZERO_CHUNK_BYTES,
    RechunkStats,
    file_holes,
    hash_file_only,
    rechunk_file,
)

MAX = CHUNK_SIZE_BYTES_MAX


def composed(seed: int) -> tuple[bytes, list[tuple[int, int]]]:
    """Random bytes and zero runs of sizes around the thresholds, and where the runs are."""
    rng = random.Random(seed)
    parts, zeros, pos = [], [], 0
    for _ in range(rng.randint(1, 4)):
        n = rng.choice([0, 1, 5000, rng.randint(1, 3 * MAX)])
        parts.append(rng.randbytes(n))
        pos += n
        z = rng.choice([0, MAX, 2 * MAX - 1, 2 * MAX, 2 * MAX + 1, rng.randint(0, 6 * MAX)])
        parts.append(bytes(z))
        zeros.append((pos, pos + z))
        pos += z
    return b"".join(parts), zeros


@pytest.mark.parametrize("seed", range(40))
def test_known_zero_runs_give_the_chunks_of_every_byte(seed: int) -> None:
    data, zeros = composed(seed)
    assert chunk_buffer(data, zeros=zeros) == chunk_buffer(data)


def test_a_zero_run_starts_with_the_measured_zero_chunk() -> None:
    assert chunk_buffer(bytes(64 << 20))[0].length == ZERO_CHUNK_BYTES
    for _limit, size_class in cdc.TIERS:  # each size class has its own, its max
        length, digest = cdc.zero_chunk(size_class)
        assert length == size_class.max_bytes and digest == cdc.chunk_hash(bytes(length))
        assert chunk_buffer(bytes(3 * MAX), chunking=size_class)[0].length == length


def sparse_file(path: Path, pieces: list[tuple[int, bytes]], size: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.ftruncate(fd, size)
    for offset, piece in pieces:
        os.pwrite(fd, piece, offset)
    return fd


def test_a_sparse_file_hashes_and_chunks_as_its_bytes(tmp_path: Path) -> None:
    size = 40 * MAX + 12345  # holes not a multiple of the cached zero block
    pieces = [(0, os.urandom(5000)), (17 * MAX + 3, os.urandom(MAX)), (size - 10, b"t" * 10)]
    fd = sparse_file(tmp_path / "f", pieces, size)
    try:
        whole = bytearray(size)
        for offset, piece in pieces:
            whole[offset : offset + len(piece)] = piece
        assert file_holes(fd, 0, size), "this file system reports no holes"
        assert hash_file_only(fd, size) == blake3.blake3(bytes(whole)).digest()
        assert chunking.chunk_file(fd, size) == chunk_buffer(bytes(whole))
    finally:
        os.close(fd)


def test_an_extending_rechunk_does_not_hash_the_zeros(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 9 MiB extended by 16 MiB: both in one size class (another would re-chunk all).
    head = os.urandom(36 * MAX + 777)
    old = chunk_buffer(head)
    new_size = head.__len__() + 64 * MAX
    assert cdc.chunking_for(len(head)) == cdc.chunking_for(new_size)
    fd = sparse_file(tmp_path / "f", [(0, head)], new_size)
    hashed: list[int] = []
    real_hash = chunking.chunk_hash

    def counting(data: chunking.Buffer) -> bytes:
        hashed.append(len(data))
        return real_hash(data)

    monkeypatch.setattr(cdc, "chunk_hash", counting)  # the shared core the store chunks with
    try:
        stats = RechunkStats()
        got = rechunk_file(
            fd,
            old,
            old_size=len(head),
            new_size=new_size,
            changed_start=len(head),
            changed_end=len(head),
            stats=stats,
        )
    finally:
        os.close(fd)
    monkeypatch.undo()
    assert got == chunk_buffer(head + bytes(new_size - len(head)))
    # Only the chunks around the old end were hashed: not the 16 MiB of zeros.
    assert sum(hashed) <= 3 * MAX and stats.bytes_rechunked == sum(hashed)


def test_an_8_gib_truncate_and_its_recovery_skip_the_zeros(root: Path) -> None:
    size = 8 << 30
    store = ObjectStore(root, StoreConfig(cache_capacity_bytes=0))
    try:
        store.put("big", b"head" * 1000)
        store.truncate("big", size)
        assert store.stats()["bytes_rechunked"] < 3 * MAX
        chunks = store.attrs.get("big").chunks  # type: ignore[union-attr]
        assert sum(c.length for c in chunks) == size
        assert chunks[-2].hash == chunks[-3].hash  # zero chunks share their hash
        store.close(checkpoint=False)
        store = ObjectStore(root, StoreConfig(cache_capacity_bytes=0))
        assert store.recovery.records >= 1
        assert store.attrs.get("big").chunks == chunks  # type: ignore[union-attr]
        assert store.read("big", size - 8, 8) == bytes(8)
    finally:
        store.close()
        os.unlink(root / "big")


def test_a_write_past_the_end_and_its_stat_are_exact(root: Path) -> None:
    with ObjectStore(root) as store:
        store.put("o", b"start")
        offset = 40 * MAX + 5
        store.write("o", offset, b"end")
        content = b"start" + bytes(offset - 5) + b"end"
        attrs = store.stat("o")
        assert list(attrs.chunks) == chunk_buffer(content)
        assert attrs.hash == object_hash(content)
        assert store.stats()["bytes_rechunked"] < 4 * MAX
