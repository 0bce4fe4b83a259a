"""What the frame-layer tests share (``test_frame_*.py``): a frame built from the
layout in docs/protocol.md rather than by the code under test, readers with small
limits, and payloads of known bytes.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import msgpack

from shuttle.wire.events import FrameKind
from shuttle.wire.frames import DIRECT_PAYLOAD_BYTES_MIN, FrameReader

HEADER_MAX = 200
PAYLOAD_MAX = 1 << 20
BIG = DIRECT_PAYLOAD_BYTES_MIN  # the smallest payload received into a buffer of its own


def exactly(message: str) -> str:
    return "^" + re.escape(message) + "$"


def frame(
    header: Any, payload: bytes = b"", kind: FrameKind = FrameKind.REQUEST, flags: int = 0
) -> bytes:
    """A frame built from the layout in docs/protocol.md, not by the code under test."""
    head = msgpack.packb(header, use_bin_type=True)
    return struct.pack(">2sBBII", b"SH", kind, flags, len(head), len(payload)) + head + payload


def reader(*, grow: bool = False, header_max: int = HEADER_MAX) -> FrameReader:
    return FrameReader(
        header_bytes_max=header_max, payload_bytes_max=PAYLOAD_MAX, grow_payloads=grow
    )


def frames_of(r: FrameReader) -> list[tuple[FrameKind, Any, bytes, int]]:
    out = []
    while (f := r.next_frame()) is not None:
        kind, header, payload, refused = f
        out.append((kind, header, bytes(payload), refused))
    return out


def body(n: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(n))


def frames_through_reused_buffer(
    r: FrameReader, wire: bytes, buffer_bytes: int, spoil: bytes
) -> list[tuple[FrameKind, Any, bytes, int]]:
    """The frames ``r`` reads when ``wire`` arrives through one receive buffer of
    ``buffer_bytes`` used for every receive, and filled with ``spoil`` after each (as
    the next receive would overwrite it)."""
    buf = bytearray(buffer_bytes)
    got = []
    for i in range(0, len(wire), len(buf)):
        piece = wire[i : i + len(buf)]
        buf[: len(piece)] = piece
        r.feed(memoryview(buf)[: len(piece)])
        got += frames_of(r)
        buf[:] = spoil * len(buf)
    return got
