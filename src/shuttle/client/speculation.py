"""Speculative remote read: run the program on the cached copy while the check is out.

Yi's speculative remote read (``../shared/papers/speculative-remote-read.txt``):
:meth:`Speculator.speculate` runs ``work(data, checkpoint)`` on the cached copy of an
object at once, as an optimistic branch (:mod:`shuttle.client.branches`), while the
calling thread, the pessimistic branch, asks the node for the object's version. The
branch may not pass its next checkpoint (a ``checkpoint()`` call, or its return)
until the check confirms the copy. If the copy was stale the branch is killed, the
pessimistic branch fetches the object and runs ``work`` again, from the checkpoint,
on the fresh bytes. ``work`` is never re-run after it passed a checkpoint, and its
result is always that of a run on data that was current when the check reached the
node.

Mechanisms: ``thread`` (cheap; the program supplies ``save``/``restore`` for what
``work`` mutates before its checkpoint), ``fork`` (transparent; ``work``'s effect is
its return value), ``none`` (a normal read: check, then fetch if stale, then work),
and ``auto``, which measures T_c, T_r, p and each mechanism's T_f as it goes and
speculates only when T_f < (1 − p)·T_c (:mod:`shuttle.client.speculation_costs`).

The cached copy is the client cache's (:class:`~shuttle.client.cache.ClientCache`): the
object's blocks at the version this engine last validated. An object with no whole
copy cached is read normally.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from shuttle.client.branches import Branch, ForkBranch, ThreadBranch, Work, reap_all
from shuttle.client.model import ObjectInfo
from shuttle.client.speculation_costs import MECHANISMS, CostModel
from shuttle.errors import InvalidArgumentError

if TYPE_CHECKING:
    from shuttle.client.client import Client

T = TypeVar("T")
S = TypeVar("S")
Mechanism = Literal["auto", "thread", "fork", "none"]
#: Every mechanism :meth:`Speculator.speculate` takes.
MECHANISM_CHOICES: tuple[str, ...] = ("auto", *MECHANISMS, "none")
#: ``auto`` re-measures the T_f of every mechanism it may use once per this many
#: decisions (a trivial branch: ~0.1 ms for a thread, a few ms for a fork), so an
#: estimate left over from a quieter machine does not decide forever.
PROBE_EVERY = 64
#: Threads that run version checks for speculative opens (each has its own connection).
CHECK_THREADS = 4


class _NotCached(Exception):
    """A block of the cached copy is gone (evicted): there is no whole copy to run on."""


def _refuse(start: int, end: int) -> bytes:
    raise _NotCached


def _no_checkpoint() -> None:
    """The checkpoint of a run on data just validated: nothing to wait for."""


@dataclass
class SpeculationCounters:
    """What speculation did: the counters ``client.counters()`` reports."""

    calls: int = 0
    #: Reads with no whole cached copy (read normally, whatever the mechanism).
    no_copy: int = 0
    #: Normal reads of a cached copy (mechanism ``none``, or ``auto`` deciding so).
    normal: int = 0
    speculated: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MECHANISMS, 0))
    #: Speculations whose copy the check confirmed, and those it found stale (re-run).
    confirmed: int = 0
    stale: int = 0
    auto_speculated: int = 0
    auto_normal: int = 0
    probes: int = 0
    #: Speculative opens (the ``speculative`` validation mode) and how their checks ended.
    opens_checked: int = 0
    opens_stale: int = 0


class Speculator:
    """The speculation engine of one client (``client.speculate`` delegates here)."""

    def __init__(
        self,
        client: Client,
        *,
        auto_mechanisms: Iterable[str] = MECHANISMS,
        probe_every: int = PROBE_EVERY,
    ) -> None:
        self.client = client
        #: The mechanisms ``auto`` may choose from (drop ``fork`` where forking is unsafe).
        self.auto_mechanisms = tuple(auto_mechanisms)
        unknown = set(self.auto_mechanisms) - set(MECHANISMS)
        if unknown:
            raise InvalidArgumentError(
                f"auto_mechanisms: no mechanism {sorted(unknown)}; choose from {MECHANISMS}"
            )
        self.probe_every = probe_every
        self.costs = CostModel()
        self.counters = SpeculationCounters()
        self._known: dict[str, ObjectInfo] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._auto_calls = 0
        #: Mechanisms ``auto`` used since its last re-measuring, and checks since the
        #: last timed one.
        self._used_since_due: set[str] = set()
        self._untimed_checks = 0

    # --- the cached copy ------------------------------------------------------------

    def cached_info(self, key: str) -> ObjectInfo | None:
        """The attributes of the copy of ``key`` the client cache holds blocks of (at
        the version this engine validated last), or None."""
        info = self._known.get(key)
        if info is None or self.client.cache.version(key) != info.version:
            return None
        return info

    def cached_copy(self, key: str) -> tuple[ObjectInfo, bytes] | None:
        """The whole cached copy of ``key`` and its attributes, without a round trip
        (None if nothing, or not all of it, is cached)."""
        info = self.cached_info(key)
        if info is None or not self.client.cache.enabled:
            return None
        try:
            data = self.client.cache.read(info, 0, info.size, _refuse)
        except _NotCached:
            return None
        if self.client.cache.version(key) != info.version:  # replaced while we read
            return None
        return info, data

    def remember(self, info: ObjectInfo) -> bool:
        """Validate the client cache against ``info`` (just had from the node) and
        remember it as the copy's version; returns whether the cached blocks held."""
        valid = self.client.cache.validate(info)
        self._known[info.key] = info
        return valid

    def forget(self, key: str) -> None:
        self._known.pop(key, None)

    def fetch(self, info: ObjectInfo) -> bytes:
        """The whole object at ``info``'s version, through the client cache (blocks
        pinned to that version: a change meanwhile is a ``VersionMismatchError``)."""
        t0 = time.perf_counter()
        client = self.client
        if client.cache.enabled:
            node = client.node_for(info.key)

            def fetch(start: int, stop: int) -> bytes:
                args = {
                    "key": info.key,
                    "offset": start,
                    "length": stop - start,
                    "expected_version": info.version,
                }
                return bytes(client.call(node, "read", args).payload)

            data = client.cache.read(info, 0, info.size, fetch)
        else:
            data = b"".join(client.iter_read(info.key, info=info))
        with self._lock:
            self.costs.fetch(time.perf_counter() - t0)
        return data

    def check(
        self, key: str, cached: ObjectInfo | None, *, timed: bool = True
    ) -> tuple[ObjectInfo, bool]:
        """Ask the node for ``key``'s attributes; returns them and whether the copy
        at ``cached`` was stale (counted into p; timed into T_c if ``timed``: a check
        made beside a thread branch waits for the interpreter the branch holds, so it
        says little of what a normal read's check costs)."""
        t0 = time.perf_counter()
        info = self.client.stat(key)
        stale = None if cached is None else info.version != cached.version
        with self._lock:
            if timed:
                self.costs.check(time.perf_counter() - t0, stale=stale)
                self._untimed_checks = 0
            else:
                self._untimed_checks += 1
                if stale is not None:
                    self.costs.p.add(1.0 if stale else 0.0)
        return info, bool(stale)

    # --- speculate --------------------------------------------------------------------

    def speculate(
        self,
        key: str,
        work: Work[T],
        *,
        mechanism: str = "auto",
        save: Callable[[], S] | None = None,
        restore: Callable[[S], None] | None = None,
    ) -> T:
        """``work(data, checkpoint)`` on ``key``'s bytes, speculatively (module docstring).

        Returns ``work``'s value from a run on data that was current when the check
        reached the node. Raises what ``work`` raised on such data; the check's errors
        (``NotFoundError``, ``UnreachableError``...) after stopping the branch;
        :class:`SpeculationError` if a forked branch could not return its result.
        ``save()`` runs before a thread branch starts and ``restore(saved)`` after
        a stale one has stopped, before ``work`` runs again.
        """
        if mechanism not in MECHANISM_CHOICES:
            raise InvalidArgumentError(
                f"mechanism must be one of {', '.join(MECHANISM_CHOICES)}, not {mechanism!r}"
            )
        with self._lock:
            self.counters.calls += 1
        copy = self.cached_copy(key)
        if copy is None:
            with self._lock:
                self.counters.no_copy += 1
            info, _ = self.check(key, None)
            self.remember(info)
            return work(self.fetch(info), _no_checkpoint)
        chosen = self._choose() if mechanism == "auto" else mechanism
        if chosen == "none":
            with self._lock:
                self.counters.normal += 1
            return self._normal(key, work, *copy)
        return self._speculate(key, work, chosen, copy, save, restore)

    def _normal(self, key: str, work: Work[T], cached: ObjectInfo, data: bytes) -> T:
        t0 = time.perf_counter()
        info, stale = self.check(key, cached)
        if stale:
            self.remember(info)
            data = self.fetch(info)
        return self._timed(work, data, "none", t0)

    def _timed(self, work: Work[T], data: bytes, how: str, t0: float) -> T:
        """``work`` on data just validated; what the read added beyond it (the time
        since ``t0`` less the work's) is observed as ``how``'s T1 or T2."""
        tw = time.perf_counter()
        value = work(data, _no_checkpoint)
        end = time.perf_counter()
        with self._lock:
            self.costs.observe(how, (end - t0) - (end - tw))
        return value

    def _start(self, mechanism: str, work: Work[T], data: bytes) -> Branch[T]:
        if mechanism == "fork":
            return ForkBranch(work, data, self.client.after_fork_in_child)
        return ThreadBranch(work, data)

    def _speculate(
        self,
        key: str,
        work: Work[T],
        mechanism: str,
        copy: tuple[ObjectInfo, bytes],
        save: Callable[[], S] | None,
        restore: Callable[[S], None] | None,
    ) -> T:
        cached, data = copy
        t0 = time.perf_counter()
        saved = save() if save is not None and mechanism == "thread" else None
        branch = self._start(mechanism, work, data)
        with self._lock:
            self.counters.speculated[mechanism] += 1
        try:
            info, stale = self.check(key, cached, timed=mechanism != "thread")
        except BaseException:
            branch.kill()
            branch.wait_stopped()
            raise
        if not stale:
            branch.confirm()
            try:
                return branch.result()
            finally:
                # What the read added to the caller's time beyond work itself: T2 as
                # measured; less the waits at checkpoints (the check showing), T_f.
                excess_s = max(0.0, time.perf_counter() - t0 - branch.work_s)
                with self._lock:
                    self.counters.confirmed += 1
                    self.costs.branch(mechanism, max(0.0, excess_s - branch.wait_s))
                    self.costs.observe(mechanism, excess_s)
        branch.kill()
        with self._lock:
            self.counters.stale += 1
        try:
            self.remember(info)
            fresh = self.fetch(info)
        finally:
            if restore is not None:
                branch.wait_stopped()  # before restore puts back what it mutated
        if restore is not None and mechanism == "thread":
            restore(saved)  # type: ignore[arg-type]
        return self._timed(work, fresh, mechanism, t0)

    # --- auto -------------------------------------------------------------------------

    def _choose(self) -> str:
        """The way ``auto`` reads now. Every ``probe_every`` choices it re-measures
        the T_f of mechanisms it has not used since (a trivial branch), forgets the
        measured T2s (so a mechanism found slower is tried again under today's
        conditions), and reads normally once if most checks since were not timed
        (made beside thread branches), to keep T_c measured."""
        with self._lock:
            self._auto_calls += 1
            due = self._auto_calls % self.probe_every == 0
            to_probe = self.costs.unmeasured(self.auto_mechanisms)
            refresh_tc = False
            if due:
                to_probe += [
                    m
                    for m in self.auto_mechanisms
                    if m not in self._used_since_due and m not in to_probe
                ]
                self._used_since_due.clear()
                self.costs.forget_observed()
                refresh_tc = self._untimed_checks >= self.probe_every // 2
        for mechanism in to_probe:
            self.probe(mechanism)
        with self._lock:
            chosen = "none" if refresh_tc else self.costs.choose(self.auto_mechanisms)
            if chosen == "none":
                self.counters.auto_normal += 1
            else:
                self.counters.auto_speculated += 1
                self._used_since_due.add(chosen)
        return chosen

    def probe(self, mechanism: str) -> float:
        """Measure ``mechanism``'s T_f with a branch that does nothing; returns it."""
        t0 = time.perf_counter()
        branch: Branch[None] = self._start(mechanism, lambda data, checkpoint: None, b"")
        branch.confirm()
        branch.result()
        tf_s = time.perf_counter() - t0
        with self._lock:
            self.counters.probes += 1
            self.costs.branch(mechanism, tf_s)
        return tf_s

    # --- checks in the background (the speculative validation mode) ------------------------

    def check_async(self, key: str, cached: ObjectInfo) -> Future[tuple[ObjectInfo, bool]]:
        """Start a check of the copy at ``cached`` on a pool thread; the future gives
        the node's attributes and whether the copy was stale. A stale copy stays in
        the cache for the files open on it (each reads one consistent version until
        its checkpoint); the next open checks first and drops it."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="shuttle-check")
            pool = self._pool

        def run() -> tuple[ObjectInfo, bool]:
            info, stale = self.check(key, cached)
            with self._lock:
                self.counters.opens_checked += 1
                self.counters.opens_stale += int(stale)
            if stale:  # the next open checks first; files open on the copy keep it
                self._known[key] = info
            return info, stale

        return pool.submit(run)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        reap_all()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**asdict(self.counters), "estimates": self.costs.as_dict()}
