"""Object files kept open across reads: a bounded cache of read-only descriptors.

A block-cache miss that the page cache holds costs the node about 18 µs, and a third
of that was opening and closing the object's file (``SafeRoot.open_file``: a ``dup``
of the root, one ``openat`` per directory of the key, the leaf, an ``fstat``, then
the ``close`` of each: about 5 µs, and the walk can touch the disk's metadata on the
event loop). :class:`OpenFiles` keeps the file of a recently read object open, so
the next miss on it is one ``pread`` (benchmarks/README.md, "The miss path").

Why it can never serve another version's bytes (tests/unit/store/test_open_files.py):

* an entry is for one **version** of its object: a reader asks for the version it
  read under the key's shared lock, and an entry of any other version is dropped, not
  used (every change bumps the version; a put of a large object renames a new file
  into place, which a descriptor of the old one would never see);
* every change **forgets** the key's entry while it holds the key's exclusive lock
  (``StoreCore._change_lock``), before it touches the file: put, create, write,
  truncate, remove, set_mtime, an upload's commit, and anything added later that
  changes an object through that lock. So a removed object's file is closed at once
  (its space is freed) and an in-place write is read through a fresh descriptor;
* a restart starts with no entry (the cache lives in memory only).

A node's worker processes (``--workers N``, :mod:`shuttle.node.worker_reads`) keep
their open files here too, by the same two rules, with what they can see of a change
in place of the lock: the *version* of a worker's entry is the generation of its
key's slot (:mod:`shuttle.store.generations`), which moves with every change of the
key and never repeats, and a worker forgets a key as soon as it sees its slot move.

A descriptor is closed only when nobody is reading through it: readers *borrow* an
entry and give it back, and an entry evicted or forgotten while borrowed is closed by
its last reader (closing it under a reader would let the number be reused by another
``open`` and the reader read the wrong file).

What it does not see: a file changed **behind** the store (an operator replacing or
deleting it under the data directory) keeps being read through the descriptor opened
before, as the block cache keeps serving the blocks it read before; such changes are
unsupported either way (docs/storage-format.md).

Bounded by ``entries_max`` (:data:`OPEN_FILES_MAX`, and at most a sixteenth of the
process's descriptor limit: :func:`open_files_max`), which the node counts in the
descriptors it keeps for the store (``DESCRIPTORS_RESERVED`` in
:mod:`shuttle.net.admission`). A store short of descriptors (``EMFILE``) gives every
idle one back (:meth:`OpenFiles.clear`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

#: Object files kept open at most: a hot set of 128 objects covers the node's typical
#: concurrent readers (one file each), and stays a quarter of the 512 descriptors the
#: node keeps for its store (shuttle.net.admission.DESCRIPTORS_RESERVED).
OPEN_FILES_MAX = 128
#: Never more than this share of the process's descriptor limit (a limit of 1024
#: keeps at most 64 files open), so connections and the store's own files keep room.
OPEN_FILES_LIMIT_SHARE = 16


#: Errors of a process (or system) out of file descriptors: transient, not disk faults.
_OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})


def is_out_of_descriptors(exc: OSError) -> bool:
    """Whether ``exc`` says the process (or the system) has no descriptor to spare: a
    store then gives back the files it keeps open (:meth:`OpenFiles.clear`)."""
    return exc.errno in _OUT_OF_DESCRIPTORS


def open_files_max(requested: int = OPEN_FILES_MAX, descriptor_limit: int | None = None) -> int:
    """``requested``, fitted to a sixteenth of ``descriptor_limit`` (None: this
    process's soft ``RLIMIT_NOFILE``)."""
    if descriptor_limit is None:
        descriptor_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if descriptor_limit <= 0:  # RLIM_INFINITY
        return requested
    return max(0, min(requested, descriptor_limit // OPEN_FILES_LIMIT_SHARE))


class Lease:
    """One open object file, borrowed by a reader (see :meth:`OpenFiles.borrow`)."""

    __slots__ = ("fd", "retired", "users", "version")

    def __init__(self, fd: int, version: int) -> None:
        self.fd = fd
        self.version = version
        #: Readers holding it now.
        self.users = 1
        #: True once it left the cache (evicted, forgotten, of an old version): the
        #: last reader closes it.
        self.retired = False


class OpenFiles:
    """A bounded LRU of open read-only object files, one per key, each for one version
    of its object (see the module). Thread-safe (one mutex; ``open`` runs outside it).

    Counters (the node's ``stats()["store"]["open_files"]``): ``hits`` reads through a
    kept file, ``opens`` files opened, ``evictions`` closed for room, ``forgotten``
    dropped because the object changed (or a newer version was asked for).
    """

    def __init__(self, entries_max: int) -> None:
        if entries_max < 0:
            raise ValueError(f'"entries_max" must be >= 0 (0: keep none), got {entries_max}')
        self.entries_max = entries_max
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Lease] = OrderedDict()
        self._closed = False
        self.hits = 0
        self.opens = 0
        self.evictions = 0
        self.forgotten = 0

    def borrow(self, key: str, version: int, open_file: Callable[[str], int]) -> Lease:
        """The open file of ``key`` at ``version``: the kept one, else ``open_file(key)``
        (kept if there is room). The caller holds the key's lock (shared is enough),
        read ``version`` under it, and gives the lease back with :meth:`give_back`
        when done. Raises what ``open_file`` raises (nothing is kept then)."""
        lock = self._lock
        lock.acquire()
        entry = self._entries.get(key)
        if entry is not None:
            if entry.version == version:
                self._entries.move_to_end(key)
                entry.users += 1
                self.hits += 1
                lock.release()
                return entry
            del self._entries[key]  # another version's file: never read through again
            self.forgotten += 1
            self._retire(entry)
        lock.release()
        fresh = Lease(open_file(key), version)
        with lock:
            self.opens += 1
            if self._closed or not self.entries_max or key in self._entries:
                fresh.retired = True  # not kept (closed, or a concurrent reader kept one)
            else:
                self._entries[key] = fresh
                while len(self._entries) > self.entries_max:
                    _, victim = self._entries.popitem(last=False)
                    self.evictions += 1
                    self._retire(victim)
        return fresh

    def give_back(self, lease: Lease) -> None:
        """End a :meth:`borrow`; closes the file if it left the cache meanwhile."""
        lock = self._lock
        lock.acquire()
        lease.users -= 1
        fd = lease.fd if lease.retired and lease.users == 0 else -1
        if fd >= 0:
            lease.fd = -1
        lock.release()
        if fd >= 0:
            os.close(fd)

    def forget(self, key: str) -> None:
        """Drop ``key``'s file (its object is about to change, or is gone). The caller
        holds the key's exclusive lock, so nobody reads through it now."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.forgotten += 1
                self._retire(entry)

    def clear(self) -> None:
        """Give every kept file back (a store short of descriptors, a cold-cache run)."""
        with self._lock:
            entries = list(self._entries.values())
            self._entries.clear()
            for entry in entries:
                self._retire(entry)

    def close(self) -> None:
        """:meth:`clear`, and keep nothing from now on (the store is closing)."""
        with self._lock:
            self._closed = True
        self.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, Any]:
        return {
            "open": len(self._entries),
            "entries_max": self.entries_max,
            "hits": self.hits,
            "opens": self.opens,
            "evictions": self.evictions,
            "forgotten": self.forgotten,
        }

    def _retire(self, entry: Lease) -> None:
        """Out of the cache: closed now if nobody reads through it. Caller holds the lock."""
        entry.retired = True
        if entry.users == 0 and entry.fd >= 0:
            fd, entry.fd = entry.fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)
