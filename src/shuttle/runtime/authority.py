"""Who an object's calls act for, and what a principal may call (docs/security.md,
"Principals and capabilities").

**An object acts for the principal that created it**, never with the node's own
rights. The run-time keeps that principal on each hosted object
(``Hosted.principal``: a name, or None for an object made by the cluster key's
holder) and, while one of its methods runs, as the *acting principal* of the call
(:data:`ACTING`, a context variable: per thread for object code, per task on the
run-time's loop). Everything the method calls is checked against it:

* a call into a node's anchored objects (its storage object, the file system's
  isolation and atomicity services) is checked method by method against the
  anchored class's :attr:`~shuttle.runtime.mobile.MobileObject.access` table: the
  keys each method touches need the read or write capability; a method not in the
  table is refused to principals;
* a call into any other object is allowed only to the principal that owns it (or to
  an unrestricted caller): an object's rights are its owner's, so nobody else may
  borrow them;
* calls to other run-times authenticate as the acting principal
  (:class:`~shuttle.runtime.peers.Peers` derives its key on a node), so the node at
  the other end checks them the same way: the principal travels as the identity of
  the connection, which nothing on the path can change.

A node resolves names through its :class:`~shuttle.net.principals.PrincipalBook` at
every call, so a change of caps applies to the next call and an object whose
principal was removed keeps running with no rights. A client's run-time has no book:
everything there runs as its own principal, whose connections the nodes check.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from shuttle.errors import InvalidArgumentError, NotPermittedError
from shuttle.net.principals import Principal, PrincipalBook

#: The principal the running code acts for (None: unrestricted, the node's own work
#: or the cluster key's holder).
ACTING: ContextVar[str | None] = ContextVar("shuttle_acting_principal", default=None)

#: Keys a method touches, taken from its bound arguments.
KeysOf = Callable[[Mapping[str, Any]], Iterable[str]]


def acting() -> str | None:
    """The principal the current call acts for (None: unrestricted)."""
    return ACTING.get()


@contextlib.contextmanager
def acting_for(principal: str | None) -> Iterator[None]:
    """Run the block as ``principal`` (restored after)."""
    token = ACTING.set(principal)
    try:
        yield
    finally:
        ACTING.reset(token)


def arg(name: str) -> KeysOf:
    """The key in parameter ``name`` (nothing if it is empty or not a string)."""

    def keys(bound: Mapping[str, Any]) -> Iterable[str]:
        value = bound.get(name)
        return [value] if isinstance(value, str) and value else []

    return keys


def every(name: str) -> KeysOf:
    """The keys in the list in parameter ``name`` (``[key, ...]``)."""

    def keys(bound: Mapping[str, Any]) -> Iterable[str]:
        items = bound.get(name)
        if not isinstance(items, list | tuple):
            return []
        return [item for item in items if isinstance(item, str) and item]

    return keys


def each(name: str, index: int = 0) -> KeysOf:
    """The keys at ``index`` of each item of the list in parameter ``name``
    (``[[key, offset, ...], ...]``)."""

    def keys(bound: Mapping[str, Any]) -> Iterable[str]:
        items = bound.get(name)
        if not isinstance(items, list | tuple):
            return []
        return [
            item[index]
            for item in items
            if isinstance(item, list | tuple) and len(item) > index and isinstance(item[index], str)
        ]

    return keys


@dataclass(frozen=True)
class Needs:
    """What one method of an anchored object needs of a principal: the read capability
    on the keys ``read`` names, the write capability on those ``write`` names.
    ``lists``: the method answers a listing and filters it itself (by :func:`list_roots`)."""

    read: tuple[KeysOf, ...] = ()
    write: tuple[KeysOf, ...] = ()
    lists: bool = False


def needs(
    *, read: Iterable[str | KeysOf] = (), write: Iterable[str | KeysOf] = (), lists: bool = False
) -> Needs:
    """:class:`Needs` with parameter names taken as :func:`arg`."""

    def of(items: Iterable[str | KeysOf]) -> tuple[KeysOf, ...]:
        return tuple(arg(i) if isinstance(i, str) else i for i in items)

    return Needs(of(read), of(write), lists)


#: A method that touches no key (any principal may call it).
NOTHING = Needs()

_SIGNATURES: dict[tuple[type, str], inspect.Signature] = {}


def _bound(cls: type, method: str, args: Any, kwargs: dict[str, Any]) -> Mapping[str, Any]:
    signature = _SIGNATURES.get((cls, method))
    if signature is None:
        signature = _SIGNATURES[(cls, method)] = inspect.signature(getattr(cls, method))
    try:
        bound = signature.bind(None, *args, **kwargs)  # None for self
    except TypeError as exc:
        raise InvalidArgumentError(f"{cls.__name__}.{method}: {exc}") from None
    bound.apply_defaults()
    return bound.arguments


def check_call(
    book: PrincipalBook,
    name: str,
    rid: str,
    owner: str | None,
    anchored_type: type | None,
    label: str,
    method: str,
    args: Any,
    kwargs: dict[str, Any],
) -> None:
    """May principal ``name`` call ``method`` of object ``rid``? Raises
    :class:`NotPermittedError` naming what is missing.

    ``anchored_type``: the class of a node's anchored object (checked by its
    ``access`` table); None for any other object (owned by ``owner``)."""
    principal = book.resolve(name)
    if anchored_type is None:
        if owner != name:
            whose = f"principal {owner!r}" if owner is not None else "the cluster key's holder"
            raise NotPermittedError(
                f"principal {name!r} may not call {method} of object {rid} ({label}): it "
                f"belongs to {whose}, and an object acts with its owner's rights only"
            )
        if principal.removed:
            raise principal.refusal(f"call {method} of object {rid}", "read")
        return
    table: Mapping[str, Needs] = getattr(anchored_type, "access", {})
    rule = table.get(method)
    if rule is None:
        raise NotPermittedError(
            f"principal {name!r} may not call {label}.{method}: that method of a node's "
            "own object is not open to principals (the cluster key's holder may call it)"
        )
    if not (rule.read or rule.write):
        if principal.removed:
            raise principal.refusal(f"call {label}.{method}", "read")
        return
    bound = _bound(anchored_type, method, args, kwargs)
    via = f" (through {label}.{method})"
    for keys_of in rule.read:
        for key in keys_of(bound):
            principal.require_read(key, via=via)
    for keys_of in rule.write:
        for key in keys_of(bound):
            principal.require_write(key, via=via)


def current_principal(book: PrincipalBook | None) -> Principal | None:
    """The acting principal resolved in ``book`` (None: unrestricted)."""
    name = ACTING.get()
    if name is None or book is None:
        return None
    return book.resolve(name)


def list_roots(book: PrincipalBook | None, prefix: str) -> list[str] | None:
    """What a listing under ``prefix`` may show the acting principal: None for all of
    it, else the prefixes it may read under ``prefix`` (see
    :meth:`~shuttle.net.principals.Caps.list_roots`)."""
    principal = current_principal(book)
    return None if principal is None else principal.caps.list_roots(prefix)
