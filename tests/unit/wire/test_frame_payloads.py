"""Large payloads in the frame layer (``wire/frames.py``), with the chunk edges placed
where the reader changes paths: a large payload whose end and the next frame arrive
in one chunk, one arriving whole in one feed, in many small pieces, received into a
buffer of its own or through a receive buffer used again and again, a refused one
skipped, and the memory a reader holds meanwhile. Each test names the mutants of
``wire/frames.py`` it was seen to fail against (docs/testing.md).
"""

from __future__ import annotations

import tracemalloc

import pytest

from shuttle.wire.events import FrameKind
from shuttle.wire.frames import FrameReader
from tests.unit.wire.framehelp import (
    BIG,
    HEADER_MAX,
    PAYLOAD_MAX,
    body,
    frame,
    frames_of,
    frames_through_reused_buffer,
    reader,
)


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
    r = reader()
    got = frames_through_reused_buffer(r, wire, 7, b"\xff")
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
    got = frames_through_reused_buffer(r, wire, BIG + 100, b"\x00")
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
