"""``callback``: the node promises to say when an object changes (AFS-style callbacks).

The first open of an object asks for its attributes *and a promise*
(``callback.promise``); while the promise holds, opens use the cached attributes and
blocks with no round trip. The node breaks the promise before it applies any change
to the object, and the change waits until this client acknowledged the break (or the
promise's term ran out, or this client's session ended): so while a promise holds, the
node's copy is the cached one. docs/consistency.md states the semantics.

Per node, one listener thread with a connection of its own holds the session and
long-polls ``callback.wait``; for each break it drops the cached blocks and the promise
*before* it acknowledges (the ack rides on its next poll). Three rules keep the client
from trusting a promise the node no longer keeps:

* a promise's term is counted from the moment the request was *sent*, so it lapses
  here no later than on the node (which counts from when it granted it);
* if the listener's connection fails, every promise from that node is void at once
  (the node drops a session's promises when its connection closes);
* a grant whose reply arrives after a break covering it (the two travel on different
  connections) is void on arrival: breaks name the highest grant they cover.

A node that does not serve the callback operations, or whose session cannot be opened,
is validated as in ``check`` (a stat per open) until a retry succeeds.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from shuttle.client.calls import entries, no_chunks
from shuttle.client.model import NodeAddress, ObjectInfo
from shuttle.client.validation.base import DirectoryKeyError, Listed, Validated, ValidationMode
from shuttle.errors import RemoteProtocolError, ShuttleError, UnknownOperationError
from shuttle.net.attr_rows import ROWS_FORM

if TYPE_CHECKING:
    from shuttle.client.client import Client
    from shuttle.client.connections import NodeConnection

log = logging.getLogger("shuttle.client.callback")

#: After a node's callback session failed, opens on that node are checked with a stat
#: (no promise) for this long before a new session is tried: a node that is down is
#: not dialled again on every open.
RESTART_INTERVAL_S = 1.0
#: The longest :meth:`CallbackMode.close` waits for a listener thread to finish.
CLOSE_JOIN_S = 2.0
#: A long poll lasts at most this fraction of the client's request timeout, so an
#: empty answer always arrives before the request is given up as lost.
WAIT_FRACTION_OF_TIMEOUT = 0.5


@dataclass(frozen=True, slots=True)
class _Promise:
    info: ObjectInfo
    seq: int
    expires_at: float


@dataclass
class CallbackCounters:
    """How the mode went (``client.counters()["validation"]["callback"]``)."""

    opens: int = 0
    #: Opens served from a live promise: no round trip at all.
    opens_no_round_trip: int = 0
    promises_granted: int = 0
    #: Stats answered without a promise (a change was pending, or the node's limit).
    promises_refused: int = 0
    promises_broken: int = 0
    promises_expired: int = 0
    #: Promises dropped because their node's listener connection failed or closed.
    promises_voided: int = 0
    #: Grants whose reply arrived after a break covering them.
    grants_void_on_arrival: int = 0
    #: Opens validated with a plain stat because the node had no session.
    opens_without_session: int = 0
    listener_failures: int = 0


class CallbackMode(ValidationMode):
    name = "callback"
    staleness_s: ClassVar[float] = 0.0

    def __init__(self, client: Client) -> None:
        super().__init__(client)
        #: Guards every listener's promises and these counters.
        self.lock = threading.Lock()
        self.counters = CallbackCounters()
        self._listeners: dict[str, _Listener] = {}
        self._retry_at: dict[str, float] = {}
        self._start_lock = threading.Lock()

    def open(self, key: str) -> Validated:
        node = self.client.node_for(key)
        listener = self._listener(node)
        with self.lock:
            self.counters.opens += 1
            info = listener.lookup(key, time.monotonic()) if listener is not None else None
            if info is not None:
                self.counters.opens_no_round_trip += 1
                return Validated(info, True)
            if listener is None:
                self.counters.opens_without_session += 1
        if listener is None:
            info = self.client.stat(key)
            return Validated(info, self.client.cache.validate(info))
        return listener.promise(key)

    def stat_many(self, keys: Sequence[str]) -> list[ObjectInfo | None]:
        """Attributes of ``keys`` with a promise on each (one round trip per node):
        after a listing, opening any of its files costs no round trip."""
        out: list[ObjectInfo | None] = [None] * len(keys)
        for node_id, idxs in self.client.by_node(keys).items():
            mine = [keys[i] for i in idxs]
            listener = self._listener(self.client.node(node_id))
            found = self.client.stat_many(mine) if listener is None else listener.promise_many(mine)
            for i, info in zip(idxs, found, strict=True):
                out[i] = info
        return out

    def listdir(self, prefix: str) -> Listed | None:
        """The keys and sub-prefixes directly under ``prefix`` with each key's
        attributes and a promise on it: one round trip per node and page
        (``callback.promise_list``). None if some node cannot (no session now, or an
        older node): the caller lists, then calls :meth:`stat_many`."""
        found: dict[str, ObjectInfo | None] = {}
        prefixes: set[str] = set()
        for node in self.client.nodes:
            listener = self._listener(node)
            page = listener.promise_list(prefix) if listener is not None else None
            if page is None:
                return None
            found.update(page[0])
            prefixes.update(page[1])
        keys = sorted(found)
        return sorted(prefixes), keys, [found[k] for k in keys]

    def forget(self, key: str) -> None:
        with self.lock:
            for listener in self._listeners.values():
                listener.promises.pop(key, None)

    def close(self) -> None:
        with self._start_lock, self.lock:
            listeners, self._listeners = list(self._listeners.values()), {}
            self._retry_at.clear()
        for listener in listeners:
            listener.stop()

    def stats(self) -> dict[str, Any]:
        with self.lock:
            held = sum(len(li.promises) for li in self._listeners.values() if li.alive)
            sessions = sum(1 for li in self._listeners.values() if li.alive)
            return {**asdict(self.counters), "promises_held": held, "sessions": sessions}

    def _listener(self, node: NodeAddress) -> _Listener | None:
        """The live listener of ``node``: started if there is none (and the last
        failure is not too recent); None if the node has no session for us now."""
        with self._start_lock:
            listener = self._listeners.get(node.node_id)
            if listener is not None and listener.alive:
                return listener
            now = time.monotonic()
            if now < self._retry_at.get(node.node_id, 0.0):
                return None
            try:
                listener = _Listener(self, node)
            except UnknownOperationError:
                log.warning("node %s serves no callbacks: checking on every open", node.node_id)
                self._retry_at[node.node_id] = float("inf")
                return None
            except (ShuttleError, OSError) as exc:
                log.warning("no callback session with node %s (%s)", node.node_id, exc)
                with self.lock:
                    self.counters.listener_failures += 1
                self._retry_at[node.node_id] = now + RESTART_INTERVAL_S
                return None
            with self.lock:
                self._listeners[node.node_id] = listener
            listener.start()
            return listener


class _Listener:
    """One node's callback session: its promises, and a thread that hears breaks."""

    def __init__(self, mode: CallbackMode, node: NodeAddress) -> None:
        self.mode = mode
        self.client = mode.client
        self.node = node
        self.conn: NodeConnection = self.client.dial(node)
        try:
            opened = self.conn.call("callback.open").result
        except BaseException:
            self.conn.close()
            raise
        self.session: str = opened["session"]
        #: Asks for chunk lists only if the client looks chunks up (lookaside stores).
        self._chunks = no_chunks(self.client.chunk_lists)
        self.wait_s = min(
            float(opened["wait_s_max"]), self.client.request_timeout_s * WAIT_FRACTION_OF_TIMEOUT
        )
        #: Key -> promise (guarded by ``mode.lock``, as everything below).
        self.promises: dict[str, _Promise] = {}
        #: Promise requests in flight per key, and the highest grant broken on each such
        #: key meanwhile (kept only while a request is in flight: that is when a grant
        #: can arrive after its break).
        self._inflight: dict[str, int] = {}
        self._broken: dict[str, int] = {}
        #: Listings with promises in flight: their keys are not known until the answer,
        #: so meanwhile every break is remembered.
        self._lists_inflight = 0
        #: False once the node said it has no ``callback.promise_list`` (an older node).
        self.lists = True
        self.alive = True
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"shuttle-callbacks-{node.node_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def lookup(self, key: str, now: float) -> ObjectInfo | None:
        """The cached attributes of ``key`` if a live promise covers them (lock held)."""
        p = self.promises.get(key)
        if p is None or not self.alive:
            return None
        if now >= p.expires_at:
            del self.promises[key]
            self.mode.counters.promises_expired += 1
            return None
        return p.info

    def promise(self, key: str) -> Validated:
        """Stat ``key`` with a promise request; keep the promise unless it is void."""
        with self._in_flight([key]):
            sent = time.monotonic()  # the term runs from here: it ends here first
            args = {"key": key, "session": self.session, "dirs": True, **self._chunks}
            reply = self.client.call(self.node, "callback.promise", args).result
            if reply.get("dir") is True:
                raise DirectoryKeyError(f"{key!r} is a directory (a prefix of other keys)")
            info = ObjectInfo.from_wire(reply)
            cache_was_valid = self.client.cache.validate(info)
            self._keep(key, info, reply.get("promise"), sent)
        return Validated(info, cache_was_valid)

    def promise_many(self, keys: list[str]) -> list[ObjectInfo | None]:
        """Attributes of ``keys`` (None where missing) with a promise on each object."""
        out: list[ObjectInfo | None] = []
        with self._in_flight(keys):
            sent = time.monotonic()
            args = {"keys": keys, "session": self.session, "form": ROWS_FORM, **self._chunks}
            res = self.client.call(self.node, "callback.promise_many", args)
            for key, reply in zip(keys, entries(res, keys), strict=True):
                out.append(None if reply is None else self._kept(key, reply, sent))
        return out

    def promise_list(self, prefix: str) -> tuple[dict[str, ObjectInfo | None], list[str]] | None:
        """This node's keys directly under ``prefix`` with their attributes and a
        promise on each, and its sub-prefixes (all pages); None if the node lacks the
        operation."""
        if not self.lists:
            return None
        found: dict[str, ObjectInfo | None] = {}
        prefixes: list[str] = []
        start_after: str | None = None
        while True:
            args: dict[str, Any] = {"prefix": prefix, "session": self.session, **self._chunks}
            if start_after is not None:
                args["start_after"] = start_after
            with self._list_in_flight():
                sent = time.monotonic()
                try:
                    res = self.client.call(self.node, "callback.promise_list", args)
                except UnknownOperationError:
                    self.lists = False
                    return None
                try:
                    raw = res.result
                    keys = [prefix + name for name in raw["names"]]
                    prefixes += [prefix + name for name in raw["prefixes"]]
                    after, start_after = start_after, raw["next"]
                except (KeyError, TypeError) as exc:
                    raise RemoteProtocolError(f"malformed listing from node: {exc!r}") from exc
                if start_after is not None and not (
                    isinstance(start_after, str) and (after is None or start_after > after)
                ):  # a page must move on, or the listing would never end
                    raise RemoteProtocolError(
                        f"malformed listing from node: next page after {after!r} "
                        f"starts after {start_after!r}"
                    )
                for key, reply in zip(keys, entries(res, keys), strict=True):
                    found[key] = None if reply is None else self._kept(key, reply, sent)
            if start_after is None:
                return found, prefixes

    def _kept(self, key: str, reply: dict[str, Any], sent: float) -> ObjectInfo:
        info = ObjectInfo.from_wire(reply)
        self.client.cache.validate(info)  # blocks of another version go now
        self._keep(key, info, reply.get("promise"), sent)
        return info

    @contextlib.contextmanager
    def _list_in_flight(self) -> Iterator[None]:
        with self.mode.lock:
            self._lists_inflight += 1
        try:
            yield
        finally:
            with self.mode.lock:
                self._lists_inflight -= 1
                if not self._lists_inflight:
                    for key in [k for k in self._broken if k not in self._inflight]:
                        del self._broken[key]

    @contextlib.contextmanager
    def _in_flight(self, keys: list[str]) -> Iterator[None]:
        """While a promise request for ``keys`` is in flight, breaks on them are
        remembered, so a grant that arrives after its break is void."""
        with self.mode.lock:
            for key in keys:
                self._inflight[key] = self._inflight.get(key, 0) + 1
        try:
            yield
        finally:
            with self.mode.lock:
                for key in keys:
                    left = self._inflight[key] - 1
                    if left:
                        self._inflight[key] = left
                    else:
                        del self._inflight[key]
                        if not self._lists_inflight:
                            self._broken.pop(key, None)

    def _keep(self, key: str, info: ObjectInfo, grant: dict[str, Any] | None, sent: float) -> None:
        """Hold the promise ``grant`` on ``key`` unless it is void (lock not held)."""
        _check_grant(key, grant)
        mode, counters = self.mode, self.mode.counters
        with mode.lock:
            if grant is None:
                counters.promises_refused += 1
            elif not self.alive or grant["seq"] <= self._broken.get(key, 0):
                counters.grants_void_on_arrival += 1
            else:
                self.promises[key] = _Promise(info, grant["seq"], sent + grant["term_s"])
                counters.promises_granted += 1

    def _run(self) -> None:
        ack = 0
        try:
            while not self._stopping:
                args = {"session": self.session, "ack": ack, "timeout_s": self.wait_s}
                # Not retried on a new connection: the session died with the old one.
                out = self.conn.call("callback.wait", args, idempotent=False).result
                for key, grant in out["breaks"]:
                    self._break(key, grant)
                ack = out["seq"]  # acknowledged with the next poll, after the drops above
                if out["closed"]:
                    break
        except (ShuttleError, OSError) as exc:
            if not self._stopping:
                log.warning(
                    "callback listener of node %s failed (%s): its promises are void",
                    self.node.node_id,
                    exc,
                )
                with self.mode.lock:
                    self.mode.counters.listener_failures += 1
        finally:
            self._void()
            self.conn.close()

    def _break(self, key: str, grant: int) -> None:
        with self.mode.lock:
            p = self.promises.get(key)
            if p is not None and p.seq <= grant:
                del self.promises[key]
                self.mode.counters.promises_broken += 1
            if key in self._inflight or self._lists_inflight:
                self._broken[key] = max(grant, self._broken.get(key, 0))
        self.client.forget(key)  # the cached blocks, and what any other mode keeps on it

    def _void(self) -> None:
        with self.mode.lock:
            self.alive = False
            if not self._stopping:
                self.mode.counters.promises_voided += len(self.promises)
            self.promises.clear()

    def stop(self) -> None:
        """End the session (the node answers the long poll) and the thread."""
        self._stopping = True
        with self.mode.lock:
            live = self.alive
        self._void()
        # A listener that failed took its session with its connection: nothing to close,
        # and its node may be down (closing the client must not wait to dial it).
        # If this fails, the node ends the session when the listener's connection closes.
        if live:
            with contextlib.suppress(ShuttleError, OSError):
                self.client.call(self.node, "callback.close", {"session": self.session})
        self._thread.join(CLOSE_JOIN_S)


def _check_grant(key: str, grant: object) -> None:
    """A node's grant is nil or ``{seq: int, term_s: number}``; anything else is the
    node's fault, named as such (not a TypeError later, at the promise's first use)."""
    if grant is None:
        return
    seq = grant.get("seq") if isinstance(grant, dict) else None
    term = grant.get("term_s") if isinstance(grant, dict) else None
    if (
        type(seq) is not int
        or isinstance(term, bool)
        or not isinstance(term, int | float)
        or not term >= 0
    ):
        raise RemoteProtocolError(
            f"the node answered a malformed callback promise for {key!r}: {grant!r:.120}; "
            "is it a Shuttle node of a compatible version?"
        )
