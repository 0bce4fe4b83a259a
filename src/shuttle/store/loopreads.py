"""What the store's two reads on the event loop share, compiled.

A node answers a small read on its event loop in one of two ways: from the block cache
without the key's lock (:class:`~shuttle.store.fastread.CachedReads`), or, when that
misses, from the kernel's page cache without waiting for the disk
(:class:`~shuttle.store.missread.MissReads`). Both look at the same parts of one store,
held here once as a :class:`StoreView`: the store itself (for the miss's open files
and nowait reader), whether it is closed (the view's own flag, which the store's
``close`` sets: a native field the reads look at for every read), its key locks, the
attribute table's two maps (by reference: the table never rebinds them, only changes
their contents), the block cache and the counters. Both are a :class:`LoopRead`: a view and the most
bytes a read may ask for, narrowed by :meth:`LoopRead.limited` for a node's inline
limit. Alone in a module, compiled with the mypyc group (:mod:`shuttle.compiled`), so
the two reads' native code calls it natively.
"""

from __future__ import annotations

from typing import Any, Self, final

from shuttle.blockcache import BlockCache
from shuttle.store.attrs import StoredAttrs
from shuttle.store.locks import KeyLocks
from shuttle.store.stats import StoreCounters


@final
class StoreView:
    """The parts of one store the loop-side reads look at (see the module)."""

    def __init__(
        self,
        store: Any,
        locks: KeyLocks,
        dirty: dict[str, Any],
        clean: dict[str, Any],
        cache: BlockCache,
        counters: StoreCounters,
    ) -> None:
        self.store = store  # read at every call: tests change it
        #: Set once by the store's ``close``: from then on both reads decline.
        self.closed = False
        self.locks = locks
        self.dirty = dirty
        self.clean = clean
        self.cache = cache
        self.counters = counters

    def peek(self, key: str) -> StoredAttrs | None:
        """The key's attributes if they are in memory, else None: the table's maps read
        as ``AttrTable.peek`` reads them, without its mutex (a dict lookup is atomic
        under the GIL, and a checkpoint moving the record between the maps at worst
        makes a reader decline). An absent key's marker, or a record still on disk, is
        None too: the usual way answers those."""
        found = self.dirty.get(key)
        if found is None:
            found = self.clean.get(key)
        if type(found) is not StoredAttrs:
            return None
        rec: StoredAttrs = found
        return rec


class LoopRead:
    """A read an event loop may call, over one store's :class:`StoreView`, for reads of
    up to ``max_bytes``; subclasses give its ``read``."""

    def __init__(self, view: StoreView, max_bytes: int) -> None:
        self.view = view
        self.max_bytes = max_bytes

    def limited(self, max_bytes: int) -> Self:
        """The same reads over the same view, for at most ``max_bytes`` (a node's
        inline limit)."""
        return type(self)(self.view, min(self.max_bytes, max_bytes))
