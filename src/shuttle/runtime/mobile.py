"""The programming model: mobile objects, anchored objects and object managers
(ABACUS section 4).

A :class:`MobileObject` is state plus methods. The run-time creates it, calls its
public methods (any method whose name does not start with ``_``, except the few
below that belong to the run-time), and moves it: it calls :meth:`checkpoint` at the
source, ships the bytes, makes a fresh instance at the target *without* calling
``__init__`` and calls :meth:`restore` on it. The default checkpoint is the object's
public attributes (those not starting with ``_``) encoded with
:mod:`shuttle.runtime.values`, references included; an object with state that does
not fit (an open file, a compiled regex) keeps it in ``_`` attributes and overrides
:meth:`restore` to rebuild it.

Anchored objects never move: a node's storage object, an application's console.
``migratable = False`` anchors any other object where it was created.

An :class:`ObjectManager` holds all objects of one type on one node (section 4.2):
the run-time asks it to create, adopt (after a migration) and release objects, and
routes invocations through it, so a manager can share resources among its objects
(one cache's memory for all cache objects of a node, say). Most types use the
default manager.

Methods are called with msgpack-able arguments (and references), run to completion
on one thread, and may call other objects through the references they hold.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, TypeVar

from shuttle.errors import InvalidArgumentError, UnknownOperationError
from shuttle.runtime import values
from shuttle.runtime.authority import Needs
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.refs import Invoker, Ref

#: Methods that belong to the run-time, never invocable by other objects.
RUNTIME_METHODS = frozenset(
    {
        "checkpoint",
        "restore",
        "state",
        "set_state",
        "memory_bytes",
        "attach",
        "methods",
        "destroying",
        "durable_checkpoint",
    }
)


class CallMoved(Exception):
    """Raised by a method that has changed nothing, while its object is moving
    (:meth:`MobileObject.moving`): the run-time lets the move go ahead and calls the
    method again wherever the object lands. The caller never sees it."""


class MobileObject:
    """Base class of every mobile object (built-in or shipped)."""

    #: Name of a built-in type (``grep``); shipped classes leave it empty.
    type_name: ClassVar[str] = ""
    #: False anchors the object on the node where it was created.
    migratable: ClassVar[bool] = True
    #: Storage objects and consoles: never move, never shipped.
    anchored: ClassVar[bool] = False
    #: The manager class for this type (None: the default :class:`ObjectManager`).
    manager_class: ClassVar[type[ObjectManager] | None] = None
    #: True: the object is thread-safe, and calls to it run concurrently (the storage
    #: object). False (the default): one call at a time, as an actor.
    concurrent: ClassVar[bool] = False
    #: Methods of a concurrent object that may enter while a migration drains its
    #: active calls: short callbacks that wait on nothing and that an active call may
    #: be waiting for through another object (a directory's ``invalidate``, which
    #: another client's commit waits on while this object's own commit waits on that
    #: client's). Admitted only until the drain ends, never during the checkpoint.
    quiesce_admits: ClassVar[frozenset[str]] = frozenset()
    #: An anchored object's methods open to principals, with the keys each touches
    #: (:mod:`shuttle.runtime.authority`); a method not listed is refused to them.
    access: ClassVar[Mapping[str, Needs]] = {}
    #: False: only an unrestricted caller (the cluster key's holder) may create one (an
    #: object that reaches data other than through the storage object: ``osdgrep``).
    principals_may_create: ClassVar[bool] = True
    #: True: made durable (``Runtime.create(..., durable=True)`` says so for one
    #: object): its state is written to its home's disk before a call that changed it
    #: is answered, and its home brings it back from there if its node dies.
    durable: ClassVar[bool] = False
    #: Methods that never change what :meth:`durable_checkpoint` saves: a durable
    #: object's calls of these are answered without writing anything.
    readonly: ClassVar[frozenset[str]] = frozenset()

    _rid: ObjectId | None = None
    _invoker: Invoker | None = None

    # --- set by the run-time -------------------------------------------------------

    def attach(self, rid: ObjectId, invoker: Invoker) -> None:
        """Called by the run-time before any method: the object's id and the run-time
        that its references call through (the node it now runs on)."""
        self._rid = rid
        self._invoker = invoker

    @property
    def rid(self) -> ObjectId:
        if self._rid is None:
            raise InvalidArgumentError("this object was not created by a run-time")
        return self._rid

    @property
    def invoker(self) -> Invoker | None:
        return self._invoker

    def moving(self) -> bool:
        """True while the run-time drains this object's calls to move it. A method
        that has changed nothing yet may then raise :class:`CallMoved` to be called
        again wherever the object lands, instead of holding the move up (an update
        starved of commits by clients that already sit at the node)."""
        check = getattr(self._invoker, "is_moving", None)
        return bool(check is not None and self._rid is not None and check(self._rid))

    def report_wait(self, callee: Ref, seconds: float) -> None:
        """Tell the monitor this object waited ``seconds`` because of its calls to
        ``callee`` outside the calls themselves (an optimistic retry's back-off after
        a conflict): if the callee is remote, the time counts as stall on that edge,
        which the placement model prices (it goes when both meet). A no-op where
        nothing monitors (a shipped object's worker)."""
        report = getattr(self._invoker, "report_wait", None)
        if report is not None and self._rid is not None and seconds > 0:
            report(self._rid, callee, seconds)

    def self_ref(self) -> Ref:
        """A reference to this object, to hand to others (a callback holder, say).
        Built-in objects only: a shipped object's worker has no run-time to ask."""
        own = getattr(self._invoker, "own_ref", None)
        if self._rid is None or own is None:
            raise InvalidArgumentError(f"{_describe(self)} cannot make a reference to itself")
        ref: Ref = own(self._rid)
        return ref

    # --- state for migration -------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What :meth:`checkpoint` saves: the public attributes."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def set_state(self, state: dict[str, Any]) -> None:
        """Put :meth:`state`'s result back (references already bound)."""
        vars(self).update(state)

    def checkpoint(self) -> bytes:
        """The object's state as bytes; the run-time calls it with no call active."""
        return values.pack(self.state())

    def restore(self, data: bytes) -> None:
        """Reinstate :meth:`checkpoint`'s bytes on a fresh instance (``__init__`` was
        not called; :meth:`attach` was)."""
        state = values.unpack(data, self._invoker)
        if not isinstance(state, dict):
            raise InvalidArgumentError(f"checkpoint of {type(self).__name__} is not a map")
        self.set_state(state)

    def durable_checkpoint(self) -> bytes:
        """What a durable object must not lose, as :meth:`restore` takes it back: the
        whole :meth:`checkpoint` by default. Override to leave out what can be rebuilt
        (a cache): it is written after every call that changed it. A concurrent
        object's override must be safe while other calls run."""
        return self.checkpoint()

    def memory_bytes(self) -> int:
        """Memory the object holds (buffers, caches), for the placement model's memory
        limits. Override to report it; the default is 0."""
        return 0

    def destroying(self) -> None:
        """Called once when the object ends for good (its application destroyed it or
        closed, or its lease ran out), with no call active, before it goes; never
        when it moves. Give back here what others hold on this object's behalf (a
        directory's callback promises at the isolation objects, which would
        otherwise make the next writer wait on callbacks to an object that is gone).
        It may call other objects; an error is logged and the object ends anyway.
        The default does nothing."""

    @classmethod
    def methods(cls) -> list[str]:
        """The names other objects may invoke."""
        return sorted(
            name
            for name in dir(cls)
            if not name.startswith("_")
            and name not in RUNTIME_METHODS
            and callable(getattr(cls, name, None))
            and not isinstance(getattr(cls, name, None), type)
        )


def bound_method(obj: MobileObject, method: str) -> Callable[..., Any]:
    """``obj``'s invocable method ``method``, or :class:`UnknownOperationError`."""
    if method.startswith("_") or method in RUNTIME_METHODS:
        raise UnknownOperationError(
            f"{method!r} cannot be invoked on an object: private and run-time methods "
            f"are not part of its interface; {_describe(obj)} offers {', '.join(obj.methods())}"
        )
    fn = getattr(obj, method, None)
    if fn is None or not callable(fn) or isinstance(fn, type):
        raise UnknownOperationError(
            f"{_describe(obj)} has no method {method!r}; it offers {', '.join(obj.methods())}"
        )
    return fn  # type: ignore[no-any-return]


def _describe(obj: MobileObject) -> str:
    rid = obj._rid
    kind = obj.type_name or type(obj).__qualname__
    return f"object {rid} ({kind})" if rid is not None else f"a {kind} object"


def type_label(cls: type[MobileObject]) -> str:
    """What ``shuttle objects`` shows as the type: the built-in name, or the class."""
    return cls.type_name or f"{cls.__module__}.{cls.__qualname__}"


class ObjectManager:
    """All objects of one type on one node. Subclass to share resources among them;
    the interface is the type's own, with the object's id first (section 4.2)."""

    def __init__(self, cls: type[MobileObject], node_id: str) -> None:
        self.cls = cls
        self.node_id = node_id
        self._objects: dict[ObjectId, MobileObject] = {}
        #: How many activations of each id this manager was given and not yet told
        #: to release: an object that leaves and comes back (or whose in-doubt move
        #: resolves late) can arrive again before its old activation is closed, and
        #: that late close must not take the new one away ("does not hold").
        self._holds: dict[ObjectId, int] = {}

    def _hold(self, rid: ObjectId, obj: MobileObject) -> None:
        self._objects[rid] = obj
        self._holds[rid] = self._holds.get(rid, 0) + 1

    def create(self, rid: ObjectId, invoker: Invoker, params: dict[str, Any]) -> MobileObject:
        """A new object of this type made from ``params`` (``CreateObj``)."""
        obj = self.cls.__new__(self.cls)
        obj.attach(rid, invoker)
        self.share(obj)
        obj.__init__(**params)  # type: ignore[misc]
        self._hold(rid, obj)
        return obj

    def adopt(self, rid: ObjectId, invoker: Invoker, checkpoint: bytes) -> MobileObject:
        """An object that migrated here: a fresh instance restored from ``checkpoint``."""
        obj = self.cls.__new__(self.cls)
        obj.attach(rid, invoker)
        self.share(obj)
        obj.restore(checkpoint)
        self._hold(rid, obj)
        return obj

    def share(self, obj: MobileObject) -> None:
        """Hand a new or arriving object what this type's objects share on this node
        (a cache's memory, say), before its ``__init__`` or ``restore`` runs. The
        default shares nothing."""

    def register(self, rid: ObjectId, obj: MobileObject) -> None:
        """Hold an object the run-time made itself (an anchored storage object)."""
        self._hold(rid, obj)

    def release(self, rid: ObjectId) -> MobileObject | None:
        """Forget an activation of object ``rid`` (it migrated away or was destroyed);
        the object is gone once every activation it was given is released (the one
        held now is the latest). Returns the object forgotten, or None."""
        left = self._holds.get(rid, 0) - 1
        if left > 0:
            self._holds[rid] = left
            return None
        self._holds.pop(rid, None)
        return self._objects.pop(rid, None)

    def get(self, rid: ObjectId) -> MobileObject | None:
        return self._objects.get(rid)

    def invoke(
        self, rid: ObjectId, method: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> Any:
        obj = self._objects.get(rid)
        if obj is None:
            raise InvalidArgumentError(f"manager of {self.cls.__name__} does not hold {rid}")
        return bound_method(obj, method)(*args, **kwargs)

    def __iter__(self) -> Iterator[MobileObject]:
        return iter(list(self._objects.values()))

    def __len__(self) -> int:
        return len(self._objects)


# --- built-in types, by name ---------------------------------------------------------

#: Built-in object types by name. ``shuttle.objects`` fills it when imported.
BUILTIN_TYPES: dict[str, type[MobileObject]] = {}
#: The package whose import registers the built-in types.
BUILTIN_PACKAGE = "shuttle.objects"

M = TypeVar("M", bound=type[MobileObject])


def builtin(name: str) -> Callable[[M], M]:
    """Class decorator: register a built-in object type under ``name``."""

    def register(cls: M) -> M:
        if name in BUILTIN_TYPES and BUILTIN_TYPES[name] is not cls:
            raise InvalidArgumentError(f"built-in object type {name!r} is registered twice")
        cls.type_name = name
        BUILTIN_TYPES[name] = cls
        return cls

    return register


def builtin_type(name: str, *, anchored_ok: bool = False) -> type[MobileObject]:
    """The built-in type called ``name``; :class:`InvalidArgumentError` lists the known.
    Anchored types (the storage object) are made by the run-time only."""
    if name not in BUILTIN_TYPES:
        importlib.import_module(BUILTIN_PACKAGE)  # the built-ins register themselves
    cls = BUILTIN_TYPES.get(name)
    if cls is None:
        raise InvalidArgumentError(
            f"no built-in object type {name!r}; built-in types: "
            f"{', '.join(sorted(BUILTIN_TYPES))}. "
            "A class of your own is shipped by value (Runtime.create(MyClass, ...))"
        )
    if cls.anchored and not anchored_ok:
        raise InvalidArgumentError(
            f"{name!r} objects are anchored: each node has one, made by the run-time; "
            "refer to it with Runtime.storage(node) instead of creating one"
        )
    return cls
