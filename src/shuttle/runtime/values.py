"""How arguments, results and checkpoints travel between run-times.

msgpack, with one extension: a :class:`~shuttle.runtime.refs.Ref` travels as its id
and home address and is bound to the receiving run-time on arrival. Everything an
object passes to another object on a different node must be msgpack-able (numbers,
strings, bytes, lists, maps, None) or a reference; anything else is refused with a
message that says so. Tuples arrive as lists.

:func:`byte_size` is the resource monitor's measure of what a call moves: the bytes
of data it carries, counted without encoding anything (a local call copies nothing,
and measuring must not either).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from shuttle.errors import InvalidArgumentError, LimitExceededError
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.refs import Invoker, Ref

#: msgpack extension type code of a reference.
EXT_REF = 1
#: Nesting below which byte_size stops descending (a deep structure is not data).
SIZE_DEPTH_MAX = 8
#: Items (every list, map, string, number... each counts one, a map's pair two) in one
#: value from a peer that need not be frugal. Decoded, an item costs up to about 100
#: bytes (an empty list is 56 bytes plus its slot, a dict 64, an int 28 + 8), so a
#: million items cost at most some 100 MB however few bytes carried them, where 8 MB
#: of ``[[]] * 8_000_000`` decoded unbounded took 490 MB and 13 s. A value with more
#: items than that is a bulk of numbers or records, which travels better as bytes.
ITEMS_MAX = 1 << 20
#: Nesting of lists and maps: data is a few levels deep, and the run-time walks values
#: recursively (binding references), so a deep one must not reach Python's recursion
#: limit (1000) nor msgpack's own (1024).
DEPTH_MAX = 64


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """What one value from an untrusting peer may hold, checked before it is decoded."""

    bytes_max: int
    items_max: int = ITEMS_MAX
    depth_max: int = DEPTH_MAX


def _default(value: Any) -> Any:
    if isinstance(value, Ref):
        return msgpack.ExtType(EXT_REF, msgpack.packb([str(value.rid), value.home_address]))
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise InvalidArgumentError(
        f"a value of type {type(value).__name__} cannot travel between run-times; "
        "use numbers, strings, bytes, lists, dicts, None or object references"
    )


def pack(value: Any) -> bytes:
    """``value`` as bytes (msgpack with references as an extension type)."""
    try:
        return msgpack.packb(value, default=_default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(f"cannot encode {type(value).__name__}: {exc}") from None


def unpack(
    data: bytes | bytearray | memoryview,
    invoker: Invoker | None = None,
    limits: DecodeLimits | None = None,
) -> Any:
    """Decode :func:`pack`'s bytes; references come back bound to ``invoker``.

    With ``limits``, the encoded value is first walked without building anything
    (:func:`check_limits`): :class:`LimitExceededError` naming the limit if it is over
    one. :class:`InvalidArgumentError` if the bytes are not a value."""
    if limits is not None:
        check_limits(data, limits)

    def ext_hook(code: int, raw: bytes) -> Any:
        if code == EXT_REF:
            rid, home = msgpack.unpackb(raw)
            return Ref(ObjectId.parse(rid), home, invoker)
        return msgpack.ExtType(code, raw)

    try:
        return msgpack.unpackb(data, raw=False, ext_hook=ext_hook, strict_map_key=False)
    except msgpack.StackError:
        raise LimitExceededError(
            "a value nests lists or maps deeper than the decoder allows (1024); flatten it"
        ) from None
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise InvalidArgumentError(
            f"undecodable value ({exc}); is the peer a Shuttle run-time?"
        ) from None


def bind_refs(value: Any, invoker: Invoker) -> Any:
    """``value`` with every reference in it bound to ``invoker`` (lists, tuples and
    dicts are rebuilt; everything else is returned as it is)."""
    if isinstance(value, Ref):
        return value.bind(invoker)
    if isinstance(value, list | tuple):
        return [bind_refs(v, invoker) for v in value]
    if isinstance(value, dict):
        return {k: bind_refs(v, invoker) for k, v in value.items()}
    return value


def byte_size(value: Any, depth: int = 0) -> int:
    """About how many bytes ``value`` carries: lengths of bytes and strings, 8 per
    number, summed through lists and dicts. No encoding, no copies."""
    kind = type(value)
    if kind is bytes or kind is bytearray or kind is str:
        return len(value)
    if kind is memoryview:
        return value.nbytes  # type: ignore[no-any-return]
    if kind is int or kind is float:
        return 8
    if value is None or kind is bool:
        return 1
    if depth >= SIZE_DEPTH_MAX:
        return 8
    if kind is list or kind is tuple:
        return 1 + sum(byte_size(v, depth + 1) for v in value)
    if kind is dict:
        return 1 + sum(byte_size(k, depth + 1) + byte_size(v, depth + 1) for k, v in value.items())
    if kind is Ref:
        return 32
    return 16


# --- bounds before decoding -------------------------------------------------------------

#: Bytes after the first byte of a msgpack item that hold no further items, by first
#: byte (nil, booleans, floats, ints, fixext), or the size of its length field and
#: any extra bytes (str, bin, ext), or a container's count field.
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}
_FIXED.update({0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8})
_FIXED.update({0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17})  # fixext: type + data
#: str8/16/32, bin8/16/32: length field size; ext8/16/32: length field size (+1 type).
_SIZED = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}
_EXT = {0xC7: 1, 0xC8: 2, 0xC9: 4}
#: array16/32, map16/32: count field size and items per count.
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}


def check_limits(data: bytes | bytearray | memoryview, limits: DecodeLimits) -> None:
    """Walk one encoded value without decoding it; :class:`LimitExceededError` naming
    the limit (bytes, items or nesting) it goes over. Costs one step per item, and
    stops at the first limit crossed, so a value far over the item limit costs no more
    than one at it. Malformed bytes are left for the decoder to refuse."""
    view = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    end = len(view)
    if end > limits.bytes_max:
        raise LimitExceededError(
            f"a value of {end} bytes is over the limit of {limits.bytes_max} bytes"
        )
    items_max, depth_max = limits.items_max, limits.depth_max
    pending = [1]  # items still to read at each open level
    items = 0
    pos = 0
    while pending and pos < end:
        if pending[-1] == 0:
            pending.pop()
            continue
        pending[-1] -= 1
        items += 1
        if items > items_max:
            raise LimitExceededError(
                f"a value of {end} bytes holds more than {items_max} items (every list, map, "
                "string and number counts), the limit for one value; send bulk data as "
                "bytes, or in several calls"
            )
        b = view[pos]
        pos += 1
        count = 0
        if b <= 0x7F or b >= 0xE0:
            continue
        if b <= 0x8F:
            count = 2 * (b & 0x0F)
        elif b <= 0x9F:
            count = b & 0x0F
        elif b <= 0xBF:
            pos += b & 0x1F
            continue
        elif b in _FIXED:
            pos += _FIXED[b]
            continue
        elif b in _SIZED:
            width = _SIZED[b]
            pos += width + int.from_bytes(view[pos : pos + width], "big")
            continue
        elif b in _EXT:
            width = _EXT[b]
            pos += width + 1 + int.from_bytes(view[pos : pos + width], "big")
            continue
        elif b in _CONTAINERS:
            width, per = _CONTAINERS[b]
            count = per * int.from_bytes(view[pos : pos + width], "big")
            pos += width
        else:
            return  # 0xC1, never used: the decoder refuses it
        if count:
            if len(pending) > depth_max:
                raise LimitExceededError(
                    f"a value of {end} bytes nests lists or maps more than {depth_max} "
                    "deep, the limit for one value; flatten it"
                )
            pending.append(count)
