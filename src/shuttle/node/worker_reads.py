"""A worker's own reads: small reads of the primary's files, checked by generation.

A worker process of a node (docs/architecture.md, "Workers") holds none of the store's
state: the attributes, the journal, the key locks and the block cache are the
primary's. What it may do alone is read an object's file, which the primary changes
only inside its change hook, bracketed by the key's slot in the shared change
generations (:mod:`shuttle.store.generations`). So a worker answers a read itself
when it knows the object's attributes *as of the slot's current generation*:

* **learning** (:meth:`WorkerReads.learn`, a task): read the slot's generation ``g``
  (even: no change running), ask the primary for the object's ``stat``, open its
  file, and read the slot again: if it is still ``g``, the attributes and the open
  file are those of the object as it was at ``g``, and are kept under ``g``;
* **reading** (:meth:`WorkerReads.read`, the read lane's call on the worker's event
  loop): the slot's generation must still be the one the attributes were kept under;
  the bytes are read with ``RWF_NOWAIT`` (:mod:`shuttle.store.nowait`: a read the page
  cache cannot answer whole would wait for the disk, and the loop must not); and the
  slot is read again afterwards: unchanged, the bytes are of that settled state.

Anything else (a key not learnt yet, a moved generation, an expected version that
differs, a read past the end, over 64 KiB, or not resident) returns None, and the
worker sends the read to the primary, whose answer is the node's answer. A key the
primary does not serve as an object (missing, a directory, refused) is remembered as
such for its generation, so its reads go to the primary without asking again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from shuttle.errors import ShuttleError
from shuttle.store.generations import ChangeGenerations, slot_of
from shuttle.store.nowait import NowaitReads
from shuttle.store.paths import SafeRoot

log = logging.getLogger("shuttle.node")

#: Reads a worker answers itself: up to 64 KiB, the primary's inline read bound
#: (``shuttle.node.handlers.INLINE_READ_BYTES_MAX``); a larger read streams, and the
#: primary's thread pool is where that belongs.
WORKER_READ_BYTES_MAX = 64 << 10
#: Objects whose attributes (and open file) a worker keeps. Each holds a descriptor:
#: 1,024 stay far below the connection cap's share of the descriptor limit; past it
#: the oldest learnt is dropped (its next read goes to the primary and learns again).
KNOWN_OBJECTS_MAX = 1024
#: Stats in flight to the primary at once for learning: a burst of new keys must not
#: become a burst of requests to the process it is meant to unload.
LEARNING_MAX = 16

#: ``stat(key)`` at the primary: the attributes reply (``size``, ``version``, ...).
StatCall = Callable[[str], Awaitable[dict[str, Any]]]


@dataclass(slots=True)
class _Known:
    """What a worker knows of one object, valid while its slot is at ``generation``."""

    slot: int
    generation: int
    version: int
    size: int
    #: The object's file, open (-1: the primary does not serve this key as an object).
    fd: int


class WorkerReads:
    """The worker's reads of one data directory (see the module docstring).

    Counters (the worker's ``node.stats`` → ``worker.reads``): ``served`` here,
    ``declined`` (sent to the primary), ``learnt`` (attributes learnt),
    ``outdated`` (learnt ones a change made stale).
    """

    def __init__(
        self,
        root: str,
        generations: ChangeGenerations,
        stat: StatCall,
        *,
        nowait: NowaitReads | None = None,
    ) -> None:
        self.paths = SafeRoot(root)
        self.generations = generations
        self._stat = stat
        self.nowait = nowait if nowait is not None else NowaitReads()
        self._known: dict[str, _Known] = {}
        self._learning: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.served = 0
        self.declined = 0
        self.learnt = 0
        self.outdated = 0

    def read(self, key: str, offset: int, length: int, version: int | None) -> bytes | None:
        """Bytes ``[offset, offset+length)`` of ``key`` (fewer at its end) if this worker
        can answer for the node, else None (ask the primary). Never raises; on the
        event loop."""
        known = self._known.get(key)
        gens = self.generations
        if known is None:
            self._start_learning(key)
            self.declined += 1
            return None
        generation = gens.read(known.slot)
        if generation != known.generation:
            self._forget(key, known)
            self.outdated += 1
            self._start_learning(key)
            self.declined += 1
            return None
        end = min(known.size, offset + length)
        if (
            known.fd < 0
            or (version is not None and version != known.version)
            or not 0 < length <= WORKER_READ_BYTES_MAX
            or offset < 0
            or offset >= end
        ):
            self.declined += 1
            return None  # the primary answers (or says what is wrong)
        try:
            data = self.nowait.read(known.fd, offset, end)
        except OSError:
            data = None
        if data is None or gens.read(known.slot) != generation:
            self.declined += 1
            return None  # not resident, or a change began meanwhile
        self.served += 1
        return data

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
            fd = -1
            version = size = 0
            try:
                attrs = await self._stat(key)
                version, size = int(attrs["version"]), int(attrs["size"])
                fd = self.paths.open_file(key, os.O_RDONLY)
            except (ShuttleError, OSError, KeyError, TypeError, ValueError):
                fd = -1  # the primary answers this key's reads, whatever it is
            if self.generations.read(slot) != generation:
                if fd >= 0:
                    os.close(fd)
                return
            old = self._known.pop(key, None)
            if old is not None and old.fd >= 0:
                os.close(old.fd)
            while len(self._known) >= KNOWN_OBJECTS_MAX:
                oldest = next(iter(self._known))
                self._forget(oldest, self._known[oldest])
            self._known[key] = _Known(slot, generation, version, size, fd)
            self.learnt += 1
        except Exception:  # learning is an optimisation: the primary still answers
            log.exception("worker: learning the attributes of %r failed", key)
        finally:
            self._learning.discard(key)

    def _forget(self, key: str, known: _Known) -> None:
        if self._known.get(key) is known:
            del self._known[key]
        if known.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(known.fd)

    def stats(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "declined": self.declined,
            "learnt": self.learnt,
            "outdated": self.outdated,
            "known": len(self._known),
            "nowait": self.nowait.stats(),
        }

    def close(self) -> None:
        """Cancel learning and close every file kept open."""
        for task in list(self._tasks):
            task.cancel()
        for key, known in list(self._known.items()):
            self._forget(key, known)
        self.paths.close()
