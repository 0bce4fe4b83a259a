"""What wraps the store's calls and changes (:class:`~shuttle.store.core.StoreCore`).

* Every public call runs in an :class:`OpScope`: it counts the call's error by code
  and turns an ``OSError`` into the error a client can act on (a full disk, a
  passing shortage of descriptors, a disk fault), each saying what to do.
* Every change holds its key's exclusive lock through :func:`forgetting`, which
  forgets the key's kept open file once the lock is held (no read through it can
  outlive the change), inside the change hook's :func:`hooked` when there is one
  (the node's callbacks and the workers' generations hear of the change first).
* A journaled change that finds no free descriptor is run again a few times
  (:func:`retry_while_out_of_descriptors`): its record is durable, so giving up would
  leave the store refusing changes until a restart.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from shuttle.errors import DiskFullError, NodeBusyError, ShuttleError, StorageIOError
from shuttle.store.config import ChangeHook
from shuttle.store.openfiles import OpenFiles, is_out_of_descriptors
from shuttle.store.space import is_disk_full
from shuttle.store.stats import StoreCounters

_T = TypeVar("_T")


@contextlib.contextmanager
def forgetting(
    open_files: OpenFiles, key: str, lock: AbstractContextManager[object]
) -> Iterator[None]:
    """``lock`` (the key's exclusive lock), and once it is held the key's kept open
    file forgotten."""
    with lock:
        open_files.forget(key)
        yield


@contextlib.contextmanager
def hooked(hook: ChangeHook, key: str, lock: AbstractContextManager[object]) -> Iterator[None]:
    """``lock`` entered once the change hook let the change of ``key`` go ahead."""
    with hook.changing(key), lock:
        yield


#: Waits between retries of a journaled change that found no free descriptor: about
#: 2 s in all, for connections and reads to give some back. (The node caps its
#: connections below its descriptor limit, so this is the rare case.)
DESCRIPTOR_RETRY_DELAYS_S = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def retry_while_out_of_descriptors(change: Callable[[], _T]) -> _T:
    """Run a journaled change again while descriptors are short (its record is durable,
    so giving up would leave the store refusing changes until a restart)."""
    for delay in DESCRIPTOR_RETRY_DELAYS_S:
        time.sleep(delay)
        try:
            return change()
        except OSError as exc:
            if not is_out_of_descriptors(exc):
                raise
    return change()


class OpScope:
    """Around each public call: count its error, turn an OSError into StorageIOError.
    A plain class, not a generator context manager: it is on every call's path."""

    __slots__ = ("_counters", "_name")

    def __init__(self, counters: StoreCounters, name: str) -> None:
        self._counters = counters
        self._name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        if isinstance(exc, ShuttleError):
            self._counters.error(exc.code)
        elif isinstance(exc, OSError) and is_out_of_descriptors(exc):
            self._counters.error(NodeBusyError.code)
            raise NodeBusyError(
                f"{self._name} failed: the node is out of file descriptors ({exc.strerror}), "
                "a passing shortage, not a disk fault. Nothing was changed: retry shortly; if "
                "it persists, raise the node's 'ulimit -n' or lower --connections-max."
            ) from exc
        elif isinstance(exc, OSError) and is_disk_full(exc):
            self._counters.error(DiskFullError.code)
            raise DiskFullError(
                f"{self._name} failed: the node's disk is full ({exc}). Nothing was changed. "
                "Remove objects (removes always work) or give the file system more space."
            ) from exc
        elif isinstance(exc, OSError):
            self._counters.error(StorageIOError.code)
            raise StorageIOError(f"{self._name} failed on the node's disk: {exc}") from exc
