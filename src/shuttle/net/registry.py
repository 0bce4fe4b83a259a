"""Operations a node serves, as a registry of named handlers.

The storage node registers its storage operations here, the server its system
operations (``ping``, ``node.stats``, ``node.ops``), and the run-time (a later issue)
its mobile-object operations; the server dispatches by name and never needs to know
which is which.

A handler takes ``(args, payload)`` and returns a :class:`Reply` (or any msgpack
value, taken as the result with an empty payload). How it runs is its ``mode``:

* ``INLINE``: a short synchronous call made directly on the event loop (no thread
  hop: the fast path for cached reads and stats);
* ``THREAD``: a synchronous call that may block (disk writes with fsync, cold reads),
  run in the node's thread pool;
* ``ASYNC``: a coroutine function, awaited as a task.

A ``THREAD`` operation (an ``ASYNC`` one with ``inline_try`` too: a worker's
``read``, which asks its primary when it cannot answer) may run on the event loop
when it can answer from memory,
saying so in one of two ways: an ``inline_try(args, payload)`` that answers (a
:class:`Reply`) or returns None when the request would block (a read whose blocks
are not all in the block cache), or an ``inline_when(args)`` predicate that says
beforehand (a stat whose attributes are cached). Either way the request it does not
answer runs in the thread pool. Every operation's way of running inline is folded
into one call at registration, :attr:`Operation.inline`, which the server makes for
every request: it answers, or returns None for "run it the operation's way".

An operation that opens something a connection owns (an upload session) is
registered ``per_connection``: the server puts the connection's number in
``args[CONNECTION_ARG]`` (overwriting whatever a client sent there), and the
``on_disconnect`` hooks hear when that connection closes, so what it opened can be
released at once instead of waiting for an idle timeout.

Who may call an operation: a connection authenticated with the cluster key (or on a
node without one) may call every operation. A connection authenticated as a principal
(:mod:`shuttle.net.principals`) may call an operation only if its ``guard`` lets the
principal through (checked before the operation runs, raising ``NotPermittedError``
naming what is missing); an operation registered without a guard is a cluster
operation, open to principals with the ``admin`` capability only. An operation that
decides per key itself (a listing filters what it shows) is registered
``wants_principal``: the server puts the connection's :class:`Principal` (None for an
unrestricted connection) in ``args[PRINCIPAL_ARG]``, overwriting whatever a client
sent there.

A ``THREAD`` operation may also have a ``start(args, payload)`` call, tried on the event
loop when it was not answered inline: it starts the operation where it completes
without a thread (a RADOS store's read that missed its block cache: an asynchronous
librados read, :mod:`shuttle.store.rados_aio`) and returns its future, or None, and
the thread pool runs it.

A ``THREAD`` operation may also have a ``before(args)`` step (:meth:`OperationRegistry.
add_before`): it runs on the event loop before the thread hop and returns None (go
ahead at once) or an awaitable the request waits on *without holding a thread* (a
write waiting for callback promises on its object to be broken).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, TypeVar

from shuttle.blockcache import SpanReader
from shuttle.errors import ConfigError, InvalidArgumentError, UnknownOperationError
from shuttle.net.principals import Guard, Principal, admin_only
from shuttle.wire.events import Payload


class Mode(Enum):
    INLINE = "inline"
    THREAD = "thread"
    ASYNC = "async"


# Not frozen: a frozen dataclass sets its fields through object.__setattr__, which
# makes it three times as dear to build, and one is built for every data reply.
@dataclass(slots=True)
class Reply:
    """A handler's result: a msgpack-able ``result`` and raw ``payload`` bytes."""

    result: Any = None
    payload: Payload = b""


SyncHandler = Callable[[dict[str, Any], bytes], Any]
AsyncHandler = Callable[[dict[str, Any], bytes], Awaitable[Any]]
Handler = SyncHandler | AsyncHandler
F = TypeVar("F", bound=Callable[..., Any])


InlineWhen = Callable[[dict[str, Any]], bool]
#: Answers a request from memory on the event loop, or returns None: it would block.
InlineTry = Callable[[dict[str, Any], bytes], Reply | None]
#: ``read``'s call for the lane's miss: (key, offset, length, expected_version) →
#: the bytes, or None.
ReadMiss = Callable[[str, int, int, int | None], bytes | None]
#: ``read``'s location of a ``direct`` read's miss, ``(key, offset, length,
#: expected_version)`` → ``{pool, namespace, object, version}`` or None (a RADOS
#: node's ``LoopReads.located``).
ReadLocated = Callable[[str, int, int, int | None], Any]


#: A THREAD operation's way to run without a thread: a future of its Reply that the
#: event loop completes, or None (the thread pool runs it).
Start = Callable[[dict[str, Any], bytes], asyncio.Future[Reply] | None]
#: A step before a THREAD operation's thread hop: None, or something to wait for first.
Before = Callable[[dict[str, Any]], Awaitable[None] | None]

#: The argument a ``per_connection`` operation finds its connection's number in.
CONNECTION_ARG = "_connection"
#: The argument a ``wants_principal`` operation finds its connection's principal in
#: (a :class:`Principal`, or None: the connection is unrestricted).
PRINCIPAL_ARG = "_principal"


def principal_of(args: dict[str, Any]) -> Principal | None:
    """The principal the server put in ``args`` (None: unrestricted)."""
    found = args.get(PRINCIPAL_ARG)
    return found if isinstance(found, Principal) else None


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    handler: Handler
    mode: Mode
    doc: str
    inline_when: InlineWhen | None = None
    per_connection: bool = False
    before: Before | None = None
    #: The server's one inline call (see the module docstring): a Reply, or None to
    #: run the operation its usual way. None for operations never run inline.
    inline: InlineTry | None = None
    #: ``read`` only: its inline read for the read lane (:mod:`shuttle.wire.readlane`),
    #: a :class:`~shuttle.blockcache.SpanReader` the compiled lane calls natively:
    #: ``lane_span(key, offset, length, expected_version)`` → ``(buffer, start, stop)``,
    #: the bytes ``buffer[start:stop]`` (usually a whole cached block, whose range the
    #: reply's packer copies straight into the frame), or ``NO_SPAN`` to run it the
    #: usual way (:class:`~shuttle.blockcache.BytesSpans` makes one of a read that
    #: answers bytes). Never raises; called on the event loop.
    read_lane: SpanReader | None = None
    #: ``read`` only: the read lane's second try when ``read_lane`` found the range not
    #: all in the block cache, for a miss that can still be answered without waiting
    #: (the page cache, :mod:`shuttle.store.nowait`); the same arguments and rules,
    #: its answer the bytes (:data:`ReadMiss`). None: a miss runs the usual way.
    read_miss: ReadMiss | None = None
    #: ``read`` only: where a ``direct`` read's bytes are when both tries above missed
    #: (:data:`ReadLocated`; the reply ``{"rados": location}``, as ``inline`` answers
    #: it), asked after the guard; None: such a read runs the usual way.
    read_located: ReadLocated | None = None
    #: THREAD only: tried on the event loop when ``inline`` declined, before the thread
    #: hop: starts the operation where it can complete without a thread (a RADOS
    #: store's read that missed the block cache: an asynchronous librados read) and
    #: returns its future, or None (the pool runs it). Never raises; counted as running
    #: like a pool request (the connection's ``executing``).
    start: Start | None = None
    #: What a principal needs to call it (see the module docstring); the server runs it
    #: for connections authenticated as a principal only.
    guard: Guard | None = None
    #: The server puts the connection's principal in ``args[PRINCIPAL_ARG]``.
    wants_principal: bool = False


def _inline_call(
    handler: Handler, mode: Mode, inline_when: InlineWhen | None, inline_try: InlineTry | None
) -> InlineTry | None:
    """An operation's :attr:`Operation.inline`."""
    if inline_try is not None:
        return inline_try
    if mode is Mode.INLINE:
        sync = handler

        def always(args: dict[str, Any], payload: bytes) -> Reply:
            out = sync(args, payload)
            return out if type(out) is Reply else Reply(out)

        return always
    if inline_when is not None:
        when = inline_when
        sync = handler

        def if_when(args: dict[str, Any], payload: bytes) -> Reply | None:
            if not when(args):
                return None
            out = sync(args, payload)
            return out if type(out) is Reply else Reply(out)

        return if_when
    return None


class OperationRegistry:
    """Name → :class:`Operation`. Names are dotted identifiers (``read``, ``node.stats``)."""

    def __init__(self) -> None:
        self._ops: dict[str, Operation] = {}
        #: Called (in the thread pool) with a connection's number when it closes.
        self.disconnect_hooks: list[Callable[[int], object]] = []
        #: How many things a connection owns (a connection owning any is not idle).
        self.owned_counters: list[Callable[[int], int]] = []

    def add(
        self,
        name: str,
        handler: Handler,
        mode: Mode = Mode.INLINE,
        doc: str = "",
        *,
        inline_when: InlineWhen | None = None,
        inline_try: InlineTry | None = None,
        per_connection: bool = False,
        read_lane: SpanReader | None = None,
        read_miss: ReadMiss | None = None,
        read_located: ReadLocated | None = None,
        start: Start | None = None,
        guard: Guard | None = None,
        wants_principal: bool = False,
    ) -> None:
        """Register ``handler`` as operation ``name``; a name can be taken only once.
        Without ``guard`` only unrestricted connections and admin principals may call it."""
        if name in self._ops:
            raise ConfigError(f"operation {name!r} is registered twice")
        if inline_when is not None and mode is not Mode.THREAD:
            raise ConfigError(f"operation {name!r}: inline_when only applies to THREAD mode")
        if inline_try is not None and mode is Mode.INLINE:
            raise ConfigError(f"operation {name!r}: inline_try applies to THREAD or ASYNC mode")
        if inline_when is not None and inline_try is not None:
            raise ConfigError(f"operation {name!r}: give inline_when or inline_try, not both")
        if start is not None and mode is not Mode.THREAD:
            raise ConfigError(f"operation {name!r}: a start call only applies to THREAD mode")
        if per_connection and mode is Mode.INLINE:
            raise ConfigError(f"operation {name!r}: a per-connection operation runs in a thread")
        doc = doc or (handler.__doc__ or "").strip()
        inline = _inline_call(handler, mode, inline_when, inline_try)
        if read_lane is not None and (name != "read" or inline_try is None):
            raise ConfigError(f"operation {name!r}: only read, with inline_try, has a read lane")
        if read_miss is not None and read_lane is None:
            raise ConfigError(f"operation {name!r}: a read_miss call needs a read lane")
        if read_located is not None and read_lane is None:
            raise ConfigError(f"operation {name!r}: a read_located call needs a read lane")
        self._ops[name] = Operation(
            name,
            handler,
            mode,
            doc,
            inline_when,
            per_connection,
            inline=inline,
            read_lane=read_lane,
            read_miss=read_miss,
            read_located=read_located,
            start=start,
            guard=guard or admin_only(name),
            wants_principal=wants_principal,
        )

    def add_before(self, name: str, before: Before) -> None:
        """Give the THREAD operation ``name`` a step run on the event loop before its
        thread hop (see the module's docstring); one step per operation."""
        op = self.get(name)
        if op.mode is not Mode.THREAD:
            raise ConfigError(f"operation {name!r}: a before step only applies to THREAD mode")
        if op.before is not None:
            raise ConfigError(f"operation {name!r} already has a before step")
        self._ops[name] = replace(op, before=before)

    def on_disconnect(
        self, hook: Callable[[int], object], *, owned: Callable[[int], int] | None = None
    ) -> None:
        """Call ``hook(connection)`` when a connection closes (see ``per_connection``);
        ``owned(connection)`` counts what it still owns (the server does not close a
        connection for idling while it owns something: a slow writer keeps its upload)."""
        self.disconnect_hooks.append(hook)
        if owned is not None:
            self.owned_counters.append(owned)

    def owns_anything(self, connection: int) -> bool:
        return any(count(connection) for count in self.owned_counters)

    def set_guard(self, name: str, guard: Guard) -> None:
        """Give operation ``name`` (registered already) the guard ``guard``."""
        self._ops[name] = replace(self.get(name), guard=guard)

    def operation(
        self,
        name: str,
        mode: Mode = Mode.INLINE,
        *,
        inline_when: InlineWhen | None = None,
        guard: Guard | None = None,
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`add`."""

        def register(fn: F) -> F:
            self.add(name, fn, mode, inline_when=inline_when, guard=guard)
            return fn

        return register

    def find(self, name: str) -> Operation | None:
        """The operation called ``name``, or None."""
        return self._ops.get(name)

    def get(self, name: str) -> Operation:
        """The operation called ``name``; :class:`UnknownOperationError` lists the known ones."""
        op = self._ops.get(name)
        if op is None:
            known = ", ".join(sorted(self._ops))
            raise UnknownOperationError(
                f"unknown operation {name!r}; this node serves: {known}. "
                "Is the client newer than the node?"
            )
        return op

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def __iter__(self) -> Iterator[Operation]:
        return iter(sorted(self._ops.values(), key=lambda op: op.name))

    def __len__(self) -> int:
        return len(self._ops)


# --- argument helpers for handlers ----------------------------------------------------

T = TypeVar("T")
_MISSING: Any = object()


def arg(args: dict[str, Any], name: str, kind: type[T], default: T = _MISSING) -> T:
    """``args[name]`` checked to be a ``kind``; :class:`InvalidArgumentError` otherwise.

    ``bool`` is not accepted where ``int`` is asked for (msgpack keeps them apart).
    """
    value = args.get(name, _MISSING)
    if value is _MISSING or (value is None and default is not _MISSING):
        if default is _MISSING:
            raise InvalidArgumentError(f"missing argument {name!r}")
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidArgumentError(
            f"argument {name!r} must be {kind.__name__}, got {type(value).__name__}"
        )
    return value


def non_negative(args: dict[str, Any], name: str, default: int = _MISSING) -> int:
    """An integer argument that must be ≥ 0 (offsets, lengths, sizes)."""
    value = arg(args, name, int, default)
    if value < 0:
        raise InvalidArgumentError(f"argument {name!r} must be ≥ 0, got {value}")
    return value
