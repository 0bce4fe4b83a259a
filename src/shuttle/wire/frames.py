"""Frame layout: a 12-byte prefix, a msgpack header, then raw payload bytes.

::

    offset  size  field
    0       2     magic  b"SH"
    2       1     kind   (FrameKind)
    3       1     flags  (reserved, must be 0)
    4       4     header_len   unsigned big-endian
    8       4     payload_len  unsigned big-endian
    12      H     header       msgpack
    12+H    P     payload      raw bytes, never re-encoded

:class:`FrameReader` turns a byte stream into :class:`RawFrame` objects with bounded
memory: an oversized payload is skipped as it streams past, not buffered, and (on a
node, ``grow_payloads``) a large payload costs the bytes that have arrived, not the
length its prefix claims: a peer that claims 16 MiB and sends 10 bytes holds 10 bytes.
"""

from __future__ import annotations

import reprlib
import struct
from typing import Any, Final

import msgpack

from shuttle.errors import LimitExceededError, RemoteProtocolError
from shuttle.wire.events import FrameKind, Payload
from shuttle.wire.limits import HEADER_DEPTH_MAX, PREFIX_BYTES

MAGIC: Final = b"SH"
_PREFIX: Final = struct.Struct(">2sBBII")
_KIND_OF: Final = {int(k): k for k in FrameKind}
# The codec's primitives, bound once (the connection's fast lanes use them directly).
PREFIX_PACK: Final = _PREFIX.pack
PREFIX_UNPACK_FROM: Final = _PREFIX.unpack_from
pack_header: Final = msgpack.Packer(use_bin_type=True, autoreset=True).pack
#: msgpack >= 1.0 (the pinned minimum) defaults to raw=False, use_list=True and
#: strict_map_key=True: str keys and values, lists, no non-str/bytes map keys.
unpack_header: Final = msgpack.unpackb

assert _PREFIX.size == PREFIX_BYTES

#: Payloads at least this large are received into a buffer of their own (no copy
#: through the reader's stream buffer; with :meth:`FrameReader.payload_buffer`, no
#: copy at all). Smaller ones are cheaper to slice out of the stream buffer.
DIRECT_PAYLOAD_BYTES_MIN: Final = 64 << 10


#: A growing payload's small arrivals are gathered in buffers of about this size (a
#: peer sending it in tiny segments must not cost an object per segment).
_PART_BYTES: Final = 1 << 20

#: One frame off the wire: ``(kind, header, payload, payload_refused)``, the header
#: decoded from msgpack. ``payload_refused`` is non-zero when the payload was longer
#: than the reader's limit: its bytes were discarded (``payload`` is empty) and the
#: receiver should answer with a limit error. A plain tuple: it is made for every
#: frame, and a tuple costs a fraction of a class instance.
RawFrame = tuple[FrameKind, Any, "bytes | bytearray", int]


def encode_frame(
    kind: FrameKind,
    header: Any,
    payload: Payload = b"",
    *,
    header_bytes_max: int,
    payload_bytes_max: int,
) -> list[Payload]:
    """Encode one frame as buffers for ``writelines`` (the payload is not copied).

    Raises :class:`LimitExceededError` if the header or payload is over the limit.
    """
    return encode_frame_fast(kind, header, payload, header_bytes_max, payload_bytes_max)


def encode_frame_fast(
    kind: FrameKind,
    header: Any,
    payload: Payload,
    header_bytes_max: int,
    payload_bytes_max: int,
    join_below: int = 0,
) -> list[Payload]:
    """:func:`encode_frame` with positional arguments (it is on every request's path);
    a payload shorter than ``join_below`` is joined with the prefix and header."""
    head = pack_header(header)
    if len(head) > header_bytes_max:
        raise LimitExceededError(
            f"frame header is {len(head)} bytes, over the limit of {header_bytes_max}; "
            "send fewer or smaller arguments (page listings, move data to the payload)"
        )
    payload_len = payload.nbytes if type(payload) is memoryview else len(payload)
    if payload_len > payload_bytes_max:
        raise LimitExceededError(
            f"frame payload is {payload_len} bytes, over the limit of {payload_bytes_max} "
            "one request or answer carries; send less in one call"
        )
    if not payload_len:
        return [PREFIX_PACK(MAGIC, kind, 0, len(head), 0) + head]
    if payload_len < join_below:
        return [b"".join((PREFIX_PACK(MAGIC, kind, 0, len(head), payload_len), head, payload))]
    return [PREFIX_PACK(MAGIC, kind, 0, len(head), payload_len) + head, payload]


_brief_repr = reprlib.Repr()
_brief_repr.maxlevel = 4
_brief_repr.maxstring = 60
_brief_repr.maxother = 60


def brief(value: Any) -> str:
    """A short repr for error messages, whatever the value's size or depth (a plain
    repr of a deeply nested header would exceed the recursion limit)."""
    return _brief_repr.repr(value)[:200]


def nested_too_deep(value: Any, depth_max: int = HEADER_DEPTH_MAX) -> bool:
    """Whether lists and maps in ``value`` nest deeper than ``depth_max`` (no recursion)."""
    level: list[Any] = [value]
    for _ in range(depth_max):
        inner: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is list:
                inner += item
            elif kind is dict:
                inner += item.values()
        if not inner:
            return False
        level = inner
    return any(type(item) is list or type(item) is dict for item in level)


def _decode_header(raw: bytes | bytearray) -> Any:
    """A frame's msgpack header; :class:`RemoteProtocolError` if it is not msgpack or
    nests deeper than :data:`HEADER_DEPTH_MAX`."""
    try:
        # msgpack >= 1.0 (the pinned minimum) defaults to raw=False, use_list=True and
        # strict_map_key=True: str keys and values, lists, no non-str/bytes map keys.
        header = unpack_header(raw)
    except Exception as exc:  # msgpack raises many types on garbage
        raise RemoteProtocolError(
            f"undecodable frame header ({type(exc).__name__}: {exc}); the stream is corrupt"
        ) from exc
    if len(raw) > HEADER_DEPTH_MAX and nested_too_deep(header):
        raise RemoteProtocolError(
            f"frame header nests lists or maps deeper than {HEADER_DEPTH_MAX} levels; "
            "the peer is broken or hostile"
        )
    return header


class FrameReader:
    """Accumulates stream bytes and yields complete frames.

    Raises :class:`RemoteProtocolError` when the stream is corrupt (bad magic, unknown
    kind, non-zero flags, oversized or undecodable header, EOF inside a frame); the
    reader is then unusable.
    """

    def __init__(
        self, *, header_bytes_max: int, payload_bytes_max: int, grow_payloads: bool = False
    ) -> None:
        self._header_bytes_max = header_bytes_max
        self._payload_bytes_max = payload_bytes_max
        #: Received bytes from ``_pos`` on are not parsed yet. Usually a bytearray that
        #: accumulates; but a ``bytes`` object fed when nothing was pending is kept as
        #: it is (it cannot change under us), which saves copying every small frame.
        self._buf: bytes | bytearray = bytearray()
        self._pos = 0
        #: Bytes of a refused payload still to discard as they arrive.
        self._skip = 0
        #: A large payload being received into a buffer of its own (see
        #: :meth:`payload_buffer`), with the kind and header of its frame.
        self._payload: bytearray | None = None
        self._filled = 0
        self._pending: tuple[FrameKind, Any] | None = None
        #: With ``grow_payloads`` (a node, whose peers are not trusted), a large
        #: payload is kept as the chunks that arrived and joined once whole, instead
        #: of a buffer of the claimed size allocated up front; ``_payload_len`` is the
        #: claimed size. (A client asked for what it receives: it preallocates, so
        #: the bytes can be received straight into place.)
        self._grow = grow_payloads
        self._parts: list[bytes | bytearray] | None = None
        self._payload_len = 0

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos + self._filled

    @property
    def partial_frame(self) -> bool:
        """True while a frame has started to arrive and is not whole yet."""
        return not self.at_frame_boundary()

    def feed(self, data: Payload) -> None:
        if self._skip:
            n = len(data) if not isinstance(data, memoryview) else data.nbytes
            if n <= self._skip:
                self._skip -= n
                return
            data = memoryview(data)[self._skip :]
            self._skip = 0
        if self._parts is not None:
            n = len(data) if not isinstance(data, memoryview) else data.nbytes
            take = min(n, self._payload_len - self._filled)
            parts = self._parts
            if take >= DIRECT_PAYLOAD_BYTES_MIN:
                parts.append(
                    data if take == n and type(data) is bytes else bytes(memoryview(data)[:take])
                )
            elif parts and type(parts[-1]) is bytearray and len(parts[-1]) < _PART_BYTES:
                parts[-1] += memoryview(data)[:take]  # small pieces share one buffer
            else:
                parts.append(bytearray(memoryview(data)[:take]))
            self._filled += take
            if take == n:
                return
            data = memoryview(data)[take:]
        elif self._payload is not None:
            view = memoryview(data).cast("B")
            take = min(view.nbytes, len(self._payload) - self._filled)
            self._payload[self._filled : self._filled + take] = view[:take]
            self._filled += take
            if take == view.nbytes:
                return
            data = view[take:]
        buf = self._buf
        if self._pos == len(buf):  # everything before was parsed
            self._pos = 0
            if type(data) is bytes:
                self._buf = data
            elif isinstance(buf, bytearray):
                buf.clear()
                buf += data
            else:
                self._buf = bytearray(data)
        elif isinstance(buf, bytearray):
            if self._pos * 2 >= len(buf):
                del buf[: self._pos]
                self._pos = 0
            buf += data
        else:  # a partial frame in a kept chunk: start accumulating
            grown = bytearray(memoryview(buf)[self._pos :])
            grown += data
            self._buf, self._pos = grown, 0

    def at_frame_boundary(self) -> bool:
        """True when no partial frame is buffered (a clean place for EOF)."""
        return (
            self._skip == 0
            and self._payload is None
            and self._parts is None
            and self._pos == len(self._buf)
        )

    def payload_buffer(self) -> memoryview | None:
        """Where the rest of a large payload goes, or None when none is awaited.

        An I/O layer may ``recv_into`` this view and then call
        :meth:`payload_received`; the bytes then land in their final buffer with no
        intermediate copy. (Feeding them through :meth:`feed` works too.)
        """
        if self._payload is None or self._filled == len(self._payload):
            return None
        return memoryview(self._payload)[self._filled :]

    def payload_received(self, nbytes: int) -> None:
        """``nbytes`` were written into :meth:`payload_buffer`."""
        assert self._payload is not None and self._filled + nbytes <= len(self._payload)
        self._filled += nbytes

    def whole_frame(self, data: Payload) -> RawFrame | None:
        """The small-frame fast lane: if nothing is pending and ``data`` is a ``bytes``
        object holding exactly one whole small frame (payload under
        :data:`DIRECT_PAYLOAD_BYTES_MIN`, every limit kept), that frame, decoded from
        ``data`` without buffering it. Otherwise None with nothing consumed: feed
        ``data`` through :meth:`feed` then (which also reports anything wrong with it).

        This is the only way in to the reader besides :meth:`feed`: every caller that
        wants a whole frame from one chunk (the node's request lane, the clients'
        response lanes) comes through here, so the frame rules live in one place.
        """
        if type(data) is not bytes:
            return None
        n = len(data)
        if (
            n < PREFIX_BYTES
            or self._pos != len(self._buf)
            or self._skip
            or self._payload is not None
            or self._parts is not None
        ):
            return None
        magic, kind, flags, header_len, payload_len = PREFIX_UNPACK_FROM(data, 0)
        head_end = PREFIX_BYTES + header_len
        if (
            head_end + payload_len != n
            or payload_len >= DIRECT_PAYLOAD_BYTES_MIN
            or payload_len > self._payload_bytes_max
            or header_len > self._header_bytes_max
            or magic != MAGIC
            or flags
        ):
            return None
        frame_kind = _KIND_OF.get(kind)
        if frame_kind is None:
            return None
        try:
            header = unpack_header(data[PREFIX_BYTES:head_end])
        except Exception:  # the long way raises the protocol error
            return None
        if header_len > HEADER_DEPTH_MAX and nested_too_deep(header):
            return None  # likewise
        return (frame_kind, header, data[head_end:] if payload_len else b"", 0)

    def next_frame(self) -> RawFrame | None:
        """The next complete frame, or ``None`` if more bytes are needed."""
        if self._parts is not None:
            if self._filled < self._payload_len:
                return None
            assert self._pending is not None
            (kind_, header_), parts = self._pending, self._parts
            self._parts, self._pending, self._filled = None, None, 0
            return (kind_, header_, parts[0] if len(parts) == 1 else b"".join(parts), 0)
        if self._payload is not None:
            if self._filled < len(self._payload):
                return None
            assert self._pending is not None
            (kind_, header_), payload_ = self._pending, self._payload
            self._payload, self._pending, self._filled = None, None, 0
            return (kind_, header_, payload_, 0)
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < PREFIX_BYTES:
            return None
        magic, kind, flags, header_len, payload_len = PREFIX_UNPACK_FROM(buf, pos)
        if magic != MAGIC:
            raise RemoteProtocolError(
                f"bad frame magic {bytes(magic)!r} (expected {MAGIC!r}): the peer is not "
                "speaking the Shuttle protocol or the stream is corrupt"
            )
        frame_kind = _KIND_OF.get(kind)
        if frame_kind is None or flags != 0:
            raise RemoteProtocolError(
                f"bad frame prefix (kind={kind}, flags={flags}): unknown frame kind or "
                "reserved flags set; is the peer a newer Shuttle?"
            )
        if header_len > self._header_bytes_max:
            raise RemoteProtocolError(
                f"frame header of {header_len} bytes is over the limit of "
                f"{self._header_bytes_max}; refusing the stream"
            )
        head_start = pos + PREFIX_BYTES
        head_end = head_start + header_len
        if payload_len < DIRECT_PAYLOAD_BYTES_MIN and payload_len <= self._payload_bytes_max:
            # The common case: a small frame, sliced out of the stream buffer.
            end = head_end + payload_len
            if end > len(buf):
                return None
            header = _decode_header(buf[head_start:head_end])
            if not payload_len:
                payload = b""
            elif type(buf) is bytes:
                payload = buf[head_end:end]
            else:
                # One copy, where bytes(buf[a:b]) makes two. The temporary views are
                # freed by reference counting as the statement ends: buf may resize.
                payload = memoryview(buf)[head_end:end].tobytes()
            self._pos = end
            return (frame_kind, header, payload, 0)
        refuse = payload_len > self._payload_bytes_max
        if avail < PREFIX_BYTES + header_len:
            return None
        header = _decode_header(buf[head_start:head_end])
        if refuse:
            self._pos = head_end
            rest = len(buf) - head_end
            take = min(rest, payload_len)
            self._pos += take
            self._skip = payload_len - take
            return (frame_kind, header, b"", payload_len)
        return self._start_direct_payload(frame_kind, header, head_end, payload_len)

    def _start_direct_payload(
        self, kind: FrameKind, header: Any, start: int, payload_len: int
    ) -> RawFrame | None:
        """Move the payload bytes already buffered into the payload's own buffer; the
        rest will be received straight into it."""
        buf = self._buf
        have = min(len(buf) - start, payload_len)
        if self._grow:
            with memoryview(buf) as view:
                part = view[start : start + have].tobytes()
            self._pos = start + have
            if have == payload_len:
                return (kind, header, part, 0)
            self._parts, self._filled, self._pending = [part], have, (kind, header)
            self._payload_len = payload_len
            return None
        payload = bytearray(payload_len)
        with memoryview(buf) as view:
            payload[:have] = view[start : start + have]
        self._pos = start + have
        if have == payload_len:
            return (kind, header, payload, 0)
        self._payload, self._filled, self._pending = payload, have, (kind, header)
        return None
