"""Change generations shared between a node's processes: a seqlock per slot of keys.

A node with ``--workers N`` (docs/architecture.md, "Workers") has one *primary*
process that owns the store (journal, locks, attributes, block cache) and applies
every change, and worker processes that answer small reads of the same files
themselves. A worker cannot take the primary's key locks, so it validates what it
read the way the store's lock-free cache-hit read does (:mod:`shuttle.store.locks`):
by a generation counter that is odd while a change runs. Here the counters live in
shared memory (a ``memfd`` the primary creates and hands to its workers), one per
*slot*; a key's slot is its CRC-32 modulo :data:`SLOTS`, the same in every process.

* The primary (:meth:`ChangeGenerations.changing`, entered by the store's change
  hook around every change: put, write, truncate, remove, an upload's commit, a mobile
  object's write) makes the key's slot odd before the change touches the file and
  even again after it was applied. Two keys of one slot share the counter: a change
  of one makes the workers ask about the other again, never trust it wrongly.
* A worker (:meth:`ChangeGenerations.read`) reads the slot before and after it reads
  the file: the bytes are those of one settled state of the object if both reads give
  the same even value. Anything else (odd, or moved) and the worker asks the primary.

A slot is odd while *any* change of its keys runs (the primary counts the changes
running per slot, and only the first to start and the last to end bump the counter),
and its counter only grows, so an even value seen twice means no change ran in
between. Loads and stores are of aligned 8-byte words through a ``memoryview`` cast to
``Q`` (single machine loads and stores on x86-64 and arm64); the file reads between
them are system calls, which the kernel orders with the loads. Only the primary
writes; its threads take turns on a lock for the count and the increment.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import zlib
from collections.abc import Iterator
from typing import Final

from shuttle.errors import ConfigError

#: Slots in the table: 64 Ki of 8 bytes, 512 KiB of shared memory. A slot is shared by
#: the keys that hash to it, and a change of one makes the workers re-ask about the
#: others: with 64 Ki slots a node with a million hot keys still finds an unrelated
#: change in about one read in 65,000 per changed key.
SLOTS: Final = 1 << 16
#: Bytes of the shared table.
TABLE_BYTES: Final = SLOTS * 8


def slot_of(key: str) -> int:
    """The slot of ``key`` (the same in every process: CRC-32, not ``hash``, which is
    salted per process)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) & (SLOTS - 1)


class ChangeGenerations:
    """The shared table, as the primary (``writer=True``) or a worker sees it."""

    def __init__(self, fd: int, *, writer: bool) -> None:
        size = os.fstat(fd).st_size
        if size != TABLE_BYTES:
            raise ConfigError(
                f"the change-generation table (descriptor {fd}) is {size} bytes, not "
                f"{TABLE_BYTES}: a worker of another Shuttle version? Restart the node"
            )
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writer else 0)
        self.fd = fd
        self._map = mmap.mmap(fd, TABLE_BYTES, mmap.MAP_SHARED, prot)
        self._words = memoryview(self._map).cast("Q")
        self._writer = writer
        self._lock = threading.Lock()
        #: Changes running per slot (primary only; absent: none).
        self._running: dict[int, int] = {}
        #: Changes the primary bracketed (its side only).
        self.changes = 0

    @classmethod
    def create(cls) -> ChangeGenerations:
        """A new table in anonymous shared memory, all slots even (0), for the primary.
        Its :attr:`fd` is what the workers are given."""
        fd = os.memfd_create("shuttle-generations", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, TABLE_BYTES)
            return cls(fd, writer=True)
        except BaseException:
            os.close(fd)
            raise

    def read(self, slot: int) -> int:
        """The slot's generation now (odd: a change of one of its keys is running)."""
        return int(self._words[slot])

    def _enter(self, slot: int) -> None:
        with self._lock:
            running = self._running.get(slot, 0)
            if not running:
                self._words[slot] += 1  # odd: workers stop trusting what they knew
            self._running[slot] = running + 1

    def _exit(self, slot: int) -> None:
        with self._lock:
            running = self._running.pop(slot) - 1
            if running:
                self._running[slot] = running
            else:
                self._words[slot] += 1  # even again, and different from before

    @contextlib.contextmanager
    def changing(self, key: str) -> Iterator[None]:
        """Bracket a change of ``key``: its slot is odd from entry to exit."""
        if not self._writer:
            raise ConfigError("a worker's view of the change generations is read-only")
        slot = slot_of(key)
        self._enter(slot)
        try:
            yield
        finally:
            self._exit(slot)
            self.changes += 1

    def close(self) -> None:
        """Unmap the table and close its descriptor."""
        self._words.release()
        self._map.close()
        with contextlib.suppress(OSError):
            os.close(self.fd)
