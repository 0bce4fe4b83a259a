"""The frame layer alone (``wire/frames.py``): the bytes of a frame pinned, the prefix
(magic, kind, reserved flags) checked, and errors about headers that say what was
wrong. test_codec.py covers the same reader through the connection with random
chunkings. Each test names the mutants of ``wire/frames.py`` it was seen to fail
against (docs/testing.md).
"""

from __future__ import annotations

import array
import re
import struct
from typing import Any

import msgpack
import pytest

from shuttle.errors import RemoteProtocolError
from shuttle.wire.events import FrameKind
from shuttle.wire.frames import MAGIC, brief, encode_frame, encode_frame_fast
from shuttle.wire.limits import HEADER_DEPTH_MAX, PREFIX_BYTES
from tests.unit.wire.framehelp import HEADER_MAX, PAYLOAD_MAX, exactly, frame, frames_of, reader

#: A REQUEST frame ``[7, "read", {"key": "k"}]`` with payload ``abc``: prefix (magic SH,
#: kind 3, flags 0, header and payload lengths big-endian), msgpack header, payload. If
#: this fails the wire format changed: peers of the previous version cannot talk to this
#: one. Change it only with PROTOCOL_VERSION_MAX and docs/protocol.md.
GOLDEN_FRAME = bytes.fromhex(
    "5348"
    "03"
    "00"
    "0000000e"
    "00000003"  # "SH", REQUEST, flags 0, 14, 3
    "9307a47265616481a36b6579a16b"  # [7, "read", {"key": "k"}]
    "616263"  # "abc"
)


def test_a_frame_is_the_documented_bytes() -> None:
    # Mutants: the prefix's fields (kind, flags, lengths), the header's encoding.
    parts = encode_frame(
        FrameKind.REQUEST,
        [7, "read", {"key": "k"}],
        b"abc",
        header_bytes_max=HEADER_MAX,
        payload_bytes_max=PAYLOAD_MAX,
    )
    assert b"".join(parts) == GOLDEN_FRAME
    assert parts[-1] == b"abc"  # the payload is its own buffer (not copied)
    assert frame([7, "read", {"key": "k"}], b"abc") == GOLDEN_FRAME
    assert (MAGIC, PREFIX_BYTES) == (b"SH", 12)
    r = reader()
    r.feed(GOLDEN_FRAME)
    assert frames_of(r) == [(FrameKind.REQUEST, [7, "read", {"key": "k"}], b"abc", 0)]


def test_small_payloads_are_joined_and_large_ones_are_not_copied() -> None:
    # Mutants: `payload_len < join_below` turned, the empty-payload case changed.
    head = [1, "put", {}]
    small = encode_frame_fast(FrameKind.REQUEST, head, b"xy", HEADER_MAX, PAYLOAD_MAX, 3)
    assert small == [frame(head, b"xy")]
    edge = encode_frame_fast(FrameKind.REQUEST, head, b"xyz", HEADER_MAX, PAYLOAD_MAX, 3)
    assert edge == [frame(head, b"xyz")[:-3], b"xyz"]
    view = memoryview(b"payload")
    parts = encode_frame_fast(FrameKind.REQUEST, head, view, HEADER_MAX, PAYLOAD_MAX)
    assert parts[1] is view and b"".join(bytes(p) for p in parts) == frame(head, b"payload")
    assert encode_frame_fast(FrameKind.GOODBYE, None, b"", HEADER_MAX, PAYLOAD_MAX) == [
        frame(None, kind=FrameKind.GOODBYE)
    ]


@pytest.mark.parametrize("flags", [1, 0x80])
def test_reserved_flags_are_a_protocol_error(flags: int) -> None:
    # Mutants: `or flags != 0` deleted from next_frame (a frame from a newer peer whose
    # flags change its meaning would be read as if they were 0), `or flags` deleted from
    # the fast lane.
    wire = frame([1, "ping", {}], flags=flags)
    r = reader()
    assert r.whole_frame(wire) is None
    r.feed(wire)
    with pytest.raises(
        RemoteProtocolError,
        match=exactly(
            f"bad frame prefix (kind=3, flags={flags}): unknown frame kind or reserved "
            "flags set; is the peer a newer Shuttle?"
        ),
    ):
        r.next_frame()


@pytest.mark.parametrize("kind", [0, 8, 255])
def test_an_unknown_kind_is_a_protocol_error(kind: int) -> None:
    head = msgpack.packb([1])
    wire = struct.pack(">2sBBII", b"SH", kind, 0, len(head), 0) + head
    r = reader()
    assert r.whole_frame(wire) is None
    r.feed(wire)
    with pytest.raises(RemoteProtocolError, match=re.escape(f"(kind={kind}, flags=0)")):
        r.next_frame()


def test_bad_magic_names_what_arrived() -> None:
    # Mutant: the fast lane's `or magic != MAGIC` joined to the next test with `and`.
    assert reader().whole_frame(b"XH" + frame([1])[2:]) is None
    r = reader()
    r.feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(
        RemoteProtocolError,
        match=exactly(
            "bad frame magic b'GE' (expected b'SH'): the peer is not speaking the Shuttle "
            "protocol or the stream is corrupt"
        ),
    ):
        r.next_frame()


def test_errors_about_headers_say_what_was_wrong() -> None:
    # Mutants: the messages of _decode_header replaced, the exception's type name lost.
    r = reader()
    r.feed(struct.pack(">2sBBII", b"SH", 3, 0, 1, 0) + b"\xc1")
    with pytest.raises(
        RemoteProtocolError,
        match=exactly("undecodable frame header (FormatError: ); the stream is corrupt"),
    ):
        r.next_frame()
    deep: Any = 0
    for _ in range(HEADER_DEPTH_MAX + 1):
        deep = [deep]
    r = reader(header_max=1 << 10)
    r.feed(frame(deep))
    with pytest.raises(
        RemoteProtocolError,
        match=exactly(
            f"frame header nests lists or maps deeper than {HEADER_DEPTH_MAX} levels; "
            "the peer is broken or hostile"
        ),
    ):
        r.next_frame()


def test_brief_keeps_messages_short() -> None:
    # Mutants: brief's value replaced, its 200-character cut changed.
    assert brief({"op": "read", "n": 3}) == "{'n': 3, 'op': 'read'}"
    wide = {f"{k}{'x' * 70}": [f"{k}{'y' * 70}"] * 9 for k in "abcd"}
    assert len(brief(wide)) == 200
    assert brief(wide) == brief(wide)[:200] and brief(wide).startswith("{'axxx")


def test_a_payload_of_wide_items_is_framed_by_its_bytes() -> None:
    # A caller's buffer may be a view of 4- or 8-byte items (an array, numpy data): the
    # prefix carries its length in bytes. Mutant: `payload.nbytes if type(payload) is
    # memoryview else len(payload)` forced to len() (a quarter of the length).
    items = memoryview(array.array("I", range(1000)))
    parts = encode_frame(
        FrameKind.REQUEST, [1], items, header_bytes_max=HEADER_MAX, payload_bytes_max=PAYLOAD_MAX
    )
    wire = b"".join(bytes(p) for p in parts)
    assert wire == frame([1], items.tobytes())
    assert struct.unpack_from(">I", wire, 8)[0] == items.nbytes == 4000
