"""The frame layer's limits (``wire/frames.py``) at exactly their values: a header or
payload at the limit passes, one byte more is refused, both ways. Each test names
the mutants of ``wire/frames.py`` it was seen to fail against (docs/testing.md).
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from shuttle.errors import LimitExceededError, RemoteProtocolError
from shuttle.wire.events import FrameKind
from shuttle.wire.frames import FrameReader, encode_frame
from tests.unit.wire.framehelp import (
    BIG,
    HEADER_MAX,
    PAYLOAD_MAX,
    body,
    exactly,
    frame,
    frames_of,
    reader,
)


def _header_of(size: int) -> list[Any]:
    """A header whose msgpack encoding is exactly ``size`` bytes (size 50..HEADER_MAX)."""
    for pad in range(size, 0, -1):
        header = [1, "op", {"pad": "x" * pad}]
        if len(msgpack.packb(header)) == size:
            return header
    raise AssertionError(f"no header of {size} bytes")


def test_a_header_exactly_at_the_limit_is_sent_and_read() -> None:
    # Mutants: `len(head) > header_bytes_max` and `header_len > self._header_bytes_max`
    # turned into >= (in the encoder, the reader and the fast lane).
    header = _header_of(HEADER_MAX)
    wire = b"".join(
        encode_frame(
            FrameKind.REQUEST, header, header_bytes_max=HEADER_MAX, payload_bytes_max=PAYLOAD_MAX
        )
    )
    assert wire == frame(header)
    r = reader()
    assert r.whole_frame(wire) == (FrameKind.REQUEST, header, b"", 0)
    r.feed(wire)
    assert frames_of(r) == [(FrameKind.REQUEST, header, b"", 0)]


def test_a_header_one_byte_over_the_limit_is_refused_both_ways() -> None:
    header = _header_of(HEADER_MAX + 1)
    with pytest.raises(
        LimitExceededError,
        match=exactly(
            f"frame header is {HEADER_MAX + 1} bytes, over the limit of {HEADER_MAX}; "
            "send fewer or smaller arguments (page listings, move data to the payload)"
        ),
    ):
        encode_frame(
            FrameKind.REQUEST, header, header_bytes_max=HEADER_MAX, payload_bytes_max=PAYLOAD_MAX
        )
    r = reader()
    assert r.whole_frame(frame(header)) is None  # the fast lane leaves it to the long way
    r.feed(frame(header))
    with pytest.raises(
        RemoteProtocolError,
        match=exactly(
            f"frame header of {HEADER_MAX + 1} bytes is over the limit of {HEADER_MAX}; "
            "refusing the stream"
        ),
    ):
        r.next_frame()


def test_a_payload_exactly_at_the_limit_is_sent_and_one_byte_more_is_refused() -> None:
    # Mutants: `payload_len > payload_bytes_max` turned into >= in the encoder and the
    # reader; the refused length reported.
    limit = BIG + 10
    data = body(limit)
    parts = encode_frame(
        FrameKind.REQUEST, [1], data, header_bytes_max=HEADER_MAX, payload_bytes_max=limit
    )
    assert b"".join(parts) == frame([1], data)
    with pytest.raises(
        LimitExceededError,
        match=exactly(
            f"frame payload is {limit + 1} bytes, over the limit of {limit} "
            "one request or answer carries; send less in one call"
        ),
    ):
        encode_frame(
            FrameKind.REQUEST,
            [1],
            data + b"!",
            header_bytes_max=HEADER_MAX,
            payload_bytes_max=limit,
        )
    r = FrameReader(header_bytes_max=HEADER_MAX, payload_bytes_max=limit)
    r.feed(frame([1], data) + frame([2], data + b"!") + frame([3]))
    assert frames_of(r) == [
        (FrameKind.REQUEST, [1], data, 0),
        (FrameKind.REQUEST, [2], b"", limit + 1),  # refused: skipped, its length told
        (FrameKind.REQUEST, [3], b"", 0),
    ]


def test_a_small_refused_payload_is_skipped_as_it_arrives() -> None:
    # A payload over a small limit (below DIRECT_PAYLOAD_BYTES_MIN) goes the refusing way
    # too. Mutants: `payload_len <= self._payload_bytes_max` in the small-frame test
    # deleted or turned; the skip's arithmetic (rest, take, _skip) changed.
    r = FrameReader(header_bytes_max=HEADER_MAX, payload_bytes_max=10)
    wire = frame([1], b"a" * 11) + frame([2], b"b" * 10)
    r.feed(wire[:20])
    assert frames_of(r) == [(FrameKind.REQUEST, [1], b"", 11)]
    for i in range(20, len(wire)):  # the rest a byte at a time
        r.feed(wire[i : i + 1])
    assert frames_of(r) == [(FrameKind.REQUEST, [2], b"b" * 10, 0)]
    assert r.at_frame_boundary()
