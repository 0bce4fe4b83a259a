"""The read lane (``shuttle.wire.readlane``): its C functions give the same bytes, the
same answers and the same errors as the pure reference, and both take only what the
general codec takes the same way."""

from __future__ import annotations

import importlib
import socket
import struct
from collections.abc import Callable
from types import ModuleType
from typing import Any

import msgpack
import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from shuttle.wire import readlane
from shuttle.wire.events import FrameKind
from shuttle.wire.frames import FrameReader, encode_frame_fast
from tests.examples import examples

INT64 = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
NATURAL = st.integers(min_value=0, max_value=(1 << 63) - 1)
RID = st.integers(min_value=1, max_value=(1 << 63) - 1)
BIG = 1 << 30
# Keys with characters of every UTF-8 length, of every str size class.
KEYS = st.text(
    st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=300
) | st.sampled_from(["a" * 31, "a" * 32, "b" * 255, "c" * 256, "d" * 70000])


def _native() -> ModuleType:
    try:
        return importlib.import_module("shuttle.wire._readlane")
    except ImportError:
        pytest.skip("the C read lane is not built (scripts/build_compiled.py)")


PURE = {
    "parse_read_request": readlane.pure_parse_read_request,
    "pack_read_reply": readlane.pure_pack_read_reply,
    "pack_read_request": readlane.pure_pack_read_request,
    "parse_read_reply": readlane.pure_parse_read_reply,
}


def both(name: str, *args: Any) -> Any:
    """``name(*args)`` from C and from the reference: equal results or equal errors."""
    c_fn: Callable[..., Any] = getattr(_native(), name)
    outcomes = []
    for fn in (c_fn, PURE[name]):
        try:
            outcomes.append(("ok", fn(*args)))
        except Exception as exc:  # compared: the same type and message
            outcomes.append(("error", type(exc), str(exc)))
    assert outcomes[0] == outcomes[1], f"C and pure differ on {name}{args!r:.300}"
    return outcomes[0][1] if outcomes[0][0] == "ok" else None


def general_request(
    rid: int, key: str, offset: int, length: int, version: int | None, direct: Any = False
) -> bytes:
    """The general codec's frame of the read (``direct`` sent unless False: a client
    that reads a RADOS node's miss itself sends ``direct: true``)."""
    args: dict[str, Any] = {"key": key, "offset": offset, "length": length}
    if version is not None:
        args["expected_version"] = version
    if direct is not False:
        args["direct"] = direct
    return encode_frame_fast(FrameKind.REQUEST, [rid, "read", args], b"", BIG, BIG)[0]


def general_decode(data: bytes) -> tuple[FrameKind, Any, bytes] | None:
    """The general reader's frame from ``data`` (None if it needs more or refuses)."""
    reader = FrameReader(header_bytes_max=BIG, payload_bytes_max=BIG)
    try:
        reader.feed(data)
        frame = reader.next_frame()
    except Exception:
        return None
    if frame is None or reader.buffered_bytes:
        return None
    return frame[0], frame[1], bytes(frame[2])


@settings(max_examples=examples(300), deadline=None)
@given(RID, KEYS, INT64, INT64, st.none() | INT64, st.booleans())
def test_a_request_is_packed_byte_for_byte_as_the_codec_does(
    rid: int, key: str, offset: int, length: int, version: int | None, direct: bool
) -> None:
    packed = both("pack_read_request", rid, key, offset, length, version, direct)
    assert packed == general_request(rid, key, offset, length, version, direct)
    if not direct:  # the argument left out: the plain read
        assert both("pack_read_request", rid, key, offset, length, version) == packed


# Where msgpack's integer forms change, on both sides of each boundary.
BOUNDARIES = sorted(
    {b + d for b in (0, 127, 255, 65535, (1 << 32) - 1) for d in (0, 1)}
    | {b - d for b in (-32, -128, -32768, -(1 << 31)) for d in (0, 1)}
    | {(1 << 63) - 1, -(1 << 63)}
)


@pytest.mark.parametrize("value", BOUNDARIES)
def test_integers_at_every_form_boundary_are_packed_as_the_codec_does(value: int) -> None:
    rid = max(value, 1)
    packed = both("pack_read_request", rid, "k", value, value, value)
    assert packed == general_request(rid, "k", value, value, value)
    assert both("pack_read_reply", rid, b"x") == b"".join(
        encode_frame_fast(FrameKind.RESPONSE, [rid, None], b"x", BIG, BIG, BIG)
    )
    if value >= 0:
        assert both("parse_read_request", packed, BIG) == (rid, "k", value, value, value, False)


@settings(max_examples=examples(300), deadline=None)
@given(RID, KEYS, NATURAL, NATURAL, st.none() | INT64, st.sampled_from([None, False, True]))
def test_a_packed_request_parses_back(
    rid: int, key: str, offset: int, length: int, version: int | None, direct: bool | None
) -> None:
    """``direct`` absent (None here), false or true: the same read, ``direct`` as sent."""
    args = (rid, key, offset, length, version)
    data = general_request(*args, False if direct is None else direct)
    if direct is False:  # sent as false, not left out
        head = msgpack.packb([rid, "read", {**readlane.read_args(*args[1:]), "direct": False}])
        data = struct.pack(">2sBBII", b"SH", 3, 0, len(head), 0) + head
    assert both("parse_read_request", data, BIG) == (*args, bool(direct))
    # Over the header limit it is not taken (the general path answers the limit).
    assert both("parse_read_request", data, len(data) - 13) is None


def _int(value: int, width: int) -> bytes:
    """``value`` in msgpack's ``width``-byte form (0: the fixint, if it fits)."""
    if width == 0:
        return msgpack.packb(value)
    if value >= 0:
        code = {1: 0xCC, 2: 0xCD, 4: 0xCE, 8: 0xCF}[width]
        return bytes([code]) + value.to_bytes(width, "big")
    code = {1: 0xD0, 2: 0xD1, 4: 0xD2, 8: 0xD3}[width]
    return bytes([code]) + value.to_bytes(width, "big", signed=True)


def _fits(value: int, width: int) -> bool:
    if width == 0:
        return True
    if value >= 0:
        return value < 1 << (8 * width)
    return value >= -(1 << (8 * width - 1))


@settings(max_examples=examples(300), deadline=None)
@given(
    RID,
    NATURAL,
    st.lists(st.sampled_from([0, 1, 2, 4, 8]), min_size=2, max_size=2),
    st.sampled_from([b"\x93", b"\xdc\x00\x03", b"\xdd\x00\x00\x00\x03"]),
    st.sampled_from([b"\xa4read", b"\xd9\x04read", b"\xda\x00\x04read"]),
)
def test_any_valid_encoding_of_a_read_is_taken_as_the_codec_decodes_it(
    rid: int, offset: int, widths: list[int], array: bytes, op: bytes
) -> None:
    assume(_fits(rid, widths[0]) and _fits(offset, widths[1]))
    head = (
        array
        + _int(rid, widths[0])
        + op
        + b"\x83\xa3key\xa1k\xa6offset"
        + _int(offset, widths[1])
        + b"\xa6length\xcd\x10\x00"
    )
    data = struct.pack(">2sBBII", b"SH", 3, 0, len(head), 0) + head
    got = both("parse_read_request", data, BIG)
    assert got == (rid, "k", offset, 4096, None, False)
    frame = general_decode(data)
    assert frame is not None and frame[1] == [
        rid,
        "read",
        {"key": "k", "offset": offset, "length": 4096},
    ]


@pytest.mark.parametrize(
    "header",
    [
        [1, "write", {"key": "k", "offset": 0, "length": 1}],
        [1, "read", {"key": "k", "offset": -1, "length": 1}],
        [1, "read", {"key": "k", "offset": 0, "length": -1}],
        [0, "read", {"key": "k", "offset": 0, "length": 1}],
        [1, "read", {"key": "k", "offset": 0}],
        [1, "read", {"key": b"k", "offset": 0, "length": 1}],
        [1, "read", {"key": "k", "offset": 0, "length": 1, "expected_version": None}],
        [1, "read", {"key": "k", "offset": 0, "length": 1, "other": 1}],
        # direct must be a bool: anything else is the general path's to refuse
        [1, "read", {"key": "k", "offset": 0, "length": 1, "direct": 1}],
        [1, "read", {"key": "k", "offset": 0, "length": 1, "direct": "true"}],
        [1, "read", {"key": "k", "offset": 0, "length": 1, "direct": None}],
        [1, "read", {"key": "k", "offset": 0.0, "length": 1}],
        [1, "read", {"key": "k", "offset": True, "length": 1}],
        [1, "read", {"key": "k", "offset": 1 << 63, "length": 1}],
        [1 << 63, "read", {"key": "k", "offset": 0, "length": 1}],
        [1, "read", {"key": "k", "offset": 0, "length": 1}, None],
        [1, "read", [["key", "k"]]],
        {"rid": 1},
    ],
)
def test_what_the_lane_does_not_take_goes_the_general_path(header: Any) -> None:
    head = msgpack.packb(header, use_bin_type=True)
    data = struct.pack(">2sBBII", b"SH", 3, 0, len(head), 0) + head
    assert both("parse_read_request", data, BIG) is None


def test_unusual_frames_go_the_general_path() -> None:
    good = general_request(7, "k", 0, 4096, None)
    head = good[12:]
    duplicated = b"\x93\x07\xa4read\x84\xa3key\xa1k\xa6offset\x00\xa6length\x01\xa3key\xa1j"
    bad_utf8 = b"\x93\x07\xa4read\x83\xa3key\xa2\xed\xa0\xa6offset\x00\xa6length\x01"
    for data in (
        good + b"\x00",  # a stray byte after the frame
        good[:-1],  # a short frame
        b"SX" + good[2:],  # bad magic
        good[:3] + b"\x01" + good[4:],  # flags set
        good[:2] + b"\x04" + good[3:],  # a response, not a request
        struct.pack(">2sBBII", b"SH", 3, 0, len(head) + 1, 0) + head + b"\xc0",  # extra data
        struct.pack(">2sBBII", b"SH", 3, 0, len(head), 1) + head + b"x",  # a payload
        struct.pack(">2sBBII", b"SH", 3, 0, len(duplicated), 0) + duplicated,
        struct.pack(">2sBBII", b"SH", 3, 0, len(bad_utf8), 0) + bad_utf8,
        bytearray(good),  # not bytes
    ):
        assert both("parse_read_request", data, BIG) is None, data


@settings(max_examples=examples(500), deadline=None)
@given(RID, KEYS, NATURAL, NATURAL, st.none() | NATURAL, st.booleans(), st.data())
@example(1, "k", 0, 1, None, False, None)
@example(1, "k", 0, 1, None, True, None)
def test_a_mutated_request_is_declined_or_read_as_the_codec_reads_it(
    rid: int,
    key: str,
    offset: int,
    length: int,
    version: int | None,
    direct: bool,
    data: Any,
) -> None:
    frame = bytearray(general_request(rid, key[:40], offset, length, version, direct))
    if data is not None:
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(frame) - 1))
            frame[at] = data.draw(st.integers(0, 255))
    raw = bytes(frame)
    got = both("parse_read_request", raw, BIG)
    if got is not None:
        decoded = general_decode(raw)
        assert decoded is not None
        kind, header, payload = decoded
        rid2, key2, offset2, length2, version2, direct2 = got
        args = {"key": key2, "offset": offset2, "length": length2}
        if version2 is not None:
            args["expected_version"] = version2
        # The general path's args say the same read: ``direct`` false or left out alike.
        general = dict(header[2]) if type(header[2]) is dict else header[2]
        if type(general) is dict and general.get("direct") is False:
            del general["direct"]
        if direct2:
            args["direct"] = True
        assert (kind, [header[0], header[1], general], payload) == (
            FrameKind.REQUEST,
            [rid2, "read", args],
            b"",
        )


@settings(max_examples=examples(300), deadline=None)
@given(RID, st.binary(max_size=70000))
def test_a_reply_is_packed_as_the_codec_does_and_parses_back(rid: int, payload: bytes) -> None:
    reply = both("pack_read_reply", rid, payload)
    general = encode_frame_fast(FrameKind.RESPONSE, [rid, None], payload, BIG, BIG, BIG)
    assert reply == b"".join(general)
    assert both("parse_read_reply", reply, rid, len(payload)) == payload
    assert both("parse_read_reply", reply, rid + 1, len(payload)) is None  # another id
    if payload:
        assert both("parse_read_reply", reply, rid, len(payload) - 1) is None  # over the limit


@settings(max_examples=examples(300), deadline=None)
@given(RID, st.binary(max_size=70000), st.data())
def test_a_reply_packed_from_a_range_of_a_buffer_is_the_reply_of_that_range(
    rid: int, buffer: bytes, data: Any
) -> None:
    """The node's read lane hands the packer a cached block and a range: the frame is
    the one of the range's bytes, copied once."""
    start = data.draw(st.integers(0, len(buffer)))
    stop = data.draw(st.integers(start, len(buffer)))
    reply = both("pack_read_reply", rid, buffer, start, stop)
    assert reply == both("pack_read_reply", rid, buffer[start:stop])
    assert both("parse_read_reply", reply, rid, BIG) == buffer[start:stop]


@pytest.mark.parametrize(
    "start, stop", [(-1, 2), (3, 2), (0, 6), (6, 6), (True, 2), (0, 2.0), (0, None), (1 << 64, 1)]
)
def test_a_range_outside_the_buffer_is_refused_with_the_same_error(start: Any, stop: Any) -> None:
    with pytest.raises(ValueError, match=r"0 <= start <= stop <= len\(data\) \(5\)"):
        readlane.pure_pack_read_reply(1, b"abcde", start, stop)
    both("pack_read_reply", 1, b"abcde", start, stop)  # C: the same type and message


@settings(max_examples=examples(500), deadline=None)
@given(RID, st.binary(max_size=64), st.data())
def test_a_mutated_reply_is_declined_or_read_as_the_codec_reads_it(
    rid: int, payload: bytes, data: Any
) -> None:
    frame = bytearray(readlane.pure_pack_read_reply(rid, payload))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    raw = bytes(frame)
    got = both("parse_read_reply", raw, rid, BIG)
    if got is not None:
        assert general_decode(raw) == (FrameKind.RESPONSE, [rid, None], got)


def test_replies_that_are_not_a_plain_read_answer_go_the_general_path() -> None:
    for header in ([5, {"x": 1}], [5, None, None], [5], [5, False], {"rid": 5}):
        head = msgpack.packb(header)
        data = struct.pack(">2sBBII", b"SH", 4, 0, len(head), 2) + head + b"ab"
        assert both("parse_read_reply", data, 5, BIG) is None
    head = msgpack.packb([5, None]) + b"\xc0"  # a stray byte inside the header
    data = struct.pack(">2sBBII", b"SH", 4, 0, len(head), 2) + head + b"ab"
    assert both("parse_read_reply", data, 5, BIG) is None
    error = encode_frame_fast(FrameKind.ERROR, [5, "not_found", "no"], b"", BIG, BIG)[0]
    assert both("parse_read_reply", error, 5, BIG) is None


def test_bad_arguments_raise_the_same_errors() -> None:
    both("pack_read_reply", 1 << 63, b"")
    both("pack_read_reply", 1, bytearray(b"x"))
    with pytest.raises(OverflowError):
        readlane.pure_pack_read_reply(1 << 63, b"")
    with pytest.raises(TypeError):
        readlane.pure_pack_read_reply(1, bytearray(b"x"))
    # Arguments the lane does not encode: the general path encodes them or raises.
    for args in (
        (1, 5, 0, 1, None),
        (1, "k", 1 << 64, 1, None),
        (1, "k", 0, 1, "v"),
        (1, "k", 0, 1, None, 1),  # direct not a bool
        (1, "k", 0, 1, None, None),
    ):
        assert both("pack_read_request", *args) is None
    assert both("pack_read_request", 1, "\udc80", 0, 1, None) is None  # not UTF-8


def test_the_public_names_are_the_c_functions_when_compiled() -> None:
    from shuttle import compiled

    if not compiled.active().compiled:
        assert readlane.parse_read_request is readlane.pure_parse_read_request
        return
    native = _native()
    assert readlane.NATIVE
    assert readlane.parse_read_request is native.parse_read_request
    assert readlane.pack_read_reply is native.pack_read_reply


def test_the_c_parser_gives_the_same_key_object_for_a_key_read_again() -> None:
    """The C parser keeps the last ASCII key it made: the next read of that key gets the
    same str (its hash already computed), any other key a str of its own, equal to
    what the reference gives."""
    native = _native()

    def key_of(key: str, rid: int = 1) -> str:
        got = native.parse_read_request(general_request(rid, key, 0, 4096, None), BIG)
        assert got is not None and got[1] == key
        return str(got[1])

    first = key_of("bench/netrand.dat")
    assert key_of("bench/netrand.dat", 2) is first
    other = key_of("bench/other.dat")
    assert other is not first and key_of("bench/other.dat") is other
    assert key_of("bench/netrand.dat") is not first  # one key kept: the last
    assert key_of("bench/netrand.daX") == "bench/netrand.daX"  # same length, other bytes
    assert key_of("clé") == "clé" and key_of("clé") == "clé"  # not ASCII: decoded each time
    assert key_of("") == "" and key_of("k" * 300) == "k" * 300  # empty; over the memo's bound


def recv_both(arrived: bytes, rid: int, length: int, payload_max: int = BIG) -> Any:
    """``recv_read_reply`` from C and from the reference, each reading a socket that
    holds ``arrived``: the same answer (type and bytes) or the same error, and the same
    bytes left unread in the socket. Returns the answer (None for an error)."""
    native = _native()
    outcomes = []
    for fn in (native.recv_read_reply, readlane.pure_recv_read_reply):
        a, b = socket.socketpair()
        with a, b:
            if arrived:
                a.sendall(arrived)
            b.setblocking(False)
            try:
                got = fn(b.fileno(), rid, length, payload_max)
                outcome: tuple[Any, ...] = ("ok", type(got), bytes(got))
            except Exception as exc:  # compared: the same type and message
                outcome = ("error", type(exc), str(exc))
            try:
                left = b.recv(1 << 20)
            except BlockingIOError:
                left = b""
            outcomes.append((outcome, left))
    assert outcomes[0] == outcomes[1], f"C and pure differ on {arrived!r:.200}, {rid}, {length}"
    outcome = outcomes[0][0]
    return outcome[1](outcome[2]) if outcome[0] == "ok" else None


@settings(max_examples=examples(200), deadline=None)
@given(
    st.sampled_from([1, 127, 128, 255, 256, 65535, 65536, 0xFFFFFFFF]) | RID,
    st.binary(max_size=9000),
    st.integers(0, 64),
)
@example(rid=300, payload=b"p" * 4096, spare=0)  # the benchmark's warm read
def test_a_reply_received_whole_is_its_payload_read_in_place(
    rid: int, payload: bytes, spare: int
) -> None:
    """A client's receive of its read's reply: the payload when the socket holds
    exactly that frame (asked for ``len(payload) + spare`` bytes: a read near the
    object's end gets fewer), with nothing of the next frame taken."""
    reply = readlane.pure_pack_read_reply(rid, payload)
    after = readlane.pure_pack_read_reply(1, b"next")
    got = recv_both(reply, rid, len(payload) + spare)
    assert type(got) is bytes and got == payload
    if spare:  # the bytes after the reply stay in the socket (recv_both compares them)
        assert type(recv_both(reply + after, rid, len(payload) + spare)) is bytearray
    assert recv_both(reply + after, rid, len(payload)) == payload


def test_a_reply_that_is_not_exactly_the_reads_comes_back_as_it_arrived() -> None:
    """Anything else is what arrived, as a bytearray, for the general path: another
    id's reply, an error, a payload over either limit, part of a frame, an unusual
    encoding of the header, the end of the stream."""
    reply = readlane.pure_pack_read_reply(5, b"abcd")
    error = encode_frame_fast(FrameKind.ERROR, [5, "not_found", "no"], b"", BIG, BIG)[0]
    head = b"\x92\xcc\x05\xc0"  # rid 5 as a uint8: valid msgpack, not the packer's form
    unusual = struct.pack(">2sBBII", b"SH", 4, 0, len(head), 4) + head + b"abcd"
    for arrived, rid, length, payload_max in (
        (reply, 6, 4, BIG),  # another id
        (error, 5, 4096, BIG),
        (reply, 5, 3, BIG),  # longer than asked for: the rest stays in the socket
        (reply, 5, 4, 3),  # over the payload limit
        (reply[:9], 5, 4, BIG),  # part of the prefix
        (reply[:-1], 5, 4, BIG),  # all but the last byte
        (unusual, 5, 8, BIG),
        (b"", 5, 4, BIG),  # nothing yet: the socket's error, as os.read raises it
    ):
        got = recv_both(arrived, rid, length, payload_max)
        if arrived:
            assert type(got) is bytearray and arrived.startswith(got), arrived
    a, b = socket.socketpair()
    with a, b:
        a.close()  # the end of the stream
        assert _native().recv_read_reply(b.fileno(), 5, 4, BIG) == bytearray()
        assert readlane.pure_recv_read_reply(b.fileno(), 5, 4, BIG) == bytearray()


def test_recv_read_reply_refuses_bad_arguments_with_the_same_error() -> None:
    for args in ((-1, 5, 4, 1), (0, 0, 4, 1), (0, 5, -1, 1), (0, 5, 1 << 32, 1), (0, 5, 4, None)):
        with pytest.raises(ValueError, match="fd >= 0, rid > 0, 0 <= length < 4 GiB"):
            readlane.pure_recv_read_reply(*args)
        with pytest.raises(ValueError, match="fd >= 0, rid > 0, 0 <= length < 4 GiB"):
            _native().recv_read_reply(*args)


@pytest.mark.parametrize("rid", [1, 127, 128, 255, 256, 65535, 65536, 0xFFFFFFFF])
def test_the_client_counts_a_replys_head_as_the_packer_makes_it(rid: int) -> None:
    """What the client adds to ``bytes_received`` for a reply read in place: its bytes
    before the payload, as the lane packs them, for ids of every size."""
    from shuttle.net.blocking import _reply_head_bytes

    assert _reply_head_bytes(rid) == len(readlane.pure_pack_read_reply(rid, b""))
