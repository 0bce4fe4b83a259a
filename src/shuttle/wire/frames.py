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
memory: an oversized payload is skipped as it streams past, not buffered.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from shuttle.errors import LimitExceededError, RemoteProtocolError
from shuttle.wire.events import FrameKind, Payload
from shuttle.wire.limits import PREFIX_BYTES

MAGIC = b"SH"
_PREFIX = struct.Struct(">2sBBII")
_KINDS = frozenset(int(k) for k in FrameKind)
_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack

assert _PREFIX.size == PREFIX_BYTES

#: Payloads at least this large are received into a buffer of their own (no copy
#: through the reader's stream buffer; with :meth:`FrameReader.payload_buffer`, no
#: copy at all). Smaller ones are cheaper to slice out of the stream buffer.
DIRECT_PAYLOAD_BYTES_MIN = 64 << 10


@dataclass(slots=True)
class RawFrame:
    """One frame off the wire, its header decoded from msgpack.

    ``payload_refused`` is non-zero when the payload was longer than the reader's
    limit: the payload bytes are then discarded (``payload`` is empty) and the
    receiver should answer with a limit error.
    """

    kind: FrameKind
    header: Any
    payload: bytes | bytearray = b""
    payload_refused: int = 0


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
    head = _pack(header)
    if len(head) > header_bytes_max:
        raise LimitExceededError(
            f"frame header is {len(head)} bytes, over the limit of {header_bytes_max}; "
            "send fewer or smaller arguments (page listings, move data to the payload)"
        )
    payload_len = len(payload) if not isinstance(payload, memoryview) else payload.nbytes
    if payload_len > payload_bytes_max:
        raise LimitExceededError(
            f"frame payload is {payload_len} bytes, over the limit of {payload_bytes_max}; "
            "split the data into several range requests"
        )
    prefix = _PREFIX.pack(MAGIC, kind, 0, len(head), payload_len)
    if payload_len:
        return [prefix + head, payload]
    return [prefix + head]


class FrameReader:
    """Accumulates stream bytes and yields complete frames.

    Raises :class:`RemoteProtocolError` when the stream is corrupt (bad magic, unknown
    kind, non-zero flags, oversized or undecodable header, EOF inside a frame); the
    reader is then unusable.
    """

    def __init__(self, *, header_bytes_max: int, payload_bytes_max: int) -> None:
        self._header_bytes_max = header_bytes_max
        self._payload_bytes_max = payload_bytes_max
        self._buf = bytearray()
        self._pos = 0
        #: Bytes of a refused payload still to discard as they arrive.
        self._skip = 0
        #: A large payload being received into a buffer of its own (see
        #: :meth:`payload_buffer`), with the kind and header of its frame.
        self._payload: bytearray | None = None
        self._filled = 0
        self._pending: tuple[FrameKind, Any] | None = None

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf) - self._pos + self._filled

    def feed(self, data: Payload) -> None:
        if self._skip:
            n = len(data) if not isinstance(data, memoryview) else data.nbytes
            if n <= self._skip:
                self._skip -= n
                return
            data = memoryview(data)[self._skip :]
            self._skip = 0
        if self._payload is not None:
            view = memoryview(data).cast("B")
            take = min(view.nbytes, len(self._payload) - self._filled)
            self._payload[self._filled : self._filled + take] = view[:take]
            self._filled += take
            if take == view.nbytes:
                return
            data = view[take:]
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def at_frame_boundary(self) -> bool:
        """True when no partial frame is buffered (a clean place for EOF)."""
        return self._skip == 0 and self._payload is None and self.buffered_bytes == 0

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

    def next_frame(self) -> RawFrame | None:
        """The next complete frame, or ``None`` if more bytes are needed."""
        if self._payload is not None:
            if self._filled < len(self._payload):
                return None
            assert self._pending is not None
            (kind_, header_), payload_ = self._pending, self._payload
            self._payload, self._pending, self._filled = None, None, 0
            return RawFrame(kind_, header_, payload_)
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < PREFIX_BYTES:
            return None
        magic, kind, flags, header_len, payload_len = _PREFIX.unpack_from(buf, pos)
        if magic != MAGIC:
            raise RemoteProtocolError(
                f"bad frame magic {bytes(magic)!r} (expected {MAGIC!r}): the peer is not "
                "speaking the Shuttle protocol or the stream is corrupt"
            )
        if kind not in _KINDS or flags != 0:
            raise RemoteProtocolError(
                f"bad frame prefix (kind={kind}, flags={flags}): unknown frame kind or "
                "reserved flags set; is the peer a newer Shuttle?"
            )
        if header_len > self._header_bytes_max:
            raise RemoteProtocolError(
                f"frame header of {header_len} bytes is over the limit of "
                f"{self._header_bytes_max}; refusing the stream"
            )
        refuse = payload_len > self._payload_bytes_max
        direct = not refuse and payload_len >= DIRECT_PAYLOAD_BYTES_MIN
        needed = PREFIX_BYTES + header_len + (0 if refuse or direct else payload_len)
        if avail < needed:
            return None
        head_start = pos + PREFIX_BYTES
        head_end = head_start + header_len
        try:
            header = msgpack.unpackb(
                buf[head_start:head_end], raw=False, use_list=True, strict_map_key=True
            )
        except Exception as exc:  # msgpack raises many types on garbage
            raise RemoteProtocolError(
                f"undecodable frame header ({type(exc).__name__}: {exc}); the stream is corrupt"
            ) from exc
        if refuse:
            self._pos = head_end
            rest = len(buf) - head_end
            take = min(rest, payload_len)
            self._pos += take
            self._skip = payload_len - take
            return RawFrame(FrameKind(kind), header, b"", payload_refused=payload_len)
        if direct:
            return self._start_direct_payload(FrameKind(kind), header, head_end, payload_len)
        payload = b""
        if payload_len:
            with memoryview(buf) as view:  # one copy, where a bytearray slice makes two
                payload = view[head_end : head_end + payload_len].tobytes()
        self._pos = head_end + payload_len
        if self._pos == len(buf):
            buf.clear()
            self._pos = 0
        return RawFrame(FrameKind(kind), header, payload)

    def _start_direct_payload(
        self, kind: FrameKind, header: Any, start: int, payload_len: int
    ) -> RawFrame | None:
        """Move the payload bytes already buffered into the payload's own buffer; the
        rest will be received straight into it."""
        buf = self._buf
        have = min(len(buf) - start, payload_len)
        payload = bytearray(payload_len)
        with memoryview(buf) as view:
            payload[:have] = view[start : start + have]
        self._pos = start + have
        if self._pos == len(buf):
            buf.clear()
            self._pos = 0
        if have == payload_len:
            return RawFrame(kind, header, payload)
        self._payload, self._filled, self._pending = payload, have, (kind, header)
        return None
