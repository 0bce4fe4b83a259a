"""The binding manager (ABACUS 5.1): ids, locations and invocation.

Every run-time (a storage node's, or a client's) has one. It

* gives each object it creates a network-wide id (:class:`ObjectId`: this run-time
  is its *home*, or a node for a durable object) and, for those it is the home of,
  keeps where they are now and at which epoch (authoritative);
* keeps *hints* of where other objects are, which may be stale;
* hosts objects: the ones running here, each behind a
  :class:`~shuttle.runtime.gate.Gate` (built by :class:`~shuttle.runtime.hosting.Hosting`,
  found in the :class:`~shuttle.runtime.locations.LocationTable`);
* invokes: :meth:`invoke` is a plain call when the object is here (no copies; the
  resource monitor sees the call and the return) and an ``object.invoke`` RPC
  otherwise. A node that no longer hosts the object answers "moved" with what it
  knows; with nothing better, the caller asks the object's home, which always knows,
  and retries there. A call carries the newest epoch of the object the caller has
  heard of: a copy older than that is stale and stops (the caller told it so).

It is a composition: the location table (where), hosting (making and ending
objects), the move history (what moved), durability (:mod:`shuttle.runtime.durable`),
and the two sides of a call: invoking an object wherever it runs and asking its home
where that is (:mod:`shuttle.runtime.invocation`), and a call entering an object
hosted here (:mod:`shuttle.runtime.hosted_calls`). What stays here: ids and
references, the bridge between threads and the run-time's loop, and an object's
life on this run-time (hosted, retired, released, destroyed).
Migration (5.2) lives in :mod:`shuttle.runtime.migration`.

Threads: object methods and application code run on ordinary threads and call
:meth:`invoke` synchronously; network I/O runs on the run-time's event loop, reached
with ``run_coroutine_threadsafe``. Nothing here may be called on the loop's thread
(it would wait on itself); handlers there go through the executor.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from shuttle.errors import (
    InvalidArgumentError,
    LocalProtocolError,
    ObjectBusyError,
)
from shuttle.net.principal_limits import PrincipalLoad
from shuttle.net.principals import PrincipalBook
from shuttle.runtime import hosted_calls, invocation
from shuttle.runtime.authority import ACTING, acting
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.durable import Durability
from shuttle.runtime.gate import GateState
from shuttle.runtime.hosted import Hosted
from shuttle.runtime.hosting import Hosting
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.locations import LocationTable
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.moves import MoveHistory
from shuttle.runtime.peers import Peers
from shuttle.runtime.refs import Ref

log = logging.getLogger("shuttle.runtime")
T = TypeVar("T")


class BindingManager:
    """Finding, hosting and calling objects, for run-time ``runtime_id``."""

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
        principals: PrincipalBook | None = None,
        durable_dir: Path | None = None,
        load: PrincipalLoad | None = None,
    ) -> None:
        self.id = runtime_id
        self.address = ""
        self.config = config
        #: A node's principals (None: a client's run-time, or a node without a key),
        #: against which the calls of principals' objects are checked.
        self.principals = principals
        self.peers = peers
        self.monitor = monitor
        #: Raw CPU speed R relative to the reference machine (a node's --cpu-factor).
        self.speed = speed
        #: Extra CPU to burn per CPU second of object work (a slower node), 1/R - 1.
        self.burn_ratio = max(0.0, 1.0 / speed - 1.0)
        self.is_node = is_node
        #: Threads that run object methods (calls from other run-times).
        self.executor = executor
        #: Threads for the run-time's own blocking steps (quiesce, checkpoint, install,
        #: destroy): separate, so that calls held at a closed gate never starve the
        #: migration that will open it.
        self.control = control or executor
        self.loop: asyncio.AbstractEventLoop | None = None
        self.table = LocationTable(runtime_id)
        self.hosting = Hosting(
            runtime_id,
            self,
            speed=speed,
            accepts_shipped=accepts_shipped,
            sandbox_limits=sandbox_limits,
            is_node=is_node,
            principals=principals,
            load=load,
            census=self.table.principals_hosted,
        )
        self.history = MoveHistory(runtime_id)
        self.durability = Durability(self, durable_dir)
        self.incarnation = secrets.token_hex(3)
        self._ids = itertools.count(1)
        #: The call chain this thread works for (``chain.id``; None: none yet): set by
        #: the first call out of a thread and by a remote caller's invocation, so a
        #: chain that comes back into an object it holds re-enters it
        #: (:mod:`shuttle.runtime.hosted_calls`).
        self.chain = threading.local()
        #: Background tasks (migrations, stage resolutions) to finish before closing.
        self.tasks: set[asyncio.Task[Any]] = set()

    # --- plumbing ------------------------------------------------------------------

    @property
    def accepts_shipped(self) -> bool:
        return self.hosting.accepts_shipped

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
        principal = acting()
        if principal is not None:  # the loop's task acts for this thread's principal
            coro = _acting_as(principal, coro)
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` as a background task of this run-time (on its loop)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def in_control(self, fn: Any, *args: Any) -> Any:
        """A blocking step of the run-time's own, on the threads calls cannot occupy."""
        return await asyncio.get_running_loop().run_in_executor(self.control, fn, *args)

    def new_id(self, home: str | None = None) -> ObjectId:
        """A fresh id whose home is this run-time (or node ``home``, for a durable
        object this run-time makes: then the local part carries a random tag, since
        the node hands out no ids itself)."""
        if home is None or home == self.id:
            return ObjectId(self.id, f"{self.incarnation}-{next(self._ids)}")
        return ObjectId(home, f"d{secrets.token_hex(8)}-{next(self._ids)}")

    def ref(self, rid: ObjectId, home_address: str | None = None) -> Ref:
        """A reference to ``rid`` bound to this run-time."""
        address = home_address or (self.address if rid.home == self.id else "")
        if not address:
            address = self.peers.address_of(rid.home) or ""
        return Ref(rid, address, self)

    def own_ref(self, rid: ObjectId) -> Ref:
        """A reference to ``rid``, an object hosted here, naming its real home (what
        an object hands out as a reference to itself)."""
        hosted = self.table.hosted(rid)
        return self.ref(rid, hosted.home_address if hosted is not None else None)

    def is_moving(self, rid: ObjectId) -> bool:
        """Whether hosted object ``rid`` is being drained for a migration."""
        hosted = self.table.hosted(rid)
        return hosted is not None and hosted.gate.state is GateState.QUIESCING

    def report_wait(self, caller: ObjectId, callee: Ref, seconds: float) -> None:
        """Object ``caller`` (hosted here) waited ``seconds`` on account of its calls
        to ``callee`` (see :meth:`MobileObject.report_wait`): stall on that edge if
        the callee runs elsewhere; nothing if it is here (local calls do not stall)."""
        if self.table.hosted(callee.rid) is None:
            self.monitor.record_wait(str(caller), str(callee.rid), seconds)

    def learn_home(self, ref: Ref) -> None:
        if ref.home_address and ref.rid.home != self.id:
            self.peers.learn(ref.rid.home, ref.home_address)

    # --- hosting -------------------------------------------------------------------

    def host_new(
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
        """Make object ``rid`` here (an executor thread, never the loop), acting for
        ``principal``, its creator (None: unrestricted). A durable one is recorded by
        its home (here, or a node) before this returns."""
        self.table.refuse_taken(rid)  # before a manager holds a second object under it
        hosted = self.hosting.make(
            rid,
            home_address,
            cls,
            type_name,
            code,
            params,
            policy,
            durable=durable,
            app=app,
            principal=principal,
        )
        try:
            self.table.created_here(hosted)
        except BaseException:
            self.hosting.close(hosted)
            raise
        if durable:
            try:
                self.durability.host.register(hosted)
            except BaseException:
                self.table.left(rid)
                self.table.forgotten(rid)
                hosted.gate.retire()
                self.hosting.close(hosted)
                raise
        return hosted

    def host_anchored(self, rid: ObjectId, obj: MobileObject) -> Hosted:
        """One of this run-time's anchored objects (a node's storage object)."""
        hosted = self.hosting.anchor(rid, obj, self.address)
        self.table.anchored_here(hosted)
        return hosted

    def retire(self, hosted: Hosted) -> None:
        """End this copy here without telling it anything (it left, or went stale):
        out of the table first, then its gate (held calls look for it again)."""
        self.table.left(hosted.rid, hosted)
        if not hosted.gate.retire():
            return  # another path ended it first (and closes it)
        self.monitor.forget(str(hosted.rid))
        if hosted.gate.active == 0:
            self.hosting.close(hosted)
        else:  # calls inside (perhaps the caller's own) finish before it goes
            self.control.submit(self._close_when_idle, hosted)

    def _close_when_idle(self, hosted: Hosted) -> None:
        if not hosted.gate.wait_idle(self.config.drain_timeout_s):
            log.warning("closing %s with calls still inside it", hosted.rid)
        self.hosting.close(hosted)

    def release(self, rid: ObjectId, *, destroyed: bool = False) -> Hosted | None:
        """Stop hosting ``rid`` (the run-time closes; with ``destroyed`` it ends for
        good and is told first: :meth:`MobileObject.destroying`)."""
        hosted = self.table.hosted(rid)
        if hosted is None:
            return None
        if destroyed:
            self.hosting.tell_destroyed(hosted)
        self.table.left(rid)
        self.hosting.close(hosted)
        return hosted

    def destroy_hosted(self, rid: ObjectId) -> bool:
        """End object ``rid`` if it runs here, after its active calls drain (executor
        thread). Later calls get :class:`ObjectNotFoundError` from its home."""
        hosted = self.table.hosted(rid)
        if hosted is not None:
            if rid.is_anchored or getattr(type(hosted.impl), "anchored", False):
                raise InvalidArgumentError(
                    f"{rid} is anchored (one of a node's own objects); it cannot be destroyed"
                )
            if hosted.gate.closed or self.table.is_migrating(rid):
                raise ObjectBusyError(
                    f"object {rid} is moving or arriving; destroy it once it has settled"
                )
            if hosted.gate.quiesce(self.config.drain_timeout_s) is None:
                raise ObjectBusyError(
                    f"object {rid} is busy: its calls did not finish within "
                    f"{self.config.drain_timeout_s:g} s; try again"
                )
            self.hosting.tell_destroyed(hosted)
            self.retire(hosted)
        if rid.home == self.id:
            self.table.forgotten(rid)
            self.durability.forget(rid)
        elif hosted is not None and hosted.durable:
            self.durability.host.tell_home_ended(hosted)
        return hosted is not None

    def describe(self) -> list[dict[str, Any]]:
        """The objects hosted here, JSON-ready (``shuttle objects``)."""
        now = time.monotonic()
        out = []
        for rid, h in self.table.hosted_items():
            out.append(
                {
                    "rid": str(rid),
                    "type": h.type_label,
                    "host": self.id,
                    "home": rid.home,
                    "state": h.gate.state.value,
                    "epoch": h.epoch,
                    "serving": h.serving(now),
                    "durable": h.durable,
                    "policy": h.policy if h.migratable else "anchored",
                    "sandboxed": h.sandboxed,
                    "memory_bytes": h.memory_bytes(),
                    "since_s": round(now - h.arrived_at, 3),
                    "arrived_from": h.arrived_from,
                }
            )
        return out

    # --- where is it ---------------------------------------------------------------

    def location_hint(self, rid: ObjectId) -> str | None:
        """Where we think ``rid`` runs (authoritative if we are its home)."""
        return self.table.where(rid)

    async def locate(self, rid: ObjectId, failed_at: str = "") -> str:
        """Ask ``rid``'s home where it is (correcting our hint). ``failed_at``: the
        run-time where a call just found it unreachable or gone: the home checks, and
        brings a durable object back if its node died. Raises
        :class:`RequestTimeoutError` (with how long to wait) while that happens."""
        return await invocation.locate(self, rid, failed_at)

    # --- invocation ------------------------------------------------------------------

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``method`` on the object ``ref`` names, wherever it runs (blocking).

        Raises the callee's typed error (:class:`ObjectFailedError` if its code
        raised), :class:`ObjectNotFoundError` if no such object exists (or it was
        lost with its node), :class:`UnreachableError` if the node it runs on cannot
        be reached, or :class:`RequestTimeoutError` if it is in doubt (moving, or
        being brought back by its home) for longer than a caller waits
        (:mod:`shuttle.runtime.invocation`)."""
        return invocation.invoke(self, ref, method, args, kwargs)

    def current_chain(self) -> str:
        return getattr(self.chain, "id", None) or ""

    def call_hosted(
        self,
        hosted: Hosted,
        method: str,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        caller: str | None,
    ) -> Any:
        """Run ``method`` on an object hosted here, through its gate, monitored.
        ``caller``: the calling object if it runs here (its edge is recorded here).
        See :mod:`shuttle.runtime.hosted_calls`."""
        return hosted_calls.call(self, hosted, method, args, kwargs, caller)[0]

    def serve_invoke(
        self,
        rid: ObjectId,
        method: str,
        args: list[Any],
        kwargs: dict[str, Any],
        chain: str = "",
        epoch: int = 0,
        principal: str | None = None,
    ) -> tuple[str, Any, float, int]:
        """A remote caller's invocation (on an executor thread): ``("ok", result,
        seconds, epoch)`` (the call's own wall time here, less what it blocked on
        remote calls: the caller's monitor takes it out of its stall; the epoch of
        the copy that served) or ``("moved", {to, address}, 0, 0)`` when the object
        is not here. ``chain``: the caller's call chain, which this thread works for
        meanwhile. ``epoch``: the newest the caller heard of; an older copy here is
        stale and stops. ``principal``: whom the caller's connection authenticated
        as (None: unrestricted)."""
        return hosted_calls.serve_invoke(self, rid, method, args, kwargs, chain, epoch, principal)


async def _acting_as(principal: str, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` as ``principal`` (in the task that runs it: calls it makes to other
    run-times authenticate as that principal, see :mod:`shuttle.runtime.peers`)."""
    ACTING.set(principal)
    return await coro
