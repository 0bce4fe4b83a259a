"""Callback promises (AFS-style): what this node promised to tell which client.

A client opens a *session* (``callback.open``, on a connection of its own) and asks
for a promise with each stat of an object it caches (``callback.promise``). While the
promise holds, the client uses its cached copy with no round trip. Before any change
to an object is applied, every promise on it is *broken*: the node queues a break for
each holder (the holder's long poll, ``callback.wait``, delivers it) and the change
waits until each holder has acknowledged it (its next ``callback.wait`` carries the
ack, sent after it dropped its cached copy), or the promise's term ran out, or the
holder's session ended (its connection closed). So a change is applied only once no
client still trusts the old contents; docs/consistency.md states the semantics.

Two races, and how they are closed:

* *A grant between the break and the apply* would be a promise on contents about to
  change. While a change to a key is pending, no promise on it is granted (the stat is
  answered without one). The promise is recorded *before* the stat reads the
  attributes, so a change that starts after the grant breaks it.
* *A grant that crosses its own break* (the break reaches the client, on its listener
  connection, before the grant's reply on another connection). Grants are numbered per
  session and a break names the highest grant it covers; the client drops a grant
  numbered no higher than a break it has seen on that key.

The table has a lock and a clock and does no I/O. Waiting for a change's breaks comes
in two forms: blocking (:meth:`PromiseTable.changing`, the store's change hook, on a
store thread) and as a coroutine (:meth:`PromiseTable.clear`, run on the event loop
before a write's thread hop, so writers held up by a slow client hold no thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from shuttle.errors import ConfigError, InvalidArgumentError, NodeBusyError, NotFoundError
from shuttle.net.clock import REAL_CLOCK, Clock

#: How long a promise holds unless broken. It bounds how long a client that stopped
#: or was cut off (without its connection closing) holds up writers of an object it
#: caches, and a client re-validates a hot object once per term. AFS-2 used hours for
#: a campus of workstations; 30 s keeps a stuck client's cost to writers small while a
#: hot object still costs one round trip per 30 s instead of one per open.
CALLBACK_TERM_S_DEFAULT = 30.0
#: Longest term a node accepts (an hour: past that a vanished client stalls writers
#: for longer than any operator would wait).
CALLBACK_TERM_S_MAX = 3600.0
#: Longest a ``callback.wait`` is held before it answers with no breaks: well under
#: the client's request timeout (60 s) and the node's idle timeout (300 s).
CALLBACK_WAIT_S_MAX = 20.0
#: Promises one session may hold; past it, stats are answered without a promise (the
#: client then checks on each open). 100,000 promises are about 20 MB of table.
PROMISES_PER_SESSION_MAX = 100_000
#: Sessions a node keeps (one per client process and node); past it ``callback.open``
#: is refused as busy.
SESSIONS_MAX = 4096
#: A session's name: random, so one client cannot guess (and ack for) another's.
SESSION_TOKEN_BYTES = 16


@dataclass(slots=True)
class _Promise:
    seq: int
    expires_at: float


@dataclass(eq=False, slots=True)
class _Session:
    token: str
    owner: int | None
    promises: dict[str, _Promise] = field(default_factory=dict)
    #: Breaks not yet acknowledged: key -> (break number, highest grant it covers).
    outbox: dict[str, tuple[int, int]] = field(default_factory=dict)
    grants: int = 0
    breaks: int = 0
    acked: int = 0
    closed: bool = False
    #: The node is stopping: the long poll answers ``closed``, no promise is granted.
    closing: bool = False
    #: Wakes the session's pending ``callback.wait`` (None: none is pending).
    wake: Callable[[], None] | None = None


@dataclass(frozen=True, slots=True)
class Grant:
    """A promise granted: its number in the session and its term."""

    seq: int
    term_s: float


@dataclass(frozen=True, slots=True)
class _Owed:
    """A break a change waits for: resolved when acked, expired or its session ended."""

    session: _Session
    break_seq: int
    expires_at: float

    def resolved(self, now: float) -> bool:
        s = self.session
        return s.closed or s.acked >= self.break_seq or now >= self.expires_at


@dataclass(slots=True)
class Change:
    """A change in progress on ``keys``: the breaks it waits for, from when."""

    keys: tuple[str, ...]
    #: Every break it waits for; ``issued``: those it broke itself.
    owed: list[_Owed]
    issued: list[_Owed]
    started_at: float
    ended: bool = False


@dataclass
class CallbackCounters:
    """What the table has done (the ``callbacks`` section of ``node.stats``)."""

    sessions_opened: int = 0
    sessions_closed: int = 0
    promises_granted: int = 0
    #: Stats answered without a promise: a change on the key was pending, or the
    #: session held its maximum.
    promises_refused: int = 0
    #: Promises that lapsed at their term with no change breaking them.
    promises_expired: int = 0
    #: Promises broken by a change, and how each break was resolved.
    breaks: int = 0
    breaks_acked: int = 0
    breaks_expired: int = 0
    breaks_released: int = 0
    #: Changes to objects (every one passes the store's change hook).
    changes: int = 0
    #: Changes that had to wait for at least one break, and how long they waited.
    changes_waited: int = 0
    writer_wait_s_total: float = 0.0
    writer_wait_s_max: float = 0.0


class PromiseTable:
    """The promises of one node: sessions, promises per key, changes pending.

    Thread-safe: grants come from the stat path (event loop or thread pool), breaks
    from the store's change hook (a store thread) or a write's before-step (the loop),
    acks from the long poll (the loop), session ends from disconnect hooks (threads).
    """

    def __init__(self, term_s: float = CALLBACK_TERM_S_DEFAULT, *, clock: Clock = REAL_CLOCK):
        if not 0 < term_s <= CALLBACK_TERM_S_MAX:
            raise ConfigError(
                f"the callback term must be in (0, {CALLBACK_TERM_S_MAX:g}] seconds, got {term_s:g}"
            )
        self.term_s = term_s
        self._now = clock.now
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._sessions: dict[str, _Session] = {}
        #: Key -> sessions holding a promise on it.
        self._holders: dict[str, set[_Session]] = {}
        #: Key -> breaks issued on it and not yet resolved (any change waits for them).
        self._breaking: dict[str, list[_Owed]] = {}
        #: Key -> changes in progress on it (no promise is granted meanwhile).
        self._pending: dict[str, int] = {}
        #: Coroutines waiting for breaks to resolve: each is poked on any ack or end.
        self._watchers: set[Callable[[], None]] = set()
        self._promises = 0
        self.counters = CallbackCounters()

    # --- sessions ------------------------------------------------------------------

    def open_session(self, owner: int | None = None) -> str:
        """A new session (owned by connection ``owner``); returns its token."""
        with self._lock:
            if len(self._sessions) >= SESSIONS_MAX:
                raise NodeBusyError(
                    f"this node keeps at most {SESSIONS_MAX} callback sessions and has them "
                    "all; retry later or use the 'check' validation mode"
                )
            token = os.urandom(SESSION_TOKEN_BYTES).hex()
            self._sessions[token] = _Session(token, owner)
            self.counters.sessions_opened += 1
            return token

    def close_session(self, token: str) -> bool:
        """End a session: its promises are dropped and changes stop waiting for them.
        Returns whether it was open."""
        with self._lock:
            s = self._sessions.get(token)
            if s is None:
                return False
            wake = self._end(s)
            watchers = list(self._watchers)
        _call_all([*watchers, *([wake] if wake else [])])
        return True

    def release_owner(self, owner: int) -> int:
        """End the sessions of connection ``owner`` (it closed); returns how many."""
        with self._lock:
            theirs = [s for s in self._sessions.values() if s.owner == owner]
            wakes = [self._end(s) for s in theirs]
            watchers = list(self._watchers) if theirs else []
        _call_all([*watchers, *(w for w in wakes if w is not None)])
        return len(theirs)

    def close_all(self) -> int:
        """The node is stopping: tell every session's long poll it is over. Promises
        stay in force until each holder closes its connection (having dropped them)
        or their term ends, so a change is never applied while a holder still trusts
        its copy. Returns how many sessions were told."""
        with self._lock:
            sessions = list(self._sessions.values())
            for s in sessions:
                s.closing = True
            wakes = [s.wake for s in sessions if s.wake is not None]
        _call_all(wakes)
        return len(sessions)

    def sessions_owned_by(self, owner: int) -> int:
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.owner == owner)

    def _end(self, s: _Session) -> Callable[[], None] | None:
        """Drop ``s`` (lock held); returns its long poll's wake-up to call outside it."""
        s.closed = True
        for key in s.promises:
            self._unhold(key, s)
        self._promises -= len(s.promises)
        s.promises.clear()
        s.outbox.clear()
        del self._sessions[s.token]
        self.counters.sessions_closed += 1
        self._changed.notify_all()
        return s.wake

    def _unhold(self, key: str, s: _Session) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(s)
            if not holders:
                del self._holders[key]

    def _session(self, token: str, owner: int | None) -> _Session:
        s = self._sessions.get(token)
        if s is None:
            raise NotFoundError(
                f"no callback session {token[:12]!r} on this node (it ended when its "
                "connection closed, or the node restarted); open a new one"
            )
        _check_owner(s, owner)
        return s

    # --- promises -------------------------------------------------------------------

    def grant(self, token: str, key: str) -> Grant | None:
        """Promise session ``token`` to break before ``key`` changes; None if no
        promise can be given now (a change on ``key`` is pending, the session ended or
        holds its maximum). Call it *before* reading the attributes the promise covers."""
        with self._lock:
            s = self._sessions.get(token)
            if s is None or s.closing:
                return None
            if self._pending.get(key) or (
                key not in s.promises and len(s.promises) >= PROMISES_PER_SESSION_MAX
            ):
                self.counters.promises_refused += 1
                return None
            if key not in s.promises:
                self._holders.setdefault(key, set()).add(s)
                self._promises += 1
            s.grants += 1
            s.promises[key] = _Promise(s.grants, self._now() + self.term_s)
            self.counters.promises_granted += 1
            return Grant(s.grants, self.term_s)

    def withdraw(self, token: str, key: str) -> None:
        """Drop session ``token``'s promise on ``key`` (its stat failed: nothing to keep)."""
        with self._lock:
            s = self._sessions.get(token)
            if s is not None and s.promises.pop(key, None) is not None:
                self._promises -= 1
                self._unhold(key, s)

    def has_promises(self, keys: Iterable[str]) -> bool:
        """Whether any of ``keys`` has a promise, or a break not yet resolved (a
        lock-free hint for the fast path)."""
        holders, breaking = self._holders, self._breaking
        return any(k in holders or k in breaking for k in keys)

    # --- changes --------------------------------------------------------------------

    def begin_change(self, keys: Iterable[str]) -> Change:
        """Start a change on ``keys``: no promise on them is granted until
        :meth:`end_change`, and every promise held now is broken (queued for its holder).
        The change may be applied once :meth:`owed` is empty: the breaks it issued,
        and those an earlier change on the same keys issued and that are not resolved
        yet (that change may still be waiting; a holder must not see a second change
        go ahead of its ack)."""
        wakes: list[Callable[[], None]] = []
        keys = tuple(keys)
        with self._lock:
            now = self._now()
            owed: list[_Owed] = []
            issued: list[_Owed] = []
            for key in keys:
                self._pending[key] = self._pending.get(key, 0) + 1
                earlier = [o for o in self._breaking.get(key, ()) if not o.resolved(now)]
                owed += earlier
                holders = self._holders.pop(key, None)
                for s in holders or ():
                    p = s.promises.pop(key)
                    self._promises -= 1
                    if p.expires_at <= now:
                        self.counters.promises_expired += 1
                        continue
                    s.breaks += 1
                    s.outbox[key] = (s.breaks, p.seq)
                    issued.append(_Owed(s, s.breaks, p.expires_at))
                    earlier.append(issued[-1])
                    self.counters.breaks += 1
                    if s.wake is not None:
                        wakes.append(s.wake)
                if earlier:
                    self._breaking[key] = earlier
                else:
                    self._breaking.pop(key, None)
            owed += issued
            change = Change(keys, owed, issued, now)
        _call_all(wakes)
        return change

    def owed(self, change: Change) -> list[_Owed]:
        """The breaks ``change`` still waits for (not acked, not expired, holder alive)."""
        with self._lock:
            return self._owed(change)

    def _owed(self, change: Change) -> list[_Owed]:
        now = self._now()
        return [o for o in change.owed if not o.resolved(now)]

    def end_change(self, change: Change) -> None:
        """The change is applied (or failed): promises on its keys may be granted again."""
        with self._lock:
            if change.ended:
                return
            change.ended = True
            now = self._now()
            for key in change.keys:
                left = self._pending[key] - 1
                if left:
                    self._pending[key] = left
                else:
                    del self._pending[key]
                breaking = [o for o in self._breaking.get(key, ()) if not o.resolved(now)]
                if breaking:
                    self._breaking[key] = breaking
                else:
                    self._breaking.pop(key, None)
            c = self.counters
            for o in change.issued:
                if o.session.acked >= o.break_seq:
                    c.breaks_acked += 1
                elif o.session.closed:
                    c.breaks_released += 1
                else:
                    c.breaks_expired += 1
            if change.owed:
                waited = max(0.0, self._now() - change.started_at)
                c.changes_waited += 1
                c.writer_wait_s_total += waited
                c.writer_wait_s_max = max(c.writer_wait_s_max, waited)

    @contextlib.contextmanager
    def changing(self, key: str) -> Iterator[None]:
        """The store's change hook: break ``key``'s promises, block until they are
        resolved, and grant none on it until the change is applied."""
        change = self.begin_change((key,))
        with self._lock:  # counted here only: a write's before-step is not a second change
            self.counters.changes += 1
        try:
            with self._changed:
                while left := self._owed(change):
                    self._changed.wait(max(o.expires_at for o in left) - self._now())
            yield
        finally:
            self.end_change(change)

    async def clear(self, keys: Iterable[str]) -> None:
        """Break ``keys``' promises and wait, on the event loop, until they are resolved
        (a write's step before its thread hop; the store's hook then finds none left,
        unless one was granted in between)."""
        change = self.begin_change(keys)
        try:
            await self._wait(change)
        finally:
            self.end_change(change)

    async def _wait(self, change: Change) -> None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def poke() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed
                loop.call_soon_threadsafe(event.set)

        with self._lock:
            self._watchers.add(poke)
        try:
            while True:
                event.clear()  # before looking: a poke after the look is not lost
                left = self.owed(change)
                if not left:
                    return
                timeout_s = max(o.expires_at for o in left) - self._now()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), max(timeout_s, 0.0))
        finally:
            with self._lock:
                self._watchers.discard(poke)

    # --- the holder's side: breaks and acks -------------------------------------------

    def ack(self, token: str, seq: int, *, owner: int | None = None) -> None:
        """Session ``token`` has dropped what breaks up to number ``seq`` named."""
        with self._lock:
            s = self._session(token, owner)
            seq = min(seq, s.breaks)
            if seq <= s.acked:
                return
            s.acked = seq
            for key in [k for k, (b, _) in s.outbox.items() if b <= seq]:
                del s.outbox[key]
            self._changed.notify_all()
            watchers = list(self._watchers)
        _call_all(watchers)

    def pending_breaks(self, token: str, *, owner: int | None = None) -> dict[str, Any]:
        """The breaks session ``token`` has not acknowledged: ``{"breaks": [[key,
        grant], ...], "seq": n, "closed": bool}``; acking ``n`` acknowledges them all.
        Also drops the session's promises that lapsed."""
        with self._lock:
            s = self._sessions.get(token)
            if s is None:
                return {"breaks": [], "seq": 0, "closed": True}
            _check_owner(s, owner)
            self._lapse(s)
            return {
                "breaks": [[k, g] for k, (_, g) in s.outbox.items()],
                "seq": s.breaks,
                "closed": s.closing,
            }

    def _lapse(self, s: _Session) -> None:
        now = self._now()
        lapsed = [k for k, p in s.promises.items() if p.expires_at <= now]
        for key in lapsed:
            del s.promises[key]
            self._unhold(key, s)
        self._promises -= len(lapsed)
        self.counters.promises_expired += len(lapsed)

    async def wait_breaks(
        self, token: str, ack: int, timeout_s: float, *, owner: int | None = None
    ) -> dict[str, Any]:
        """``callback.wait``: ack ``ack``, then answer as soon as a break is pending or
        the session ends, or with no breaks after ``timeout_s``."""
        self.ack(token, ack, owner=owner)
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(event.set)

        with self._lock:
            s = self._session(token, owner)
            s.wake = wake
        deadline = self._now() + min(max(timeout_s, 0.0), CALLBACK_WAIT_S_MAX)
        try:
            while True:
                event.clear()
                out = self.pending_breaks(token, owner=owner)
                remaining_s = deadline - self._now()
                if out["breaks"] or out["closed"] or remaining_s <= 0:
                    return out
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining_s)
        finally:
            with self._lock:
                if s.wake is wake:
                    s.wake = None

    # --- counters -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                **asdict(self.counters),
                "term_s": self.term_s,
                "sessions_open": len(self._sessions),
                "promises_outstanding": self._promises,
                "changes_pending": sum(self._pending.values()),
            }


def _check_owner(s: _Session, owner: int | None) -> None:
    if owner is not None and s.owner is not None and s.owner != owner:
        raise InvalidArgumentError(
            "a callback session is waited on only from the connection that opened it"
        )


def _call_all(fns: Iterable[Callable[[], None]]) -> None:
    for fn in fns:
        fn()
