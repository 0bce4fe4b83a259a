"""The callback operations a node serves, and the step that makes writes break promises.

* ``callback.open``    a session for this connection (``per_connection``: it ends when
  the connection closes); answers ``{session, term_s, wait_s_max}``.
* ``callback.wait``    the session's long poll: carries the ack of the last answer
  and answers with the breaks not yet acknowledged, or none after ``timeout_s``.
* ``callback.promise`` a stat plus a promise on the object (``promise``: ``{seq,
  term_s}``, or None when none can be given now).
* ``callback.promise_many`` the same for many keys at once (``stat_many`` with a
  promise on each object found; a directory listing costs one round trip, not one
  per file).
* ``callback.promise_list`` a directory listing with ``callback.promise_many`` of its
  keys in the same round trip (names relative to the prefix, attributes as rows).
* ``callback.close``   end a session (from any connection: the client's own
  connection is blocked in its long poll).

Every operation that changes objects gets a step before its thread hop that breaks the
promises on the keys it changes and waits, on the event loop, until they are resolved
(:meth:`PromiseTable.clear`). The store's change hook (the table itself) covers every
change again, whatever its path (mobile objects writing through the store too); after
the step it usually finds nothing left to break.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from shuttle.errors import InvalidArgumentError, NotFoundError, ShuttleError
from shuttle.net.attr_rows import encode_rows
from shuttle.net.principals import Principal, anyone, reads_each
from shuttle.net.registry import (
    CONNECTION_ARG,
    Mode,
    OperationRegistry,
    arg,
    non_negative,
    principal_of,
)
from shuttle.node.callbacks import CALLBACK_WAIT_S_MAX, PromiseTable
from shuttle.node.handlers import attrs_reply, chunks_max, list_for, rows_asked
from shuttle.store.interface import Store
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX

#: The operations that change objects, and the keys each one changes.
KeysOf = Callable[[dict[str, Any]], list[str]]


def _key(args: dict[str, Any]) -> list[str]:
    key = args.get("key")
    return [key] if isinstance(key, str) else []


def _keys(args: dict[str, Any]) -> list[str]:
    keys = args.get("keys")
    return [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []


def register_callback_ops(registry: OperationRegistry, store: Store, table: PromiseTable) -> None:
    """Add the callback operations to ``registry``, make every change to ``store``
    break promises first (its change hook), and give the registry's changing
    operations their before-steps. The storage operations must be registered already."""

    async def open_(args: dict[str, Any], payload: bytes) -> Any:
        """Open a callback session on this connection (it ends when the connection closes)."""
        token = table.open_session(args.get(CONNECTION_ARG))
        return {"session": token, "term_s": table.term_s, "wait_s_max": CALLBACK_WAIT_S_MAX}

    async def wait(args: dict[str, Any], payload: bytes) -> Any:
        """Acknowledge breaks up to ``ack``; answer the breaks not yet acknowledged."""
        timeout_s = args.get("timeout_s", CALLBACK_WAIT_S_MAX)
        if not isinstance(timeout_s, int | float) or isinstance(timeout_s, bool):
            raise InvalidArgumentError(f"timeout_s must be a number, got {timeout_s!r}")
        return await table.wait_breaks(
            arg(args, "session", str),
            non_negative(args, "ack", 0),
            float(timeout_s),
            owner=args.get(CONNECTION_ARG),
        )

    def promise(args: dict[str, Any], payload: bytes) -> Any:
        """Attributes of one object (as ``stat``) and a promise to break before it changes.
        With ``dirs: true``, a key that names a directory (a prefix of this node's keys)
        answers ``{"dir": true}`` instead of ``not_found``: a lookup in one round trip."""
        key = arg(args, "key", str)
        session = arg(args, "session", str)
        dirs = arg(args, "dirs", bool, False)
        principal = principal_of(args)
        if principal is not None and not principal.caps.may_read(key):
            # A principal may look up a directory that leads to what it may read.
            if dirs and is_dir(principal, key):
                return {"dir": True}
            principal.require_read(key, "stat")
        grant = table.grant(session, key)  # before the stat: a later change breaks it
        try:
            out = attrs_reply(store.stat(key), chunks_max(args))
        except ShuttleError as exc:
            if grant is not None:
                table.withdraw(session, key)
            if dirs and isinstance(exc, NotFoundError) and is_dir(principal, key):
                return {"dir": True}
            raise
        out["promise"] = None if grant is None else {"seq": grant.seq, "term_s": grant.term_s}
        return out

    def is_dir(principal: Principal | None, key: str) -> bool:
        """Whether ``key/`` holds a key that ``principal`` may see listed."""
        return bool(list_for(store, principal, key + "/", None, None, 1).keys)

    def promised(session: str, keys: list[str], limit: int) -> list[dict[str, Any] | None]:
        """Attributes of ``keys`` (None where missing; chunk lists cut to ``limit``), each
        with its promise."""
        grants = [table.grant(session, k) for k in keys]  # before the stats, as above
        try:
            found = store.stat_many(keys)
        except ShuttleError:
            for k, g in zip(keys, grants, strict=True):
                if g is not None:
                    table.withdraw(session, k)
            raise
        out: list[dict[str, Any] | None] = []
        for k, g, a in zip(keys, grants, found, strict=True):
            if a is None:
                if g is not None:
                    table.withdraw(session, k)
                out.append(None)
                continue
            reply = attrs_reply(a, limit)
            reply["promise"] = None if g is None else {"seq": g.seq, "term_s": g.term_s}
            out.append(reply)
        return out

    def promise_many(args: dict[str, Any], payload: bytes) -> Any:
        """``callback.promise`` of many keys: attributes (None where missing), each with
        a promise; with ``form: "rows1"`` as compact rows (docs/protocol.md)."""
        keys = arg(args, "keys", list)
        if not all(isinstance(k, str) for k in keys):
            raise InvalidArgumentError("keys must be a list of strings")
        rows = rows_asked(args)
        out = promised(arg(args, "session", str), keys, chunks_max(args))
        return encode_rows(out, promises=True) if rows else out

    def promise_list(args: dict[str, Any], payload: bytes) -> Any:
        """A directory in one round trip: a page of this node's keys directly under
        ``prefix`` (names relative to it) and its sub-prefixes, with the attributes of
        each key and a promise on it, as rows (docs/protocol.md)."""
        prefix = arg(args, "prefix", str, "")
        session = arg(args, "session", str)
        page = list_for(
            store,
            principal_of(args),
            prefix,
            "/",
            arg(args, "start_after", str, None),  # type: ignore[arg-type]
            arg(args, "limit", int, LIST_PAGE_ENTRIES_MAX),
        )
        out = encode_rows(promised(session, page.keys, chunks_max(args)), promises=True)
        out["names"] = [k[len(prefix) :] for k in page.keys]
        out["prefixes"] = [p[len(prefix) :] for p in page.prefixes]
        out["next"] = page.next_start_after
        return out

    def close(args: dict[str, Any], payload: bytes) -> Any:
        """End a callback session: its promises are dropped and its long poll answers."""
        return {"closed": table.close_session(arg(args, "session", str))}

    # Sessions touch no key; a promise is a stat (read), a listing shows what may be read.
    registry.add("callback.open", open_, Mode.ASYNC, per_connection=True, guard=anyone)
    registry.add("callback.wait", wait, Mode.ASYNC, per_connection=True, guard=anyone)
    registry.on_disconnect(table.release_owner, owned=table.sessions_owned_by)
    registry.add(
        "callback.promise",
        promise,
        Mode.THREAD,
        inline_when=lambda a: store.stat_is_cached(str(a.get("key", ""))),
        guard=anyone,  # checked inside: a directory's lookup is a listing
        wants_principal=True,
    )
    registry.add(
        "callback.promise_many", promise_many, Mode.THREAD, guard=reads_each("keys", "stat")
    )
    registry.add(
        "callback.promise_list", promise_list, Mode.THREAD, guard=anyone, wants_principal=True
    )
    registry.add("callback.close", close, guard=anyone)

    def upload_key(args: dict[str, Any]) -> list[str]:
        upload = args.get("upload")
        if not isinstance(upload, str):
            return []
        try:
            return [store.uploads.get(upload).key]
        except ShuttleError:
            return []  # the commit answers the error

    changing: dict[str, KeysOf] = {
        "put": _key,
        "create": _key,
        "write": _key,
        "truncate": _key,
        "set_mtime": _key,
        "remove": _key,
        "remove_many": _keys,
        "upload.commit": upload_key,
    }
    for name, keys_of in changing.items():
        registry.add_before(name, _breaker(table, keys_of))
    store.change_hook = table


def _breaker(
    table: PromiseTable, keys_of: KeysOf
) -> Callable[[dict[str, Any]], Awaitable[None] | None]:
    def before(args: dict[str, Any]) -> Awaitable[None] | None:
        keys = keys_of(args)
        if not keys or not table.has_promises(keys):
            return None  # the usual case: nobody holds a promise, no task, no wait
        return table.clear(keys)

    return before
