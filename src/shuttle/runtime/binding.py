"""The binding manager (ABACUS 5.1): ids, locations and invocation.

Every run-time (a storage node's, or a client's) has one. It

* gives each object it creates a network-wide id (:class:`ObjectId`: this run-time
  is its *home*) and keeps, for those, where they are now (authoritative);
* keeps *hints* of where other objects are, which may be stale;
* hosts objects, through its base :class:`~shuttle.runtime.hosting.Hosting`: the
  ones running here, each behind a :class:`~shuttle.runtime.gate.Gate`;
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
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from shuttle.errors import (
    LocalProtocolError,
    ObjectBusyError,
    ObjectFailedError,
    ObjectNotFoundError,
    ShuttleError,
    UnreachableError,
)
from shuttle.net.cpu import burn_cpu
from shuttle.net.principals import PrincipalBook
from shuttle.runtime import budget, values
from shuttle.runtime.authority import ACTING, acting, acting_for, check_call
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.gate import GateState
from shuttle.runtime.hosting import Hosted, Hosting, admitted_while_quiescing
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import CallMoved
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import Peers
from shuttle.runtime.refs import Ref

log = logging.getLogger("shuttle.runtime")
#: What one call of a built-in object at a node may use (checked at its calls out).
BUILTIN_BUDGET = budget.Budget()

#: Redirects one invocation follows (moved → ask home → retry) before giving up: an
#: object can be moving while we chase it, but not that many times in one call.
REDIRECTS_MAX = 8
T = TypeVar("T")


class _Retired(Exception):
    """The object left while the call waited at its gate: find it again."""


class BindingManager(Hosting):
    """Finding and calling objects, for run-time ``runtime_id`` (hosting: the base)."""

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
    ) -> None:
        super().__init__(
            runtime_id,
            config=config,
            monitor=monitor,
            speed=speed,
            accepts_shipped=accepts_shipped,
            sandbox_limits=sandbox_limits,
            is_node=is_node,
            principals=principals,
        )
        self.peers = peers
        #: Threads that run object methods (calls from other run-times).
        self.executor = executor
        #: Threads for the run-time's own blocking steps (quiesce, checkpoint, install,
        #: destroy): separate, so that calls held at a closed gate never starve the
        #: migration that will open it.
        self.control = control or executor
        self.loop: asyncio.AbstractEventLoop | None = None
        self.incarnation = secrets.token_hex(3)
        self._ids = itertools.count(1)
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
        principal = acting()
        if principal is not None:  # the loop's task acts for this thread's principal
            coro = _acting_as(principal, coro)
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout_s)

    def new_id(self) -> ObjectId:
        return ObjectId(self.id, f"{self.incarnation}-{next(self._ids)}")

    def ref(self, rid: ObjectId, home_address: str | None = None) -> Ref:
        """A reference to ``rid`` bound to this run-time."""
        address = home_address or (self.address if rid.home == self.id else "")
        if not address:
            address = self.peers.address_of(rid.home) or ""
        return Ref(rid, address, self)

    def own_ref(self, rid: ObjectId) -> Ref:
        """A reference to ``rid``, an object hosted here, naming its real home (what
        an object hands out as a reference to itself)."""
        hosted = self.hosted.get(rid)
        return self.ref(rid, hosted.home_address if hosted is not None else None)

    def is_moving(self, rid: ObjectId) -> bool:
        """Whether hosted object ``rid`` is being drained for a migration."""
        hosted = self.hosted.get(rid)
        return hosted is not None and hosted.gate.state is GateState.QUIESCING

    def report_wait(self, caller: ObjectId, callee: Ref, seconds: float) -> None:
        """Object ``caller`` (hosted here) waited ``seconds`` on account of its calls
        to ``callee`` (see :meth:`MobileObject.report_wait`): stall on that edge if
        the callee runs elsewhere; nothing if it is here (local calls do not stall)."""
        if callee.rid not in self.hosted:
            self.monitor.record_wait(str(caller), str(callee.rid), seconds)

    def learn_home(self, ref: Ref) -> None:
        if ref.home_address and ref.rid.home != self.id:
            self.peers.learn(ref.rid.home, ref.home_address)

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
        budget.check()  # a call out of a budgeted built-in call is one of its checkpoints
        self.learn_home(ref)
        caller = self.monitor.current()
        asked_home = False
        #: Where the home said the object is (authoritative), if we asked.
        home_says: str | None = None
        outer = getattr(self._chain, "id", None)
        if outer is None:
            self._chain.id = secrets.token_hex(6)  # a new chain of calls starts here
        # In flight: the monitor shows the edge, and counts a remote call's stall as
        # it accrues, before the call returns.
        token = None if caller is None else self.monitor.begin_call(caller, str(ref.rid))
        try:
            return self._invoke(ref, method, args, kwargs, caller, asked_home, home_says)
        finally:
            if token is not None:
                self.monitor.end_call(token)
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
                home_entry = self.homed.get(rid)
                if home_entry is not None and home_entry.location == where:
                    # We are the home and ``where`` is the copy we recorded: it says it
                    # handed the object on (it forwards only after the target took it),
                    # ahead of its object.moved to us, which is still on its way.
                    home_entry.location = moved_to
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
            return "moved", result, 0.0
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
                else:
                    with hosted.lock:
                        outer = hosted.owner, hosted.owner_thread
                        hosted.owner, hosted.owner_thread = chain or None, threading.get_ident()
                        try:
                            result, external = self._call_impl(hosted, method, args, kwargs)
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
        principal: str | None = None,
    ) -> tuple[str, Any, float]:
        """A remote caller's invocation (on an executor thread): ``("ok", result,
        seconds)`` (the call's own wall time here, less what it blocked on remote
        calls: the caller's monitor takes it out of its stall) or ``("moved", {to,
        address}, 0)`` when the object is not here. ``chain``: the caller's call
        chain, which this thread works for meanwhile; ``principal``: whom the caller's
        connection authenticated as (None: unrestricted)."""
        self._chain.id = chain or secrets.token_hex(6)
        try:
            with acting_for(principal):
                return self._serve_invoke(rid, method, args, kwargs)
        finally:
            self._chain.id = None

    def _serve_invoke(
        self, rid: ObjectId, method: str, args: list[Any], kwargs: dict[str, Any]
    ) -> tuple[str, Any, float]:
        for _ in range(2):
            hosted = self.hosted.get(rid)
            if hosted is None or hosted.gate.state is GateState.RETIRED:
                break
            try:
                result, own_s = self._call_hosted(hosted, method, args, kwargs, None)
                return "ok", result, own_s
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
        return "moved", moved, 0.0


async def _acting_as(principal: str, coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` as ``principal`` (in the task that runs it: calls it makes to other
    run-times authenticate as that principal, see :mod:`shuttle.runtime.peers`)."""
    ACTING.set(principal)
    return await coro
