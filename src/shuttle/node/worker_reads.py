"""A worker's own answers: small reads of the primary's files, and stats, checked by
generation.

A worker process of a node (docs/architecture.md, "Workers") holds none of the store's
state: the attributes, the journal, the key locks and the block cache are the
primary's. What it may do alone is read an object's file, which the primary changes
only inside its change hook, bracketed by the key's slot in the shared change
generations (:mod:`shuttle.store.generations`). So a worker answers a read or a stat
itself when it knows the object's attributes *as of the slot's current generation*:

* **learning** (:meth:`WorkerReads.learn`, a task): read the slot's generation ``g``
  (even: no change running), ask the primary for the object's ``stat``, open its
  file, and read the slot again: if it is still ``g``, the attributes and the open
  file are those of the object as it was at ``g``, and are kept under ``g``;
* **reading** (:meth:`WorkerReads.read`, the read lane's call on the worker's event
  loop): the slot's generation must still be the one the attributes were kept under;
  the bytes are read with ``RWF_NOWAIT`` (:mod:`shuttle.store.nowait`: a read the page
  cache cannot answer whole would wait for the disk, and the loop must not); and the
  slot is read again afterwards: unchanged, the bytes are of that settled state;
* **stat** (:meth:`WorkerReads.stat`, inline on the loop): the slot's generation must
  still be the one the attributes were kept under; then they are the object's now, and
  the answer is the primary's own answer of then (its chunk list as long as asked).

Anything else (a key not learnt yet, a moved generation, an expected version that
differs, a read past the end, over 64 KiB, or not resident, a chunk list longer than
was learnt) returns None, and the worker sends the request to the primary, whose
answer is the node's answer. A key the primary does not serve as an object (missing, a
directory, refused) is remembered as such for its generation, so its requests go to
the primary without asking again.

The open files are kept by the store's own cache of descriptors
(:class:`shuttle.store.openfiles.OpenFiles`), with the slot's generation as the
*version* of an entry: an entry opened under another generation is never read through
again, and a key whose slot the worker sees move is forgotten there at once. So a
worker closes a changed object's file by the same rule as its primary. A known object
holds its file's lease for as long as it is known (a read then costs no borrow: 0.7 µs
of a 2.8 µs read, benchmarks/worker_read_cpu.py), and the worker drops its oldest
known object before it learns one past the cache's bound, so the bound holds.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shuttle.errors import ShuttleError
from shuttle.store.generations import ChangeGenerations, slot_of
from shuttle.store.nowait import NowaitReads
from shuttle.store.openfiles import Lease, OpenFiles, open_files_max
from shuttle.store.paths import SafeRoot

log = logging.getLogger("shuttle.node")

#: Reads a worker answers itself: up to 64 KiB, the primary's inline read bound
#: (``shuttle.node.handlers.INLINE_READ_BYTES_MAX``); a larger read streams, and the
#: primary's thread pool is where that belongs.
WORKER_READ_BYTES_MAX = 64 << 10
#: Objects a worker knows (their attributes, about 1 KiB each with their chunk list,
#: and their files, open), fitted to a sixteenth of its descriptor limit by
#: ``open_files_max``: half the descriptors a node keeps beside its connections
#: (``shuttle.net.admission.DESCRIPTORS_RESERVED``), as a worker has no store files of
#: its own. Past it the oldest learnt is dropped (its next request goes to the primary
#: and learns it again).
KNOWN_OBJECTS_MAX = 256
#: Chunks of an object's list a worker learns (its ``stat`` to the primary asks for
#: this many): every object of up to this many chunks (a few MiB) has its whole list
#: here, so any stat of it is answered here; a longer list is answered here only as
#: far as it was learnt (``chunks_max`` up to this, as clients without lookaside
#: stores ask for 0).
LEARNT_CHUNKS_MAX = 16
#: Stats in flight to the primary at once for learning: a burst of new keys must not
#: become a burst of requests to the process it is meant to unload.
LEARNING_MAX = 16

#: ``stat(key, chunks_max)`` at the primary: its stat reply (``size``, ``version``, ...).
StatCall = Callable[[str, int], Awaitable[dict[str, Any]]]


@dataclass(slots=True)
class _Known:
    """What a worker knows of one object, valid while its slot is at ``generation``."""

    slot: int
    generation: int
    version: int
    size: int
    #: The primary's stat reply of then (its chunk list cut to LEARNT_CHUNKS_MAX;
    #: ``chunks_total`` says how long it is). None: the primary does not serve this
    #: key as an object, and answers its requests itself.
    attrs: dict[str, Any] | None
    #: The object's file, borrowed from the descriptor cache for as long as this is
    #: known (None with ``attrs``).
    lease: Lease | None


class WorkerReads:
    """The worker's reads and stats of one data directory (see the module docstring).

    Counters (the worker's ``node.stats`` → ``worker.reads``): ``served`` reads and
    ``stats_served`` stats answered here, ``declined`` and ``stats_declined`` (sent to
    the primary), ``learnt`` (attributes learnt), ``outdated`` (learnt ones a change
    made stale); ``open_files``: the descriptor cache's own.
    """

    def __init__(
        self,
        root: str,
        generations: ChangeGenerations,
        stat: StatCall,
        *,
        nowait: NowaitReads | None = None,
        known_max: int | None = None,
    ) -> None:
        """``known_max``: objects known (and files kept open) at most (None:
        KNOWN_OBJECTS_MAX fitted to this process's descriptor limit)."""
        self.paths = SafeRoot(root)
        self.generations = generations
        self._stat = stat
        self.nowait = nowait if nowait is not None else NowaitReads()
        # Each known object holds its file's lease, and one is dropped before another
        # is learnt past the bound: the cache never closes a file for room by itself.
        self.files = OpenFiles(
            max(1, open_files_max(KNOWN_OBJECTS_MAX) if known_max is None else known_max)
        )
        self._known: dict[str, _Known] = {}
        self._learning: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.served = 0
        self.declined = 0
        self.stats_served = 0
        self.stats_declined = 0
        self.learnt = 0
        self.outdated = 0

    def _current(self, key: str) -> _Known | None:
        """What this worker knows of ``key`` if it still holds (its slot unmoved); else
        None, having started to learn it again."""
        known = self._known.get(key)
        if known is None:
            self._start_learning(key)
            return None
        if self.generations.read(known.slot) != known.generation:
            self._forget(key, known)
            self.outdated += 1
            self._start_learning(key)
            return None
        return known

    def read(self, key: str, offset: int, length: int, version: int | None) -> bytes | None:
        """Bytes ``[offset, offset+length)`` of ``key`` (fewer at its end) if this worker
        can answer for the node, else None (ask the primary). Never raises; on the
        event loop."""
        known = self._current(key)
        if known is None:
            self.declined += 1
            return None
        end = min(known.size, offset + length)
        if (
            known.attrs is None
            or (version is not None and version != known.version)
            or not 0 < length <= WORKER_READ_BYTES_MAX
            or offset < 0
            or offset >= end
        ):
            self.declined += 1
            return None  # the primary answers (or says what is wrong)
        lease = known.lease
        assert lease is not None  # held with the attributes
        try:
            data = self.nowait.read(lease.fd, offset, end)
        except OSError:
            data = None
        if data is None or self.generations.read(known.slot) != known.generation:
            self.declined += 1
            return None  # not resident, or a change began meanwhile
        self.served += 1
        return data

    def stat(self, key: str, chunks_max: int, version: int | None) -> dict[str, Any] | None:
        """``key``'s stat reply with up to ``chunks_max`` chunks listed, as the primary
        would answer it now, if this worker knows it; else None (ask the primary).
        Never raises; on the event loop."""
        known = self._current(key)
        attrs = None if known is None else known.attrs
        if (
            known is None
            or attrs is None
            or (version is not None and version != known.version)
            or (chunks_max > len(attrs["chunks"]) and attrs["chunks_total"] > len(attrs["chunks"]))
        ):  # (the last: a longer list than was learnt, of an object that has one)
            self.stats_declined += 1
            return None
        self.stats_served += 1
        return {**attrs, "chunks": attrs["chunks"][:chunks_max]}

    def _open(self, key: str) -> int:
        return self.paths.open_file(key, os.O_RDONLY)

    def _start_learning(self, key: str) -> None:
        if key in self._learning or len(self._learning) >= LEARNING_MAX:
            return
        self._learning.add(key)
        task = asyncio.get_running_loop().create_task(self.learn(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def learn(self, key: str) -> None:
        """Learn ``key``'s attributes at its slot's current generation (see the module
        docstring); nothing is kept if a change ran meanwhile."""
        try:
            slot = slot_of(key)
            generation = self.generations.read(slot)
            if generation & 1:
                return  # a change is running: learn after it
            attrs: dict[str, Any] | None = None
            lease: Lease | None = None
            version = size = 0
            try:
                reply = await self._stat(key, LEARNT_CHUNKS_MAX)
                version, size = int(reply["version"]), int(reply["size"])
                if (
                    not isinstance(reply.get("chunks"), list)
                    or type(reply.get("chunks_total")) is not int
                ):
                    raise ValueError(f"the primary's stat of {key!r} lacks its chunk list")
                # Room for its file (no await from here to keeping it, so the cache
                # never has to close a borrowed file for room)...
                self._make_room(key)
                # ...and the file, open under this generation (an entry of another one
                # is dropped): a key the worker cannot open is the primary's to answer.
                lease = self.files.borrow(key, generation, self._open)
                attrs = reply
            except (ShuttleError, OSError, KeyError, TypeError, ValueError):
                attrs = None  # the primary answers this key's requests, whatever it is
            if self.generations.read(slot) != generation:
                self.files.forget(key)  # what was opened may be of another state
                if lease is not None:
                    self.files.give_back(lease)
                return
            old = self._known.pop(key, None)
            if old is not None and old.lease is not None:
                self.files.give_back(old.lease)
            self._make_room(key)
            self._known[key] = _Known(slot, generation, version, size, attrs, lease)
            self.learnt += 1
        except Exception:  # learning is an optimisation: the primary still answers
            log.exception("worker: learning the attributes of %r failed", key)
        finally:
            self._learning.discard(key)

    def _make_room(self, key: str) -> None:
        """Drop the oldest known objects until one more (``key``) fits the bound."""
        known = self._known
        while len(known) - (key in known) >= self.files.entries_max:
            oldest = next(k for k in known if k != key)
            self._forget(oldest, known[oldest])

    def _forget(self, key: str, known: _Known) -> None:
        """Drop what is known of ``key``, and close its file (the cache's rule)."""
        if self._known.get(key) is known:
            del self._known[key]
        self.files.forget(key)
        if known.lease is not None:
            self.files.give_back(known.lease)
            known.lease = None

    def stats(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "declined": self.declined,
            "stats_served": self.stats_served,
            "stats_declined": self.stats_declined,
            "learnt": self.learnt,
            "outdated": self.outdated,
            "known": len(self._known),
            "open_files": self.files.stats(),
            "nowait": self.nowait.stats(),
        }

    def close(self) -> None:
        """Cancel learning and close every file kept open."""
        for task in list(self._tasks):
            task.cancel()
        for key, known in list(self._known.items()):
            self._forget(key, known)
        self.files.close()
        self.paths.close()
