"""Reader/writer locks, and a table of them keyed by object key.

The store holds a key's lock shared for reads and stats, and exclusive for changes,
so a reader never sees half of a range write and the block cache never gets stale
blocks back. Waiting writers block new readers, so a busy object cannot starve a writer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    """Many readers or one writer. Not reentrant."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True

    def release_write(self) -> None:
        with self._cond:
            self._writer = False
            self._cond.notify_all()

    @contextmanager
    def read(self) -> Iterator[None]:
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self) -> Iterator[None]:
        self.acquire_write()
        try:
            yield
        finally:
            self.release_write()


class KeyLocks:
    """One :class:`RWLock` per key, made on first use and dropped when nobody holds it."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._locks: dict[str, tuple[RWLock, int]] = {}

    def _get(self, key: str) -> RWLock:
        with self._mutex:
            lock, users = self._locks.get(key, (None, 0))
            if lock is None:
                lock = RWLock()
            self._locks[key] = (lock, users + 1)
            return lock

    def _put(self, key: str) -> None:
        with self._mutex:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    @contextmanager
    def read(self, key: str) -> Iterator[None]:
        lock = self._get(key)
        try:
            with lock.read():
                yield
        finally:
            self._put(key)

    @contextmanager
    def write(self, key: str) -> Iterator[None]:
        lock = self._get(key)
        try:
            with lock.write():
                yield
        finally:
            self._put(key)

    def __len__(self) -> int:
        with self._mutex:
            return len(self._locks)
