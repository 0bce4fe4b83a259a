"""The frame reader's fast lane (``FrameReader.whole_frame``): it takes exactly one
whole small frame from one chunk and leaves everything else (undecodable or deep
headers, anything pending) to the long way. Each test names the mutants of
``wire/frames.py`` it was seen to fail against (docs/testing.md).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest

from shuttle.errors import RemoteProtocolError
from shuttle.wire.events import FrameKind
from shuttle.wire.frames import FrameReader, nested_too_deep
from shuttle.wire.limits import HEADER_DEPTH_MAX
from tests.unit.wire.framehelp import BIG, HEADER_MAX, body, frame, frames_of, reader


def test_the_fast_lane_takes_exactly_one_whole_small_frame() -> None:
    # Mutants: each of whole_frame's refusals deleted or turned (a frame with something
    # after it, a payload at DIRECT_PAYLOAD_BYTES_MIN, a non-bytes chunk, a pending frame).
    r = reader()
    one = frame([1, "read", {"k": 1}], b"p" * 10)
    assert r.whole_frame(one) == (FrameKind.REQUEST, [1, "read", {"k": 1}], b"p" * 10, 0)
    assert r.whole_frame(frame([1])) == (FrameKind.REQUEST, [1], b"", 0)
    assert r.whole_frame(one + frame([2])) is None  # two frames: the long way
    assert r.whole_frame(one[:-1]) is None  # not whole
    assert r.whole_frame(one[:5]) is None  # not even a prefix
    assert r.whole_frame(bytearray(one)) is None  # only bytes, which cannot change
    assert r.whole_frame(frame([1], body(BIG))) is None
    assert r.whole_frame(frame([1], body(BIG - 1))) == (FrameKind.REQUEST, [1], body(BIG - 1), 0)
    tight = FrameReader(header_bytes_max=HEADER_MAX, payload_bytes_max=5)
    assert tight.whole_frame(frame([1], b"123456")) is None
    assert tight.whole_frame(frame([1], b"12345")) == (FrameKind.REQUEST, [1], b"12345", 0)
    assert r.whole_frame(frame([1], b"", kind=FrameKind.RESPONSE)) == (
        FrameKind.RESPONSE,
        [1],
        b"",
        0,
    )
    r.feed(one[:3])  # something pending: the lane must not jump the queue
    assert r.whole_frame(one) is None


def test_the_fast_lane_leaves_undecodable_or_deep_headers_to_the_long_way() -> None:
    deep: Any = 0
    for _ in range(HEADER_DEPTH_MAX + 1):
        deep = [deep]
    for wire in (
        struct.pack(">2sBBII", b"SH", 3, 0, 1, 0) + b"\xc1",
        frame(deep),
    ):
        r = reader(header_max=1 << 10)
        assert r.whole_frame(wire) is None
        r.feed(wire)
        with pytest.raises(RemoteProtocolError):
            r.next_frame()


def test_nesting_is_measured_exactly() -> None:
    # Mutants: nested_too_deep's level arithmetic, `inner += item.values()`.
    assert not nested_too_deep([[1]], 2)
    assert nested_too_deep([[[1]]], 2)
    assert nested_too_deep({"a": {"b": {"c": 1}}}, 2)
    assert not nested_too_deep({"a": {"b": 1}}, 2)
    assert not nested_too_deep(5, 0)
    assert nested_too_deep([], 0)


def test_the_fast_lane_waits_behind_anything_pending() -> None:
    # Mutants: whole_frame's pending tests joined with `and` (`pos != len(buf) and skip`,
    # `payload is not None and parts is not None`): a small frame overtook a large one.
    small = frame([9, "ping", {}])
    for grow in (False, True):
        r = reader(grow=grow)
        r.feed(frame([1], body(BIG + 5))[:1000])  # a large payload under way
        assert r.next_frame() is None
        assert r.whole_frame(small) is None
    r = FrameReader(header_bytes_max=HEADER_MAX, payload_bytes_max=10)
    r.feed(frame([1], b"z" * 500)[:50])  # a refused payload still being skipped
    assert frames_of(r) == [(FrameKind.REQUEST, [1], b"", 500)]
    assert r.whole_frame(small) is None
