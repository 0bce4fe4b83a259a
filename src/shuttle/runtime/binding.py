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
objects), the move history (what moved), durability (:mod:`shuttle.runtime.durable`).
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
    ObjectFailedError,
    ObjectInDoubtError,
    ObjectNotFoundError,
    RequestTimeoutError,
    ShuttleError,
    UnreachableError,
)
from shuttle.net.cpu import burn_cpu
from shuttle.net.principal_limits import PrincipalLoad
from shuttle.net.principals import PrincipalBook
from shuttle.runtime import budget, values
from shuttle.runtime.authority import ACTING, acting, acting_for, check_call
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.durable import Durability
from shuttle.runtime.gate import GateState
from shuttle.runtime.hosting import Hosted, Hosting, admitted_while_quiescing
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.locations import LocationTable
from shuttle.runtime.mobile import CallMoved, MobileObject
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.moves import MoveHistory
from shuttle.runtime.peers import NotSent, Peers
from shuttle.runtime.refs import Ref

log = logging.getLogger("shuttle.runtime")
#: What one call of a built-in object at a node may use (checked at its calls out).
BUILTIN_BUDGET = budget.Budget()

#: Redirects one invocation follows (moved → ask home → retry) before giving up: an
#: object can be moving while we chase it, but not that many times in one call.
REDIRECTS_MAX = 8
#: Longest a call waits for an object whose home is bringing it back from its
#: durable state (its node died): a lease and a node's restart, with room to spare.
RECOVERY_WAIT_S_MAX = 60.0
T = TypeVar("T")


class _Retired(Exception):
    """The object left (or its copy went stale) while the call waited: find it again."""


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
        #: The call chain this thread works for (see :meth:`call_hosted`).
        self._chain = threading.local()
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
                self.durability.register(hosted)
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
            self.durability.tell_home_ended(hosted)
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
        if rid.home == self.id:
            if failed_at:
                await self.durability.suspect(rid, failed_at)
            where, _, _ = self.table.locate_here(rid)
            if where is None:
                raise ObjectNotFoundError(
                    f"no object {rid}: this run-time is its home and never created it "
                    "(or it was destroyed)"
                )
            if self.durability.recovering(rid):
                raise _Recovering(rid, self.id, where)
            return where
        args: dict[str, Any] = {"rid": str(rid)}
        if failed_at:
            args["failed_at"] = failed_at
        reply = (await self.peers.call(rid.home, "object.locate", args)).result
        where = reply.get("location")
        if not isinstance(where, str):
            raise ObjectNotFoundError(f"no object {rid}: its home {rid.home} does not know it")
        if reply.get("address"):
            self.peers.learn(where, reply["address"])
        if reply.get("recovering"):
            raise _Recovering(rid, rid.home, where, float(reply.get("retry_after_s", 0.5)))
        epoch = reply.get("epoch", 0)
        self.table.heard(rid, where, epoch if isinstance(epoch, int) else 0)
        return where

    # --- invocation ------------------------------------------------------------------

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``method`` on the object ``ref`` names, wherever it runs (blocking).

        Raises the callee's typed error (:class:`ObjectFailedError` if its code
        raised), :class:`ObjectNotFoundError` if no such object exists (or it was
        lost with its node), :class:`UnreachableError` if the node it runs on cannot
        be reached, or :class:`RequestTimeoutError` if it is in doubt (moving, or
        being brought back by its home) for longer than a caller waits."""
        budget.check()  # a call out of a budgeted built-in call is one of its checkpoints
        self.learn_home(ref)
        caller = self.monitor.current()
        outer = getattr(self._chain, "id", None)
        if outer is None:
            self._chain.id = secrets.token_hex(6)  # a new chain of calls starts here
        # In flight: the monitor shows the edge, and counts a remote call's stall as
        # it accrues, before the call returns.
        token = None if caller is None else self.monitor.begin_call(caller, str(ref.rid))
        try:
            return self._invoke(ref, method, args, kwargs, caller)
        finally:
            if token is not None:
                self.monitor.end_call(token)
            if outer is None:
                self._chain.id = None

    def _locate(self, rid: ObjectId, failed_at: str, deadline: float) -> str:
        """:meth:`locate`, waiting (up to ``deadline``) while the home recovers it."""
        while True:
            try:
                return self.run(self.locate(rid, failed_at))
            except _Recovering as exc:
                if time.monotonic() + exc.retry_after_s > deadline:
                    raise RequestTimeoutError(
                        f"object {rid} is being brought back by its home {exc.home} after "
                        f"{exc.where or 'its node'} failed, and it is taking longer than "
                        f"{RECOVERY_WAIT_S_MAX:g} s; try again (see {exc.home}'s log)"
                    ) from None
                time.sleep(exc.retry_after_s)

    def _invoke(
        self,
        ref: Ref,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        caller: str | None,
    ) -> Any:
        rid = ref.rid
        #: Where the home said the object is (authoritative), if we asked.
        home_says: str | None = None
        deadline = time.monotonic() + RECOVERY_WAIT_S_MAX
        for _ in range(REDIRECTS_MAX):
            hosted = self.table.hosted(rid)
            if hosted is not None and hosted.gate.state is not GateState.RETIRED:
                try:
                    return self.call_hosted(hosted, method, args, kwargs, caller)
                except _Retired:
                    continue
            where = self.table.where(rid)
            if where is None or where == self.id:
                home_says = self._locate(rid, self.id if where == self.id else "", deadline)
                if home_says == self.id and self.table.hosted(rid) is None:
                    raise ObjectNotFoundError(
                        f"object {rid} was lost: its home says it runs here, but it does "
                        "not (was this run-time restarted?)"
                    )
                continue
            try:
                status, value = self._invoke_remote(where, rid, method, args, kwargs, caller)
            except NotSent:
                # Ask the home, saying where the call failed: it knows better, or (a
                # durable object whose node died) brings it back elsewhere.
                before = self.table.known_epoch(rid)
                self.table.hint_failed(rid)
                home_says = self._locate(rid, where, deadline)
                if home_says == where and self.table.known_epoch(rid) <= before:
                    raise
                continue
            except UnreachableError as exc:
                # It left, and no answer came: it may have run. Never run it twice.
                raise ObjectInDoubtError(
                    f"the call {method} of object {rid} on {where} got no answer ({exc}); "
                    "it may or may not have taken effect: check before repeating it"
                ) from exc
            if status == "ok":
                return value
            moved_to = value.get("to")
            if isinstance(moved_to, str) and moved_to != where:
                if value.get("address"):
                    self.peers.learn(moved_to, value["address"])
                self.table.heard(rid, moved_to, int(value.get("e", 0) or 0))
                continue
            entry = self.table.home_entry(rid)
            if home_says == where or (entry is not None and entry.location == where):
                # The home itself sent us to ``where``, which does not have it: tell
                # the home (a durable object is brought back: a newer epoch), or it
                # was lost.
                before = self.table.known_epoch(rid)
                home_says = self._locate(rid, where, deadline)
                if home_says == where and self.table.known_epoch(rid) <= before:
                    raise ObjectNotFoundError(
                        f"object {rid} was lost: its home says it runs on {where}, but "
                        f"{where} does not host it (did {where} restart?); create it again"
                    )
                continue
            self.table.hint_failed(rid)
            home_says = self._locate(rid, "", deadline)
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
        status, value, far_s = self.run(
            self._call_remote(where, rid, method, packed, self.current_chain())
        )
        if status == "ok" and caller is not None:
            self.monitor.record_edge(
                caller,
                str(rid),
                bytes_down=values.byte_size(args) + values.byte_size(kwargs),
                bytes_up=values.byte_size(value),
                stall_s=time.monotonic() - start,
                remote=True,
                far_s=far_s,
            )
        return status, value

    def current_chain(self) -> str:
        return getattr(self._chain, "id", None) or ""

    async def _call_remote(
        self, where: str, rid: ObjectId, method: str, packed: bytes, chain: str = ""
    ) -> tuple[str, Any, float]:
        """``(status, value, the callee's own seconds in the call as it reported)``."""
        args: dict[str, Any] = {
            "rid": str(rid),
            "method": method,
            "from": self.id,
            "from_address": self.address,
            "chain": chain,
        }
        epoch = self.table.known_epoch(rid)
        if epoch:
            args["epoch"] = epoch
        resp = await self.peers.call_or_not_sent(where, "object.invoke", args, packed)
        result = resp.result if isinstance(resp.result, dict) else {}
        if result.get("s") == "moved":
            return "moved", result, 0.0
        served_epoch = result.get("e")
        if isinstance(served_epoch, int) and served_epoch:
            self.table.heard(rid, where, served_epoch)
        served = result.get("t", 0.0)
        far_s = float(served) if isinstance(served, int | float) and served > 0 else 0.0
        payload = resp.payload
        if result.get("raw"):
            return "ok", payload if type(payload) is bytes else bytes(payload), far_s
        return "ok", values.unpack(payload, self), far_s

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
        return self._call_hosted(hosted, method, args, kwargs, caller)[0]

    def _call_hosted(
        self,
        hosted: Hosted,
        method: str,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        caller: str | None,
    ) -> tuple[Any, float]:
        """:meth:`call_hosted`, and the call's own wall time (less its remote calls),
        if the acting principal may call it; the method acts for the object's owner
        (a node's anchored object: for its caller). See runtime/authority.py."""
        anchored = hosted.rid.is_anchored
        principal = acting()
        if principal is not None and self.principals is not None:
            check_call(
                self.principals,
                principal,
                str(hosted.rid),
                hosted.principal,
                type(hosted.impl) if anchored else None,
                hosted.type_label,
                method,
                args,
                kwargs,
            )
        with acting_for(principal if anchored else hosted.principal):
            return self._enter_hosted(hosted, method, args, kwargs, caller)

    def _enter_hosted(
        self,
        hosted: Hosted,
        method: str,
        args: tuple[Any, ...] | list[Any],
        kwargs: dict[str, Any],
        caller: str | None,
    ) -> tuple[Any, float]:
        if not hosted.gate.enter(admit=admitted_while_quiescing(hosted, method)):
            raise _Retired
        rid = str(hosted.rid)
        monitor = self.monitor
        external: float | None = None
        result: Any = None
        frame = monitor.enter(rid)
        own_s = 0.0
        try:
            # A durable copy its home has not confirmed lately serves only once it does
            # (or learns that another activation is current: then finds that one).
            if (
                hosted.durable
                and time.monotonic() >= hosted.lease_until
                and not self.durability.renew_now(hosted)
            ):
                raise _Retired
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
            try:
                if hosted.concurrent or (chain and hosted.owner == chain):
                    # Thread-safe objects take calls side by side; a call of the chain
                    # that holds the object (A -> B -> A, across threads and nodes)
                    # goes in, as a recursive call would on one thread.
                    result, external = self._call_impl(hosted, method, args, kwargs)
                    if hosted.durable and method not in hosted.readonly:
                        self._persist(hosted)
                else:
                    with hosted.lock:
                        outer = hosted.owner, hosted.owner_thread
                        hosted.owner, hosted.owner_thread = chain or None, threading.get_ident()
                        try:
                            try:
                                result, external = self._call_impl(hosted, method, args, kwargs)
                            finally:
                                if hosted.durable and method not in hosted.readonly:
                                    # In the lock: the state written is this call's.
                                    self._persist(hosted)
                        finally:
                            hosted.owner, hosted.owner_thread = outer
            except CallMoved as exc:
                # It changed nothing and its object is moving: let the drain end, and
                # call it again where the object lands.
                raise _Retired from exc
            if self.burn_ratio and external is None:
                burn_cpu(monitor.own_cpu_s(frame) * self.burn_ratio)
        finally:
            own_s = monitor.exit(
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
        return result, own_s

    def _persist(self, hosted: Hosted) -> None:
        """A durable object's call may have changed it: its state reaches its home's
        disk before the call is answered. A stale copy (another activation is
        current) ends, and the call goes to the current one."""
        if not self.durability.persist(hosted):
            raise _Retired  # the stale copy ended; its call never reached the home

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
        if self.is_node:  # a built-in object at a node: bounded (runtime/budget.py)
            who = lambda: f"object {hosted.rid} ({hosted.type_label}).{method}"  # noqa: E731
            with budget.running(BUILTIN_BUDGET, who):
                return self._call_in_process(hosted, method, args, kwargs), None
        return self._call_in_process(hosted, method, args, kwargs), None

    @staticmethod
    def _call_in_process(
        hosted: Hosted, method: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> Any:
        assert hosted.manager is not None
        try:
            return hosted.manager.invoke(hosted.rid, method, args, kwargs)
        except (ShuttleError, CallMoved):
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
        self._chain.id = chain or secrets.token_hex(6)
        try:
            with acting_for(principal):
                return self._serve_invoke(rid, method, args, kwargs, epoch)
        finally:
            self._chain.id = None

    def _serve_invoke(
        self, rid: ObjectId, method: str, args: list[Any], kwargs: dict[str, Any], epoch: int
    ) -> tuple[str, Any, float, int]:
        for _ in range(2):
            hosted = self.table.hosted(rid)
            if hosted is None or hosted.gate.state is GateState.RETIRED:
                break
            if epoch > hosted.epoch and not hosted.staged:
                log.warning(
                    "object %s: copy of epoch %d told to stop by a caller who knows epoch %d",
                    rid,
                    hosted.epoch,
                    epoch,
                )
                if self.table.hosted(rid) is hosted:
                    self.retire(hosted)
                break
            try:
                result, own_s = self._call_hosted(hosted, method, args, kwargs, None)
                return "ok", result, own_s, hosted.epoch
            except _Retired:
                continue
        where, _, known = self.table.locate_here(rid)
        moved: dict[str, Any] = {"s": "moved", "home": rid.home}
        if where is not None and where != self.id:
            moved["to"] = where
            moved["e"] = known
            moved["address"] = self.peers.address_of(where) or ""
        elif rid.home == self.id and where is None:
            raise ObjectNotFoundError(
                f"no object {rid}: this run-time is its home and does not know it "
                "(destroyed, or its creation failed)"
            )
        return "moved", moved, 0.0, 0


async def _acting_as(principal: str, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` as ``principal`` (in the task that runs it: calls it makes to other
    run-times authenticate as that principal, see :mod:`shuttle.runtime.peers`)."""
    ACTING.set(principal)
    return await coro


class _Recovering(Exception):
    """The home is bringing a durable object back; ask again in ``retry_after_s``."""

    def __init__(self, rid: ObjectId, home: str, where: str, retry_after_s: float = 0.5) -> None:
        super().__init__(f"{rid} is being recovered by {home}")
        self.home = home
        self.where = where
        self.retry_after_s = max(0.05, min(retry_after_s, 5.0))
