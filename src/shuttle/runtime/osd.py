"""The OSD as a placement site: ``grep`` and ``count`` inside Ceph's OSDs (``cls_lua``).

A Ceph OSD runs Lua sent with an operation (the ``lua`` object class, ``eval_bufferlist``)
next to the object's bytes, on the OSD's CPU. :class:`OsdSite` sends the scripts of
:mod:`shuttle.runtime.osd_lua` one slice at a time and stitches the answers into what
``grep -n`` and ``wc`` (``objects/grep.py``, ``objects/count.py``) give for the same
bytes: the same lines, numbers and counts as Python's ``re`` with the pattern as a
fixed string (tested on the same bytes).

What the bare ``cls_lua`` does, and what this module does about it (measured on a
16 MB text in issue 12):

* ``execute()`` fails with ERANGE when the output is longer than the buffer the caller
  gave (8 KiB by default): every call here gives ``out_max_bytes`` and the script never
  writes more; a call that would is cut short at a line and resumed.
* A Lua error comes back as a bare EIO with the message only in the OSD's log: the
  scripts run their body under ``pcall`` and return the message, raised here as
  :class:`ObjectFailedError` naming the object and the message.
* The OSD runs one operation at a time per placement group, so a long Lua call blocks
  every other client of that PG: each call covers at most ``slice_bytes`` and examines
  at most ``steps_max`` matches (a few ms of work), and the connection's operation
  timeout turns a call that still runs too long into :class:`RequestTimeoutError`
  rather than a hang. (The OSD's Lua has no clock and no debug hooks, so a script
  cannot time itself; the bounds are on its work.)

Only fixed-string patterns run at the OSD (Lua has no regular expressions);
:func:`literal_of` says whether a pattern is one, and the placement model leaves the OSD
out for the others. ``rados`` (Debian's ``python3-rados``) is imported only to open a
pool (through :func:`shuttle.cluster.ceph.connect`); everything else takes an
``Ioctx``-like object with ``execute``.
"""

from __future__ import annotations

import contextlib
import errno
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from shuttle.cluster.cephclient import connect
from shuttle.errors import (
    ConfigError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    ObjectFailedError,
    RequestTimeoutError,
    ServerError,
)
from shuttle.runtime.osd_lua import HANDLER_RUN, HANDLER_SCAN, RUN, SCAN

#: Bytes one call scans: 4 MiB is one default RADOS stripe unit and a few ms of
#: ``string.find`` (19-40 ms for 16 MB measured), short enough not to hold a PG long.
SLICE_BYTES_DEFAULT = 4 << 20
#: The output buffer given to ``execute`` and the most a script writes (librados's
#: default, 8 KiB, is what made execute fail with ERANGE).
OUT_MAX_BYTES_DEFAULT = 1 << 20
#: Matches one call examines before it returns and is resumed.
STEPS_MAX_DEFAULT = 100_000
#: The client's operation timeout: a call not answered by then raises instead of hanging.
OP_TIMEOUT_S_DEFAULT = 30
#: Frame header bytes the scripts reserve (see osd_lua).
_HEAD = struct.Struct("<cQQQQBQ")
_LINE_LEN = struct.Struct("<Q")
_U32 = struct.Struct("<I")
#: Characters that make a regular expression more than a fixed string.
_REGEX_META = frozenset(".^$*+?{}[]\\|()")


class Ioctx(Protocol):
    """What :class:`OsdSite` needs of a ``rados.Ioctx``."""

    def execute(
        self, key: str, cls: str, method: str, data: bytes, length: int = ...
    ) -> tuple[int, Any]: ...


def literal_of(pattern: str) -> bytes | None:
    """The pattern as a fixed string if it is one (no regex metacharacters, no
    newline), else None: only fixed strings run at the OSD."""
    if not pattern or "\n" in pattern or any(c in _REGEX_META for c in pattern):
        return None
    return pattern.encode()


def _eval_op(script: str, handler: str, data: bytes) -> bytes:
    """``cls_lua_eval_op`` in Ceph's encoding: version 1, compat 1, then the struct."""

    def s(b: bytes) -> bytes:
        return _U32.pack(len(b)) + b

    body = s(script.encode()) + s(handler.encode()) + s(data)
    return bytes((1, 1)) + _U32.pack(len(body)) + body


def _string(buf: bytes, pos: int) -> tuple[bytes, int]:
    (n,) = _U32.unpack_from(buf, pos)
    pos += 4
    return buf[pos : pos + n], pos + n


@dataclass
class SliceAnswer:
    """One scan call's answer (see :mod:`shuttle.runtime.osd_lua`)."""

    partial: bool
    size: int
    end: int
    newlines: int
    words: int
    edges: int
    matches: int
    head: bytes
    tail: bytes
    lines: list[tuple[int, bytes]] = field(default_factory=list)


@dataclass
class ScanCursor:
    """Where a scan of one object stands (what a mobile object checkpoints)."""

    offset: int = 0
    #: Newlines before ``offset``.
    lines_before: int = 0
    #: The unfinished line before ``offset``.
    carry: bytes = b""
    done: bool = False


@dataclass
class OsdCounters:
    """What an :class:`OsdSite` did: the model's measurements of the OSD site."""

    calls: int = 0
    scanned_bytes: int = 0
    returned_bytes: int = 0
    #: Wall time inside ``execute`` (the OSD's work plus a round trip each).
    execute_s: float = 0.0


class OsdSite:
    """Run grep and count at the OSD that holds a RADOS object, bounded per call."""

    def __init__(
        self,
        ioctx: Ioctx,
        *,
        slice_bytes: int = SLICE_BYTES_DEFAULT,
        out_max_bytes: int = OUT_MAX_BYTES_DEFAULT,
        steps_max: int = STEPS_MAX_DEFAULT,
    ) -> None:
        if slice_bytes < 1 or out_max_bytes < 256 or steps_max < 1:
            raise ConfigError(
                "slice_bytes must be ≥ 1, out_max_bytes ≥ 256 and steps_max ≥ 1, got "
                f"{slice_bytes}, {out_max_bytes}, {steps_max}"
            )
        self.ioctx = ioctx
        self.slice_bytes = slice_bytes
        self.out_max_bytes = out_max_bytes
        self.steps_max = steps_max
        self.counters = OsdCounters()

    # -- one call ----------------------------------------------------------------------

    def _execute(self, oid: str, script: str, handler: str, data: bytes) -> bytes:
        op = _eval_op(script, handler, data)
        t0 = time.perf_counter()
        try:
            _ret, out = self.ioctx.execute(oid, "lua", "eval_bufferlist", op, self.out_max_bytes)
        except Exception as exc:  # rados.Error subclasses carry the errno
            raise _translate(exc, oid) from exc
        finally:
            self.counters.execute_s += time.perf_counter() - t0
            self.counters.calls += 1
        out = bytes(out)
        self.counters.returned_bytes += len(out)
        return out

    def scan_slice(
        self, oid: str, pattern: bytes, offset: int, *, ignore_case: bool, collect: bool
    ) -> SliceAnswer:
        """One bounded call: scan ``[offset, offset + slice_bytes)`` of ``oid``."""
        flags = (1 if ignore_case else 0) | (2 if collect else 0)
        args = _U32.pack(len(pattern)) + pattern
        args += struct.pack(
            "<QQQQB", offset, self.slice_bytes, self.out_max_bytes, self.steps_max, flags
        )
        out = self._execute(oid, SCAN, HANDLER_SCAN, args)
        kind = out[:1]
        if kind == b"E":
            message, _ = _string(out, 1)
            raise ObjectFailedError(
                f"the Lua scan at the OSD of {oid!r} failed: {message.decode(errors='replace')}"
            )
        if kind == b"L":
            at, length = struct.unpack_from("<QQ", out, 1)
            raise LimitExceededError(
                f"a line of {length} bytes at offset {at} of {oid!r} is longer than the OSD "
                f"call's output bound of {self.out_max_bytes} bytes; raise out_max_bytes or "
                "run this search at the node or the client"
            )
        if kind not in (b"O", b"P"):
            raise ServerError(f"the OSD's scan of {oid!r} answered an unknown frame {out[:16]!r}")
        _k, size, end, newlines, words, edges, matches = _HEAD.unpack_from(out, 0)
        head, pos = _string(out, _HEAD.size)
        tail, pos = _string(out, pos)
        answer = SliceAnswer(kind == b"P", size, end, newlines, words, edges, matches, head, tail)
        while pos < len(out):
            (before,) = _LINE_LEN.unpack_from(out, pos)
            line, pos = _string(out, pos + 8)
            answer.lines.append((before, line))
        self.counters.scanned_bytes += end - offset
        return answer

    def run_lua(self, oid: str, source: str, data: bytes = b"") -> bytes:
        """Run a Lua body at the OSD of ``oid``; returns what it returns (a string).

        The body is loaded with ``load`` and run under ``pcall`` inside a registered
        handler, so syntax and run-time errors come back as :class:`ObjectFailedError`
        with Lua's message. It sees its input as ``...`` and the object as ``objclass``.
        A body that runs past the connection's operation timeout raises
        :class:`RequestTimeoutError` (it may still hold its PG at the OSD until it ends).
        """
        args = _U32.pack(len(data)) + data + _U32.pack(len(source.encode())) + source.encode()
        out = self._execute(oid, RUN, HANDLER_RUN, args)
        result, _ = _string(out, 1)
        if out[:1] == b"E":
            raise ObjectFailedError(
                f"the Lua body at the OSD of {oid!r} failed: {result.decode(errors='replace')}"
            )
        return result

    # -- whole objects ---------------------------------------------------------------

    def step(
        self, oid: str, pattern: bytes, cursor: ScanCursor, *, ignore_case: bool, collect: bool
    ) -> tuple[SliceAnswer, list[tuple[int, bytes]]]:
        """One bounded call from ``cursor`` (advanced in place): the answer and the
        matching lines it completes, ``(line number, line)`` numbered from 1, the
        fragments at slice edges joined. ``cursor.done`` says when the object is over."""
        needle = pattern.lower() if ignore_case else pattern
        c = cursor
        a = self.scan_slice(oid, needle, c.offset, ignore_case=ignore_case, collect=collect)
        found: list[tuple[int, bytes]] = []
        if a.newlines == 0 and not a.partial:
            c.carry += a.head
            if len(c.carry) > self.out_max_bytes:
                raise LimitExceededError(
                    f"a line of more than {self.out_max_bytes} bytes before offset {a.end} "
                    f"of {oid!r}; raise out_max_bytes or run this search at the node or the "
                    "client"
                )
        else:
            line = c.carry + a.head
            if needle and _has(line, needle, ignore_case):
                found.append((c.lines_before + 1, line))
            found += [(c.lines_before + before + 1, text) for before, text in a.lines]
            c.carry = a.tail
        c.lines_before += a.newlines
        c.offset = a.end
        if c.offset >= a.size and not a.partial:
            # The last line, if the object does not end with a newline.
            if c.carry and needle and _has(c.carry, needle, ignore_case):
                found.append((c.lines_before + 1, c.carry))
            c.carry = b""
            c.done = True
        return a, found

    def grep(
        self, oid: str, pattern: str | bytes, *, ignore_case: bool = False
    ) -> list[tuple[int, bytes]]:
        """The lines of ``oid`` containing ``pattern`` (a fixed string), as
        ``(line number, line)``: what ``grep -nF`` gives."""
        needle = _needle(pattern)
        cursor = ScanCursor()
        out: list[tuple[int, bytes]] = []
        while not cursor.done:
            _a, found = self.step(oid, needle, cursor, ignore_case=ignore_case, collect=True)
            out += found
        return out

    def count(
        self, oid: str, pattern: str | bytes | None = None, *, ignore_case: bool = False
    ) -> dict[str, int]:
        """Lines, words and bytes of ``oid`` (``wc``) and, with a pattern (a fixed
        string), the lines containing it: the ``count`` object's totals."""
        needle = b"" if pattern is None else _needle(pattern)
        totals = {"lines": 0, "words": 0, "bytes": 0, "matches": 0}
        prev_edge = False  # the previous slice ended inside a word
        cursor = ScanCursor()
        while not cursor.done:
            a, found = self.step(oid, needle, cursor, ignore_case=ignore_case, collect=False)
            totals["lines"] += a.newlines
            totals["words"] += a.words - (1 if prev_edge and a.edges & 1 else 0)
            totals["matches"] += a.matches + len(found)
            prev_edge = bool(a.edges & 2)
            totals["bytes"] = max(totals["bytes"], a.end)
        return totals


def _needle(pattern: str | bytes) -> bytes:
    needle = pattern.encode() if isinstance(pattern, str) else pattern
    if not needle or b"\n" in needle:
        raise InvalidArgumentError(
            f"an OSD search needs a non-empty fixed string without newlines, got {pattern!r}"
        )
    return needle


def _has(line: bytes, needle: bytes, ignore_case: bool) -> bool:
    return needle in (line.lower() if ignore_case else line)


def _translate(exc: Exception, oid: str) -> Exception:
    """A librados error as a Shuttle error that says what to do."""
    code = getattr(exc, "errno", None)
    if code is not None and code < 0:
        code = -code
    if code == errno.ETIMEDOUT:
        return RequestTimeoutError(
            f"the OSD did not answer the Lua call on {oid!r} within the connection's "
            "operation timeout; it may still be running there and holds its placement "
            "group until it ends: give the call less work (slice_bytes, steps_max)"
        )
    if code == errno.ERANGE:
        return LimitExceededError(
            f"the Lua call on {oid!r} answered more than its output buffer holds (ERANGE); "
            "raise out_max_bytes"
        )
    if code == errno.ENOENT:
        return NotFoundError(f"no RADOS object {oid!r} in this pool")
    if code == errno.EOPNOTSUPP or code == errno.EPERM:
        return ConfigError(
            f"the OSD refused the lua object class for {oid!r} ({exc}); start the OSDs "
            "with 'osd class load list = *' and 'osd class default list = *'"
        )
    if code == errno.EIO:
        return ObjectFailedError(
            f"the Lua call on {oid!r} failed at the OSD (EIO) before its error handler "
            "ran; Lua's message is in the OSD's log"
        )
    return ServerError(f"the OSD failed the Lua call on {oid!r}: {exc}")


@contextlib.contextmanager
def open_pool(
    conf_path: Path,
    pool: str,
    *,
    keyring_path: Path | None = None,
    user: str = "client.admin",
    op_timeout_s: float = OP_TIMEOUT_S_DEFAULT,
    namespace: str = "",
) -> Iterator[Any]:
    """A ``rados.Ioctx`` on ``pool`` (and ``namespace``) whose operations time out after
    ``op_timeout_s`` (whole seconds, at least 1), so a Lua call that runs too long
    raises instead of hanging."""
    # Ceph takes these timeouts in whole seconds ("30.0" is refused with EINVAL).
    whole_s = max(1, round(op_timeout_s))
    cluster = connect(conf_path, keyring_path, user=user, op_timeout_s=whole_s)
    try:
        ioctx = cluster.open_ioctx(pool)
        if namespace:
            ioctx.set_namespace(namespace)
        try:
            yield ioctx
        finally:
            ioctx.close()
    finally:
        cluster.shutdown()
