"""Hosting (ABACUS 4.2, 5.1): the objects that run on one run-time, and its tables.

:class:`Hosting` keeps, for one run-time (a storage node's or a client's), the
objects running here (each a :class:`Hosted` behind its
:class:`~shuttle.runtime.gate.Gate`), the homes it keeps for objects it created,
its hints and forwarding pointers for the others, one
:class:`~shuttle.runtime.mobile.ObjectManager` per type, and the record of recent
migrations. It makes, restores, checkpoints and ends objects: built-in objects and a
client's own classes in this process; classes shipped to a node in a sandboxed worker
process (:mod:`shuttle.runtime.sandbox`).

The binding manager (:mod:`shuttle.runtime.binding`) builds on it to find objects and
call them; migration (:mod:`shuttle.runtime.migration`) moves them between hosts.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    NotPermittedError,
    ObjectBusyError,
    ObjectFailedError,
    ShuttleError,
)
from shuttle.net.principals import PrincipalBook
from shuttle.runtime import values
from shuttle.runtime.authority import acting_for
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.gate import Gate, GateState
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject, ObjectManager, builtin_type, type_label
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.refs import Ref

log = logging.getLogger("shuttle.runtime")

#: Recent migrations kept for ``shuttle objects --watch`` and the decision log.
EVENTS_MAX = 1000
#: Placement policies: ``auto`` lets the run-time move the object; ``static`` keeps
#: it where it was created (``--placement client|server``).
POLICIES = ("auto", "static")


@dataclass
class HomeEntry:
    """What a home knows of an object it created."""

    location: str
    type_label: str
    created_at: float = field(default_factory=time.time)
    #: The principal that created it (None: unrestricted); see runtime/authority.py.
    principal: str | None = None


@dataclass
class Hosted:
    """An object running on this run-time."""

    rid: ObjectId
    home_address: str
    #: A MobileObject (in this process) or a SandboxedObject (a worker process).
    impl: Any
    manager: ObjectManager | None
    type_label: str
    #: Built-in type name, or "" for a shipped class.
    type_name: str
    #: The shipped class (cloudpickle), or None for a built-in.
    code: bytes | None
    migratable: bool
    policy: str
    gate: Gate
    lock: threading.RLock = field(default_factory=threading.RLock)
    #: The call chain inside the object now (calls of the same chain re-enter), and
    #: the thread it entered on.
    owner: str | None = None
    owner_thread: int | None = None
    #: Thread-safe objects (the storage object) take calls concurrently.
    concurrent: bool = False
    arrived_at: float = field(default_factory=time.monotonic)
    arrived_from: str | None = None
    #: Why it migrated here (the source's reason), for the arrival's event.
    arrival_reason: str = ""
    checkpoint_bytes: int = 0
    #: The principal it acts for: the one whose connection created or brought it (None:
    #: unrestricted). Kept across migrations: it is the identity the source's run-time
    #: authenticates as when it installs the object at the target.
    principal: str | None = None

    @property
    def sandboxed(self) -> bool:
        return self.manager is None

    @property
    def movable(self) -> bool:
        return self.migratable and self.policy == "auto"

    def memory_bytes(self) -> int:
        try:
            return int(self.impl.memory_bytes())
        except Exception:  # a user object's memory_bytes may fail; it is only a hint
            return 0


def admitted_while_quiescing(hosted: Hosted, method: str) -> bool:
    """Whether a call of ``method`` may enter ``hosted`` while its active calls drain
    (a concurrent built-in object's ``quiesce_admits``; see :mod:`shuttle.runtime.gate`)."""
    if hosted.manager is None or not hosted.concurrent:
        return False
    return method in getattr(type(hosted.impl), "quiesce_admits", frozenset())


@dataclass(frozen=True)
class MigrationEvent:
    """One migration that happened (or failed), for logs, ``--watch`` and ``--json``."""

    t: float
    rid: str
    source: str
    target: str
    ok: bool
    reason: str
    elapsed_s: float = 0.0
    quiesce_s: float = 0.0
    checkpoint_bytes: int = 0
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 6),
            "rid": self.rid,
            "from": self.source,
            "to": self.target,
            "ok": self.ok,
            "reason": self.reason,
            "elapsed_s": round(self.elapsed_s, 6),
            "quiesce_s": round(self.quiesce_s, 6),
            "checkpoint_bytes": self.checkpoint_bytes,
            "error": self.error,
        }


def code_hash(code: bytes) -> str:
    return hashlib.blake2b(code, digest_size=16).hexdigest()


class Hosting(abc.ABC):
    """The objects running on run-time ``runtime_id``, and where it knows others are."""

    def __init__(
        self,
        runtime_id: str,
        *,
        config: RuntimeConfig,
        monitor: ResourceMonitor,
        speed: float = 1.0,
        accepts_shipped: bool = False,
        sandbox_limits: Any = None,
        is_node: bool = False,
        principals: PrincipalBook | None = None,
    ) -> None:
        self.id = runtime_id
        #: A node's principals (None: a client's run-time, or a node without a key),
        #: against which the calls of principals' objects are checked.
        self.principals = principals
        self.address = ""
        self.config = config
        self.monitor = monitor
        #: Raw CPU speed R relative to the reference machine (a node's --cpu-factor).
        self.speed = speed
        #: Extra CPU to burn per CPU second of object work (a slower node), 1/R - 1.
        self.burn_ratio = max(0.0, 1.0 / speed - 1.0)
        self.accepts_shipped = accepts_shipped
        self.sandbox_limits = sandbox_limits
        self.is_node = is_node
        self._lock = threading.Lock()
        self.hosted: dict[ObjectId, Hosted] = {}
        self.hints: dict[ObjectId, str] = {}
        self.homed: dict[ObjectId, HomeEntry] = {}
        #: Where objects that left went, kept until their home has been told.
        self.forwarding: dict[ObjectId, str] = {}
        self.managers: dict[type[MobileObject], ObjectManager] = {}
        #: Classes this run-time shipped (by code hash): the only shipped code a
        #: client run-time accepts back.
        self.shipped_classes: dict[str, type[MobileObject]] = {}
        self.events: deque[MigrationEvent] = deque(maxlen=EVENTS_MAX)
        #: Objects with a migration under way (not to be decided about again).
        self.migrating: set[ObjectId] = set()
        #: Last time each object moved to or from here, and from where it came.
        self.moves: dict[str, tuple[float, str]] = {}
        #: Failed migrations per object: (time of the last failure, failures in a row).
        self.failures: dict[str, tuple[float, int]] = {}

    @abc.abstractmethod
    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``method`` of the object ``ref`` names, wherever it runs: the binding
        manager's job (a sandboxed object's references call out through it)."""

    def manager_for(self, cls: type[MobileObject]) -> ObjectManager:
        with self._lock:
            manager = self.managers.get(cls)
            if manager is None:
                manager = self.managers[cls] = (cls.manager_class or ObjectManager)(cls, self.id)
            return manager

    # --- creation --------------------------------------------------------------------

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

    def host_new(
        self,
        rid: ObjectId,
        home_address: str,
        cls: type[MobileObject] | None,
        type_name: str,
        code: bytes | None,
        params: dict[str, Any],
        policy: str,
        principal: str | None = None,
    ) -> Hosted:
        """Make an object here (on an executor thread): in this process, or in a
        sandbox if it is shipped code arriving at a node (``cls`` None: the class is
        only ever unpickled inside the sandbox). It acts for ``principal``, its
        creator (None: unrestricted), from its ``__init__`` on."""
        if policy not in POLICIES:
            raise InvalidArgumentError(
                f"placement policy must be one of {POLICIES}, not {policy!r}"
            )
        self._refuse_taken(rid)
        self.check_creation(principal, cls, code, rid)
        with acting_for(principal):
            hosted = self._make(rid, home_address, cls, type_name, code, params, policy)
        hosted.principal = principal
        with self._lock:
            self.hosted[rid] = hosted
            self.hints.pop(rid, None)
            self.forwarding.pop(rid, None)
            if rid.home == self.id:
                self.homed[rid] = HomeEntry(self.id, hosted.type_label, principal=principal)
        return hosted

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

    def _make(
        self,
        rid: ObjectId,
        home_address: str,
        cls: type[MobileObject] | None,
        type_name: str,
        code: bytes | None,
        params: dict[str, Any],
        policy: str,
    ) -> Hosted:
        params = values.bind_refs(params, self)
        manager: ObjectManager | None
        if code is not None and self.is_node:
            impl: Any = self._start_sandbox(rid, code, params=params)
            manager, label, migratable = None, impl.type_label, bool(impl.migratable)
        else:
            if cls is None:
                raise InvalidArgumentError(f"object {rid}: no class to make it from")
            manager = self.manager_for(cls)
            label, migratable = type_label(cls), bool(cls.migratable)
            try:
                impl = manager.create(rid, self, params)
            except ShuttleError:
                raise
            except Exception as exc:
                raise ObjectFailedError(
                    f"creating {type_label(cls)} failed: {type(exc).__name__}: {exc}"
                ) from exc
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
            Gate(),
            concurrent=bool(cls.concurrent) if cls is not None and manager is not None else False,
        )

    def host_arrival(
        self,
        rid: ObjectId,
        home_address: str,
        type_name: str,
        code: bytes | None,
        checkpoint: bytes,
        policy: str,
        source: str,
        principal: str | None = None,
    ) -> Hosted:
        """Restore an object that is migrating here, behind a closed (staged) gate; it
        acts for ``principal`` (whose connection brought it; None: unrestricted)."""
        if rid in self.hosted:
            raise InvalidArgumentError(f"object {rid} is already hosted here")
        if rid.is_anchored:
            raise InvalidArgumentError(f"{rid} is one of a node's anchored objects; it never moves")
        self.check_creation(principal, builtin_type(type_name) if type_name else None, code, rid)
        with acting_for(principal):
            hosted = self._arrive(rid, home_address, type_name, code, checkpoint, policy, source)
        hosted.principal = principal
        with self._lock:
            self.hosted[rid] = hosted
        return hosted

    def _arrive(
        self,
        rid: ObjectId,
        home_address: str,
        type_name: str,
        code: bytes | None,
        checkpoint: bytes,
        policy: str,
        source: str,
    ) -> Hosted:
        if type_name:
            cls = builtin_type(type_name)
            manager: ObjectManager | None = self.manager_for(cls)
            assert manager is not None
            try:
                impl: Any = manager.adopt(rid, self, checkpoint)
            except ShuttleError:
                raise
            except Exception as exc:
                raise ObjectFailedError(
                    f"restoring {type_name} object {rid} failed: {type(exc).__name__}: {exc}"
                ) from exc
            label, migratable = type_label(cls), bool(cls.migratable)
        elif code is None:
            raise InvalidArgumentError(f"object {rid} arrived with neither a type nor code")
        elif self.is_node:
            impl, manager = self._start_sandbox(rid, code, checkpoint=checkpoint), None
            label, migratable = impl.type_label, impl.migratable
        else:
            cls = self.shipped_classes.get(code_hash(code))  # type: ignore[assignment]
            if cls is None:
                raise NotPermittedError(
                    f"object {rid} carries a class this client never shipped; a client "
                    "run-time only takes back its own classes"
                )
            manager = self.manager_for(cls)
            try:
                impl = manager.adopt(rid, self, checkpoint)
            except Exception as exc:
                raise ObjectFailedError(
                    f"restoring {type_label(cls)} object {rid} failed: {type(exc).__name__}: {exc}"
                ) from exc
            label, migratable = type_label(cls), bool(cls.migratable)
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
            Gate(GateState.STAGED),
            concurrent=bool(getattr(impl, "concurrent", False)) and manager is not None,
            arrived_from=source,
            checkpoint_bytes=len(checkpoint),
        )

    def _refuse_taken(self, rid: ObjectId) -> None:
        """An id names one object: refuse to make another under it."""
        if rid in self.hosted or (rid.home == self.id and rid in self.homed):
            raise InvalidArgumentError(
                f"object id {rid} is taken here; every object needs an id of its own"
            )
        if rid.is_anchored:
            raise InvalidArgumentError(f"{rid} names one of a node's anchored objects")

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
                f"node {self.id} was started without a cluster key, so it does not run "
                "shipped code; start it with --key-file (`shuttle cluster up` does), or "
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
        return self.invoke(
            ref.bind(self),
            method,
            tuple(values.bind_refs(list(args), self)),
            values.bind_refs(kwargs, self),
        )

    def release(self, rid: ObjectId, *, destroyed: bool = False) -> Hosted | None:
        """Stop hosting ``rid`` (it left, or, with ``destroyed``, it ends for good and
        is told first: :meth:`MobileObject.destroying`); its process, if any, ends."""
        if destroyed:
            hosted = self.hosted.get(rid)
            if hosted is not None:
                self.tell_destroyed(hosted)
        hosted = self.unhost(rid)
        if hosted is not None:
            self.close_impl(hosted)
        return hosted

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

    def unhost(self, rid: ObjectId) -> Hosted | None:
        """Take ``rid`` out of the tables at once (calls stop finding it here)."""
        with self._lock:
            hosted = self.hosted.pop(rid, None)
        if hosted is not None and hosted.manager is not None:
            hosted.manager.release(rid)
        return hosted

    @staticmethod
    def close_impl(hosted: Hosted) -> None:
        """End what ran the object (a shipped object's worker process; may block)."""
        if hosted.manager is None:
            try:
                hosted.impl.close()
            except Exception as exc:  # closing a dead worker: nothing left to do
                log.debug("closing sandbox of %s: %s", hosted.rid, exc)

    def destroy_hosted(self, rid: ObjectId) -> bool:
        """End object ``rid`` if it runs here, after its active calls drain (executor
        thread). Later calls get :class:`ObjectNotFoundError` from its home."""
        hosted = self.hosted.get(rid)
        if hosted is not None:
            if rid.is_anchored or getattr(type(hosted.impl), "anchored", False):
                raise InvalidArgumentError(
                    f"{rid} is anchored (one of a node's own objects); it cannot be destroyed"
                )
            if hosted.gate.closed or rid in self.migrating:
                raise ObjectBusyError(
                    f"object {rid} is moving or arriving; destroy it once it has settled"
                )
            if hosted.gate.quiesce(self.config.drain_timeout_s) is None:
                raise ObjectBusyError(
                    f"object {rid} is busy: its calls did not finish within "
                    f"{self.config.drain_timeout_s:g} s; try again"
                )
            self.tell_destroyed(hosted)
            self.unhost(rid)
            hosted.gate.retire()
            self.close_impl(hosted)
            self.monitor.forget(str(rid))
        if rid.home == self.id:
            self.homed.pop(rid, None)
        return hosted is not None

    def host_anchored(self, rid: ObjectId, obj: MobileObject) -> Hosted:
        """Host an anchored object made by the run-time itself (a node's storage
        object): it never moves and is never shipped."""
        manager = self.manager_for(type(obj))
        obj.attach(rid, self)
        manager.register(rid, obj)
        hosted = Hosted(
            rid,
            self.address,
            obj,
            manager,
            type_label(type(obj)),
            obj.type_name,
            None,
            False,
            "static",
            Gate(),
            concurrent=type(obj).concurrent,
        )
        with self._lock:
            self.hosted[rid] = hosted
            if rid.home == self.id:
                self.homed[rid] = HomeEntry(self.id, hosted.type_label)
        return hosted

    def checkpoint_of(self, hosted: Hosted) -> bytes:
        """The hosted object's state (no call active: the gate is quiescing)."""
        try:
            data = hosted.impl.checkpoint()
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
        hosted.checkpoint_bytes = len(data)
        return bytes(data)

    def estimate_checkpoint_bytes(self, hosted: Hosted) -> int:
        """The size a migration would ship, measured when the object is idle."""
        if hosted.manager is None:
            return hosted.checkpoint_bytes or hosted.memory_bytes()
        if hosted.lock.acquire(blocking=False):
            try:
                hosted.checkpoint_bytes = len(hosted.impl.checkpoint())
            except Exception:  # a racing or failing checkpoint: keep the last size
                pass
            finally:
                hosted.lock.release()
        return hosted.checkpoint_bytes

    def note_move(self, rid: ObjectId, source: str) -> None:
        self.moves[str(rid)] = (time.monotonic(), source)

    def record(self, event: MigrationEvent) -> None:
        self.events.append(event)
        if event.source == self.id:
            if event.ok:
                self.failures.pop(event.rid, None)
            else:
                _, count = self.failures.get(event.rid, (0.0, 0))
                self.failures[event.rid] = (time.monotonic(), count + 1)
        while len(self.moves) > EVENTS_MAX:
            self.moves.pop(next(iter(self.moves)))
        level = logging.INFO if event.ok else logging.WARNING
        log.log(
            level,
            "migration %s %s -> %s %s (%.3f s%s)",
            event.rid,
            event.source,
            event.target,
            "done" if event.ok else "failed",
            event.elapsed_s,
            f": {event.error}" if event.error else f"; {event.reason}",
        )

    def describe(self) -> list[dict[str, Any]]:
        """The objects hosted here, JSON-ready (``shuttle objects``)."""
        now = time.monotonic()
        out = []
        for rid, h in list(self.hosted.items()):
            out.append(
                {
                    "rid": str(rid),
                    "type": h.type_label,
                    "host": self.id,
                    "home": rid.home,
                    "state": h.gate.state.value,
                    "policy": h.policy if h.migratable else "anchored",
                    "sandboxed": h.sandboxed,
                    "memory_bytes": h.memory_bytes(),
                    "since_s": round(now - h.arrived_at, 3),
                    "arrived_from": h.arrived_from,
                }
            )
        return out
