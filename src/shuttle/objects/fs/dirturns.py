"""Serialisation of directory updates (ABACUS 6.5): the directory objects on one
run-time share striped locks, so their updates of one directory take turns there
instead of conflicting and retrying over the network. That is what a directory
object gains by moving to the directory's node, where the other clients' objects
already are. A lock only orders: correctness is the commit's, so an update that waits
too long for its turn goes ahead optimistically.
"""

from __future__ import annotations

import contextlib
import threading
import zlib
from collections.abc import Callable, Iterator

#: How long an update waits for its turn among this run-time's directory objects;
#: past it, it goes ahead optimistically (the lock orders, it does not protect).
SERIALISE_WAIT_S = 1.0
#: Locks shared by one run-time's directory objects (directories hash onto them).
LOCK_STRIPES = 64


class DirectoryTurns:
    """The locks that order one run-time's updates of each directory (by its key)."""

    def __init__(self) -> None:
        self.stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]

    @contextlib.contextmanager
    def turn(self, key: str, waiting: Callable[[], None]) -> Iterator[None]:
        """Hold the turn of directory ``key`` (``waiting()`` is called first if
        another update holds it); past :data:`SERIALISE_WAIT_S`, go ahead without."""
        lock = self.stripes[zlib.crc32(key.encode()) % LOCK_STRIPES]
        if not lock.acquire(blocking=False):
            waiting()
            if not lock.acquire(timeout=SERIALISE_WAIT_S):
                yield  # a slow peer: go ahead optimistically
                return
        try:
            yield
        finally:
            lock.release()
