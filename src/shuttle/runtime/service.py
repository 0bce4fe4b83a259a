"""The run-time's operations on the wire, registered in a node's (or a client
run-time's) operation registry. (The periodic work every run-time does is
:mod:`shuttle.runtime.ticker`.)

==================  =====================================================================
``object.create``   make an object here: a built-in by name, or a shipped class (payload)
``object.invoke``   call a method of an object hosted here (or answer where it went)
``object.locate``   where an object is (its home answers with authority)
``object.moved``    tell an object's home where it went
``object.install``  stage an object migrating here (its checkpoint and code)
``object.activate`` the staged object serves, if its home commits the move
``object.abort``    drop a staged object unless it serves (asked by a source in doubt)
``object.commit``   at an object's home: a move takes effect (or is refused)
``object.resolve``  at an object's home: did a move take effect? (fences it if not)
``object.register`` at a durable object's home: it was made elsewhere; record it
``object.persist``  at a durable object's home: write its state (its host's call changed it)
``object.renew``    at a durable object's home: its host keeps serving it (a lease)
``object.ended``    at a durable object's home: it was destroyed where it ran
``object.probe``    whether an object runs here, at which epoch, and whether it serves
``object.fence``    stop a copy older than an epoch (its home brought it back elsewhere)
``object.migrate``  move an object hosted here to another run-time
``object.destroy``  end an object hosted here (at a durable object's home: wherever it is)
``runtime.digest``  a client's statistics; the answer carries its placement decisions
``runtime.objects`` the objects hosted here, their costs and edges, recent migrations
``runtime.log``     the placement decision log
==================  =====================================================================

Object code runs on the run-time's executor threads, never on the event loop.

On a node, a connection authenticated as a principal may make objects (shipped code
needs its ``ship`` capability), and call, move and end only its own objects; every
object acts for the principal that made it (runtime/authority.py). ``runtime.objects``
and ``runtime.log`` describe everyone's objects: cluster operations (``admin``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    NotPermittedError,
    ShuttleError,
)
from shuttle.net.addresses import parse_address
from shuttle.net.principals import Principal, anyone
from shuttle.net.registry import Mode, OperationRegistry, Reply, arg, principal_of
from shuttle.runtime import migration, migration_home, migration_target, values
from shuttle.runtime.authority import acting_for
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.hosted import admitted_while_quiescing
from shuttle.runtime.hosting import POLICIES
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import builtin_type
from shuttle.runtime.planner import ResourceManager
from shuttle.wire.limits import PAYLOAD_BYTES_MAX

#: What a client's arguments to an object may hold (checked before they are decoded):
#: a whole frame's payload, and the items and nesting any untrusting peer is allowed.
CLIENT_VALUE_LIMITS = values.DecodeLimits(PAYLOAD_BYTES_MAX)
#: Arguments up to this size are decoded on the event loop (microseconds); larger ones
#: on a thread, as walking a million items takes a fifth of a second.
DECODE_ON_LOOP_BYTES_MAX = 64 << 10

log = logging.getLogger("shuttle.runtime")

#: Results at least this big travel as raw payload when they are bytes (no msgpack).
RAW_RESULT_BYTES_MIN = 0


def _rid(args: dict[str, Any]) -> ObjectId:
    return ObjectId.parse(arg(args, "rid", str))


def _name(principal: Principal | None) -> str | None:
    return None if principal is None else principal.name


def require_owner(principal: Principal | None, owner: str | None, rid: ObjectId, what: str) -> None:
    """A principal may ``what`` only its own objects (an unrestricted caller: any)."""
    if principal is None or owner == principal.name:
        return
    whose = f"principal {owner!r}" if owner is not None else "the cluster key's holder"
    raise NotPermittedError(
        f"principal {principal.name!r} may not {what} object {rid}: it belongs to {whose}"
    )


def register_runtime_ops(
    registry: OperationRegistry,
    bm: BindingManager,
    *,
    manager: ResourceManager | None = None,
    extra_status: Callable[[], dict[str, Any]] | None = None,
) -> None:
    """Add the ``object.*`` and ``runtime.*`` operations over ``bm`` to ``registry``."""

    async def in_executor(fn: Callable[..., Any], *a: Any) -> Any:
        """Object code: on the threads that run objects."""
        return await asyncio.get_running_loop().run_in_executor(bm.executor, fn, *a)

    async def in_control(fn: Callable[..., Any], *a: Any) -> Any:
        """The run-time's own blocking steps: on threads calls cannot occupy."""
        return await asyncio.get_running_loop().run_in_executor(bm.control, fn, *a)

    def learn(who: str, where: str, principal: Principal | None) -> None:
        """Where run-time ``who`` listens, as a caller says (a principal may only name
        run-times not known yet: :meth:`Peers.learn`)."""
        with acting_for(_name(principal)):
            bm.peers.learn(who, where)

    def learn_caller(args: dict[str, Any]) -> None:
        who, where = args.get("from"), args.get("from_address")
        if isinstance(who, str) and isinstance(where, str) and where:
            learn(who, where, principal_of(args))

    async def create(args: dict[str, Any], payload: bytes) -> Any:
        """Make a mobile object here (a built-in by name, or shipped code in the payload)."""
        rid = _rid(args)
        learn_caller(args)
        home_address = arg(args, "home_address", str, "")
        principal = principal_of(args)
        if home_address:
            parse_address(home_address, "object.create home_address")
            if rid.home != bm.id:
                learn(rid.home, home_address, principal)
        type_name = arg(args, "type", str, "")
        policy = arg(args, "policy", str, "auto")
        if policy not in POLICIES:
            raise InvalidArgumentError(f"policy must be one of {POLICIES}, not {policy!r}")
        raw_params = args.get("params", b"")
        params = values.unpack(raw_params, None, CLIENT_VALUE_LIMITS) if raw_params else {}
        if not isinstance(params, dict):
            raise InvalidArgumentError("params must be a map of constructor arguments")
        if type_name:
            cls, code = builtin_type(type_name), None
        elif payload:
            cls, code = None, payload
        else:
            raise InvalidArgumentError("object.create needs a built-in type or a shipped class")
        durable = arg(args, "durable", bool, False)
        app = arg(args, "from", str, "")
        hosted = await in_control(
            lambda: bm.host_new(
                rid,
                home_address,
                cls,
                type_name,
                code,
                params,
                policy,
                durable=durable,
                app=app,
                principal=_name(principal),
            )
        )
        return {"rid": str(rid), "host": bm.id, "type": hosted.type_label, "epoch": hosted.epoch}

    async def invoke(args: dict[str, Any], payload: bytes) -> Any:
        """Call a method of an object hosted here; ``{s: moved, to}`` if it is not here."""
        rid = _rid(args)
        method = arg(args, "method", str)
        chain = arg(args, "chain", str, "")
        epoch = arg(args, "epoch", int, 0)
        learn_caller(args)
        if not payload:
            call: Any = [[], {}]
        elif len(payload) <= DECODE_ON_LOOP_BYTES_MAX:
            call = values.unpack(payload, bm, CLIENT_VALUE_LIMITS)
        else:  # walking and decoding a large value is not the event loop's to do
            call = await in_executor(values.unpack, payload, bm, CLIENT_VALUE_LIMITS)
        if not (
            isinstance(call, list)
            and len(call) == 2
            and isinstance(call[0], list)
            and isinstance(call[1], dict)
            and all(isinstance(k, str) for k in call[1])
        ):
            raise InvalidArgumentError(
                "object.invoke payload must be [args (a list), kwargs (a map of names)]"
            )
        hosted = bm.table.hosted(rid)
        if hosted is not None and hosted.gate.closed:
            # Held on the loop, not on a thread.
            await hosted.gate.wait_open(admit=admitted_while_quiescing(hosted, method))
        status, value, own_s, served_epoch = await in_executor(
            bm.serve_invoke,
            rid,
            method,
            call[0],
            call[1],
            chain,
            epoch,
            _name(principal_of(args)),
        )
        if status == "moved":
            return value
        # t: the call's own seconds here, which the caller's monitor tells apart from
        # the network's in its stall; e: the epoch of the copy that served.
        served = round(own_s, 6)
        if isinstance(value, bytes | bytearray | memoryview):
            return Reply({"s": "ok", "raw": True, "t": served, "e": served_epoch}, value)
        packed = values.pack(value)
        if len(packed) > PAYLOAD_BYTES_MAX:
            raise LimitExceededError(
                f"object {rid}.{method} returned {len(packed)} bytes, over the {PAYLOAD_BYTES_MAX}"
                " bytes one answer carries; have it return its result in pieces (an offset "
                "and a length per call)"
            )
        return Reply({"s": "ok", "t": served, "e": served_epoch}, packed)

    async def locate(args: dict[str, Any], payload: bytes) -> Any:
        """Where an object runs, as this run-time knows it (with authority at its home)."""
        rid = _rid(args)
        failed_at = arg(args, "failed_at", str, "")
        if failed_at and rid.home == bm.id:
            await bm.durability.suspect(rid, failed_at)
        where, authoritative, epoch = bm.table.locate_here(rid)
        address = bm.address if where == bm.id else (bm.peers.address_of(where) if where else None)
        out: dict[str, Any] = {
            "location": where,
            "address": address or "",
            "authoritative": authoritative,
            "epoch": epoch,
        }
        if rid.home == bm.id and bm.durability.recovering(rid):
            out["recovering"] = True
            out["retry_after_s"] = bm.durability.retry_after_s(rid)
        return out

    async def moved(args: dict[str, Any], payload: bytes) -> Any:
        """At an object's home: it was lost where it ran (``location`` ""), told by
        that run-time (``from``)."""
        rid = _rid(args)
        location = arg(args, "location", str)
        if rid.home != bm.id:
            raise InvalidArgumentError(f"{bm.id} is not the home of {rid}")
        entry = bm.table.home_entry(rid)
        require_owner(principal_of(args), entry.principal if entry else None, rid, "relocate")
        if location:
            raise InvalidArgumentError(
                "object.moved only reports a loss (location ''): a move takes effect "
                "at the home through object.commit"
            )
        if entry is not None and entry.location == arg(args, "from", str, entry.location):
            bm.table.forgotten(rid)
        return None

    async def install(args: dict[str, Any], payload: bytes) -> Any:
        """Stage an object migrating here (payload: its checkpoint and code)."""
        await in_control(install_as, args, payload, _name(principal_of(args)))
        return {"staged": str(_rid(args)), "host": bm.id}

    def install_as(args: dict[str, Any], payload: bytes, principal: str | None) -> None:
        with acting_for(principal):  # what it learns of run-times, it learns as that
            migration_target.install(bm, args, payload, principal)

    def own_hosted(args: dict[str, Any], what: str) -> ObjectId:
        """The object's id, if the caller may ``what`` the copy hosted here."""
        rid = _rid(args)
        hosted = bm.table.hosted(rid)
        if hosted is not None:
            require_owner(principal_of(args), hosted.principal, rid, what)
        return rid

    def own_homed(args: dict[str, Any], what: str) -> ObjectId:
        """The object's id, if the caller may ``what`` the object homed here (the
        home's record says whose it is)."""
        rid = _rid(args)
        entry = bm.table.home_entry(rid)
        if entry is not None:
            require_owner(principal_of(args), entry.principal, rid, what)
        return rid

    async def activate(args: dict[str, Any], payload: bytes) -> Any:
        """Let a staged object serve, if its home commits the move."""
        return await migration_target.activate(
            bm, own_hosted(args, "activate"), arg(args, "mid", str)
        )

    async def abort(args: dict[str, Any], payload: bytes) -> Any:
        """Drop a staged object unless it serves: active, aborted or unknown."""
        return await in_control(
            migration_target.abort, bm, own_hosted(args, "abort the move of"), arg(args, "mid", str)
        )

    async def commit(args: dict[str, Any], payload: bytes) -> Any:
        """At the object's home: the move ``mid`` takes effect, or is refused."""
        rid = own_homed(args, "move")
        target = arg(args, "target", str)
        if args.get("address"):
            address = str(args["address"])
            parse_address(address, "object.commit address")
            learn(target, address, principal_of(args))
        return await in_control(
            migration_home.commit_here,
            bm,
            rid,
            arg(args, "mid", str),
            arg(args, "source", str),
            arg(args, "epoch", int),
            target,
        )

    async def resolve(args: dict[str, Any], payload: bytes) -> Any:
        """At the object's home: did move ``mid`` take effect? (Never later if not.)"""
        return await in_control(
            migration_home.resolve_here,
            bm,
            own_homed(args, "move"),
            arg(args, "mid", str),
            arg(args, "from", str, ""),
        )

    async def register(args: dict[str, Any], payload: bytes) -> Any:
        """At a durable object's home: it was made on ``from``; record it."""
        rid = _rid(args)
        if rid.home != bm.id:
            raise InvalidArgumentError(f"{bm.id} is not the home of {rid}")
        learn_caller(args)
        body = values.unpack(payload) if payload else None
        if not isinstance(body, dict) or not isinstance(body.get("checkpoint"), bytes):
            raise InvalidArgumentError("object.register payload must hold a checkpoint")
        code = body.get("code")
        if code is not None and not isinstance(code, bytes):
            raise InvalidArgumentError("object.register: code must be bytes or nil")
        location = arg(args, "from", str)
        label = arg(args, "label", str, "?")
        bm.table.created_at(rid, location, label, True, _name(principal_of(args)))
        try:
            await in_control(
                lambda: bm.durability.recorded(
                    rid,
                    type_name=arg(args, "type", str, ""),
                    type_label=label,
                    code=code,
                    policy=arg(args, "policy", str, "auto"),
                    home_address=arg(args, "home_address", str, ""),
                    app=arg(args, "app", str, ""),
                    location=location,
                    checkpoint=body["checkpoint"],
                    principal=_name(principal_of(args)),
                )
            )
        except BaseException:
            bm.table.creation_failed(rid)
            raise
        return {"recorded": str(rid), "lease_s": bm.durability.lease_s}

    async def persist(args: dict[str, Any], payload: bytes) -> Any:
        """At a durable object's home: its host's write of its state."""
        return await in_control(
            bm.durability.on_persist,
            own_homed(args, "write the state of"),
            arg(args, "epoch", int),
            arg(args, "from", str),
            bytes(payload),
        )

    async def renew(args: dict[str, Any], payload: bytes) -> Any:
        """At durable objects' home: their host keeps serving them."""
        items = args.get("items")
        if not isinstance(items, list) or not all(
            isinstance(i, list) and len(i) == 2 and isinstance(i[1], int) for i in items
        ):
            raise InvalidArgumentError("object.renew items must be [[rid, epoch], ...]")
        parsed = [(ObjectId.parse(str(r)), e) for r, e in items]
        for rid, _ in parsed:  # a host renews each principal's objects as that principal
            entry = bm.table.home_entry(rid)
            if entry is not None:
                require_owner(principal_of(args), entry.principal, rid, "renew the lease of")
        return bm.durability.on_renew(parsed, arg(args, "from", str))

    async def ended(args: dict[str, Any], payload: bytes) -> Any:
        """At a durable object's home: it was destroyed where it ran."""
        rid = own_homed(args, "end")
        entry = bm.table.home_entry(rid)
        if entry is not None and entry.epoch == arg(args, "epoch", int, entry.epoch):
            bm.table.forgotten(rid)
            await in_control(bm.durability.forget, rid)
        return None

    async def probe(args: dict[str, Any], payload: bytes) -> Any:
        """Whether object ``rid`` runs here, at which epoch, and whether it serves."""
        rid = _rid(args)
        hosted = bm.table.hosted(rid)
        if hosted is None:
            return {"hosted": False}
        return {
            "hosted": True,
            "state": hosted.gate.state.value,
            "epoch": hosted.epoch,
            "serving": hosted.serving(time.monotonic()),
            "durable": hosted.durable,
            "lease_left_s": bm.durability.host.lease_left_s(hosted),
        }

    async def fence(args: dict[str, Any], payload: bytes) -> Any:
        """Stop the copy here if it is older than ``epoch`` (told by its home)."""
        rid = own_hosted(args, "stop")
        epoch = arg(args, "epoch", int)
        hosted = bm.table.hosted(rid)
        if hosted is not None and hosted.epoch < epoch and not hosted.staged:
            await in_control(bm.retire, hosted)
            return {"stopped": True}
        return {"stopped": False}

    async def migrate(args: dict[str, Any], payload: bytes) -> Any:
        """Move an object hosted here to run-time ``to``."""
        rid = own_hosted(args, "move")
        target = arg(args, "to", str)
        if args.get("to_address"):
            learn(target, str(args["to_address"]), principal_of(args))
        if bm.table.hosted(rid) is None:
            where = bm.table.where(rid)
            return {"moved": False, "location": where, "reason": f"not hosted on {bm.id}"}
        event = await migration.migrate_out(bm, rid, target, arg(args, "reason", str, "requested"))
        return {"moved": True, **event.to_json()}

    async def destroy(args: dict[str, Any], payload: bytes) -> Any:
        """End an object hosted here."""
        rid = own_hosted(args, "destroy")
        entry = bm.table.home_entry(rid)
        if entry is not None:
            require_owner(principal_of(args), entry.principal, rid, "destroy")
        if (
            bm.table.hosted(rid) is None
            and entry is not None
            and entry.durable
            and entry.location not in ("", bm.id)
        ):
            # The home of a durable object ends it wherever it runs, then forgets it
            # (a copy it cannot reach stops at its next renewal: unknown here). The
            # call acts for the object's principal, as every call about it does.
            with contextlib.suppress(ShuttleError, OSError), acting_for(entry.principal):
                await bm.peers.call(entry.location, "object.destroy", {"rid": str(rid)})
            bm.table.forgotten(rid)
            await in_control(bm.durability.forget, rid)
            return {"destroyed": True}
        destroyed = await in_control(bm.destroy_hosted, rid)
        return {"destroyed": destroyed}

    async def digest(args: dict[str, Any], payload: bytes) -> Any:
        """A client's digest of its statistics; the reply carries its decisions."""
        if manager is None:
            return {"decisions": []}
        body = values.unpack(payload) if payload else {}
        if not isinstance(body, dict):
            raise InvalidArgumentError("runtime.digest payload must be a map")
        decisions, local = await in_control(manager.receive, body)
        for rid_text, target, reason in local:
            bm.spawn(_move_quietly(bm, ObjectId.parse(rid_text), target, reason))
        return {"decisions": decisions, "window_s": bm.config.window_s}

    async def bye(args: dict[str, Any], payload: bytes) -> Any:
        """A client run-time is closing: forget its digests and pending decisions."""
        if manager is not None:
            manager.forget(arg(args, "runtime", str))
        return None

    async def objects(args: dict[str, Any], payload: bytes) -> Any:
        """Objects hosted here with their measured costs, known clients, migrations."""
        window = bm.monitor.window()
        out: dict[str, Any] = {
            "runtime": bm.id,
            "time": time.time(),
            "span_s": window.span_s,
            "objects": await in_control(bm.describe),
            "window": {
                rid: {
                    "calls": c.calls,
                    "cpu_s": c.cpu_s,
                    "bytes_in": c.bytes_in,
                    "bytes_out": c.bytes_out,
                }
                for rid, c in window.objects.items()
            },
            "edges": [
                {
                    "caller": a,
                    "callee": b,
                    "bytes": e.bytes,
                    "calls": e.calls,
                    "stall_s": e.stall_s,
                    "remote": e.remote,
                }
                for (a, b), e in window.edges.items()
            ],
            "events": [e.to_json() for e in bm.history.events()[-50:]],
            "clients": {},
        }
        if manager is not None:
            out["clients"] = manager.snapshot_digests()
            out["evaluations"] = manager.evaluations
        if extra_status is not None:
            out.update(extra_status())
        return Reply({"packed": True}, values.pack(out))

    async def decision_log(args: dict[str, Any], payload: bytes) -> Any:
        """Decision-log records after sequence number ``since``."""
        if manager is None:
            return Reply({"packed": True}, values.pack([]))
        since = arg(args, "since", int, 0)
        limit = arg(args, "limit", int, 200)
        return Reply({"packed": True}, values.pack(manager.log_since(since, limit)))

    # Open to principals (each checks its objects' owners itself), or cluster operations.
    for name, fn, open_to_principals in (
        ("object.create", create, True),
        ("object.invoke", invoke, True),
        ("object.locate", locate, True),
        ("object.moved", moved, True),
        ("object.install", install, True),
        ("object.activate", activate, True),
        ("object.abort", abort, True),
        ("object.commit", commit, True),
        ("object.resolve", resolve, True),
        ("object.register", register, True),
        ("object.persist", persist, True),
        ("object.renew", renew, True),
        ("object.ended", ended, True),
        ("object.probe", probe, False),
        ("object.fence", fence, True),
        ("object.migrate", migrate, True),
        ("object.destroy", destroy, True),
        ("runtime.digest", digest, True),
        ("runtime.bye", bye, True),
        ("runtime.objects", objects, False),
        ("runtime.log", decision_log, False),
    ):
        registry.add(
            name,
            fn,
            Mode.ASYNC,
            guard=anyone if open_to_principals else None,
            wants_principal=open_to_principals,
        )


async def _move_quietly(bm: BindingManager, rid: ObjectId, target: str, reason: str) -> None:
    try:
        await migration.migrate_out(bm, rid, target, reason)
    except ShuttleError as exc:  # recorded as a failed event by migrate_out
        log.info("planned migration of %s did not happen: %s", rid, exc)
