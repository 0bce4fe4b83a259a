"""Reads of the RADOS store: bytes of one version, through the node's block cache.

The version of an object lives in RADOS, and another gateway may change the object at
any time, so the cache holds, per key, the version its blocks are of and the size of
that version (an :class:`Entry`), and a read uses the blocks only of a version it
knows to be current. It knows that in one of two ways:

* *trusted* (no round trip): while the gateway's watch on the pool's channel is healthy
  (:mod:`shuttle.store.rados_watch`), every change of a key by any gateway is announced
  to this one, which drops the key (:meth:`VersionedReader.announced`) before the
  change is written. An entry that is still there is current. The node answers such a
  read on its event loop when the blocks are resident (:meth:`VersionedReader.read_cached`).
  When they are not, it starts the read from RADOS there and completes it there
  (:mod:`shuttle.store.rados_miss`, which uses :meth:`VersionedReader.trusted_entry`,
  :meth:`~VersionedReader.still_current` and :meth:`~VersionedReader.drop_older`).
* *validated*: otherwise (no healthy watch, or a new watch's probation) each read asks
  RADOS once: resident blocks are confirmed by a ``stat`` (one round trip, no data),
  blocks that are not resident are read with the version they are of (one round trip,
  never a stat and then a read). The first confirmation after a probation makes the
  entry trusted at once.

A key with nothing cached costs one round trip: the whole blocks around the range are
read, and the read reports the version it saw. Versions of a key only grow, which the
reader relies on three times: a cached version is only ever replaced by a newer one; a
read in several pieces is of one version when the version before and after it is the
same; and an announced *floor* (the version a change will exceed) keeps a read that
fetched the old version before the change from caching it after the announcement.

Counters (``stats()["rados"]``): ``validations`` (stats sent to confirm a cached
version), ``stat_free_hits`` (reads that trusted a cached version instead),
``inline_hits`` (of those, answered on the event loop), ``announced`` (announcements
heard) and ``cold_reads`` (the reads of the loop's misses count theirs in
:mod:`shuttle.store.rados_miss`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    VersionMismatchError,
)
from shuttle.store.cache import BlockCache
from shuttle.store.core import READ_BYTES_MAX, StoreConfig
from shuttle.store.keys import no_object
from shuttle.store.locks import KeyLocks, RWLock
from shuttle.store.rados_conn import PIPELINE_PIECE_BYTES, RadosConnection, read_pieces
from shuttle.store.rados_watch import PROBATION_S
from shuttle.store.stats import StoreCounters

#: Versions remembered for the block cache. When full, the cache is emptied with them.
CACHED_VERSIONS_MAX = 65536
#: Announced floors remembered. When full they are forgotten, as if announcements had
#: been missed: reads under way cache nothing (the generation moves on) and versions
#: read before the probation ends are not trusted (a change announced but not yet
#: written could otherwise be cached at its old version; rados_watch, step 4).
FLOORS_MAX = 65536
#: A cached version is trusted without a stat at most this long after RADOS reported it
#: (a bound on staleness should every other argument fail; rados_watch, step 5).
ENTRY_TRUST_S = 60.0
#: A validated read refreshes its entry's confirmation time at most this often.
RECONFIRM_S = 1.0


def small_read(k: object, offset: object, length: object, bytes_max: int) -> bool:
    """Whether a request is the shape the cache answers on the loop: a str key, an int
    offset from 0 and an int length in 1..``bytes_max`` (anything else takes the thread
    path, which words what is wrong)."""
    return (
        type(k) is str
        and type(length) is int
        and 0 < length <= bytes_max
        and type(offset) is int
        and offset >= 0
    )


class Raced(Exception):
    """The object changed between our look and our write (or read)."""


class Trust(Protocol):
    """When cached versions may be used without asking RADOS (rados_watch.Coherence)."""

    #: Versions RADOS reported before this monotonic time are not trusted.
    trust_from: float

    def trusted(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class Entry:
    """What the cache knows of one key: the version its blocks are of, and its size."""

    version: int
    #: The object's size, or (``exact`` False) a bound it is at least: the end of the
    #: whole blocks, or of the bytes, that a read found there.
    size: int
    exact: bool
    #: Monotonic time just before the RADOS operation that reported ``version``.
    confirmed_s: float


class VersionedReader:
    """The read path of one RADOS store (thread-safe)."""

    def __init__(
        self,
        conn: RadosConnection,
        cache: BlockCache,
        config: StoreConfig,
        counters: StoreCounters | None = None,
    ) -> None:
        self.conn = conn
        #: The store's counters (reads started on the loop count theirs in them too).
        self.counters = counters or StoreCounters()
        self.rados = conn.rados
        self.timeout_s = conn.op_timeout_s
        self.cache = cache
        self.config = config
        #: Set by the store once its watch exists; None: every cached read is validated.
        self.trust: Trust | None = None
        self._locks = KeyLocks()
        self._versions: dict[str, Entry] = {}  # key -> what its cached blocks are
        self._floors: dict[str, int] = {}  # key -> the least version it may cache
        self._versions_lock = threading.Lock()
        #: Grows when cached state is dropped wholesale: reads begun before cache nothing.
        self._generation = 0
        #: Grows with every drop (lock-free readers look at it before and after).
        self._epoch = 0
        #: Versions RADOS reported before this were read while floors were forgotten.
        self._trust_from = 0.0
        #: Reads started again because the object changed under them.
        self.races = 0
        self.validations = 0
        self.stat_free_hits = 0
        self.inline_hits = 0
        self.announcements = 0
        self.cold_reads = 0

    # --- what the cache knows --------------------------------------------------------

    def forget(self, k: str) -> None:
        """``k`` changed through this node: drop its cached blocks."""
        with self._locks.write(k):
            with self._versions_lock:
                self._epoch += 1
                self._versions.pop(k, None)
            self.cache.invalidate(k)

    def announced(self, k: str, floor: int) -> None:
        """Another gateway (or this one) is changing ``k`` to a version >= ``floor``:
        drop it, and cache no older version of it from now on. Runs on librados's
        watch callback before the announcement is acknowledged; takes no key lock, so
        a slow read of the key cannot hold it up. Blocks that a read under way still
        puts into the cache are never used: no entry vouches for them, and the next
        entry for the key (a newer version) drops them as it is made."""
        with self._versions_lock:
            self._epoch += 1
            self._versions.pop(k, None)
            if floor > self._floors.get(k, 0):
                if len(self._floors) >= FLOORS_MAX:
                    self._floors.clear()
                    self._generation += 1
                    self._trust_from = time.monotonic() + PROBATION_S
                self._floors[k] = floor
            self.announcements += 1
        self.cache.invalidate(k)

    def reset(self) -> None:
        """Announcements may have been missed: drop every entry, block and floor, and
        let no read under way cache what it read."""
        with self._versions_lock:
            self._epoch += 1
            self._generation += 1
            self._versions.clear()
            self._floors.clear()
        self.cache.clear()

    def clear(self) -> None:
        """Drop every entry and block (``drop_caches``); floors stay: announced changes
        may still be on their way."""
        with self._versions_lock:
            self._epoch += 1
            self._generation += 1
            self._versions.clear()
        self.cache.clear()

    def trusted_entry(self, k: str) -> Entry | None:
        """``k``'s entry if it may be used without asking RADOS (never blocks)."""
        trust = self.trust
        if trust is None or not trust.trusted():
            return None
        e = self._versions.get(k)
        if e is None or e.confirmed_s < trust.trust_from or e.confirmed_s < self._trust_from:
            return None
        if time.monotonic() - e.confirmed_s > ENTRY_TRUST_S:
            return None
        return e

    # --- reads -----------------------------------------------------------------------

    def size_version(self, k: str) -> tuple[int, int]:
        io = self.conn.ioctx()
        try:
            size, _mtime = io.stat(k)
        except self.rados.ObjectNotFound:
            raise no_object(k) from None
        return size, io.get_last_version()

    def read_cached(self, k: str, offset: int, length: int, expected: int | None) -> bytes | None:
        """A small read answered from trusted cached blocks alone, or None (a miss, no
        trust, anything unusual); never blocks, never raises (the node's event loop
        calls it). Keys are not validated: only valid keys ever get an entry.

        Why it is safe without the key's lock: every drop of an entry (an announcement,
        a change through this node, a reset) grows ``_epoch``, and every new entry is
        made under the key's lock held exclusively (its generation odd meanwhile). We
        read both, then the entry and the blocks, then both again: unchanged means the
        blocks were those of the entry when we read them, and the entry current (each
        step is atomic under the GIL, as in ObjectStore.read_cached)."""
        if not small_read(k, offset, length, self.config.cache_read_bytes_max):
            return None
        lock = self._locks.lock_for(k)
        generation, epoch = lock.generation, self._epoch
        e = self.trusted_entry(k)
        if generation & 1 or e is None or (expected is not None and expected != e.version):
            return None
        end = offset + length
        if e.exact:
            end = min(end, e.size)
        elif end > e.size:
            return None
        if offset >= end:
            return None
        data = self.cache.read_hit(k, offset, end)
        if data is None or lock.generation != generation or self._epoch != epoch:
            return None
        self.inline_hits += 1
        self.stat_free_hits += 1
        return data

    def lock_for(self, k: str) -> RWLock:
        """``k``'s lock: a read holds it shared, a change through this node exclusively."""
        return self._locks.lock_for(k)

    def entry(self, k: str) -> Entry | None:
        """``k``'s entry now, trusted or not (never blocks)."""
        return self._versions.get(k)

    def still_current(self, k: str, e: Entry, seen: Entry) -> bool:
        """Whether ``e``, the trusted entry a read of ``k`` began with, is still ``k``'s
        entry and of the version that read saw (``seen``): then the bytes it read may
        go into the cache. What ``seen`` tells more of that version (its size, a fresh
        confirmation) is merged into the entry, as :meth:`_record` merges it, without
        the key's write lock, which no merge needs. The caller holds the key's lock
        shared."""
        trust_from = self._trust_floor()
        with self._versions_lock:
            have = self._versions.get(k)
            current = have is not None and have.version == seen.version == e.version
            if current and have is not None and _newer_news(have, seen, trust_from):
                self._versions[k] = _merged(have, seen)
        return current

    def drop_older(self, k: str, version: int) -> None:
        """RADOS reported ``version`` of ``k``: drop its entry (and blocks) if older.
        Never waits for the key's lock (the event loop calls it), as an announcement."""
        with self._versions_lock:
            have = self._versions.get(k)
            if have is None or have.version >= version:
                return
            self._epoch += 1
            del self._versions[k]
        self.cache.invalidate(k)

    def read_once(
        self, k: str, offset: int, length: int | None, expected: int | None, use_cache: bool
    ) -> bytes:
        small = length is not None and length <= self.config.cache_read_bytes_max
        cached = small and use_cache and self.cache.capacity_bytes > 0
        if length is not None and length <= PIPELINE_PIECE_BYTES and not cached:
            # One round trip, of one version (one operation), which it reports: a
            # streaming client's 1 MiB pieces cost one RADOS read each, several in
            # flight at once on a RADOS node (net/admission.py, EXECUTING_MAX_RADOS).
            io = self.conn.ioctx()
            try:
                with self.conn.reading():
                    # bytes already (librados reads into a bytes object): no copy
                    data: bytes | None = io.read(k, length, offset) if length else None
            except self.rados.ObjectNotFound:
                raise no_object(k) from None
            if data is not None:
                check_version_number(k, int(io.get_last_version()), expected)
                return data
        generation = self._generation
        if cached and length:
            e = self.trusted_entry(k)
            if e is not None and (e.exact or offset + length <= e.size):
                check_version_number(k, e.version, expected)
                self.stat_free_hits += 1
                end = min(e.size, offset + length)
                if offset >= end:
                    return b""
                return self._cached(k, e, generation, offset, end - offset)
            if e is None:  # not trusted (no watch, probation): resident blocks, stat'ed
                data = self._validated_hit(k, offset, length, expected, generation)
                if data is not None:
                    return data
            # Nothing cached, past the size known, not resident, or changed: one read
            # of the blocks, which reports their version (never a stat and a read).
            return self._read_cold(k, offset, length, expected, generation)
        t0 = time.monotonic()
        size, version = self.size_version(k)
        self.validations += 1
        check_version_number(k, version, expected)
        end = size if length is None else min(size, offset + length)
        if end - offset > READ_BYTES_MAX:
            raise LimitExceededError(
                f"a read may return at most {READ_BYTES_MAX} bytes; asked for "
                f"{end - offset}. Read the object in pieces."
            )
        if offset >= end:
            return b""
        if cached:
            return self._cached(k, Entry(version, size, True, t0), generation, offset, end - offset)
        data = self.pipelined(k, offset, end - offset)
        if self.size_version(k)[1] != version:
            raise Raced  # versions only grow: equal before and after means one version
        return data

    def _validated_hit(
        self, k: str, offset: int, length: int, expected: int | None, generation: int
    ) -> bytes | None:
        """A small read of resident blocks while the cache is not trusted: the blocks,
        then a ``stat`` (one round trip, no data) that confirms their version is still
        the current one, or None (not all resident, or the object changed: the caller
        reads it from RADOS). Versions only grow, so the version RADOS reported for the
        entry and again now was current all the time between: the blocks were current
        when the stat answered. The confirmation is recorded, so that a read after the
        probation trusts the entry at once (``_newer_news``)."""
        lock = self._locks.lock_for(k)
        lock_generation, epoch = lock.generation, self._epoch
        have = self._versions.get(k)
        if lock_generation & 1 or have is None:
            return None
        end = offset + length
        if have.exact:
            end = min(end, have.size)
        elif end > have.size:
            return None
        if offset >= end:
            return None
        data = self.cache.read_hit(k, offset, end)
        if data is None or lock.generation != lock_generation or self._epoch != epoch:
            return None  # not resident, or dropped meanwhile: the blocks may be older
        t0 = time.monotonic()
        size, version = self.size_version(k)
        self.validations += 1
        check_version_number(k, version, expected)
        if version != have.version:
            return None  # changed since it was cached: read the new version
        self._record(k, Entry(version, size, True, t0), generation)
        return data

    def _read_cold(
        self, k: str, offset: int, length: int, expected: int | None, generation: int
    ) -> bytes:
        """A small read of a key with nothing cached (or past the size its entry knows):
        one round trip (the whole blocks around the range, and the version they are
        of), then into the cache."""
        bsz = self.cache.block_size_bytes
        start = offset - offset % bsz
        stop = -(-(offset + length) // bsz) * bsz
        io = self.conn.ioctx()
        t0 = time.monotonic()
        try:
            data = bytes(io.read(k, stop - start, start))
        except self.rados.ObjectNotFound:
            raise no_object(k) from None
        self.cold_reads += 1
        version = int(io.get_last_version())
        check_version_number(k, version, expected)
        # A short read ends at the object's end; a full one shows whole blocks up to stop.
        size = start + len(data)
        exact = len(data) < stop - start
        end = min(size, offset + length)
        if offset >= end:
            return b""

        def fetch(a: int, b: int) -> bytes:
            if start <= a and b <= size:
                return data[a - start : b - start]
            return self.pipelined(k, a, b - a, version)

        entry = Entry(version, size, exact, t0)
        return self._cached(k, entry, generation, offset, end - offset, fetch)

    def _cached(
        self,
        k: str,
        seen: Entry,
        generation: int,
        offset: int,
        n: int,
        fetch: Callable[[int, int], bytes] | None = None,
    ) -> bytes:
        """Cached blocks of version ``seen.version`` only (a key's versions only grow),
        after recording what RADOS reported (``seen``) unless an announcement or a
        reset since ``generation`` says it may be out of date already."""
        self._record(k, seen, generation)
        with self._locks.read(k):
            with self._versions_lock:
                have = self._versions.get(k)
                current = have is not None and have.version == seen.version
            if current:
                fetch = fetch or self._fetcher(k, seen.version)
                return self.cache.read(k, offset, n, seen.size, fetch)
        return self.pipelined(k, offset, n, seen.version)  # not the cached version

    def _record(self, k: str, seen: Entry, generation: int) -> None:
        """Record what RADOS reported of ``k`` (``seen``): a newer version replaces the
        entry (and drops its blocks); the same version updates it when it tells more
        (``_newer_news``). Nothing is recorded if an announcement or a reset since
        ``generation`` says it may be out of date already."""
        trust_from = self._trust_floor()
        with self._versions_lock:
            have = self._versions.get(k)
        if have is None or have.version < seen.version or _newer_news(have, seen, trust_from):
            with self._locks.write(k), self._versions_lock:
                have = self._versions.get(k)
                fresh = generation == self._generation and seen.version >= self._floors.get(k, 0)
                if fresh and (have is None or have.version < seen.version):
                    if len(self._versions) >= CACHED_VERSIONS_MAX:
                        self._versions.clear()
                        self.cache.clear()
                    self._versions[k] = seen
                    self.cache.invalidate(k)  # blocks of an older version
                elif fresh and have is not None and _newer_news(have, seen, trust_from):
                    self._versions[k] = _merged(have, seen)

    def _trust_floor(self) -> float:
        """Versions RADOS reported before this monotonic time are not trusted (a new
        watch's probation, or floors forgotten); +inf while no watch is registered."""
        trust = self.trust
        return max(trust.trust_from if trust is not None else 0.0, self._trust_from)

    def _fetcher(self, k: str, version: int) -> Callable[[int, int], bytes]:
        def fetch(start: int, stop: int) -> bytes:
            return self.pipelined(k, start, stop - start, version)

        return fetch

    def pipelined(self, k: str, offset: int, n: int, version: int | None = None) -> bytes:
        """``n`` bytes at ``offset`` (fewer at the end), in aio pieces read in parallel.
        With ``version``: raises _Raced unless a one-piece read saw exactly it."""
        io = self.conn.ioctx()
        if n <= PIPELINE_PIECE_BYTES:
            try:
                data = io.read(k, n, offset)
            except self.rados.ObjectNotFound:
                raise no_object(k) from None
            if version is not None:
                seen = int(io.get_last_version())
                if seen != version:
                    # A newer version than the entry's (written with librados directly,
                    # unannounced): drop the entry, so the next try reads it cold instead
                    # of racing the same stale entry until it gives up.
                    self.drop_older(k, seen)
                    raise Raced
            return bytes(data)
        data = read_pieces(io, k, offset, n, self.timeout_s)
        if version is not None:
            now = self.size_version(k)[1]
            if now != version:  # versions only grow: equal after means one version
                self.drop_older(k, now)
                raise Raced
        return data

    def stats(self) -> dict[str, int]:
        return {
            "validations": self.validations,
            "stat_free_hits": self.stat_free_hits,
            "inline_hits": self.inline_hits,
            "announced": self.announcements,
            "cold_reads": self.cold_reads,
        }


def _newer_news(have: Entry, seen: Entry, trust_from: float) -> bool:
    """``seen`` (of the same version) tells more than ``have``: the exact size, a
    confirmation :data:`RECONFIRM_S` later (not every one: each costs the key's lock),
    or the first confirmation since ``trust_from`` of an entry confirmed before it
    (during a probation): from then on the entry is trusted, and its reads ask RADOS
    nothing, at once rather than up to RECONFIRM_S after the probation ended."""
    return have.version == seen.version and (
        seen.confirmed_s > have.confirmed_s + RECONFIRM_S
        or have.confirmed_s < trust_from <= seen.confirmed_s
        or (not have.exact and (seen.exact or seen.size > have.size))
    )


def _merged(have: Entry, seen: Entry) -> Entry:
    exact = have.exact or seen.exact
    size = (have.size if have.exact else seen.size) if exact else max(have.size, seen.size)
    return Entry(have.version, size, exact, max(have.confirmed_s, seen.confirmed_s))


def check_version_number(k: str, have: int, expected: int | None) -> None:
    """VersionMismatchError unless ``expected`` is None or ``have`` (0: missing)."""
    if expected is None:
        return
    if expected < 0:
        raise InvalidArgumentError(f'"expected_version" must be >= 0, got {expected}')
    if have != expected:
        state = "does not exist" if have == 0 else f"is at version {have}"
        want = "not to exist" if expected == 0 else f"version {expected}"
        raise VersionMismatchError(
            f"{k!r} {state}, but the caller expected {want}. Stat it and retry "
            "with the current version."
        )
