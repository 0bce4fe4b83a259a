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

from typing import Any

import msgpack

from shuttle.errors import InvalidArgumentError
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.refs import Invoker, Ref

#: msgpack extension type code of a reference.
EXT_REF = 1
#: Nesting below which byte_size stops descending (a deep structure is not data).
SIZE_DEPTH_MAX = 8


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


def unpack(data: bytes | bytearray | memoryview, invoker: Invoker | None = None) -> Any:
    """Decode :func:`pack`'s bytes; references come back bound to ``invoker``."""

    def ext_hook(code: int, raw: bytes) -> Any:
        if code == EXT_REF:
            rid, home = msgpack.unpackb(raw)
            return Ref(ObjectId.parse(rid), home, invoker)
        return msgpack.ExtType(code, raw)

    try:
        return msgpack.unpackb(data, raw=False, ext_hook=ext_hook, strict_map_key=False)
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
