"""Cache coherence between the gateways of one RADOS pool and namespace: watch/notify,
so that a read of a cached block needs no RADOS ``stat`` to know it is current.

Every gateway (every :class:`~shuttle.store.rados.RadosStore` on the pool and
namespace) *watches* one channel object, :data:`CHANNEL_OBJECT`. A change of an
existing key first *announces* itself on the channel (a RADOS notify carrying the key
and a *floor*: the version before the change plus one) and is written only once every
watcher has acknowledged the announcement. A watcher's callback drops the key's cached
blocks and remembers the floor before it acknowledges; from then on it caches no
version of the key below the floor (:mod:`shuttle.store.rados_read`). A gateway trusts
its cache without asking RADOS only while its watch is known to be registered on the
OSD (:meth:`Coherence.trusted`); otherwise every cached read is confirmed by a ``stat``
as before. The argument, step by step (docs/ceph.md, "Coherence between gateways"):

1. *Which gateways hear an announcement.* The OSD delivers a notify to every watch it
   has registered on the channel and completes it when all have acknowledged, or with
   ETIMEDOUT after :data:`NOTIFY_TIMEOUT_S`. The OSD drops a watch whose client has not
   pinged it for :data:`WATCH_TIMEOUT_S` (librados pings every
   ``objecter_tick_interval``, which the connection sets to 1 s). A gateway trusts its
   cache only while librados's ``watch_check`` says the OSD confirmed the watch less
   than :data:`PING_AGE_MAX_S` ago: the watch is then still registered for at least
   ``WATCH_TIMEOUT_S - PING_AGE_MAX_S`` (2 s of margin for clocks and scheduling), so
   any announcement the OSD processes meanwhile reaches it.
2. *A writer commits only after a complete announcement.* An announcement that times
   out (a watcher is slow, or dead but not yet dropped) is sent again until one
   completes, for at most :data:`ANNOUNCE_DEADLINE_S` (a dead gateway's watch is
   dropped within ``WATCH_TIMEOUT_S``); past it the change fails with nothing changed.
   If the channel's placement group is not active (a stat of it times out too), the
   change fails at once, with nothing changed. A timed-out
   announcement is never taken as done: the laggard may still trust its cache.
3. *A watcher that heard it cannot cache the old version again.* Its callback drops the
   key and raises the key's floor before acknowledging; a read that fetched the old
   version before the commit (and finishes after the callback) may still return it, as
   the read overlapped the change, but cannot cache it (its version is below the
   floor). The new version is above the floor.
4. *A watch that broke missed announcements.* On the watch's error callback (the OSD
   dropped it, the connection reset) or a failing ``watch_check``, the gateway stops
   trusting at once, registers a new watch, and empties its whole cache. An
   announcement the new watch missed (processed just before it registered) belongs to
   a change that may still commit, so the gateway trusts nothing it read before
   :data:`PROBATION_S` after registering: a writer's announcement completes within
   ``NOTIFY_TIMEOUT_S`` and the writer's commit returns within :data:`COMMIT_WINDOW_S`
   of that, or the writer announces again after its commit, which the new watch hears.
5. *Bounded even if all else fails.* A cached version is trusted without a stat for at
   most ``rados_read.ENTRY_TRUST_S`` after RADOS last reported it.

What step 5 is for: a change whose commit failed at the writer with a timeout (so it
was not acknowledged: "may or may not have been applied") can still be applied by the
OSD later, after a new watch's probation; a gateway that began watching during its
announcement may then serve the old version until step 5 ends.

What it costs: a change of an existing key waits one notify round trip (0.9-1.1 ms on
the local test Ceph with one to three gateways); a creation announces nothing (no
gateway has a trusted version of a missing key: the removal that made it missing
announced itself). A gateway killed
without closing leaves its watch on the OSD for up to ``WATCH_TIMEOUT_S``; changes
through the others wait that long meanwhile. A change whose announcement cannot
complete in ``ANNOUNCE_DEADLINE_S`` fails with StorageIOError and changes nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import math
import threading
import time
from typing import Any, Protocol

from shuttle.errors import StorageIOError
from shuttle.store.rados_conn import RadosConnection, error_errno, timed_out_message

log = logging.getLogger(__name__)

#: The object every gateway of a namespace watches (an invalid key: no object clashes).
CHANNEL_OBJECT = ".shuttle/watch"

#: Seconds the OSD keeps a watch whose client stopped pinging (Ceph's default is 30;
#: librados pings every second here, see rados_conn). Also how long a killed gateway
#: delays the changes of the others.
WATCH_TIMEOUT_S = 5
#: A gateway trusts its cache only while the OSD confirmed its watch this recently:
#: the OSD keeps the watch ``WATCH_TIMEOUT_S`` after that, leaving a 2 s margin.
PING_AGE_MAX_S = 3.0
#: Seconds a notify waits for every watcher's acknowledgement (whole seconds: the OSD
#: rounds down, and 0 would mean its 30 s default).
NOTIFY_TIMEOUT_S = 2
#: A change gives up announcing after this long: by then a dead gateway's watch is gone.
ANNOUNCE_DEADLINE_S = WATCH_TIMEOUT_S + 3 * NOTIFY_TIMEOUT_S
#: A commit returning later than this after its announcement is announced again.
COMMIT_WINDOW_S = 1.0
#: After a new watch registers, versions read earlier than this are not trusted.
PROBATION_S = NOTIFY_TIMEOUT_S + COMMIT_WINDOW_S + 1.0
#: How often the gateway looks at its watch (and re-registers a broken one).
CHECK_INTERVAL_S = 0.25


class CacheKeeper(Protocol):
    """What the channel tells the cache (rados_read's VersionedReader)."""

    def announced(self, key: str, floor: int) -> None:
        """``key`` is changing to a version >= ``floor``: drop it, cache nothing older."""
        ...

    def reset(self) -> None:
        """Announcements may have been missed: drop everything."""
        ...


class Coherence:
    """One gateway's end of the channel: its watch, its trust, its announcements."""

    def __init__(self, conn: RadosConnection, keeper: CacheKeeper) -> None:
        self.conn = conn
        self.rados = conn.rados
        self.keeper = keeper
        self._io: Any = None
        self._watch: Any = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._broken = True
        #: The cache is trusted until this monotonic time (0: not trusted).
        self._trusted_until = 0.0
        #: Versions RADOS reported before this monotonic time are not trusted.
        self.trust_from = float("inf")
        self.watch_resets = 0
        self.watch_errors = 0
        self.announces = 0
        self.announce_timeouts = 0
        self.announces_after_commit = 0
        self.notifies_received = 0
        self._thread = threading.Thread(target=self._run, name="rados-watch", daemon=True)

    def start(self) -> None:
        """Start the watcher thread, which registers the watch (opening a store does not
        wait on RADOS: until the watch is registered, every cached read is confirmed)."""
        self._thread.start()

    def trusted(self) -> bool:
        """True while cached versions may be used without asking RADOS (never blocks)."""
        return time.monotonic() < self._trusted_until

    # --- the watch ---------------------------------------------------------------------

    def _establish(self) -> None:
        with self._lock:
            self._trusted_until = 0.0
            old, self._watch = self._watch, None
        if old is not None:
            self._close_watch(old)
        if self._io is None:
            io = self.conn.cluster.open_ioctx(self.conn.pool)
            io.set_namespace(self.conn.namespace)
            self._io = io
        ensure_channel(self.rados, self._io)
        with self._lock:
            self._broken = False  # an error from here on is this watch's
        watch = self._io.watch(CHANNEL_OBJECT, self._on_notify, self._on_error, WATCH_TIMEOUT_S)
        # Announcements before this point may be missed: forget everything read so far.
        self.trust_from = time.monotonic() + PROBATION_S
        self.keeper.reset()
        with self._lock:
            self._watch = watch
            self.watch_resets += 1

    def break_watch(self) -> None:
        """Unregister the watch as a failure would (tests; the watcher thread repairs)."""
        with self._lock:
            watch, self._watch = self._watch, None
            self._trusted_until = 0.0
        if watch is not None:
            self._close_watch(watch)

    def _look(self) -> None:
        """Trust the cache while the OSD confirmed the watch recently; repair it if not."""
        with self._lock:
            watch, broken = self._watch, self._broken
        if watch is None or broken:
            self._establish()
            return
        now = time.monotonic()
        try:
            age = watch.check().total_seconds()
        except self.rados.Error:
            self._mark_broken()
            self._establish()
            return
        with self._lock:
            if self._watch is watch and not self._broken:
                self._trusted_until = now - age + PING_AGE_MAX_S

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._look()
            except self.rados.Error as exc:  # stat-validated reads meanwhile; try again
                log.debug("RADOS watch on %s not established: %s", CHANNEL_OBJECT, exc)
            except Exception:  # a bug: keep watching (trust lapses by itself meanwhile)
                log.exception("RADOS watch check failed")
            self._wake.wait(CHECK_INTERVAL_S)
            self._wake.clear()

    def _on_error(self, watch_id: int, err: int) -> None:
        """librados: the watch failed (the OSD dropped it, the connection reset)."""
        log.info("RADOS watch on %s failed (error %s): watching again", CHANNEL_OBJECT, err)
        self._mark_broken()

    def _mark_broken(self) -> None:
        with self._lock:
            self._trusted_until = 0.0
            self._broken = True
            self.watch_errors += 1
        self._wake.set()

    def _on_notify(self, notify_id: int, notifier_id: int, watch_id: int, data: bytes) -> None:
        """An announcement: drop the key before librados acknowledges (when we return)."""
        self.notifies_received += 1
        try:
            kind, floor, key = bytes(data).decode().split(":", 2)
            if kind != "k":
                raise ValueError(kind)
            self.keeper.announced(key, int(floor))
        except Exception:
            self.keeper.reset()  # not ours to read: forget everything rather than guess

    # --- announcements -------------------------------------------------------------------

    def announce(self, key: str, floor: int) -> float:
        """Tell every watching gateway that ``key`` changes to a version >= ``floor``;
        returns (monotonic time) once all acknowledged. Raises StorageIOError, with
        nothing changed, when that cannot happen within :data:`ANNOUNCE_DEADLINE_S`."""
        deadline = time.monotonic() + ANNOUNCE_DEADLINE_S
        msg = f"k:{floor}:{key}"
        while True:
            code = self._notify(msg)
            if code == -110:
                self._check_channel_answers(key)
            if code == 0:
                with self._lock:
                    self.announces += 1
                return time.monotonic()
            if code in (-2, 2):  # the channel is gone (someone removed it): make it again
                ensure_channel(self.rados, self.conn.ioctx())
            else:
                with self._lock:
                    self.announce_timeouts += 1
            if time.monotonic() >= deadline:
                raise StorageIOError(
                    f"could not tell the other gateways that {key!r} changes (their watch "
                    f"did not acknowledge within {ANNOUNCE_DEADLINE_S:g} s, error {code}); "
                    "nothing was changed. Check `ceph -s` and the other gateways, then retry"
                )

    def committed(self, key: str, version: int, announced_s: float) -> None:
        """After a commit: announce again if it came late (see the module docstring)."""
        if time.monotonic() - announced_s > COMMIT_WINDOW_S:
            with self._lock:
                self.announces_after_commit += 1
            try:
                self.announce(key, version)
            except StorageIOError as exc:
                raise StorageIOError(
                    f"{key!r} was changed (version {version}), but its commit was slow and "
                    "announcing it again failed: a gateway that began watching in the last "
                    "few seconds may serve the previous contents (for at most "
                    "rados_read.ENTRY_TRUST_S). Check `ceph -s` and the other gateways"
                ) from exc

    def _check_channel_answers(self, key: str) -> None:
        """After a timed-out announcement: a late watcher is worth waiting for, a
        placement group that is not active is not (no other operation on the pool would
        get through either). A stat of the channel tells which; fail like any operation
        that RADOS did not answer."""
        try:
            self.conn.ioctx().stat(CHANNEL_OBJECT)
        except self.rados.Error as exc:
            if error_errno(exc) == errno.ETIMEDOUT:
                raise StorageIOError(
                    timed_out_message(f"announcing a change of {key!r}", self.conn.op_timeout_s)
                    + " (nothing was changed)"
                ) from exc

    def _notify(self, msg: str) -> int:
        """One notify on the channel; its result (0, or a negative errno), bounded."""
        done = threading.Event()
        result: list[int] = []

        def oncomplete(completion: Any, rv: int, acks: Any, timeouts: Any) -> None:
            result.append(int(rv))
            done.set()

        io = self.conn.ioctx()
        io.aio_notify(CHANNEL_OBJECT, oncomplete, msg=msg, timeout_ms=NOTIFY_TIMEOUT_S * 1000)
        # librados fails the notify after the op timeout if the channel's PG is not
        # active; the margin covers the callback.
        if not done.wait(self.conn.op_timeout_s + NOTIFY_TIMEOUT_S + 5):
            return -110
        return result[0]

    # --- the rest ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            watch = self._watch
            out: dict[str, Any] = {
                "trusted": self.trusted(),
                "watch_resets": self.watch_resets,
                "watch_errors": self.watch_errors,
                "announces": self.announces,
                "announce_timeouts": self.announce_timeouts,
                "announces_after_commit": self.announces_after_commit,
                "notifies_received": self.notifies_received,
            }
        age: float | None = None
        if watch is not None:
            with contextlib.suppress(self.rados.Error):
                age = watch.check().total_seconds()
        out["watch_confirmed_s_ago"] = age
        left = self.trust_from - time.monotonic()
        # Rounded up to the millisecond: 0 means over (a reader may act on it at once).
        out["probation_s_left"] = (
            None if left == float("inf") else math.ceil(max(0.0, left) * 1e3) / 1e3
        )
        return out

    def _close_watch(self, watch: Any) -> None:
        """Unregister ``watch``. librados cancels a watch even when unregistering it
        fails (its OSD did not answer), but the binding then keeps the watch's id and
        unregisters it again when the object is freed: a use after free that crashes
        the process. So a watch whose close failed is kept alive for good
        (:data:`_CANCELLED`); once its client is shut down, freeing it does nothing."""
        try:
            watch.close()
        except self.rados.Error as exc:
            log.info("RADOS watch on %s unregistered with an error: %s", CHANNEL_OBJECT, exc)
            with _CANCELLED_LOCK:
                _CANCELLED.append(watch)
            # The list is emptied when the interpreter exits, which would free the watch
            # after the binding's module is gone (an ignored TypeError printed at exit):
            # one reference never given back keeps it from being freed at all.
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(watch))

    def close(self) -> bool:
        """Stop the watcher thread and unregister the watch. Idempotent. False when the
        thread did not stop (it may be registering a watch): librados must then not be
        shut down, which would abort the process under it."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.conn.op_timeout_s + 5)
        if self._thread.is_alive():
            log.warning("RADOS watcher thread did not stop; leaving the Ceph connection open")
            return False
        with self._lock:
            self._trusted_until = 0.0
            watch, self._watch = self._watch, None
            io, self._io = self._io, None
        if watch is not None:
            self._close_watch(watch)
        if io is not None:
            io.close()
        return True


#: Watches whose unregistering failed: never to be touched or freed (see
#: :meth:`Coherence._close_watch`).
_CANCELLED: list[Any] = []
_CANCELLED_LOCK = threading.Lock()


def ensure_channel(rados: Any, io: Any) -> None:
    """Create the channel object if it does not exist (idempotent)."""
    with rados.WriteOpCtx() as op:
        op.new(rados.LIBRADOS_CREATE_IDEMPOTENT)
        io.operate_write_op(op, CHANNEL_OBJECT)
