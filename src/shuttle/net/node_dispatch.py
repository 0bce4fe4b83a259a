"""A request the general way: the node's dispatch of one request on a connection.

The half of :class:`~shuttle.net.node_protocol.NodeProtocol` that runs an operation
from the registry (:mod:`shuttle.net.registry`) and answers it once: the guard of the
connection's principal, the operation's inline answer on the event loop when it has
one, else the thread pool (or a start on the loop, or a wait before the pool), its
principal's share of the node's requests in flight, and the answer when it is done.
A warm read does not come here: the read lane (``NodeProtocol._read``) answers it,
and sends here only what it cannot answer itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from shuttle.errors import NodeBusyError, ShuttleError
from shuttle.net.node_closing import hang_up
from shuttle.net.registry import CONNECTION_ARG, PRINCIPAL_ARG, Mode, Operation, Reply
from shuttle.wire import Request
from shuttle.wire.events import Payload

if TYPE_CHECKING:
    from shuttle.net.node_protocol import NodeProtocol


def dispatch(
    proto: NodeProtocol,
    rid: int,
    name: str,
    args: dict[str, Any],
    payload: Payload,
    inline_tried: bool = False,
) -> None:
    """Run request ``rid`` (operation ``name``) and answer it, now or when it is done;
    ``inline_tried``: the read lane has just tried what the inline call would."""
    server = proto.server
    counters = server.counters
    counters.requests += 1
    counters.by_op[name] += 1
    op = server.registry.find(name)
    if op is None:
        try:
            server.registry.get(name)  # raises the error naming the known operations
        except ShuttleError as exc:
            proto.send_error(rid, exc)
        return
    principal = proto.principal
    if principal is not None:
        guard = op.guard
        try:
            if guard is None:
                principal.require_admin(f"call {name}, a cluster operation")
            else:
                guard(principal, args)
        except ShuttleError as exc:  # NotPermittedError, naming what is missing
            proto.send_error(rid, exc)
            return
    if op.wants_principal:
        args[PRINCIPAL_ARG] = principal  # whatever the client put there
    inline = op.inline
    if inline is not None:
        if not inline_tried:
            # The node's one inline-answer path. On the event loop, inside
            # data_received's CPU account: no second account, no Future, no closure.
            try:
                out = inline(args, payload if type(payload) is bytes else bytes(payload))
            except Exception as exc:  # every failure is answered, typed
                proto.send_error(rid, server.error_for(op.name, exc))
                return
            if out is not None:
                counters.inline += 1
                proto.send_reply(rid, out.result, out.payload)
                return
        # Not answerable from memory (a block-cache miss, a large read, a stat that
        # must read its attributes): the operation runs its usual way.
        counters.inline_declined[name] += 1
    load_name = proto.load_name
    if load_name is not None:
        try:  # its principal's share of the node's requests in flight
            server.load.take("requests", load_name)
        except NodeBusyError as exc:
            proto.send_error(rid, exc)
            return
    if op.per_connection:
        args[CONNECTION_ARG] = proto.number  # whatever the client put there
        proto.owns_sessions = True
    req = Request(rid, name, args, payload)
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any]
    if op.mode is Mode.THREAD:
        started: asyncio.Future[Any] | None = None
        try:
            wait = None if op.before is None else op.before(args)
            start = op.start  # without a thread when it can (op.start's docstring)
            if wait is None and start is not None:
                started = start(args, payload if type(payload) is bytes else bytes(payload))
        except Exception as exc:  # every failure is answered, typed
            if load_name is not None:
                server.load.give_back("requests", load_name)
            proto.send_error(rid, server.error_for(op.name, exc))
            return
        if wait is None:
            if started is None:
                counters.threaded += 1
                fut = loop.run_in_executor(server._executor, server.call_sync, op, req)
            else:
                counters.started += 1
                fut = started
        else:  # wait on the loop, then hop: a waiting request holds no thread
            counters.threaded += 1
            fut = loop.create_task(_call_after(proto, wait, op, req))
        fut.add_done_callback(lambda f: _finished(proto, f, rid, op.name, True))
        proto.executing += 1
        if proto.executing >= server.admission.executing_max or server.unsent_over:
            proto.hold()
    else:
        # Not counted: an object's call may wait for another request on this same
        # connection (nested calls between run-times), which a cap could deadlock.
        # Its replies are bounded by the unsent-bytes hold and the in-flight limit.
        fut = loop.create_task(_call_async(proto, op, req))
        fut.add_done_callback(lambda f: _finished(proto, f, rid, op.name, False))
    proto.pending.add(fut)


async def _call_after(
    proto: NodeProtocol, wait: Awaitable[None], op: Operation, req: Request
) -> Reply:
    await wait
    server = proto.server
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(server._executor, server.call_sync, op, req)


async def _call_async(proto: NodeProtocol, op: Operation, req: Request) -> Reply:
    out = await op.handler(req.args, bytes(req.payload))
    return out if isinstance(out, Reply) else Reply(out)


def _finished(
    proto: NodeProtocol, fut: asyncio.Future[Any], rid: int, op_name: str, counted: bool
) -> None:
    proto.pending.discard(fut)
    if counted:
        proto.executing -= 1
    if proto.load_name is not None:
        proto.server.load.give_back("requests", proto.load_name)
    if fut.cancelled():
        return
    # Taken even when nobody is left to answer: a failed future whose exception is never
    # retrieved is logged by asyncio as an error, with its traceback.
    exc = fut.exception()
    if proto.closed:
        return
    if exc is not None:
        proto.send_error(rid, proto.server.error_for(op_name, exc))
    else:
        reply: Reply = fut.result()
        proto.send_reply(rid, reply.result, reply.payload)
    if proto.failing is not None:
        if not proto.pending:  # the last request taken is answered: now say why
            hang_up(proto, proto.failing)
        return
    if proto.held:
        proto.release()
