"""Copies held under callback promises, with expiry and one race guard: what the
``cache`` object (a file's blocks) and the ``directory`` object (directory blocks)
both keep (ABACUS 4.3.1; AFS's callbacks).

A holder reads a block from a node's isolation object and is *promised* a callback
before anyone changes it; until then it may use its copy without asking. Three
things can make a copy wrong, and this class answers all three the same way for
both objects:

* **A callback that overtakes a read.** The isolation object may break a promise
  after it answered a read but before the reader stored the block. Every fetch takes
  a :class:`Ticket` before its call goes out; an invalidation names the blocks it
  drops and is numbered; :meth:`PromiseCache.install` refuses a block invalidated
  after the fetch's ticket was taken (the data is still returned to the caller: it
  was current when it was read; only keeping it would be wrong).
* **A node lost, or restarted.** Its promises are gone, and so is every promise a
  fetch in flight was about to rely on: :meth:`PromiseCache.invalidate_where` drops
  the blocks it names and refuses *every* install whose ticket is older, whatever
  block it is for (a fetch of a block not cached yet is exactly the one nobody
  would tell us about).
* **A node that forgot without a word** (restarted with no promise log). Promises
  lapse after :data:`PROMISE_LIFETIME_S`, as AFS's callbacks expire: a lapsed copy is
  *revalidated* (one small call that renews the promise and returns the block's
  timestamp) before it is used, and kept only if the timestamp is unchanged
  (:meth:`PromiseCache.renew`).

**The guard.** One sequence number, bumped by every invalidation. A ticket is the
number when it was taken; while any ticket is out, each invalidated block remembers
the number that dropped it (a *mark*), and an invalidation of everything remembers
its number once. An install is refused if its block's mark, or the everything-mark,
is newer than its ticket. Marks older than every ticket still out can stop nothing
and are forgotten, so the guard holds memory only for invalidations that overlap a
fetch in flight (this replaces two guards that disagreed: the cache object's
per-block epochs grew with every block ever invalidated, and the directory object's
sequence numbers did not cover a node lost or an invalidation of a whole key during
a fetch of a block it did not hold yet).

Timestamps order copies of one block: an install never replaces a newer copy (two
writes of the same holder answered out of order). The class is thread-safe; its
:attr:`~PromiseCache.lock` is reentrant, so an owner may hold it across several calls
and its own counters to make them one step.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, NewType, TypeVar

from shuttle.errors import InvalidArgumentError

#: How long a promise is trusted without a word from its node, as AFS's callbacks
#: expire: a copy older than this is revalidated (one small call) before it is used,
#: which bounds how long a cache can miss a restart of its node (the node forgets its
#: promises; it cannot call back what it forgot).
PROMISE_LIFETIME_S = 30.0
#: Marks kept while fetches are in flight before the oldest ones are pruned early:
#: past this many, marks older than every ticket still out are dropped at the next
#: ticket's end (a long-running fetch would otherwise let them pile up).
MARKS_PRUNE_AT = 4096

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


#: Taken before a fetch's call goes out: the invalidation number then (an int: every
#: read of a directory takes one, so it costs nothing to make).
Ticket = NewType("Ticket", int)


@dataclass
class Held(Generic[V]):
    """One copy: its value, the block's timestamp it was read at, when its promise
    lapses (the cache's clock)."""

    value: V
    ts: int
    expires: float


class PromiseCache(Generic[K, V]):
    """Copies by name (``K``), each under a callback promise; see the module doc.

    ``capacity``: most copies held (None: no limit); past it the least recently used
    go (their promises lapse harmlessly at the node). ``on_drop`` is called, lock
    held, with the name of every copy that goes for any reason, so an owner can keep
    the bytes elsewhere (the cache object keeps them in a shared LRU)."""

    def __init__(
        self,
        *,
        lifetime_s: float = PROMISE_LIFETIME_S,
        capacity: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_drop: Callable[[K], None] | None = None,
    ) -> None:
        if not lifetime_s > 0:
            raise InvalidArgumentError(f"lifetime_s must be > 0, got {lifetime_s!r}")
        if capacity is not None and capacity < 1:
            raise InvalidArgumentError(f"capacity must be ≥ 1 or None, got {capacity!r}")
        self.lifetime_s = lifetime_s
        self.capacity = capacity
        #: The clock promises lapse by (tests set a fake one).
        self.clock = clock
        self._on_drop = on_drop
        #: Reentrant: owners hold it across several calls to make them one step.
        self.lock = threading.RLock()
        self._held: OrderedDict[K, Held[V]] = OrderedDict()  # least recently used first
        self._seq = 0
        self._tickets: dict[int, int] = {}  # ticket -> fetches out with it
        self._marks: dict[K, int] = {}
        self._all_mark = 0

    # --- fetches ------------------------------------------------------------------------

    def begin(self) -> Ticket:
        """A ticket for a fetch about to go out; give it back with :meth:`end`."""
        with self.lock:
            seq = self._seq
            self._tickets[seq] = self._tickets.get(seq, 0) + 1
            return Ticket(seq)

    def end(self, ticket: Ticket) -> None:
        """The fetch is over (installed or not): forget what only it needed."""
        with self.lock:
            left = self._tickets[ticket] - 1
            if left > 0:
                self._tickets[ticket] = left
            else:
                del self._tickets[ticket]
            if not self._tickets:
                self._marks.clear()
            elif len(self._marks) > MARKS_PRUNE_AT:
                oldest = min(self._tickets)
                self._marks = {k: s for k, s in self._marks.items() if s > oldest}

    def fetching(self) -> _Fetching:
        """``with cache.fetching() as ticket:`` around a fetch and its install."""
        return _Fetching(self)

    def invalidated_since(self, ticket: Ticket, names: list[K]) -> bool:
        """Whether any of ``names`` (or everything) was invalidated after ``ticket``."""
        if not self._marks and self._all_mark <= ticket:
            return False  # the usual answer, without the lock (two atomic reads)
        with self.lock:
            return self._all_mark > ticket or any(
                self._marks.get(name, 0) > ticket for name in names
            )

    # --- copies -------------------------------------------------------------------------

    def look(self, name: K) -> tuple[Held[V] | None, bool]:
        """The copy of ``name`` held (None: a miss) and whether its promise is current
        (a hit: use it; else renew it first). A hit counts as a use for the LRU.

        The hit path of both objects: no lock unless there is an LRU to keep (a dict
        read is atomic; an owner that keeps the bytes elsewhere holds its own lock
        across this and their read, as the cache object does)."""
        held = self._held.get(name)
        if held is None:
            return None, False
        if self.clock() < held.expires:
            if self.capacity is not None:
                with self.lock:
                    if self._held.get(name) is held:
                        self._held.move_to_end(name)
            return held, True
        return held, False

    def get(self, name: K) -> Held[V] | None:
        """The copy of ``name`` held (lapsed or not), without counting a use."""
        with self.lock:
            return self._held.get(name)

    def install(self, name: K, value: V, ts: int, ticket: Ticket) -> bool:
        """Keep ``value`` (read at timestamp ``ts`` by the fetch holding ``ticket``)
        under a fresh promise. Refused (False) if a newer copy is held (that one
        stays), or if ``name``, or everything, was invalidated since the ticket: then
        this counts as an invalidation of ``name`` itself (the copy held goes, and
        fetches of it already out keep nothing). The fetch may be the holder's own
        write, which the node calls nobody back about, the writer included: neither
        the copy held before it nor a read of ours answered before it landed may
        outlive it, and an invalidation of everything need not have named them."""
        with self.lock:
            if self.invalidated_since(ticket, [name]):
                self.invalidate([name])
                return False
            old = self._held.get(name)
            if old is not None and old.ts >= ts:
                return False
            self._held[name] = Held(value, ts, self.clock() + self.lifetime_s)
            self._held.move_to_end(name)
            if self.capacity is not None:
                while len(self._held) > self.capacity:
                    self._pop(next(iter(self._held)))
            return True

    def keep(self, name: K, value: V, ts: int) -> None:
        """Hold a copy that came with a checkpoint (no fetch was out for it: the
        object was quiesced), under a fresh lifetime."""
        with self.lock:
            self._held[name] = Held(value, ts, self.clock() + self.lifetime_s)
            self._held.move_to_end(name)
            if self.capacity is not None:
                while len(self._held) > self.capacity:
                    self._pop(next(iter(self._held)))

    def renew(self, name: K, held: Held[V], ts_now: int) -> bool:
        """A lapsed copy's promise was renewed and the block's timestamp is ``ts_now``:
        keep the copy for another lifetime if it is still the one held and still at
        that timestamp; else drop it (False). (A callback since would have dropped
        it, and a copy installed since is another :class:`Held`.)"""
        with self.lock:
            if self._held.get(name) is not held:
                return False
            if held.ts != ts_now:
                self._pop(name)
                return False
            held.expires = self.clock() + self.lifetime_s
            self._held.move_to_end(name)
            return True

    def invalidate(self, names: list[K]) -> int:
        """Callbacks: ``names`` changed. Drop them, and refuse installs of them by
        fetches already out. Returns how many were held."""
        with self.lock:
            self._seq += 1
            dropped = 0
            for name in names:
                if self._tickets:
                    self._marks[name] = self._seq
                if name in self._held:
                    self._pop(name)
                    dropped += 1
            return dropped

    def invalidate_where(self, which: Callable[[K], bool] | None = None) -> int:
        """Promises were lost wholesale (a node lost or restarted): drop the copies
        ``which`` names (all with None) and refuse every install by a fetch already
        out, whatever it is for. Returns how many were dropped."""
        with self.lock:
            self._seq += 1
            if self._tickets:
                self._all_mark = self._seq
            names = [n for n in self._held if which is None or which(n)]
            for name in names:
                self._pop(name)
            return len(names)

    def drop(self, name: K) -> bool:
        """Forget ``name``'s copy (evicted elsewhere, or known stale without a
        callback); True if one was held. Fetches out are not affected."""
        with self.lock:
            if name not in self._held:
                return False
            self._pop(name)
            return True

    def clear(self) -> list[K]:
        """Forget every copy (the holder ends); the names that were held."""
        with self.lock:
            names = list(self._held)
            for name in names:
                self._pop(name)
            return names

    def items(self) -> list[tuple[K, Held[V]]]:
        """Every copy held, least recently used first."""
        with self.lock:
            return list(self._held.items())

    def names(self) -> list[K]:
        with self.lock:
            return list(self._held)

    def __len__(self) -> int:
        return len(self._held)

    def marks_held(self) -> int:
        """Per-block marks kept now (bounded: see the module doc)."""
        with self.lock:
            return len(self._marks)

    def _pop(self, name: K) -> None:
        del self._held[name]
        if self._on_drop is not None:
            self._on_drop(name)


class _Fetching:
    """:meth:`PromiseCache.fetching`'s context (a class: a generator-based one costs
    more than the hit it would guard)."""

    __slots__ = ("_cache", "_ticket")

    def __init__(self, cache: PromiseCache[Any, Any]) -> None:
        self._cache = cache
        self._ticket = Ticket(0)

    def __enter__(self) -> Ticket:
        self._ticket = self._cache.begin()
        return self._ticket

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cache.end(self._ticket)
