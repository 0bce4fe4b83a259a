"""The binding manager (ABACUS 5.1): ids, location tables, invocation, hosting.

Every run-time (a storage node's, or a client's) has one. It

* gives each object it creates a network-wide id (:class:`ObjectId`: this run-time
  is its *home*) and keeps, for those, where they are now (authoritative);
* keeps *hints* of where other objects are, which may be stale;
* hosts objects: the ones running here, each behind a :class:`~shuttle.runtime.gate.Gate`
  (built-in objects and the client's own classes in this process; classes shipped
  to a node in a sandboxed worker process);
* invokes: :meth:`invoke` is a plain call when the object is here (no copies; the
  resource monitor sees the call and the return) and an ``object.invoke`` RPC
  otherwise. A node that no longer hosts the object answers "moved" with what it
  knows; with no forwarding pointer, the caller asks the object's home, which always
  knows, and retries there.

Threads: object methods and application code run on ordinary threads and call
:meth:`invoke` synchronously; network I/O runs on the run-time's event loop, reached
with ``run_coroutine_threadsafe``. Nothing here may be called on the loop's thread
(it would wait on itself); handlers there go through the executor.

Migration (5.2) lives in :mod:`shuttle.runtime.migration`; it uses the tables and
gates kept here.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from shuttle.errors import (
    InvalidArgumentError,
    LocalProtocolError,
    NotPermittedError,
    ObjectBusyError,
    ObjectFailedError,
    ObjectNotFoundError,
    ShuttleError,
    UnreachableError,
)
from shuttle.net.cpu import burn_cpu
from shuttle.runtime import values
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.gate import Gate, GateState
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject, ObjectManager, builtin_type, type_label
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import Peers
from shuttle.runtime.refs import Ref

log = logging.getLogger("shuttle.runtime")

#: Redirects one invocation follows (moved → ask home → retry) before giving up: an
#: object can be moving while we chase it, but not that many times in one call.
REDIRECTS_MAX = 8
#: Recent migrations kept for ``shuttle objects --watch`` and the decision log.
EVENTS_MAX = 1000
#: Placement policies: ``auto`` lets the run-time move the object; ``static`` keeps
#: it where it was created (``--placement client|server``).
POLICIES = ("auto", "static")

T = TypeVar("T")


@dataclass
class HomeEntry:
    """What a home knows of an object it created."""

    location: str
    type_label: str
    created_at: float = field(default_factory=time.time)


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


class _Retired(Exception):
    """The object left while the call waited at its gate: find it again."""


def code_hash(code: bytes) -> str:
    return hashlib.blake2b(code, digest_size=16).hexdigest()


class BindingManager:
    """Location tables, hosting and invocation for run-time ``runtime_id``."""

    def __init__(
        self,
        runtime_id: str,
        *,
        config: RuntimeConfig,
        peers: Peers,
        monitor: ResourceMonitor,
        executor: ThreadPoolExecutor,
        control: ThreadPoolExecutor | None = None,
        speed: float = 1.0,
        accepts_shipped: bool = False,
        sandbox_limits: Any = None,
        is_node: bool = False,
    ) -> None:
        self.id = runtime_id
        self.address = ""
        self.config = config
        self.peers = peers
        self.monitor = monitor
        #: Threads that run object methods (calls from other run-times).
        self.executor = executor
        #: Threads for the run-time's own blocking steps (quiesce, checkpoint, install,
        #: destroy): separate, so that calls held at a closed gate never starve the
        #: migration that will open it.
        self.control = control or executor
        #: Raw CPU speed R relative to the reference machine (a node's --cpu-factor).
        self.speed = speed
        #: Extra CPU to burn per CPU second of object work (a slower node), 1/R - 1.
        self.burn_ratio = max(0.0, 1.0 / speed - 1.0)
        self.accepts_shipped = accepts_shipped
        self.sandbox_limits = sandbox_limits
        self.is_node = is_node
        self.loop: asyncio.AbstractEventLoop | None = None
        self.incarnation = secrets.token_hex(3)
        self._ids = itertools.count(1)
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
        #: The call chain this thread works for (see :meth:`call_hosted`).
        self._chain = threading.local()
        #: Background tasks (migrations, informing homes) to finish before closing.
        self.tasks: set[asyncio.Task[Any]] = set()

    # --- plumbing ------------------------------------------------------------------

    def attach_loop(self, loop: asyncio.AbstractEventLoop, address: str) -> None:
        self.loop = loop
        self.address = address

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the run-time's loop and wait for it (from another thread)."""
        loop = self.loop
        if loop is None:
            coro.close()
            raise LocalProtocolError("the run-time is not started")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise LocalProtocolError(
                "a blocking run-time call was made on the run-time's event loop thread; "
                "object methods run on executor threads, application code on its own"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)

    def new_id(self) -> ObjectId:
        return ObjectId(self.id, f"{self.incarnation}-{next(self._ids)}")

    def ref(self, rid: ObjectId, home_address: str | None = None) -> Ref:
        """A reference to ``rid`` bound to this run-time."""
        address = home_address or (self.address if rid.home == self.id else "")
        if not address:
            address = self.peers.address_of(rid.home) or ""
        return Ref(rid, address, self)

    def learn_home(self, ref: Ref) -> None:
        if ref.home_address and ref.rid.home != self.id:
            self.peers.learn(ref.rid.home, ref.home_address)

    def manager_for(self, cls: type[MobileObject]) -> ObjectManager:
        with self._lock:
            manager = self.managers.get(cls)
            if manager is None:
                manager = self.managers[cls] = (cls.manager_class or ObjectManager)(cls, self.id)
            return manager

    # --- where is it ---------------------------------------------------------------

    def location_hint(self, rid: ObjectId) -> str | None:
        """Where we think ``rid`` runs (authoritative if we are its home)."""
        if rid in self.hosted:
            return self.id
        home = self.homed.get(rid)
        if home is not None:
            return home.location
        return self.forwarding.get(rid) or self.hints.get(rid)

    def locate_here(self, rid: ObjectId) -> tuple[str | None, bool]:
        """(location, authoritative) as this run-time knows it."""
        if rid in self.hosted:
            return self.id, True
        home = self.homed.get(rid)
        if home is not None:
            return home.location, True
        return self.forwarding.get(rid) or self.hints.get(rid), False

    async def locate(self, rid: ObjectId) -> str:
        """Ask ``rid``'s home where it is (correcting our hint)."""
        if rid.home == self.id:
            where, _ = self.locate_here(rid)
            if where is None:
                raise ObjectNotFoundError(
                    f"no object {rid}: this run-time is its home and never created it "
                    "(or it was destroyed)"
                )
            return where
        reply = (await self.peers.call(rid.home, "object.locate", {"rid": str(rid)})).result
        where = reply.get("location")
        if not isinstance(where, str):
            raise ObjectNotFoundError(f"no object {rid}: its home {rid.home} does not know it")
        if reply.get("address"):
            self.peers.learn(where, reply["address"])
        self.hints[rid] = where
        return where

    # --- invocation ------------------------------------------------------------------

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``method`` on the object ``ref`` names, wherever it runs (blocking).

        Raises the callee's typed error (:class:`ObjectFailedError` if its code
        raised), :class:`ObjectNotFoundError` if no such object exists, or
        :class:`UnreachableError` if the node it runs on cannot be reached."""
        self.learn_home(ref)
        caller = self.monitor.current()
        asked_home = False
        #: Where the home said the object is (authoritative), if we asked.
        home_says: str | None = None
        outer = getattr(self._chain, "id", None)
        if outer is None:
            self._chain.id = secrets.token_hex(6)  # a new chain of calls starts here
        try:
            return self._invoke(ref, method, args, kwargs, caller, asked_home, home_says)
        finally:
            if outer is None:
                self._chain.id = None

    def _invoke(
        self,
        ref: Ref,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        caller: str | None,
        asked_home: bool,
        home_says: str | None,
    ) -> Any:
        rid = ref.rid
        for _ in range(REDIRECTS_MAX):
            hosted = self.hosted.get(rid)
            if hosted is not None and hosted.gate.state is not GateState.RETIRED:
                try:
                    return self.call_hosted(hosted, method, args, kwargs, caller)
                except _Retired:
                    continue
            where = self.location_hint(rid)
            if where is None or where == self.id:
                where = self.run(self.locate(rid))
                asked_home, home_says = True, where
                if where == self.id and rid not in self.hosted:
                    raise ObjectNotFoundError(
                        f"object {rid} was lost: its home says it runs here, but it does "
                        "not (was this run-time restarted?)"
                    )
                continue
            try:
                status, value = self._invoke_remote(where, rid, method, args, kwargs, caller)
            except UnreachableError:
                if asked_home or rid.home == self.id:
                    raise
                self.hints.pop(rid, None)  # the hint may be stale: ask the home
                self.run(self.locate(rid))
                asked_home = True
                continue
            if status == "ok":
                return value
            moved_to = value.get("to")
            if isinstance(moved_to, str) and moved_to != where:
                if value.get("address"):
                    self.peers.learn(moved_to, value["address"])
                self.hints[rid] = moved_to
            elif home_says == where or (
                rid.home == self.id
                and self.homed.get(rid) is not None
                and self.homed[rid].location == where
            ):
                # The home itself sent us to ``where``, which does not have it.
                raise ObjectNotFoundError(
                    f"object {rid} was lost: its home says it runs on {where}, but {where} "
                    f"does not host it (did {where} restart?); create it again"
                )
            else:
                self.hints.pop(rid, None)
                home_says = self.run(self.locate(rid))
                asked_home = True
        raise ObjectNotFoundError(
            f"could not reach object {rid}: it moved {REDIRECTS_MAX} times while being "
            "called; try again"
        )

    def _invoke_remote(
        self,
        where: str,
        rid: ObjectId,
        method: str,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        caller: str | None,
    ) -> tuple[str, Any]:
        packed = values.pack([list(args), kwargs])
        start = time.monotonic()
        reply = self.run(self._call_remote(where, rid, method, packed, self.current_chain()))
        status, value = reply
        if status == "ok" and caller is not None:
            self.monitor.record_edge(
                caller,
                str(rid),
                bytes_down=values.byte_size(args) + values.byte_size(kwargs),
                bytes_up=values.byte_size(value),
                stall_s=time.monotonic() - start,
                remote=True,
            )
        return reply

    def current_chain(self) -> str:
        return getattr(self._chain, "id", None) or ""

    async def _call_remote(
        self, where: str, rid: ObjectId, method: str, packed: bytes, chain: str = ""
    ) -> tuple[str, Any]:
        resp = await self.peers.call(
            where,
            "object.invoke",
            {
                "rid": str(rid),
                "method": method,
                "from": self.id,
                "from_address": self.address,
                "chain": chain,
            },
            packed,
        )
        result = resp.result if isinstance(resp.result, dict) else {}
        if result.get("s") == "moved":
            return "moved", result
        payload = resp.payload
        if result.get("raw"):
            return "ok", payload if type(payload) is bytes else bytes(payload)
        return "ok", values.unpack(payload, self)

    def call_hosted(
        self,
        hosted: Hosted,
        method: str,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        caller: str | None,
    ) -> Any:
        """Run ``method`` on an object hosted here, through its gate, monitored.
        ``caller``: the calling object if it runs here (its edge is recorded here)."""
        if not hosted.gate.enter():
            raise _Retired
        rid = str(hosted.rid)
        monitor = self.monitor
        external: float | None = None
        result: Any = None
        frame = monitor.enter(rid)
        try:
            chain = self.current_chain()
            if (
                chain
                and hosted.owner == chain
                and hosted.manager is None
                and hosted.owner_thread != threading.get_ident()
            ):
                # A shipped object's worker runs one call at a time, and the node
                # talks to it from the thread that made the call: a cycle that comes
                # back on another thread cannot enter. Say so at once.
                raise ObjectBusyError(
                    f"call cycle: {hosted.rid} ({hosted.type_label}) is a shipped object "
                    "already inside this chain of calls, and shipped objects cannot be "
                    "re-entered from another node; break the cycle (A -> B -> A)"
                )
            if hosted.concurrent or (chain and hosted.owner == chain):
                # Thread-safe objects take calls side by side; a call of the chain
                # that holds the object (A -> B -> A, across threads and nodes) goes
                # in, as a recursive call would on one thread.
                result, external = self._call_impl(hosted, method, args, kwargs)
            else:
                with hosted.lock:
                    outer = hosted.owner, hosted.owner_thread
                    hosted.owner, hosted.owner_thread = chain or None, threading.get_ident()
                    try:
                        result, external = self._call_impl(hosted, method, args, kwargs)
                    finally:
                        hosted.owner, hosted.owner_thread = outer
            if self.burn_ratio and external is None:
                burn_cpu(monitor.own_cpu_s(frame) * self.burn_ratio)
        finally:
            monitor.exit(
                frame,
                bytes_in=values.byte_size(args) + values.byte_size(kwargs),
                bytes_out=values.byte_size(result),
                external_cpu_s=external,
            )
            hosted.gate.leave()
        if caller is not None:
            monitor.record_edge(
                caller,
                rid,
                bytes_down=values.byte_size(args) + values.byte_size(kwargs),
                bytes_up=values.byte_size(result),
            )
        return result

    def _call_impl(
        self,
        hosted: Hosted,
        method: str,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
    ) -> tuple[Any, float | None]:
        if hosted.manager is None:
            result, cpu = hosted.impl.invoke(method, args, kwargs)
            return result, cpu
        return self._call_in_process(hosted, method, args, kwargs), None

    @staticmethod
    def _call_in_process(
        hosted: Hosted, method: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> Any:
        assert hosted.manager is not None
        try:
            return hosted.manager.invoke(hosted.rid, method, args, kwargs)
        except ShuttleError:
            raise
        except Exception as exc:
            log.debug("object %s.%s raised", hosted.rid, method, exc_info=exc)
            raise ObjectFailedError(
                f"object {hosted.rid} ({hosted.type_label}).{method} raised "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def serve_invoke(
        self,
        rid: ObjectId,
        method: str,
        args: list[Any],
        kwargs: dict[str, Any],
        chain: str = "",
    ) -> tuple[str, Any]:
        """A remote caller's invocation (on an executor thread): ``("ok", result)`` or
        ``("moved", {to, address})`` when the object is not here. ``chain``: the
        caller's call chain, which this thread works for meanwhile."""
        self._chain.id = chain or secrets.token_hex(6)
        try:
            return self._serve_invoke(rid, method, args, kwargs)
        finally:
            self._chain.id = None

    def _serve_invoke(
        self, rid: ObjectId, method: str, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[str, Any]:
        for _ in range(2):
            hosted = self.hosted.get(rid)
            if hosted is None or hosted.gate.state is GateState.RETIRED:
                break
            try:
                return "ok", self.call_hosted(hosted, method, args, kwargs, None)
            except _Retired:
                continue
        where, _ = self.locate_here(rid)
        moved: dict[str, Any] = {"s": "moved", "home": rid.home}
        if where is not None and where != self.id:
            moved["to"] = where
            moved["address"] = self.peers.address_of(where) or ""
        elif rid.home == self.id:
            raise ObjectNotFoundError(
                f"no object {rid}: this run-time is its home and does not know it "
                "(destroyed, or its creation failed)"
            )
        return "moved", moved

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
    ) -> Hosted:
        """Make an object here (on an executor thread): in this process, or in a
        sandbox if it is shipped code arriving at a node (``cls`` None: the class is
        only ever unpickled inside the sandbox)."""
        if policy not in POLICIES:
            raise InvalidArgumentError(
                f"placement policy must be one of {POLICIES}, not {policy!r}"
            )
        self._refuse_taken(rid)
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
        hosted = Hosted(
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
        with self._lock:
            self.hosted[rid] = hosted
            self.hints.pop(rid, None)
            self.forwarding.pop(rid, None)
            if rid.home == self.id:
                self.homed[rid] = HomeEntry(self.id, hosted.type_label)
        return hosted

    def host_arrival(
        self,
        rid: ObjectId,
        home_address: str,
        type_name: str,
        code: bytes | None,
        checkpoint: bytes,
        policy: str,
        source: str,
    ) -> Hosted:
        """Restore an object that is migrating here, behind a closed (staged) gate."""
        if rid in self.hosted:
            raise InvalidArgumentError(f"object {rid} is already hosted here")
        if rid.is_storage:
            raise InvalidArgumentError(f"{rid} is a node's anchored storage object; it never moves")
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
        hosted = Hosted(
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
            arrived_from=source,
            checkpoint_bytes=len(checkpoint),
        )
        with self._lock:
            self.hosted[rid] = hosted
        return hosted

    def _refuse_taken(self, rid: ObjectId) -> None:
        """An id names one object: refuse to make another under it."""
        if rid in self.hosted or (rid.home == self.id and rid in self.homed):
            raise InvalidArgumentError(
                f"object id {rid} is taken here; every object needs an id of its own"
            )
        if rid.is_storage:
            raise InvalidArgumentError(f"{rid} names a node's anchored storage object")

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

    def release(self, rid: ObjectId) -> Hosted | None:
        """Stop hosting ``rid`` (it left, or was destroyed); its process, if any, ends."""
        hosted = self.unhost(rid)
        if hosted is not None:
            self.close_impl(hosted)
        return hosted

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
            if rid.is_storage or getattr(type(hosted.impl), "anchored", False):
                raise InvalidArgumentError(
                    f"{rid} is anchored (a node's storage object); it cannot be destroyed"
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
