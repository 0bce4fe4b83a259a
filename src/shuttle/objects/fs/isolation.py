"""``isolation``: callbacks for cache coherence and optimistic concurrency control by
timestamps (ABACUS 4.3.1), one per node, anchored as ``NODE/isolation``.

Blocks are named by ``(key, offset)``: every reader of a file or directory uses the
same block size for it, so one block has one name. The object keeps

* a **timestamp** per block: it grows with every update of the block. Timestamps come
  from one counter started at the node's wall clock in nanoseconds, so a block never
  written since the node started has the start value, and every timestamp handed out
  before a restart is different from (lower than) any handed out after it: a client
  that cached a block before a node restart finds its timestamp stale, never equal.
* **callbacks**: who caches which block. :meth:`IsolationObject.read` with a
  ``holder`` (a reference to a cache or directory object) records a promise; an update
  of the block breaks every other holder's promise (calls ``holder.invalidate(key,
  offsets)``) before it returns, as AFS does, so a holder may use its cached copy
  without asking until it hears otherwise.

:meth:`write` updates blocks unconditionally (a file cache's write-through).
:meth:`commit` is the optimistic path (the paper's ``CommitAction``): it checks that
every block in the *read set* still has the timestamp the caller read it at, and only
then applies the *write set* through the node's atomicity object (all blocks or
none, across a crash); otherwise nothing is written and the caller learns which
blocks changed, re-reads them and retries. Checks and updates run under one lock, so
commits are serialisable in timestamp order. Callbacks are broken after the lock is
let go (a holder being told may itself be waiting to commit), but before the call
returns.

**Durable.** The promises live in memory, but which holder holds promises on which
key is on disk (:mod:`shuttle.objects.fs.holders`), written before the read that
made the first of them is answered. A node that restarts calls every holder back
for every key it held (:meth:`recover`: ``invalidate(key, [])``, all its blocks)
before it lets a write through: no holder keeps serving a block changed after the
restart. (The atomicity object is durable by its log; the timestamps by the clock,
which starts past every timestamp handed out before.)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from shuttle.errors import (
    InvalidArgumentError,
    NotFoundError,
    ObjectNotFoundError,
    ShuttleError,
)
from shuttle.objects.fs.atomicity import AtomicityObject, check_writes
from shuttle.objects.fs.holders import HolderLog
from shuttle.runtime.authority import Needs, acting, acting_for, each, needs
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.runtime.refs import Ref
from shuttle.store.interface import Store

log = logging.getLogger("shuttle.objects.fs")

#: Tries to deliver one callback (with doubling pauses from CALLBACK_RETRY_S).
CALLBACK_ATTEMPTS = 3
CALLBACK_RETRY_S = 0.05
#: Largest block one read may return.
READ_BYTES_MAX = 4 << 20
#: Largest range one ``changed`` names (a RAID 5 write takes up to 16 MiB).
CHANGE_BYTES_MAX = 64 << 20
#: Longest a write waits for a restarted node's callbacks to every holder from before
#: (each holder is tried CALLBACK_ATTEMPTS times; one that cannot be told is dropped).
RECOVERY_WAIT_S = 60.0

Block = tuple[str, int]


def _check_block(key: Any, offset: Any, where: str) -> Block:
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"{where}: key must be a non-empty string, got {key!r:.60}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgumentError(f"{where}: offset must be an integer ≥ 0, got {offset!r:.40}")
    return key, offset


def _check_length(length: Any, where: str, limit: int = READ_BYTES_MAX) -> None:
    if isinstance(length, bool) or not isinstance(length, int):
        raise InvalidArgumentError(f"{where}: length must be an integer, got {length!r:.40}")
    if not 0 < length <= limit:
        raise InvalidArgumentError(f"{where}: length must be in 1..{limit}, got {length}")


#: Holders whose principal is remembered before the ones holding nothing are forgotten
#: (a cache object holds blocks for its life; this bounds what ended ones leave).
HOLDER_PRINCIPALS_MAX = 100_000


@builtin("isolation")
class IsolationObject(MobileObject):
    """A node's block timestamps and callbacks, and the commit check over them."""

    anchored = True
    migratable = False
    concurrent = True  # one lock inside; callbacks are broken outside it
    # What a principal's objects need to call each method (runtime/authority.py).
    access: ClassVar[Mapping[str, Needs]] = {
        "read": needs(read=["key"]),
        "promise": needs(read=["key"]),
        "size": needs(read=["key"]),
        "timestamps": needs(read=[each("blocks")]),
        "release": needs(read=[each("blocks")]),
        "changed": needs(write=["key"]),
        "write": needs(write=["key"]),
        "commit": needs(read=[each("reads")], write=[each("writes")]),
        "remove": needs(write=["key"]),
    }

    def __init__(
        self, store: Store, atomicity: AtomicityObject, holders: HolderLog | None = None
    ) -> None:
        self._store = store
        self._atomicity = atomicity
        self._log = holders
        #: Set once every holder from before a restart was called back: writes wait.
        self._recovered = threading.Event()
        if holders is None or not holders.before_restart:
            self._recovered.set()
        self._lock = threading.Lock()
        self._start = time.time_ns()
        self._clock = self._start
        self._ts: dict[Block, int] = {}
        #: block -> {holder id: holder}
        self._holders: dict[Block, dict[str, Ref]] = {}
        #: holder id -> the principal it was registered for: its callbacks act for it
        #: (a node acting for nobody could not reach a principal's own run-time, and
        #: must not reach others' objects on a principal's say-so).
        self._acting: dict[str, str | None] = {}
        #: key -> {offset: length} of the blocks read or written: a write breaks the
        #: promises and bumps the timestamps of every block it overlaps.
        self._extents: dict[str, dict[int, int]] = {}
        self.commits = 0
        self.conflicts = 0
        self.broken = 0

    # --- reads --------------------------------------------------------------------------

    def read(self, key: str, offset: int, length: int, holder: Ref | None = None) -> list[Any]:
        """``[bytes, timestamp]`` of block ``(key, offset)`` (up to ``length`` bytes; b""
        past the end or for a missing object). With ``holder``: a callback promise."""
        block = _check_block(key, offset, "read")
        _check_length(length, "read")
        with self._lock:
            data = self._read_store(key, offset, length)
            extents = self._extents.setdefault(key, {})
            extents[offset] = max(extents.get(offset, 0), length)
            if holder is not None:
                self._hold(block, str(holder.rid), holder)
            answer = [data, self._ts.get(block, self._start)]
        if holder is not None:
            self._remember(holder, key)
        return answer

    def promise(self, key: str, offset: int, length: int, holder: Ref) -> int:
        """A callback promise on block ``(key, offset)`` of ``length`` bytes whose data
        lives elsewhere (a RAID 5 file's blocks are striped over the columns' nodes;
        the file's cache reads them through its ``raid5`` object), and the block's
        timestamp now. Ask before reading the data: a change that lands after this
        breaks the promise, so a copy read after it is current or called back."""
        block = _check_block(key, offset, "promise")
        _check_length(length, "promise")
        with self._lock:
            extents = self._extents.setdefault(key, {})
            extents[offset] = max(extents.get(offset, 0), length)
            self._hold(block, str(holder.rid), holder)
            stamp = self._ts.get(block, self._start)
        self._remember(holder, key)
        return stamp

    def _remember(self, holder: Ref, key: str) -> None:
        """On disk before the promise is answered: ``holder`` holds one on ``key``."""
        if self._log is None:
            return
        hid = str(holder.rid)
        self._log.remember(hid, holder, key, self._acting.get(hid))
        if self._log.needs_compaction:
            self._log.restart_from(self._current_holders())

    def _current_holders(self) -> dict[str, tuple[Ref, set[str], str | None]]:
        with self._lock:
            out: dict[str, tuple[Ref, set[str], str | None]] = {}
            for (key, _), held in self._holders.items():
                for hid, ref in held.items():
                    out.setdefault(hid, (ref, set(), self._acting.get(hid)))[1].add(key)
            return out

    def _await_recovery(self) -> None:
        if not self._recovered.wait(RECOVERY_WAIT_S):
            log.warning(
                "writes go ahead before every holder from before the restart was called "
                "back (%.0f s); a holder not told yet may serve a stale block until its "
                "promise expires",
                RECOVERY_WAIT_S,
            )
            self._recovered.set()

    def recover(self) -> None:
        """After a restart (on a thread, once the node's run-time runs): call every
        holder from before back for every key it held, then let writes through."""
        if self._log is None or self._recovered.is_set():
            return
        holders = self._log.holders_before_restart(self._invoker)  # type: ignore[arg-type]
        told = 0
        for hid, ref, keys, principal in holders:
            with self._lock:  # its callbacks act for the principal it held them for
                self._acting[hid] = principal
            for key in keys:
                if not self._tell(hid, ref, key, []):
                    break
                told += 1
        self._log.restart_from({})
        self._recovered.set()
        log.info(
            "promises from before the restart: %d holders called back (%d keys)",
            len(holders),
            told,
        )

    def changed(self, key: str, offset: int, length: int, writer: Ref | None = None) -> int:
        """Bytes ``[offset, offset + length)`` of ``key`` changed elsewhere (a RAID 5
        write, after its stripes are written): every block someone read, promised or
        wrote here that they overlap gets a new timestamp (returned), and every other
        holder's promise is broken before this returns, as :meth:`write` does for
        data stored here. The ``writer`` holds the block at ``offset``; without one
        the range is not remembered as a block (blocks never read need no stamp)."""
        _check_block(key, offset, "changed")
        _check_length(length, "changed", CHANGE_BYTES_MAX)
        self._await_recovery()
        me = None if writer is None else str(writer.rid)
        to_break: dict[str, tuple[Ref, list[Block]]] = {}
        with self._lock:
            self._clock = max(self._clock + 1, time.time_ns())
            # Only a writer's block is remembered as a block: a long write through a
            # RAID object with no cache above it names no block anyone reads.
            self._stamp(key, offset, length, writer, me, to_break, record=writer is not None)
            self.commits += 1
            stamp = self._clock
        if writer is not None:
            self._remember(writer, key)
        self._break(to_break)
        return stamp

    def size(self, key: str) -> int:
        """Bytes in object ``key`` (0 if there is none yet)."""
        try:
            return self._store.stat(key).size
        except NotFoundError:
            return 0

    def timestamps(self, blocks: list[Any]) -> list[int]:
        """The current timestamps of ``[[key, offset], ...]`` (cheap validation)."""
        with self._lock:
            return [
                self._ts.get(_check_block(b[0], b[1], "timestamps"), self._start) for b in blocks
            ]

    def release(self, blocks: list[Any], holder: Ref) -> None:
        """``holder`` no longer caches ``blocks``: drop its promises."""
        with self._lock:
            for b in blocks:
                held = self._holders.get((b[0], b[1]))
                if held is not None:
                    held.pop(str(holder.rid), None)

    def _read_store(self, key: str, offset: int, length: int) -> bytes:
        try:
            return self._store.read(key, offset, length)
        except NotFoundError:
            return b""

    # --- updates ------------------------------------------------------------------------

    def write(self, key: str, offset: int, data: bytes, writer: Ref | None = None) -> int:
        """Write one block now, break the other holders' callbacks, return its new
        timestamp."""
        result = self.commit([], [[key, offset, data]], writer)
        return int(result["timestamps"][0])

    def commit(
        self, reads: list[Any], writes: list[Any], writer: Ref | None = None
    ) -> dict[str, Any]:
        """``CommitAction``: if every ``[key, offset, timestamp]`` of ``reads`` is still
        current, apply ``writes`` (``[[key, offset, bytes], ...]``) all or nothing.

        Returns ``{"ok": True, "timestamps": [new timestamp per write]}``, or
        ``{"ok": False, "conflicts": [[key, offset, current timestamp], ...]}`` with
        nothing written. The writer (if named) holds a callback on the blocks it wrote
        (its copy is the new one); every other holder's are broken before this returns."""
        if not isinstance(reads, list | tuple):
            raise InvalidArgumentError("commit: reads must be a list of [key, offset, timestamp]")
        checks = []
        for r in reads:
            if not isinstance(r, list | tuple) or len(r) != 3:
                raise InvalidArgumentError(
                    f"commit: a read is [key, offset, timestamp], got {r!r:.60}"
                )
            checks.append((_check_block(r[0], r[1], "commit"), r[2]))
        blocks = check_writes(writes)
        self._await_recovery()
        me = None if writer is None else str(writer.rid)
        to_break: dict[str, tuple[Ref, list[Block]]] = {}
        with self._lock:
            conflicts = [
                [b[0], b[1], self._ts.get(b, self._start)]
                for b, ts in checks
                if self._ts.get(b, self._start) != ts
            ]
            if conflicts:
                self.conflicts += 1
                return {"ok": False, "conflicts": conflicts}
            self._atomicity.apply([list(w) for w in blocks])
            stamps = []
            for key, offset, data in blocks:
                self._clock = max(self._clock + 1, time.time_ns())
                stamps.append(self._clock)
                self._stamp(key, offset, len(data), writer, me, to_break)
            self.commits += 1
        if writer is not None:
            for key in {w[0] for w in blocks}:
                self._remember(writer, key)
        self._break(to_break)
        return {"ok": True, "timestamps": stamps}

    def remove(self, key: str) -> bool:
        """File ``key`` is gone: remove its object from this node's store if there is
        one (True if there was), and break every promise on any of its blocks before
        this returns, as a write does. Its blocks keep their timestamps, raised, so a
        copy cached before can never pass for one read after.

        For a file whose data lives elsewhere (a RAID 5 file's columns, on their
        nodes), remove the data first and then call this at the file's home, where
        its caches hold their promises: the same order as a RAID write and its
        :meth:`changed`, so a cache that reads in between is called back."""
        _check_block(key, 0, "remove")
        self._await_recovery()
        to_break: dict[str, tuple[Ref, list[Block]]] = {}
        with self._lock:  # ordered with commits and reads of the key, as they are
            try:
                self._store.remove(key)
                existed = True
            except NotFoundError:
                existed = False
            self._clock = max(self._clock + 1, time.time_ns())
            extents = self._extents.get(key, {})
            end = max((o + n for o, n in extents.items()), default=1)
            self._stamp(key, 0, end, None, None, to_break, record=False)
            self.commits += 1
        self._break(to_break)
        return existed

    def _stamp(
        self,
        key: str,
        offset: int,
        length: int,
        writer: Ref | None,
        me: str | None,
        to_break: dict[str, tuple[Ref, list[Block]]],
        *,
        record: bool = True,
    ) -> None:
        """Bytes ``[offset, offset + length)`` of ``key`` changed (lock held): every
        block they overlap takes the clock's timestamp and its holders' promises go to
        ``to_break``, but the writer's own on the block it wrote (its copy is the new
        one: it holds it). ``record``: remember the range as a block."""
        extents = self._extents.setdefault(key, {})
        if record:
            extents[offset] = max(extents.get(offset, 0), length)
        end = offset + length
        for o in [o for o, n in extents.items() if o < end and offset < o + n]:
            self._ts[(key, o)] = self._clock
            held = self._holders.get((key, o))
            if not held:
                continue
            for hid, ref in held.items():
                if hid != me or o != offset:
                    to_break.setdefault(hid, (ref, []))[1].append((key, o))
            held.clear()
        if writer is not None and me is not None:
            self._hold((key, offset), me, writer)

    def _hold(self, block: Block, hid: str, holder: Ref) -> None:
        """``holder`` caches ``block`` (under the lock), for the principal calling now."""
        self._holders.setdefault(block, {})[hid] = holder
        self._acting[hid] = acting()
        if len(self._acting) > HOLDER_PRINCIPALS_MAX:  # forget holders that hold nothing
            live = {h for held in self._holders.values() for h in held}
            self._acting = {h: p for h, p in self._acting.items() if h in live}

    def _break(self, to_break: dict[str, tuple[Ref, list[Block]]]) -> None:
        """Tell each holder which of its blocks changed (AFS: before the update returns).
        A holder that no longer exists (the run-time says so: destroyed, or lost with
        its node) has its promises dropped at once. One that cannot be told after a
        few tries (its application died, or lost this node) has them dropped too:
        the application's lease on its objects ends them, as the node would drop a
        dead client's."""
        for hid, (ref, blocks) in to_break.items():
            by_key: dict[str, list[int]] = {}
            for key, offset in blocks:
                by_key.setdefault(key, []).append(offset)
            for key, offsets in by_key.items():
                if not self._tell(hid, ref, key, offsets):
                    break  # its promises are gone, the other keys' with them

    def _tell(self, hid: str, ref: Ref, key: str, offsets: list[int]) -> bool:
        """One callback, retried; False if the holder's promises were dropped."""
        for attempt in range(CALLBACK_ATTEMPTS):
            try:
                with acting_for(self._acting.get(hid)):
                    ref.invalidate(key, offsets)
                self.broken += len(offsets)
                return True
            except ObjectNotFoundError as exc:
                log.info("callback holder %s is gone (%s); its promises are dropped", hid, exc)
            except ShuttleError as exc:
                if attempt + 1 < CALLBACK_ATTEMPTS:
                    time.sleep(CALLBACK_RETRY_S * 2**attempt)
                    continue
                log.warning("callback to %s not delivered (%s); its promises are dropped", hid, exc)
            break
        with self._lock:
            for held in self._holders.values():
                held.pop(hid, None)
            self._acting.pop(hid, None)
        return False

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "commits": self.commits,
                "conflicts": self.conflicts,
                "callbacks_broken": self.broken,
                "callbacks_held": sum(len(h) for h in self._holders.values()),
                "atomic_updates": self._atomicity.applied,
            }
