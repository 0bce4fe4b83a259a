"""The sans-I/O layer both clients build their requests with: no socket, no loop."""

from __future__ import annotations

import io

import pytest

from shuttle.client import calls
from shuttle.client.integrity import payload_hash
from shuttle.errors import InvalidArgumentError, LimitExceededError, RemoteProtocolError
from shuttle.wire import Response


def test_only_calls_safe_to_repeat_are_idempotent() -> None:
    """What the retry on a dropped connection may send twice: reads, listings and an
    unconditional put (the same bytes again); never a change that builds on the
    current state, nor a conditional put (the repeat would fail on the new version)."""
    repeatable = [
        calls.stat("k"),
        calls.read("k", 0, 10),
        calls.read("k", 0, 10, expected_version=3),
        calls.chunks_page("k", 0, 3),
        calls.stat_many(["a", "b"]),
        calls.list_page("p/"),
        calls.put("k", b"x"),
        calls.upload_abort("u"),
        calls.remove_many(["a"]),
        calls.cache_drop([]),
    ]
    once = [
        calls.put("k", b"x", expected_version=3),
        calls.write("k", 0, b"x"),
        calls.truncate("k", 0),
        calls.remove("k"),
        calls.create("k"),
        calls.upload_begin("k"),
        calls.upload_write("u", 0, b"x"),
        calls.upload_commit("u"),
    ]
    assert [op.op for op in repeatable if not op.idempotent] == []
    assert [op.op for op in once if op.idempotent] == []


def test_conditions_ride_only_when_given() -> None:
    assert calls.write("k", 4, b"x").args == {
        "key": "k",
        "offset": 4,
        "create": False,
        "hash": payload_hash(b"x"),  # every payload carries its hash (integrity.py)
    }
    assert calls.write("k", 4, b"x", expected_version=7).args["expected_version"] == 7
    for op in (
        calls.truncate("k", 0),
        calls.remove("k"),
        calls.put("k", b""),
        calls.upload_begin("k"),
    ):
        assert "expected_version" not in op.args
    assert calls.remove("k", expected_version=2).args == {"key": "k", "expected_version": 2}
    assert calls.upload_begin("k", 5).args == {"key": "k", "expected_version": 5}
    assert calls.list_page("p", "/", "p/a").args == {
        "prefix": "p",
        "delimiter": "/",
        "start_after": "p/a",
    }


def test_streamed_reads_cover_the_range_pinned_to_one_version() -> None:
    ops = list(calls.read_pieces("k", 5, 25, 8, version=9))
    assert [(o.args["offset"], o.args["length"]) for o in ops] == [(5, 8), (13, 8), (21, 4)]
    assert {o.args["expected_version"] for o in ops} == {9}
    assert list(calls.read_pieces("k", 5, 5, 8, version=9)) == []


def test_limits_are_checked_before_anything_is_sent() -> None:
    over = bytes(calls.REQUEST_PAYLOAD_BYTES_MAX + 1)
    with pytest.raises(LimitExceededError, match="split it into several range writes"):
        calls.write("k", 0, over)
    with pytest.raises(LimitExceededError, match="one request may carry"):
        calls.upload_write("u", 0, memoryview(over), key="k")
    calls.write("k", 0, memoryview(over)[:-1])  # exactly at the limit: fine
    assert calls.single_put(bytes(calls.SINGLE_PUT_BYTES_MAX))
    assert not calls.single_put(bytes(calls.SINGLE_PUT_BYTES_MAX + 1))
    assert not calls.single_put(io.BytesIO(b"x"))
    with pytest.raises(LimitExceededError, match="go through an upload"):
        calls.put("k", bytes(calls.SINGLE_PUT_BYTES_MAX + 1))
    for piece_bytes, window in ((0, 1), (1, 0), (-1, 8)):
        with pytest.raises(InvalidArgumentError, match="must be positive"):
            calls.check_tuning(piece_bytes, window)


def test_answers_parse_or_say_the_node_was_wrong() -> None:
    raw = {"key": "k", "size": 3, "version": 2, "mtime_ns": 1, "hash": b"h"}
    assert calls.object_info(Response(1, raw)).version == 2
    assert calls.infos(Response(1, [raw, None]), ["k", "gone"])[1] is None
    assert calls.existed(Response(1, [1, 0])) == [True, False]
    page = calls.page(Response(1, {"keys": ["a"], "prefixes": ["d/"], "next": None}))
    assert (page.keys, page.prefixes, page.next) == (["a"], ["d/"], None)
    with pytest.raises(RemoteProtocolError, match="malformed listing page"):
        calls.page(Response(1, {"keys": ["a"]}))
    assert calls.piece(Response(1, None, memoryview(b"ab"))) == b"ab"


def test_sources_are_cut_into_pieces() -> None:
    assert list(calls.pieces(b"abcde", 2)) == [b"ab", b"cd", b"e"]
    assert list(calls.pieces(io.BytesIO(b"abcde"), 2)) == [b"ab", b"cd", b"e"]
    assert list(calls.pieces([b"a", b"bcd", b"e"], 2)) == [b"ab", b"cd", b"e"]
