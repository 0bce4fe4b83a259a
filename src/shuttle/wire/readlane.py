"""The read lane: a small ``read``'s request and reply as bytes, with no codec objects.

A warm 4 KiB read is the request the node answers most and the one whose round trip
``shuttle bench netrand`` holds against Redis. On the general path each end builds
and walks msgpack objects, a header list and an args dict, an event tuple, for a
request whose shape never changes. The lane parses and builds exactly that shape:

* :func:`parse_read_request` (node) — a frame holding one ``read`` request
  ``[rid, "read", {"key", "offset", "length"[, "expected_version"][, "direct"]}]``,
  and nothing else, to ``(rid, key, offset, length, version, direct)`` (``direct``: a
  client that reads a RADOS node's miss itself, docs/ceph.md; False when absent);
* :func:`pack_read_reply` (node) — its response ``[rid, nil]`` with the bytes read
  (or a range of a buffer holding them: a cached block, copied once, into the frame);
* :func:`pack_read_request` (client) — the request (``direct: true`` last when asked
  for), byte for byte what :func:`~shuttle.wire.frames.encode_frame_fast` makes of it;
* :func:`parse_read_reply` (client) — a frame holding exactly that response, to its
  payload;
* :func:`recv_read_reply` (client) — that response received from a plain socket's
  descriptor with its payload read straight into the bytes object returned (one
  ``readv``: the prefix and header, whose size the id gives, and the payload), or
  else the bytes that arrived, for the general path.

The lane only ever takes what the general path would take the same way: a parse
returns None for anything else (another operation, an unusual encoding such as a
duplicated map key, a negative offset, an integer beyond 64 bits, a stray byte), and
the caller then goes the general path, which answers it or says what is wrong with
it. The lane checks only the frame; the protocol rules (ids in flight, states, the
peers' limits) stay with :class:`~shuttle.wire.connection.Connection`.

The ``pure_*`` functions here are the reference; ``shuttle.wire._readlane`` is the
same five in C (``src/shuttle/wire/_readlane.c``), and the public names are the C ones
when Shuttle runs its compiled modules (:mod:`shuttle.compiled`), else the pure ones.
tests/unit/wire/test_readlane.py checks that both give the same bytes, answers and
errors, and take only what the general codec reads the same way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Final

import msgpack

from shuttle.wire.events import FrameKind
from shuttle.wire.frames import MAGIC, PREFIX_PACK, PREFIX_UNPACK_FROM, pack_header
from shuttle.wire.limits import PREFIX_BYTES

#: A parsed read request: ``(rid, key, offset, length, expected_version or None,
#: direct)``.
ReadRequest = tuple[int, str, int, int, int | None, bool]

_INT64_MAX: Final = (1 << 63) - 1
_INT64_MIN: Final = -(1 << 63)
_REQUEST: Final = int(FrameKind.REQUEST)
_RESPONSE: Final = int(FrameKind.RESPONSE)
_READ_ARGS: Final = frozenset(("key", "offset", "length", "expected_version", "direct"))


def read_args(
    key: str, offset: int, length: int, version: int | None, direct: bool = False
) -> dict[str, Any]:
    """The arguments of the same ``read`` as the general path sends them (a client
    whose request the lane cannot make, a node whose lane declines the read)."""
    args: dict[str, Any] = {"key": key, "offset": offset, "length": length}
    if version is not None:
        args["expected_version"] = version
    if direct:
        args["direct"] = True
    return args


class _Pairs(list[tuple[Any, Any]]):
    """A msgpack map as its pairs, in order (so a repeated key is seen)."""


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, object_pairs_hook=_Pairs)


def _int64(value: Any) -> bool:
    return type(value) is int and _INT64_MIN <= value <= _INT64_MAX


def pure_parse_read_request(data: bytes, header_max: int) -> ReadRequest | None:
    """``(rid, key, offset, length, version, direct)`` if ``data`` is exactly one
    REQUEST frame of a ``read`` (no payload, header at most ``header_max`` bytes, rid >
    0, offset and length ≥ 0, every integer within 64 bits, ``direct`` a bool, each
    argument once, none other); else None (a non-boolean ``direct`` too: the general
    path words its refusal)."""
    if type(data) is not bytes or len(data) < PREFIX_BYTES:
        return None
    magic, kind, flags, header_len, payload_len = PREFIX_UNPACK_FROM(data, 0)
    if (
        magic != MAGIC
        or kind != _REQUEST
        or flags
        or payload_len
        or header_len > header_max
        or PREFIX_BYTES + header_len != len(data)
    ):
        return None
    try:
        header = _unpack(data[PREFIX_BYTES:])
    except Exception:
        return None
    if type(header) is not list or len(header) != 3:
        return None
    rid, op, pairs = header
    if not (_int64(rid) and rid > 0 and type(op) is str and op == "read"):
        return None
    if type(pairs) is not _Pairs:
        return None
    args: dict[str, Any] = {}
    for name, value in pairs:
        if type(name) is not str or name not in _READ_ARGS or name in args:
            return None
        args[name] = value
    key, offset, length = args.get("key"), args.get("offset"), args.get("length")
    version = args.get("expected_version")
    direct = args.get("direct", False)
    if (
        type(key) is not str
        or not _int64(offset)
        or not _int64(length)
        or offset < 0  # type: ignore[operator]
        or length < 0  # type: ignore[operator]
        or ("expected_version" in args and not _int64(version))
        or type(direct) is not bool
    ):
        return None
    return rid, key, offset, length, version, direct  # type: ignore[return-value]


def pure_pack_read_reply(rid: int, data: bytes, *span: int) -> bytes:
    """The RESPONSE frame ``[rid, nil]`` carrying ``data``, or with ``span`` given as
    ``start, stop`` the bytes ``data[start:stop]``, as one bytes object: the payload is
    copied once, into the frame, so a node answering from a cached block passes the
    block and the range rather than a slice of it. ``start`` and ``stop`` must be ints
    with ``0 <= start <= stop <= len(data)``; anything else raises ValueError."""
    if len(span) not in (0, 2):
        raise TypeError("pack_read_reply(rid, data[, start, stop])")
    if not _int64(rid):
        raise OverflowError("pack_read_reply: rid must be a 64-bit int")
    if type(data) is not bytes:
        raise TypeError("pack_read_reply: data must be bytes")
    start, stop = span if span else (0, len(data))
    if not (_int64(start) and _int64(stop) and 0 <= start <= stop <= len(data)):
        raise ValueError(
            "pack_read_reply: start and stop must be ints with "
            f"0 <= start <= stop <= len(data) ({len(data)})"
        )
    head = pack_header([rid, None])
    payload = memoryview(data)[start:stop]
    return b"".join((PREFIX_PACK(MAGIC, _RESPONSE, 0, len(head), len(payload)), head, payload))


def pure_pack_read_request(
    rid: int, key: str, offset: int, length: int, version: int | None, direct: bool = False
) -> bytes | None:
    """The REQUEST frame of a ``read`` (``version`` sent as ``expected_version`` unless
    None, ``direct: true`` last when ``direct`` is True), or None when an argument is
    not a ``str``/64-bit ``int``/``bool`` (the general path then encodes it, or
    raises)."""
    if (
        type(key) is not str
        or type(direct) is not bool
        or not (
            _int64(rid)
            and _int64(offset)
            and _int64(length)
            and (version is None or _int64(version))
        )
    ):
        return None
    args = read_args(key, offset, length, version, direct)
    try:
        head = pack_header([rid, "read", args])
    except Exception:  # a key that is not valid UTF-8 (lone surrogates)
        return None
    return PREFIX_PACK(MAGIC, _REQUEST, 0, len(head), 0) + head


def pure_parse_read_reply(data: bytes, rid: int, payload_max: int) -> bytes | None:
    """The payload if ``data`` is exactly one RESPONSE frame ``[rid, nil]`` with a
    payload of at most ``payload_max`` bytes; else None."""
    if type(data) is not bytes or len(data) < PREFIX_BYTES:
        return None
    magic, kind, flags, header_len, payload_len = PREFIX_UNPACK_FROM(data, 0)
    head_end = PREFIX_BYTES + header_len
    if (
        magic != MAGIC
        or kind != _RESPONSE
        or flags
        or payload_len > payload_max
        or head_end + payload_len != len(data)
    ):
        return None
    try:
        header = _unpack(data[PREFIX_BYTES:head_end])
    except Exception:
        return None
    if type(header) is not list or len(header) != 2 or header[1] is not None:
        return None
    if not _int64(header[0]) or header[0] != rid:
        return None
    return data[head_end:]


def pure_recv_read_reply(fd: int, rid: int, length: int, payload_max: int) -> bytes | bytearray:
    """Read ``rid``'s reply from descriptor ``fd``, at most its prefix and header
    ``[rid, nil]`` and ``length`` bytes: the payload if what arrived is exactly that
    RESPONSE frame (its header in the packer's encoding) with at most
    ``min(length, payload_max)`` bytes; else what arrived, as a bytearray (empty at the
    end of the stream). OSError as ``os.read`` raises it; ValueError for arguments
    out of range."""
    if not (
        _int64(fd)
        and 0 <= fd <= 0x7FFFFFFF
        and _int64(rid)
        and rid > 0
        and _int64(length)
        and 0 <= length <= 0xFFFFFFFF
        and _int64(payload_max)
    ):
        raise ValueError(
            "recv_read_reply: fd, rid, length and payload_max must be ints, "
            "fd >= 0, rid > 0, 0 <= length < 4 GiB"
        )
    head = pack_header([rid, None])
    head_n = PREFIX_BYTES + len(head)
    data = os.read(fd, head_n + length)
    if len(data) >= head_n:
        magic, kind, flags, header_len, payload_len = PREFIX_UNPACK_FROM(data, 0)
        if (
            magic == MAGIC
            and kind == _RESPONSE
            and not flags
            and header_len == len(head)
            and data[PREFIX_BYTES:head_n] == head
            and payload_len <= min(length, payload_max)
            and len(data) == head_n + payload_len
        ):
            return data[head_n:]
    return bytearray(data)


def _native() -> Any:
    """The C module, when Shuttle runs its compiled modules (else None)."""
    from shuttle.compiled import active

    if not active().compiled:
        return None
    try:
        from shuttle.wire import _readlane
    except ImportError:  # pragma: no cover - compiled.check() requires it
        return None
    return _readlane


_lane: Any = _native()
#: True when the functions below are the C ones.
NATIVE: Final = _lane is not None

parse_read_request: Callable[[bytes, int], ReadRequest | None] = (
    _lane.parse_read_request if NATIVE else pure_parse_read_request
)
pack_read_reply: Callable[..., bytes] = _lane.pack_read_reply if NATIVE else pure_pack_read_reply
pack_read_request: Callable[..., bytes | None] = (
    _lane.pack_read_request if NATIVE else pure_pack_read_request
)
parse_read_reply: Callable[[bytes, int, int], bytes | None] = (
    _lane.parse_read_reply if NATIVE else pure_parse_read_reply
)
recv_read_reply: Callable[[int, int, int, int], bytes | bytearray] = (
    _lane.recv_read_reply if NATIVE else pure_recv_read_reply
)
