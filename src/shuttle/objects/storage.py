"""The storage object: a node's objects as seen by mobile objects (anchored).

Every node hosts one, with the id ``NODE/storage``; it never moves. Objects
running at the node call it with a plain method call; objects at a client reach it
by RPC, and the resource monitor measures the bytes on that edge, which is what
placement is about.

It also offers the *parity primitives* a RAID 5 object needs (``swap`` and the
``stripe_*`` calls): they are the node half of RAID 5 parity and live in
:mod:`shuttle.objects.fs.raid_node`; the methods here only hand them on, so that
callers reach them, and the run-time checks them, as methods of the storage object.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any, ClassVar

from shuttle.errors import InvalidArgumentError
from shuttle.objects.fs import raid_node
from shuttle.objects.fs.raid_node import ParityNode
from shuttle.runtime.authority import Needs, every, list_roots, needs
from shuttle.runtime.mobile import MobileObject, builtin
from shuttle.store.interface import Store
from shuttle.store.listing import list_within

#: Most keys one ``list`` call returns (a page; ``next`` continues).
LIST_PAGE_MAX = 1000


@builtin("storage")
class StorageObject(MobileObject):
    """Reads and writes of one node's object store."""

    anchored = True
    migratable = False
    concurrent = True  # the store is thread-safe: readers must not queue behind a write
    # What a principal's objects need to call each method (runtime/authority.py): the
    # keys it reads or writes (the parity primitives': raid_node.ACCESS).
    access: ClassVar[Mapping[str, Needs]] = {
        "read": needs(read=["key"]),
        "size": needs(read=["key"]),
        "stat": needs(read=["key"]),
        "list": needs(lists=True),
        "put": needs(write=["key"]),
        "write": needs(write=["key"]),
        "remove": needs(write=["key"]),
        "remove_many": needs(write=[every("keys")]),
        **raid_node.ACCESS,
    }

    def __init__(self, store: Store) -> None:
        self._store = store
        self._parity = ParityNode(store)

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
        # A principal's object sees only the keys its principal may read.
        roots = list_roots(getattr(self._invoker, "principals", None), prefix)
        if roots is None:
            page = self._store.list(prefix, start_after=start_after, limit=limit)
        else:
            page = list_within(self._list, prefix, roots, None, start_after, limit)
        return {"keys": list(page.keys), "next": page.next_start_after}

    def _list(self, prefix: str, delimiter: str | None, after: str | None, limit: int) -> Any:
        return self._store.list(prefix, delimiter=delimiter, start_after=after, limit=limit)

    def put(self, key: str, data: bytes) -> dict[str, Any]:
        a = self._store.put(key, data)
        return {"key": a.key, "size": a.size, "version": a.version}

    def write(self, key: str, offset: int, data: bytes) -> dict[str, Any]:
        w = self._store.write(key, offset, data, create=True)
        return {"key": w.key, "size": w.size, "version": w.version}

    def remove(self, key: str) -> bool:
        """Remove object ``key``; False if there was none (removing twice is not an
        error: a removal cut short is finished by running it again). A RAID file's
        record among the keys is forgotten by the parity primitives too."""
        return self.remove_many([key])[0]

    def remove_many(self, keys: builtins.list[str]) -> builtins.list[bool]:
        """Remove each of ``keys``; True where it existed. Every key is checked before
        anything is removed; removals done before a disk error stay done."""
        if not isinstance(keys, builtins.list | tuple) or not all(isinstance(k, str) for k in keys):
            raise InvalidArgumentError(f"keys must be a list of keys, got {keys!r:.60}")
        removed = self._store.remove_many(list(keys))
        self._parity.forget(keys)
        return removed

    # --- the parity primitives of RAID 5 (objects/fs/raid_node.py) ----------------------

    def swap(
        self,
        key: str,
        offset: int,
        data: bytes,
        return_old: bool = True,
        record: str | None = None,
        size: int = 0,
    ) -> bytes:
        """See :meth:`.raid_node.ParityNode.swap`."""
        return self._parity.swap(key, offset, data, return_old, record, size)

    def record_size(self, record: str, size: int) -> int:
        """See :meth:`.raid_node.ParityNode.record_size`."""
        return self._parity.record_size(record, size)

    def stripe_begin(
        self, record: str, stripe: int, intent: str, size: int = 0, exclusive: bool = False
    ) -> dict[str, Any]:
        """See :meth:`.raid_node.ParityNode.stripe_begin`."""
        return self._parity.stripe_begin(record, stripe, intent, size, exclusive)

    def stripe_end(
        self, record: str, stripe: int, intent: str, key: str, offset: int, delta: bytes
    ) -> dict[str, Any]:
        """See :meth:`.raid_node.ParityNode.stripe_end`."""
        return self._parity.stripe_end(record, stripe, intent, key, offset, delta)

    def stripe_abandon(self, record: str, stripe: int, intent: str) -> dict[str, Any]:
        """See :meth:`.raid_node.ParityNode.stripe_abandon`."""
        return self._parity.stripe_abandon(record, stripe, intent)

    def stripe_read(
        self,
        record: str,
        stripe: int,
        key: str = "",
        offset: int = 0,
        length: int = 0,
        intent: str | None = None,
    ) -> dict[str, Any]:
        """See :meth:`.raid_node.ParityNode.stripe_read`."""
        return self._parity.stripe_read(record, stripe, key, offset, length, intent)

    def stripe_put(
        self,
        record: str,
        stripe: int,
        version: str,
        key: str,
        offset: int,
        parity: bytes,
        intent: str | None = None,
        clear: bool = False,
    ) -> dict[str, Any]:
        """See :meth:`.raid_node.ParityNode.stripe_put`."""
        return self._parity.stripe_put(record, stripe, version, key, offset, parity, intent, clear)

    def stripe_record(self, record: str) -> dict[str, Any]:
        """See :meth:`.raid_node.ParityNode.stripe_record`."""
        return self._parity.stripe_record(record)
