"""The storage object: a node's objects as seen by mobile objects (anchored).

Every node hosts one, with the id ``NODE/storage``; it never moves. Objects
running at the node call it with a plain method call; objects at a client reach it
by RPC, and the resource monitor measures the bytes on that edge, which is what
placement is about.
"""

from __future__ import annotations

from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.store import ObjectStore

#: Most keys one ``list`` call returns (a page; ``next`` continues).
LIST_PAGE_MAX = 1000


@builtin("storage")
class StorageObject(MobileObject):
    """Reads and writes of one node's object store."""

    anchored = True
    migratable = False
    concurrent = True  # the store is thread-safe: readers must not queue behind a write

    def __init__(self, store: ObjectStore) -> None:
        self._store = store

    def read(self, key: str, offset: int = 0, length: int | None = None) -> bytes:
        """Up to ``length`` bytes of ``key`` from ``offset`` (fewer at the end, b"" past it)."""
        return self._store.read(key, offset, length)

    def size(self, key: str) -> int:
        return self._store.stat(key).size

    def stat(self, key: str) -> dict[str, Any]:
        a = self._store.stat(key)
        return {"key": a.key, "size": a.size, "version": a.version, "mtime_ns": a.mtime_ns}

    def list(
        self, prefix: str = "", start_after: str | None = None, limit: int = LIST_PAGE_MAX
    ) -> dict[str, Any]:
        """A page of keys under ``prefix``: ``{keys, next}`` (``next`` None at the end)."""
        if not 0 < limit <= LIST_PAGE_MAX:
            raise InvalidArgumentError(f"limit must be in 1..{LIST_PAGE_MAX}, got {limit}")
        page = self._store.list(prefix, start_after=start_after, limit=limit)
        return {"keys": list(page.keys), "next": page.next_start_after}

    def put(self, key: str, data: bytes) -> dict[str, Any]:
        a = self._store.put(key, data)
        return {"key": a.key, "size": a.size, "version": a.version}

    def write(self, key: str, offset: int, data: bytes) -> dict[str, Any]:
        w = self._store.write(key, offset, data, create=True)
        return {"key": w.key, "size": w.size, "version": w.version}
