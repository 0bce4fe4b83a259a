"""The synthetic filter (``objects/filter.py``) as a stream: with ``wrap`` it starts
again at the object's first byte at the end, so a client can call it for as long as a
benchmark's pass lasts; without, it ends there as before."""

from __future__ import annotations

from typing import Any

from shuttle.objects.filter import SyntheticFilter


class Blocks:
    """An object's bytes behind the storage object's ``read`` (the filter's only use
    of its storage reference)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reads: list[tuple[int, int]] = []

    def read(self, key: str, offset: int, length: int) -> bytes:
        self.reads.append((offset, length))
        return self.data[offset : offset + length]


def make(data: bytes, **params: Any) -> tuple[SyntheticFilter, Blocks]:
    blocks = Blocks(data)
    f = SyntheticFilter(blocks, "k", pass_fraction=0.5, block_bytes=4096, **params)  # type: ignore[arg-type]
    return f, blocks


def test_a_wrapping_filter_starts_again_at_the_end() -> None:
    data = bytes(range(256)) * 40  # 10240 bytes: blocks of 4096, 4096, 2048
    f, blocks = make(data, wrap=True)
    got = [f.next() for _ in range(5)]
    assert got == [data[0:2048], data[4096:6144], data[8192:9216], data[0:2048], data[4096:6144]]
    assert f.blocks == 5 and f.offset == 8192
    # At the end: one read past it, one from the start.
    assert blocks.reads[3:5] == [(10240, 4096), (0, 4096)]


def test_a_filter_that_does_not_wrap_ends() -> None:
    f, _ = make(bytes(5000))
    assert [len(f.next()) for _ in range(4)] == [2048, 452, 0, 0]


def test_a_wrapping_filter_over_an_empty_object_ends() -> None:
    f, blocks = make(b"", wrap=True)
    assert f.next() == b"" and blocks.reads == [(0, 4096)]
