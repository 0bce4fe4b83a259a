"""grep and count inside the OSD (cls_lua) against Python's ``re`` on the same bytes,
and the OSD's three failures each answered with a clear error: a Lua error, an output
longer than the caller's buffer, a call that runs too long. Needs the session's Ceph."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shuttle.cluster.ceph import LocalCeph
from shuttle.errors import LimitExceededError, ObjectFailedError, RequestTimeoutError
from shuttle.objects.grep import compile_pattern
from shuttle.runtime.osd import OsdSite, literal_of, open_pool

WORDS = [b"alpha", b"beta", b"ERROR", b"Error", b"gamma", b"x", b"", b" ", b"\t", b"err"]


@pytest.fixture(scope="module")
def ioctx(ceph: LocalCeph) -> Iterator[Any]:
    info = ceph.info()
    with open_pool(info.conf_path, info.pool, keyring_path=info.keyring_path) as io:
        yield io


def text(seed: int, lines: int, *, trailing_newline: bool) -> bytes:
    rnd = random.Random(seed)
    out = [b" ".join(rnd.choice(WORDS) for _ in range(rnd.randrange(0, 12))) for _ in range(lines)]
    if rnd.random() < 0.1:
        out.append(b"ERROR" * 300)  # a line longer than the small slices
    data = b"\n".join(out)
    return data + b"\n" if trailing_newline else data


def reference(data: bytes, pattern: bytes, ignore_case: bool) -> list[tuple[int, bytes]]:
    """What grep -n gives: Python's re, the pattern escaped, line by line."""
    regex = compile_pattern(re.escape(pattern.decode()), ignore_case)
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    return [(i + 1, line) for i, line in enumerate(lines) if regex.search(line)]


@pytest.mark.parametrize(
    ("seed", "slice_bytes", "trailing"),
    [(1, 4 << 20, True), (2, 4 << 20, False), (3, 997, True), (4, 61, False), (5, 2, True)],
)
def test_grep_and_count_give_what_python_re_gives(
    ioctx: Any, seed: int, slice_bytes: int, trailing: bool
) -> None:
    """Whole object in one call, and slices so small that lines and words straddle them
    (two bytes: every line is stitched from fragments)."""
    # Small slices cost a call each (a few ms): fewer lines for them.
    data = text(
        seed,
        3000 if slice_bytes > 1000 else 300 if slice_bytes > 2 else 12,
        trailing_newline=trailing,
    )
    oid = f"cls-lua-{seed}"
    ioctx.write_full(oid, data)
    site = OsdSite(ioctx, slice_bytes=slice_bytes)
    for pattern, ignore_case in ((b"ERROR", False), (b"error", True), (b"beta gam", False)):
        want = reference(data, pattern, ignore_case)
        assert site.grep(oid, pattern, ignore_case=ignore_case) == want
        assert site.count(oid, pattern, ignore_case=ignore_case) == {
            "lines": data.count(b"\n"),
            "words": len(data.split()),
            "bytes": len(data),
            "matches": len(want),
        }
    assert site.count(oid)["words"] == len(data.split())


def test_an_empty_object_and_one_line_without_a_newline(ioctx: Any) -> None:
    ioctx.write_full("cls-lua-empty", b"")
    site = OsdSite(ioctx)
    assert site.grep("cls-lua-empty", "x") == []
    assert site.count("cls-lua-empty", "x") == {"lines": 0, "words": 0, "bytes": 0, "matches": 0}
    ioctx.write_full("cls-lua-one", b"one ERROR line")
    assert site.grep("cls-lua-one", "ERROR") == [(1, b"one ERROR line")]


def test_bounded_calls_resume_where_they_stopped(ioctx: Any) -> None:
    """A call stops after ``steps_max`` matches or ``out_max`` bytes and the next one
    resumes at that line: same answer, more calls."""
    data = text(7, 1000, trailing_newline=True)
    ioctx.write_full("cls-lua-bounded", data)
    want = reference(data, b"ERROR", False)
    site = OsdSite(ioctx, steps_max=3, out_max_bytes=1024)
    assert site.grep("cls-lua-bounded", "ERROR") == want
    # Each call takes at most 3 matches, plus the line it stitches from fragments.
    assert site.counters.calls > len(want) // 5
    assert OsdSite(ioctx).count("cls-lua-bounded", "ERROR")["matches"] == len(want)


def test_only_fixed_strings_go_to_the_osd() -> None:
    assert literal_of("ERROR 42") == b"ERROR 42"
    for regex in ("ERR.R", "^x", "a|b", "a+", "(a)", "x\\d", ""):
        assert literal_of(regex) is None


def test_a_lua_error_comes_back_with_its_message(ioctx: Any) -> None:
    ioctx.write_full("cls-lua-err", b"x\n")
    site = OsdSite(ioctx)
    with pytest.raises(ObjectFailedError, match="boom at the OSD"):
        site.run_lua("cls-lua-err", 'error("boom at the OSD")')
    with pytest.raises(ObjectFailedError, match=r"syntax:.*"):
        site.run_lua("cls-lua-err", "this is not lua")
    # A failed cls call inside the body: its errno and message, not a bare EIO.
    with pytest.raises(ObjectFailedError, match="errno"):
        site.run_lua("cls-lua-err", 'return objclass.getxattr("no-such-attr")')
    assert site.run_lua("cls-lua-err", "return 'size ' .. objclass.stat()") == b"size 2"


def test_an_oversized_output_is_a_clear_error(ioctx: Any) -> None:
    """A matching line longer than the output bound: not ERANGE from librados but an
    error naming the line, the bound and what to do."""
    ioctx.write_full("cls-lua-long", b"short\n" + b"ERROR" * 2000 + b"\nend\n")
    site = OsdSite(ioctx, out_max_bytes=4096)
    with pytest.raises(LimitExceededError, match=r"line of 10000 bytes .* 4096 bytes"):
        site.grep("cls-lua-long", "ERROR")
    # A body that returns more than the buffer: librados's ERANGE, translated.
    with pytest.raises(LimitExceededError, match="ERANGE"):
        site.run_lua("cls-lua-long", "return string.rep('x', 100000)")


def test_a_slow_call_times_out_with_a_clear_error(ceph: LocalCeph) -> None:
    """A Lua body that runs past the connection's operation timeout raises instead of
    hanging; the OSD finishes it (it holds its PG until then), and the object is
    usable again afterwards. The body's length is measured on this machine first (a
    fixed count of iterations took 4-8 s on one machine and 0.9 s on another, under
    the 1 s timeout): about 4 s of it, well over the timeout and under the OSD's 15 s
    op-thread timeout."""
    info = ceph.info()
    with open_pool(info.conf_path, info.pool, keyring_path=info.keyring_path) as io:
        io.write_full("cls-lua-slow", b"x\n")
        probe = 10_000_000
        t0 = time.monotonic()
        OsdSite(io).run_lua("cls-lua-slow", f"local x = 0 for i = 1, {probe} do x = x + i end")
        per_iteration_s = (time.monotonic() - t0) / probe
    iterations = int(min(4.0 / per_iteration_s, 3e9))
    with open_pool(
        info.conf_path, info.pool, keyring_path=info.keyring_path, op_timeout_s=1.0
    ) as io:
        site = OsdSite(io)
        t0 = time.monotonic()
        with pytest.raises(RequestTimeoutError, match=r"did not answer .*slice_bytes"):
            site.run_lua("cls-lua-slow", f"local x = 0 for i = 1, {iterations} do x = x + i end")
        assert time.monotonic() - t0 < 10
    with open_pool(info.conf_path, info.pool, keyring_path=info.keyring_path) as io:
        assert OsdSite(io).grep("cls-lua-slow", "x") == [(1, b"x")]
