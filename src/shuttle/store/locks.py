"""Reader/writer locks, and a table of them keyed by object key.

The store holds a key's lock shared for reads and stats, and exclusive for changes,
so a reader never sees half of a range write and the block cache never gets stale
blocks back. Waiting writers block new readers, so a busy object cannot starve a writer.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Final

from shuttle.store.keys import KEY_BYTES_MAX


class RWLock:
    """Many readers or one writer. Not reentrant.

    ``generation`` makes it a sequence lock as well: it is odd while a writer holds the
    lock and grows by two with every write. A reader that takes no lock at all can read
    it before and after looking at shared state: the same even value both times means
    no writer held the lock in between, so what it saw was consistent (the store's
    lock-free cache hits, :meth:`ObjectStore.read`).
    """

    def __init__(self) -> None:
        # The condition's mutex, also held directly where nothing waits: entering a
        # threading.Condition runs its Python-level __enter__ and __exit__, about a
        # microsecond of interpreted calls per shared hold on the node's read paths.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._readers_waiting = 0
        self.generation = 0

    @property
    def writers_waiting(self) -> int:
        """Writers blocked in :meth:`acquire_write` now (tests order threads by it)."""
        return self._writers_waiting

    @property
    def readers_waiting(self) -> int:
        """Readers blocked in :meth:`acquire_read` now, behind a writer."""
        return self._readers_waiting

    def acquire_read(self) -> None:
        with self._cond:
            if self._writer or self._writers_waiting:  # the slow path only: count it
                self._readers_waiting += 1
                try:
                    while self._writer or self._writers_waiting:
                        self._cond.wait()
                finally:
                    self._readers_waiting -= 1
            self._readers += 1

    def try_acquire_read(self) -> bool:
        """Take the lock shared if no writer holds it or waits for it, and say whether
        it was taken: never waits for a writer, so an event loop may call it (the
        node's reads of the page cache there, :mod:`shuttle.store.missread`). The
        condition's mutex is only ever held for a few instructions."""
        mutex = self._mutex
        mutex.acquire()
        if self._writer or self._writers_waiting:
            mutex.release()
            return False
        self._readers += 1
        mutex.release()
        return True

    def release_read(self) -> None:
        mutex = self._mutex
        mutex.acquire()
        try:
            self._readers -= 1
            if self._readers == 0 and self._writers_waiting:
                self._cond.notify_all()  # the condition's mutex is held: mutex is it
        finally:
            mutex.release()

    def acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
            self.generation += 1  # odd: a change is under way

    def release_write(self) -> None:
        with self._cond:
            self.generation += 1  # even again, and different from before the change
            self._writer = False
            self._cond.notify_all()

    def read(self) -> _ReadGuard:
        """``with lock.read():`` holds the lock shared for the block."""
        return _ReadGuard(self)

    def write(self) -> _WriteGuard:
        """``with lock.write():`` holds the lock exclusive for the block."""
        return _WriteGuard(self)


# Plain classes rather than @contextmanager generators: this sits on the path of every
# cached 4 KiB read, and a generator-based context manager costs microseconds.
class _ReadGuard:
    __slots__ = ("_lock",)

    def __init__(self, lock: RWLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire_read()

    def __exit__(self, *exc: object) -> None:
        self._lock.release_read()


class _WriteGuard:
    __slots__ = ("_lock",)

    def __init__(self, lock: RWLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire_write()

    def __exit__(self, *exc: object) -> None:
        self._lock.release_write()


#: 1,024 stripes: with the node's thread pool (tens of threads) two busy keys share a
#: stripe rarely, and the table costs about 200 KiB.
STRIPES: Final = 1024

#: Keys whose stripe is remembered (the oldest forgotten first): compiled, ``hash(key)``
#: is boxed into a new int object whenever it needs more than 62 bits, half of all
#: keys, and the modulo of such an int is a generic call: 1.6-2.1 k instructions of a
#: warm read's 12 k (callgrind, benchmarks/README.md). A remembered key costs a dict
#: lookup by the hash its ``str`` already holds. Only a key of a valid length is kept
#: (the read lane asks before the key is checked: a client's megabyte "keys" must not
#: stay alive here): 4,096 keys of at most 1,024 characters keep at most 16 MiB alive
#: (4 bytes a character at worst), about 4 MiB for ASCII keys. A working set of more
#: keys costs what no memo would.
STRIPE_MEMO_KEYS_MAX: Final = 4096


class KeyLocks:
    """A :class:`RWLock` per key, striped: key ``k`` uses lock ``hash(k) % stripes``.

    Two keys may share a stripe, which only costs a little concurrency; the store never
    holds two keys' locks at once, so sharing cannot deadlock. Striping saves making
    and dropping a lock object on every call (a few microseconds of a 4 KiB cached read).
    """

    def __init__(self, stripes: int = STRIPES) -> None:
        self._stripes = [RWLock() for _ in range(stripes)]
        #: key -> its stripe, for the keys read lately (see STRIPE_MEMO_KEYS_MAX). Read
        #: and written without a lock: each dict operation is atomic under the GIL, and
        #: a lost entry only costs the next lookup the hash again.
        self._memo: dict[str, RWLock] = {}

    def lock_for(self, key: str) -> RWLock:
        lock = self._memo.get(key)
        if lock is None:
            lock = self._stripes[hash(key) % len(self._stripes)]
            if len(key) <= KEY_BYTES_MAX:
                memo = self._memo
                if len(memo) >= STRIPE_MEMO_KEYS_MAX:
                    # One forgotten, not all: freeing 4,096 strings at once on the
                    # event loop would be a pause in the reads it answers.
                    # (Another thread may change the memo first: no harm.)
                    with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                        del memo[next(iter(memo))]
                memo[key] = lock
        return lock

    def read(self, key: str) -> _ReadGuard:
        return _ReadGuard(self.lock_for(key))

    def write(self, key: str) -> _WriteGuard:
        return _WriteGuard(self.lock_for(key))
