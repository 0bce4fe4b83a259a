"""The frame layer alone (``wire/frames.py``), at its boundaries: the bytes of a frame
pinned, a large payload whose end and the next frame arrive in one chunk, a large
payload arriving whole in one feed, reserved flags, and every limit at exactly its
value. test_codec.py covers the same reader through the connection with random
chunkings; these tests place the chunk edges where the reader changes paths. Each test
names the mutants of ``wire/frames.py`` it was seen to fail against (docs/testing.md).
"""

from __future__ import annotations

import array
import re
import struct
import tracemalloc
from typing import Any

import msgpack
import pytest

from shuttle.errors import LimitExceededError, RemoteProtocolError
from shuttle.wire.events import FrameKind
from shuttle.wire.frames import (
    DIRECT_PAYLOAD_BYTES_MIN,
    MAGIC,
    FrameReader,
    brief,
    encode_frame,
    encode_frame_fast,
    nested_too_deep,
)
from shuttle.wire.limits import HEADER_DEPTH_MAX, PREFIX_BYTES

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


# --- golden bytes ---------------------------------------------------------------------------

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


# --- limits at their exact values ----------------------------------------------------------


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


# --- the prefix ------------------------------------------------------------------------------


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


# --- large payloads at chunk boundaries -----------------------------------------------------


@pytest.mark.parametrize("grow", [False, True], ids=["client", "node"])
@pytest.mark.parametrize("size", [BIG, BIG + 1, 3 * BIG + 5])
def test_a_large_payload_arriving_whole_in_one_feed_is_not_lost(grow: bool, size: int) -> None:
    # Mutants: _start_direct_payload returning None where the whole payload was already
    # there (the frame was lost: nothing pending, nothing returned), `have == payload_len`
    # turned, the slice of buffered bytes (start, start + have) changed.
    data = body(size)
    r = reader(grow=grow)
    r.feed(frame([1, "put", {}], data) + frame([2, "ping", {}]))
    assert frames_of(r) == [
        (FrameKind.REQUEST, [1, "put", {}], data, 0),
        (FrameKind.REQUEST, [2, "ping", {}], b"", 0),
    ]
    assert r.at_frame_boundary() and r.buffered_bytes == 0


@pytest.mark.parametrize("grow", [False, True], ids=["client", "node"])
@pytest.mark.parametrize("split_at", [1, 1000, BIG - 1])
def test_a_chunk_straddling_the_end_of_a_large_payload_keeps_the_next_frame(
    grow: bool, split_at: int
) -> None:
    """The last chunk of a large payload often carries the next frame too (pipelined
    replies): the payload takes only its own bytes, the rest is the next frame."""
    # Mutants: in feed's payload branches, `if take == n: return` turned, `data =
    # view[take:]` / `memoryview(data)[take:]` changed (the next frame swallowed into
    # the payload or dropped), take's min() bounds changed.
    data = body(2 * BIG + 3)
    first = frame([1, "read", {}], data)
    second = frame([2, "stat", {}], b"small")
    head_len = len(first) - len(data)
    cut = head_len + split_at
    r = reader(grow=grow)
    r.feed(first[:cut])
    assert r.next_frame() is None and r.partial_frame
    r.feed(first[cut:] + second)  # the rest of the payload, then a whole frame
    assert frames_of(r) == [
        (FrameKind.REQUEST, [1, "read", {}], data, 0),
        (FrameKind.REQUEST, [2, "stat", {}], b"small", 0),
    ]
    assert r.at_frame_boundary()


@pytest.mark.parametrize("grow", [False, True], ids=["client", "node"])
def test_a_large_payload_in_many_small_pieces(grow: bool) -> None:
    # Mutants: the node's small arrivals gathered wrongly (parts[-1] += ..., the
    # _PART_BYTES test), _filled's arithmetic.
    data = body(BIG * 2 + 17, seed=3)
    wire = frame([1], data) + frame([2], body(10))
    r = reader(grow=grow)
    got = []
    for i in range(0, len(wire), 999):
        r.feed(wire[i : i + 999])
        got += frames_of(r)
    assert got == [(FrameKind.REQUEST, [1], data, 0), (FrameKind.REQUEST, [2], body(10), 0)]


def test_a_large_payload_is_received_into_its_own_buffer_from_the_threshold_on() -> None:
    # DIRECT_PAYLOAD_BYTES_MIN is where a payload stops being sliced out of the stream
    # buffer. Mutants: `payload_len < DIRECT_PAYLOAD_BYTES_MIN` turned into <=;
    # payload_buffer()'s None cases; payload_received's bookkeeping.
    for size, direct in ((BIG - 1, False), (BIG, True)):
        data = body(size)
        wire = frame([1], data)
        r = reader()
        r.feed(wire[:100])
        assert r.next_frame() is None
        target = r.payload_buffer()
        assert (target is not None) is direct
        if target is None:
            r.feed(wire[100:])
        else:
            assert len(target) == size - (100 - (len(wire) - size))
            target[:] = wire[100:]
            r.payload_received(len(target))
            assert r.payload_buffer() is None  # full: nothing more to receive into
        assert frames_of(r) == [(FrameKind.REQUEST, [1], data, 0)]
    assert reader().payload_buffer() is None


def test_a_node_holds_what_arrived_of_a_large_payload() -> None:
    # grow_payloads: the buffered bytes count what arrived, not the claimed length.
    r = reader(grow=True)
    wire = frame([1], body(4 * BIG))
    r.feed(wire[:5000])
    assert r.next_frame() is None
    assert r.buffered_bytes == 5000 - (len(wire) - 4 * BIG)
    assert r.partial_frame and not r.at_frame_boundary()


# --- the fast lane --------------------------------------------------------------------------


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


def test_the_end_of_a_skipped_payload_and_what_follows_share_a_chunk() -> None:
    # Mutants: `self._skip = 0` after the skipped bytes turned into 1 (a byte of the next
    # chunk dropped) or None (the reader no longer at a frame boundary).
    r = FrameReader(header_bytes_max=HEADER_MAX, payload_bytes_max=10)
    wire = frame([1], b"z" * 500) + frame([2], b"after") + frame([3], b"later")
    r.feed(wire[:50])
    assert frames_of(r) == [(FrameKind.REQUEST, [1], b"", 500)]
    second_end = len(frame([1], b"z" * 500)) + len(frame([2], b"after"))
    r.feed(wire[50:second_end])  # the skip ends inside this chunk; frame 2 follows
    assert frames_of(r) == [(FrameKind.REQUEST, [2], b"after", 0)]
    assert r.at_frame_boundary()
    r.feed(wire[second_end:])
    assert frames_of(r) == [(FrameKind.REQUEST, [3], b"later", 0)]


def test_a_node_copies_what_it_keeps_of_a_reused_receive_buffer() -> None:
    """An I/O layer may receive into one bytearray again and again: a piece the reader
    keeps must be a copy (only an immutable ``bytes`` chunk may be kept as it is)."""
    # Mutants: `type(data) is bytes` turned into `is not` (a bytearray chunk kept by
    # reference, then overwritten by the next receive).
    data = body(3 * BIG, seed=5)
    wire = frame([1], data)
    r = reader(grow=True)
    buf = bytearray(BIG + 100)
    got = []
    for i in range(0, len(wire), len(buf)):
        piece = wire[i : i + len(buf)]
        buf[: len(piece)] = piece
        r.feed(memoryview(buf)[: len(piece)])
        got += frames_of(r)
        buf[:] = bytes(len(buf))  # the next receive overwrites it
    assert got == [(FrameKind.REQUEST, [1], data, 0)]


def test_a_node_gathers_small_pieces_after_a_large_one() -> None:
    # A large piece is kept as it came; small ones after it are gathered in a new buffer.
    # Mutants: `parts and type(parts[-1]) is bytearray and len(...) < _PART_BYTES` with
    # an `and` turned into `or`, or `is bytearray` into `is not` (small pieces appended
    # to the kept bytes).
    data = body(BIG + 5000, seed=9)
    wire = frame([1], data) + frame([2])
    head = len(wire) - len(data) - len(frame([2]))
    r = reader(grow=True)
    r.feed(wire[: head + 10])
    assert r.next_frame() is None
    r.feed(wire[head + 10 : head + 10 + BIG])  # one large piece
    for i in range(head + 10 + BIG, len(wire), 777):
        r.feed(wire[i : i + 777])
    assert frames_of(r) == [(FrameKind.REQUEST, [1], data, 0), (FrameKind.REQUEST, [2], b"", 0)]


def test_receiving_past_the_payload_buffer_is_a_programming_error() -> None:
    # Mutants: payload_received's assertion weakened (`or`, `filled - nbytes`).
    r = reader()
    with pytest.raises(AssertionError):
        r.payload_received(1)  # nothing awaited
    r.feed(frame([1], body(BIG))[:100])
    assert r.next_frame() is None
    target = r.payload_buffer()
    assert target is not None
    with pytest.raises(AssertionError):
        r.payload_received(len(target) + 1)


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


def test_a_reader_receives_large_payloads_in_place_unless_told_to_grow() -> None:
    # The default (a client's reader) preallocates the payload it asked for. Mutant:
    # grow_payloads defaulting to True.
    r = FrameReader(header_bytes_max=HEADER_MAX, payload_bytes_max=PAYLOAD_MAX)
    r.feed(frame([1], body(BIG))[:20])
    assert r.next_frame() is None
    target = r.payload_buffer()
    assert target is not None and len(target) == BIG - (20 - len(frame([1])))


def test_receiving_starts_as_soon_as_the_header_is_whole() -> None:
    # Mutants: `avail < PREFIX_BYTES + header_len` turned into <= (the payload's buffer
    # waited for a payload byte) or into `PREFIX_BYTES - header_len` (a header cut short
    # was decoded, and the stream declared corrupt).
    wire = frame([1, "put", {"key": "k" * 40}], body(BIG))
    head = len(wire) - BIG
    r = reader()
    r.feed(wire[: head - 10])  # the header cut short: wait, nothing wrong yet
    assert r.next_frame() is None and r.payload_buffer() is None
    r.feed(wire[head - 10 : head])  # the header whole, no payload byte yet
    assert r.next_frame() is None
    target = r.payload_buffer()
    assert target is not None and len(target) == BIG
    target[:] = wire[head:]
    r.payload_received(BIG)
    assert frames_of(r) == [(FrameKind.REQUEST, [1, "put", {"key": "k" * 40}], body(BIG), 0)]


def test_a_payload_at_a_small_limit_is_sliced_from_the_stream() -> None:
    # A payload of exactly the limit, under DIRECT_PAYLOAD_BYTES_MIN, is a small frame.
    # Mutant: `payload_len <= self._payload_bytes_max` turned into < (it took the large
    # frames' way instead).
    r = FrameReader(header_bytes_max=HEADER_MAX, payload_bytes_max=10)
    wire = frame([1], b"0123456789")
    r.feed(wire[:-3])
    assert r.next_frame() is None and r.payload_buffer() is None
    r.feed(wire[-3:])
    payload = r.next_frame()[2]  # type: ignore[index]
    # Sliced out of the reader's accumulating buffer, a small payload is still bytes.
    # Mutant: `elif type(buf) is bytes` turned into `is not` (a bytearray slice).
    assert type(payload) is bytes and payload == b"0123456789"


@pytest.mark.parametrize("grow", [False, True], ids=["client", "node"])
def test_nothing_is_left_buffered_after_a_large_payload(grow: bool) -> None:
    # buffered_bytes is what a node's admission charges a connection. Mutants: the
    # filled count left at 1 instead of 0 when a large payload completes.
    wire = frame([1], body(BIG + 1)) + frame([2])
    r = reader(grow=grow)
    r.feed(wire[:500])
    assert r.next_frame() is None
    r.feed(wire[500:])
    assert len(frames_of(r)) == 2
    assert r.buffered_bytes == 0 and r.at_frame_boundary()


def test_a_partial_frame_is_copied_out_of_a_reused_receive_buffer() -> None:
    # Only an immutable bytes chunk may be kept as the stream buffer. Mutant: `if
    # type(data) is bytes` turned into `is not` (a view of the caller's buffer kept,
    # then overwritten by the next receive).
    wire = frame([1, "a", {}]) + frame([2, "b", {}])
    buf = bytearray(7)
    r = reader()
    got = []
    for i in range(0, len(wire), len(buf)):
        piece = wire[i : i + len(buf)]
        buf[: len(piece)] = piece
        r.feed(memoryview(buf)[: len(piece)])
        got += frames_of(r)
        buf[:] = b"\xff" * len(buf)
    assert got == [
        (FrameKind.REQUEST, [1, "a", {}], b"", 0),
        (FrameKind.REQUEST, [2, "b", {}], b"", 0),
    ]


def test_tiny_pieces_of_a_large_payload_cost_their_bytes() -> None:
    """A node's reader keeps a large payload as the pieces that arrived: a peer sending it
    a byte at a time must cost about a byte per byte, not an object per byte."""
    # Mutant: the test for a gathering buffer (`type(parts[-1]) is bytearray`) never true
    # (every tiny piece became an object of its own: some 60 bytes each).
    wire = frame([1], body(4 * BIG))
    head = len(wire) - 4 * BIG
    r = reader(grow=True)
    r.feed(wire[:head])
    assert r.next_frame() is None
    tracemalloc.start()
    try:
        for i in range(head, head + 20_000):
            r.feed(wire[i : i + 1])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 200_000, f"{held} bytes held for 20,000 bytes received"


def test_a_stream_that_never_ends_on_a_frame_boundary_keeps_a_bounded_buffer() -> None:
    """Chunks that always end inside a frame leave a partial frame behind each time: the
    parsed bytes in front of it must be dropped, or the buffer grows with the stream."""
    # Mutant: the compaction test `self._pos * 2 >= len(buf)` made never true (/ 2).
    one = frame([1, "ping", {}])
    stream = one * 3000
    step = 5 * len(one)  # whole frames per chunk, after a first chunk that ends mid-frame
    first = step + 3
    r = reader()
    r.feed(stream[:first])
    frames_of(r)
    assert r.partial_frame
    tracemalloc.start()
    try:
        for i in range(first, len(stream) - step, step):
            r.feed(stream[i : i + step])
            frames_of(r)
            assert r.partial_frame
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 20_000, f"{held} bytes held after {len(stream)} bytes streamed"
