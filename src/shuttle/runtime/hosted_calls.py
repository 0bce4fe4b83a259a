"""A call entering an object hosted here, from this run-time or from another.

Concepts: the way into a hosted object (the acting principal's check, the object's
gate, the monitor's frame around the call, one call at a time or side by side, a
chain of calls re-entering the object it holds, a durable object written to its
home before the call is answered, the budget of a built-in call at a node) and a
remote caller's ``object.invoke`` served (the epoch it knows, or "moved" with what
this run-time knows of the object). The caller's side, finding the object and
following its moves, is :mod:`shuttle.runtime.invocation`.

Functions over the binding manager (:mod:`shuttle.runtime.binding`), which calls
them from its methods of the same names; they run on executor or application
threads, never on the run-time's loop.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any

from shuttle.errors import (
    ObjectBusyError,
    ObjectFailedError,
    ObjectNotFoundError,
    ShuttleError,
)
from shuttle.net.cpu import burn_cpu
from shuttle.runtime import budget, values
from shuttle.runtime.authority import acting, acting_for, check_call
from shuttle.runtime.gate import GateState
from shuttle.runtime.hosted import Hosted, admitted_while_quiescing
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import CallMoved

if TYPE_CHECKING:
    from shuttle.runtime.binding import BindingManager

log = logging.getLogger("shuttle.runtime")
#: What one call of a built-in object at a node may use (checked at its calls out).
BUILTIN_BUDGET = budget.Budget()


class Retired(Exception):
    """The object left (or its copy went stale) while the call waited: find it again."""


def call(
    bm: BindingManager,
    hosted: Hosted,
    method: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    caller: str | None,
) -> tuple[Any, float]:
    """Run ``method`` on ``hosted`` through its gate, monitored, if the acting
    principal may call it: its result and the call's own wall time (less its remote
    calls). The method acts for the object's owner (a node's anchored object: for its
    caller; see runtime/authority.py). ``caller``: the calling object if it runs here
    (its edge is recorded here). Raises :class:`Retired` when the object left (or its
    copy went stale) meanwhile: the caller finds it again."""
    anchored = hosted.rid.is_anchored
    principal = acting()
    if principal is not None and bm.principals is not None:
        check_call(
            bm.principals,
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
        return _enter_hosted(bm, hosted, method, args, kwargs, caller)


def _enter_hosted(
    bm: BindingManager,
    hosted: Hosted,
    method: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
    caller: str | None,
) -> tuple[Any, float]:
    if not hosted.gate.enter(admit=admitted_while_quiescing(hosted, method)):
        raise Retired
    rid = str(hosted.rid)
    monitor = bm.monitor
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
            and not bm.durability.host.renew_now(hosted)
        ):
            raise Retired
        chain = bm.current_chain()
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
                result, external = _call_impl(bm, hosted, method, args, kwargs)
                if hosted.durable and method not in hosted.readonly:
                    _persist(bm, hosted)
            else:
                with hosted.lock:
                    outer = hosted.owner, hosted.owner_thread
                    hosted.owner, hosted.owner_thread = chain or None, threading.get_ident()
                    try:
                        try:
                            result, external = _call_impl(bm, hosted, method, args, kwargs)
                        finally:
                            if hosted.durable and method not in hosted.readonly:
                                # In the lock: the state written is this call's.
                                _persist(bm, hosted)
                    finally:
                        hosted.owner, hosted.owner_thread = outer
        except CallMoved as exc:
            # It changed nothing and its object is moving: let the drain end, and
            # call it again where the object lands.
            raise Retired from exc
        if bm.burn_ratio and external is None:
            burn_cpu(monitor.own_cpu_s(frame) * bm.burn_ratio)
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


def _persist(bm: BindingManager, hosted: Hosted) -> None:
    """A durable object's call may have changed it: its state reaches its home's
    disk before the call is answered. A stale copy (another activation is
    current) ends, and the call goes to the current one."""
    if not bm.durability.host.persist(hosted):
        raise Retired  # the stale copy ended; its call never reached the home


def _call_impl(
    bm: BindingManager,
    hosted: Hosted,
    method: str,
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any],
) -> tuple[Any, float | None]:
    if hosted.manager is None:
        result, cpu = hosted.impl.invoke(method, args, kwargs)
        return result, cpu
    if bm.is_node:  # a built-in object at a node: bounded (runtime/budget.py)
        who = lambda: f"object {hosted.rid} ({hosted.type_label}).{method}"  # noqa: E731
        with budget.running(BUILTIN_BUDGET, who):
            return _call_in_process(hosted, method, args, kwargs), None
    return _call_in_process(hosted, method, args, kwargs), None


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
            f"object {hosted.rid} ({hosted.type_label}).{method} raised {type(exc).__name__}: {exc}"
        ) from exc


def serve_invoke(
    bm: BindingManager,
    rid: ObjectId,
    method: str,
    args: list[Any],
    kwargs: dict[str, Any],
    chain: str = "",
    epoch: int = 0,
    principal: str | None = None,
) -> tuple[str, Any, float, int]:
    """:meth:`BindingManager.serve_invoke`: a remote caller's invocation, served by
    the copy here if it is current, else answered "moved"."""
    bm.chain.id = chain or secrets.token_hex(6)
    try:
        with acting_for(principal):
            return _serve_invoke(bm, rid, method, args, kwargs, epoch)
    finally:
        bm.chain.id = None


def _serve_invoke(
    bm: BindingManager,
    rid: ObjectId,
    method: str,
    args: list[Any],
    kwargs: dict[str, Any],
    epoch: int,
) -> tuple[str, Any, float, int]:
    for _ in range(2):
        hosted = bm.table.hosted(rid)
        if hosted is None or hosted.gate.state is GateState.RETIRED:
            break
        if epoch > hosted.epoch and not hosted.staged:
            log.warning(
                "object %s: copy of epoch %d told to stop by a caller who knows epoch %d",
                rid,
                hosted.epoch,
                epoch,
            )
            if bm.table.hosted(rid) is hosted:
                bm.retire(hosted)
            break
        try:
            result, own_s = call(bm, hosted, method, args, kwargs, None)
            return "ok", result, own_s, hosted.epoch
        except Retired:
            continue
    where, _, known = bm.table.locate_here(rid)
    moved: dict[str, Any] = {"s": "moved", "home": rid.home}
    if where is not None and where != bm.id:
        moved["to"] = where
        moved["e"] = known
        moved["address"] = bm.peers.address_of(where) or ""
    elif rid.home == bm.id and where is None:
        raise ObjectNotFoundError(
            f"no object {rid}: this run-time is its home and does not know it "
            "(destroyed, or its creation failed)"
        )
    return "moved", moved, 0.0, 0
