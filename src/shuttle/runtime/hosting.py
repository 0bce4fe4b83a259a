"""Hosting (ABACUS 4.2): making, restoring, checkpointing and ending the objects that
run on one run-time.

:class:`Hosting` is the one place a :class:`Hosted` is built, whether the object is
new (:meth:`Hosting.make`), arrives by migration or comes back from a durable
checkpoint (:meth:`Hosting.restore`), or is one of a node's anchored objects
(:meth:`Hosting.anchor`): one rule for what a hosted object may do (take calls
side by side, be written to disk after a call), read from its class, or from the
worker that runs a shipped class. A new object and a restored one differ only in
what they are made from (parameters or a checkpoint), so both are built by one
helper (``Hosting._build``): where it runs, for whom it acts, how a failure reads.
Built-in objects and a client's own classes run in this process, under one
:class:`~shuttle.runtime.mobile.ObjectManager` per type; classes shipped to a node
run in a sandboxed worker (:mod:`shuttle.runtime.sandbox`).

The record it builds is :mod:`shuttle.runtime.hosted`'s. It keeps no table of where
objects are: that is :mod:`shuttle.runtime.locations`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    NotPermittedError,
    ObjectFailedError,
    ShuttleError,
)
from shuttle.net.principal_limits import PrincipalLoad
from shuttle.net.principals import PrincipalBook
from shuttle.runtime import values
from shuttle.runtime.authority import acting_for
from shuttle.runtime.gate import Gate, GateState
from shuttle.runtime.hosted import Hosted, Stage
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.locations import FIRST_EPOCH
from shuttle.runtime.mobile import MobileObject, ObjectManager, builtin_type, type_label
from shuttle.runtime.refs import Invoker, Ref

log = logging.getLogger("shuttle.runtime")

#: Placement policies: ``auto`` lets the run-time move the object; ``static`` keeps
#: it where it was created (``--placement client|server``).
POLICIES = ("auto", "static")


def code_hash(code: bytes) -> str:
    return hashlib.blake2b(code, digest_size=16).hexdigest()


class Hosting:
    """Makes and ends the objects of run-time ``runtime_id``; ``invoker`` is what their
    references call through (the binding manager)."""

    def __init__(
        self,
        runtime_id: str,
        invoker: Invoker,
        *,
        speed: float = 1.0,
        accepts_shipped: bool = False,
        sandbox_limits: Any = None,
        is_node: bool = False,
        principals: PrincipalBook | None = None,
        load: PrincipalLoad | None = None,
        census: Callable[[], Counter[str]] | None = None,
    ) -> None:
        self.runtime_id = runtime_id
        #: The node's limits on what each principal holds (None: none), and what each
        #: principal's objects here number now (the location table's count).
        self.load = load
        self.census = census
        #: Objects being made or restored for each principal (not yet in the table).
        self._arriving: Counter[str] = Counter()
        self._room_lock = threading.Lock()
        self.invoker = invoker
        #: A node's principals (None: a client's run-time, or a node without a key),
        #: against which the calls of principals' objects are checked.
        self.principals = principals
        self.speed = speed
        self.accepts_shipped = accepts_shipped
        self.sandbox_limits = sandbox_limits
        self.is_node = is_node
        self._lock = threading.Lock()
        self._managers: dict[type[MobileObject], ObjectManager] = {}
        #: Classes this run-time shipped (by code hash): the only shipped code a
        #: client run-time accepts back.
        self._shipped: dict[str, type[MobileObject]] = {}

    def manager_for(self, cls: type[MobileObject]) -> ObjectManager:
        with self._lock:
            manager = self._managers.get(cls)
            if manager is None:
                manager = self._managers[cls] = (cls.manager_class or ObjectManager)(
                    cls, self.runtime_id
                )
            return manager

    def shipped(self, cls: type[MobileObject], code: bytes) -> None:
        """This client run-time ships ``cls`` as ``code``: it takes it back later."""
        self._shipped[code_hash(code)] = cls

    def resolve_type(self, kind: str | type[MobileObject]) -> tuple[type[MobileObject], str]:
        """(class, built-in name or "" for a shipped class)."""
        if isinstance(kind, str):
            return builtin_type(kind), kind  # refuses anchored types by name
        if not (isinstance(kind, type) and issubclass(kind, MobileObject)):
            raise InvalidArgumentError(
                f"objects are made from a built-in type name or a MobileObject subclass, "
                f"not {kind!r:.80}"
            )
        if kind.anchored:
            raise InvalidArgumentError(f"{kind.__name__} is anchored; the run-time makes those")
        name = kind.type_name
        if name:
            try:
                if builtin_type(name) is kind:
                    return kind, name
            except InvalidArgumentError:
                pass
        return kind, ""

    # --- the one builder --------------------------------------------------------------

    @staticmethod
    def _hosted(
        rid: ObjectId,
        home_address: str,
        impl: Any,
        manager: ObjectManager | None,
        *,
        type_name: str,
        code: bytes | None,
        policy: str,
        gate: GateState,
        durable: bool,
        epoch: int,
        app: str,
        **extra: Any,
    ) -> Hosted:
        """Every Hosted is built here. What the object may do comes from its class in
        this process; a shipped object's worker says its label and whether it may
        move, and it takes one call at a time (its worker is one thread)."""
        if manager is not None:
            cls = type(impl)
            label, migratable = type_label(cls), bool(cls.migratable)
            concurrent = bool(cls.concurrent)
            readonly = frozenset(cls.readonly)
        else:
            label, migratable = str(impl.type_label), bool(impl.migratable)
            concurrent, readonly = False, frozenset()
        return Hosted(
            rid,
            home_address,
            impl,
            manager,
            label,
            type_name,
            code,
            migratable,
            policy,
            Gate(gate),
            concurrent=concurrent,
            durable=durable,
            readonly=readonly,
            epoch=epoch,
            app=app or rid.home,
            **extra,
        )

    def make(
        self,
        rid: ObjectId,
        home_address: str,
        cls: type[MobileObject] | None,
        type_name: str,
        code: bytes | None,
        params: dict[str, Any],
        policy: str,
        *,
        durable: bool = False,
        app: str = "",
        principal: str | None = None,
    ) -> Hosted:
        """A new object (on an executor thread): in this process, or in a sandbox if
        it is shipped code arriving at a node (``cls`` None: the class is only ever
        unpickled inside the sandbox). Not yet in any table. It acts for ``principal``,
        its creator (None: unrestricted), from its ``__init__`` on."""
        if policy not in POLICIES:
            raise InvalidArgumentError(
                f"placement policy must be one of {POLICIES}, not {policy!r}"
            )
        if rid.is_anchored:
            raise InvalidArgumentError(f"{rid} names one of a node's anchored objects")
        params = values.bind_refs(params, self.invoker)
        self.check_creation(principal, cls, code, rid)
        with self._room_for(principal):
            if code is not None and self.is_node:
                cls = None  # shipped code at a node: only ever unpickled in the sandbox
            elif cls is None:
                raise InvalidArgumentError(f"object {rid}: no class to make it from")
            return self._build(
                rid,
                home_address,
                cls,
                code,
                principal,
                params=params,
                type_name=type_name,
                policy=policy,
                gate=GateState.OPEN,
                durable=durable,
                epoch=FIRST_EPOCH,
                app=app,
            )

    @contextmanager
    def _room_for(self, principal: str | None) -> Iterator[None]:
        """Refuse a principal an object past its share of the node's objects
        (:class:`NodeBusyError`, net/principal_limits.py); while it is being made it
        counts, so objects made at once cannot pass the share together."""
        load, census = self.load, self.census
        if principal is None or load is None or census is None:
            yield
            return
        with self._room_lock:
            counts = census() + self._arriving
            load.check("objects", principal, counts[principal], sum(counts.values()))
            self._arriving[principal] += 1
        try:
            yield
        finally:
            with self._room_lock:
                self._arriving[principal] -= 1
                if not self._arriving[principal]:
                    del self._arriving[principal]

    def check_creation(
        self,
        principal: str | None,
        cls: type[MobileObject] | None,
        code: bytes | None,
        rid: ObjectId,
    ) -> None:
        """May ``principal`` make (or bring here) this object? Shipped code needs the
        ship capability; some built-in types are the cluster key's holder's only."""
        book = self.principals
        if principal is None or book is None:
            return
        who = book.resolve(principal)
        if code is not None:
            who.require_ship(f"ship code (object {rid})")
        elif cls is not None and not cls.principals_may_create:
            raise NotPermittedError(
                f"principal {principal!r} may not make a {type_label(cls)} object: it "
                "reaches data past the node's checks, so only the cluster key's holder may"
            )
        elif who.removed:
            raise who.refusal(f"make object {rid}", "read")

    def restore(
        self,
        rid: ObjectId,
        home_address: str,
        type_name: str,
        code: bytes | None,
        checkpoint: bytes,
        policy: str,
        *,
        gate: GateState,
        durable: bool,
        epoch: int,
        app: str,
        arrived_from: str | None = None,
        stage: Stage | None = None,
        principal: str | None = None,
    ) -> Hosted:
        """An object restored from ``checkpoint``: arriving by migration (``gate``
        STAGED) or brought back by its home from its durable state (OPEN). It acts
        for ``principal`` (whose connection brought it, or who made it; None:
        unrestricted)."""
        if rid.is_anchored:
            raise InvalidArgumentError(f"{rid} is one of a node's anchored objects; it never moves")
        if policy not in POLICIES:
            raise InvalidArgumentError(f"object {rid}: policy must be one of {POLICIES}")
        self.check_creation(principal, builtin_type(type_name) if type_name else None, code, rid)
        # An object arriving by migration takes room in its principal's share (a move
        # to a node where it has none left fails, and the object stays where it was); a
        # durable object its home brings back had its room before and is not refused.
        room = self._room_for(principal) if gate is GateState.STAGED else nullcontext()
        with room:
            cls: type[MobileObject] | None
            if type_name:
                cls = builtin_type(type_name)
            elif code is None:
                raise InvalidArgumentError(f"object {rid} arrived with neither a type nor code")
            elif self.is_node:
                cls = None
            else:
                shipped = self._shipped.get(code_hash(code))
                if shipped is None:
                    raise NotPermittedError(
                        f"object {rid} carries a class this client never shipped; a client "
                        "run-time only takes back its own classes"
                    )
                cls = shipped
            return self._build(
                rid,
                home_address,
                cls,
                code,
                principal,
                checkpoint=checkpoint,
                type_name=type_name,
                policy=policy,
                gate=gate,
                durable=durable,
                epoch=epoch,
                app=app,
                arrived_from=arrived_from,
                checkpoint_bytes=len(checkpoint),
                stage=stage,
            )

    def _build(
        self,
        rid: ObjectId,
        home_address: str,
        cls: type[MobileObject] | None,
        code: bytes | None,
        principal: str | None,
        *,
        params: dict[str, Any] | None = None,
        checkpoint: bytes | None = None,
        type_name: str,
        policy: str,
        gate: GateState,
        durable: bool,
        epoch: int,
        app: str,
        **extra: Any,
    ) -> Hosted:
        """A new or restored object and its :class:`Hosted`: made from ``params``
        (:meth:`make`) or restored from ``checkpoint`` (:meth:`restore`; exactly one
        of the two), acting for ``principal`` from its first line on. It runs in a
        sandboxed worker when ``cls`` is None (shipped ``code`` at a node), else in
        this process under its class's manager, whose failure is an
        :class:`ObjectFailedError` that says what was being done to which object."""
        manager: ObjectManager | None
        if cls is None:
            assert code is not None
            with acting_for(principal):
                impl: Any = self._start_sandbox(rid, code, params=params, checkpoint=checkpoint)
            manager = None
        else:
            manager = self.manager_for(cls)
            try:
                with acting_for(principal):
                    if checkpoint is None:
                        made = params if params is not None else {}
                        impl = manager.create(rid, self.invoker, made)
                    else:
                        impl = manager.adopt(rid, self.invoker, checkpoint)
            except ShuttleError:
                raise
            except Exception as exc:
                if checkpoint is None:
                    doing = f"creating {type_label(cls)}"
                else:
                    doing = f"restoring {type_label(cls)} object {rid}"
                raise ObjectFailedError(f"{doing} failed: {type(exc).__name__}: {exc}") from exc
        return self._hosted(
            rid,
            home_address,
            impl,
            manager,
            type_name=type_name,
            code=code,
            policy=policy,
            gate=gate,
            durable=durable,
            epoch=epoch,
            app=app,
            principal=principal,
            **extra,
        )

    def anchor(self, rid: ObjectId, obj: MobileObject, address: str) -> Hosted:
        """An anchored object made by the run-time itself (a node's storage object):
        it never moves and is never shipped."""
        manager = self.manager_for(type(obj))
        obj.attach(rid, self.invoker)
        manager.register(rid, obj)
        return self._hosted(
            rid,
            address,
            obj,
            manager,
            type_name=obj.type_name,
            code=None,
            policy="static",
            gate=GateState.OPEN,
            # An anchored object never moves and is made again by its node at start: a
            # durable one (the atomicity object's log) keeps its own state on disk.
            durable=False,
            epoch=FIRST_EPOCH,
            app=rid.home,
        )

    def _start_sandbox(
        self,
        rid: ObjectId,
        code: bytes,
        *,
        params: dict[str, Any] | None = None,
        checkpoint: bytes | None = None,
    ) -> Any:
        if not self.accepts_shipped:
            raise NotPermittedError(
                f"node {self.runtime_id} was started without a cluster key, so it does not "
                "run shipped code; start it with --key-file (`shuttle cluster up` does), or "
                "use a built-in object type"
            )
        from shuttle.runtime.sandbox import SandboxedObject, SandboxLimits

        limits = self.sandbox_limits if self.sandbox_limits is not None else SandboxLimits()
        return SandboxedObject.start(
            code,
            rid,
            limits=limits,
            callout=self._callout,
            params=params,
            checkpoint=checkpoint,
            cpu_factor=self.speed if self.speed < 1 else 1.0,
        )

    def _callout(self, ref: Ref, method: str, args: Any, kwargs: dict[str, Any]) -> Any:
        """A sandboxed object's call through one of its references."""
        invoker = self.invoker
        return invoker.invoke(
            ref.bind(invoker),
            method,
            tuple(values.bind_refs(list(args), invoker)),
            values.bind_refs(kwargs, invoker),
        )

    # --- state and endings --------------------------------------------------------------

    @staticmethod
    def checkpoint_of(hosted: Hosted, *, durable_part: bool = False) -> bytes:
        """The hosted object's state (for a move: no call active, its gate is closed);
        with ``durable_part``, what a durable object writes after a call."""
        try:
            impl = hosted.impl
            data = (
                impl.durable_checkpoint()
                if durable_part and hosted.manager is not None
                else impl.checkpoint()
            )
        except ShuttleError:
            raise
        except Exception as exc:
            raise ObjectFailedError(
                f"checkpoint of {hosted.rid} ({hosted.type_label}) raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ObjectFailedError(
                f"checkpoint of {hosted.rid} ({hosted.type_label}) returned "
                f"{type(data).__name__}, not bytes"
            )
        if not durable_part:
            hosted.checkpoint_bytes = len(data)
        return bytes(data)

    @staticmethod
    def last_checkpoint_bytes(hosted: Hosted) -> int:
        """The size a migration would ship, as the object's last real checkpoint had
        it (its last move's, or the one it arrived with): the planner's price of a
        move, read without running the object. Before its first checkpoint, a
        shipped object's is priced at the memory its worker holds (it cannot be
        asked more cheaply) and a built-in one's at 0 (its state is what it was
        created with; the first move measures it)."""
        if hosted.checkpoint_bytes or not hosted.sandboxed:
            return hosted.checkpoint_bytes
        return hosted.memory_bytes()

    @staticmethod
    def tell_destroyed(hosted: Hosted) -> None:
        """Let a built-in object give back what others hold for it before it ends
        (its callback promises); a failure there must not keep it alive."""
        if hosted.manager is None:
            return  # a shipped object's worker: it has no run-time to call out through
        try:
            with acting_for(hosted.principal):
                hosted.impl.destroying()
        except Exception as exc:
            log.warning("object %s, ending, could not tidy up: %s", hosted.rid, exc)

    @staticmethod
    def close(hosted: Hosted) -> None:
        """End what ran the object: its manager forgets it; a shipped object's worker
        process ends (may block). Call once it is out of the location table."""
        if hosted.manager is not None:
            hosted.manager.release(hosted.rid)
            return
        try:
            hosted.impl.close()
        except Exception as exc:  # closing a dead worker: nothing left to do
            log.debug("closing sandbox of %s: %s", hosted.rid, exc)
