"""A block-cache miss the kernel's page cache holds, read on the event loop, compiled.

:meth:`ObjectStore.read_nowait <shuttle.store.reads.ReadOps.read_nowait>`'s read,
alone in a module so that it is compiled with the mypyc group (:mod:`shuttle.compiled`)
as the cache-hit read (:mod:`shuttle.store.fastread`) is. A node's read lane calls
:meth:`MissReads.read` directly when the block cache missed, so a miss the page cache
answers runs no interpreted frame on the node either. Interpreted, this path was
about 14 µs of a 64 KiB block's miss against 2 µs for a hit (benchmarks/README.md,
"The miss path"); most of the difference was the interpreter's work around the
``preadv``: the lock, the lease of the open file, the block cache's general fill.

What it does, in order, and why each step is there (the guarantees are the thread
path's, :meth:`ObjectStore.read`):

* the key's lock taken **shared**, and only if no writer holds or waits for it
  (:meth:`RWLock.try_acquire_read <shuttle.store.locks.RWLock.try_acquire_read>`):
  while it is held no change of the key can run, so the attributes, the file and
  the blocks put in the cache are of one version, and no change can have updated
  the cache before this read puts a block of the old contents back (the block
  cache's concurrency contract). A change under way or waiting declines the read;
* the attributes looked up in memory only (the table's two maps, as the cache-hit
  read does): a key whose record is on disk, or a stale chunk list, declines;
* the object's file **borrowed** from the files kept open (:mod:`shuttle.store.openfiles`)
  for the version read under the lock, and given back once read: a pool thread's
  read of another key may evict the entry meanwhile (``preadv`` lets other threads
  run), and only the lease keeps its descriptor from being closed, and its number
  reused, under this read;
* the blocks the cache would fetch read with ``RWF_NOWAIT``
  (:class:`~shuttle.store.nowait.NowaitReads`): None (the thread pool reads it) when
  the kernel would wait for the disk or has only part;
* a range within one block handed to :meth:`BlockCache.fill
  <shuttle.blockcache.BlockCache.fill>` (one turn of the cache's mutex), a longer
  one to :meth:`BlockCache.read <shuttle.blockcache.BlockCache.read>` with the bytes
  already read as its fetch: the same fill rules and counters either way.

Anything unusual declines (None), for :meth:`ObjectStore.read` to answer or raise.
"""

from __future__ import annotations

from shuttle.errors import ShuttleError
from shuttle.store.loopreads import LoopRead
from shuttle.store.nowait import NowaitReads
from shuttle.store.openfiles import OpenFiles, is_out_of_descriptors


class MissReads(LoopRead):
    """The page-cache miss read of one store, for reads of up to ``max_bytes``.

    Reads the store's ``nowait`` and ``open_files`` and the view's ``closed`` at every
    call (tests and a closing store replace or set them), the rest once."""

    def read(
        self, key: str, offset: int, length: int, expected_version: int | None
    ) -> bytes | None:
        """Bytes ``[offset, offset+length)`` of ``key`` if the page cache holds the
        blocks they need, else None (see the module). Never waits for a writer or for
        the disk; raises nothing."""
        view = self.view
        store = view.store
        nowait: NowaitReads = store.nowait
        if not (
            0 < length <= self.max_bytes
            and offset >= 0
            and nowait.unsupported is None
            and not view.closed
        ):
            return None
        # The key is not validated: only a valid key has attributes in memory, and any
        # other declines here and is checked on the usual way (as in CachedReads).
        if view.peek(key) is None:
            return None  # unknown, absent, or attributes still on disk: the usual way
        lock = view.locks.lock_for(key)
        if not lock.try_acquire_read():
            return None  # a change under way or waiting: it may take a while
        try:
            rec = view.peek(key)  # again, now that no change can run
            if rec is None or rec.stale_chunks:
                return None
            if expected_version is not None and expected_version != rec.version:
                return None  # the usual way raises the mismatch
            size = rec.size
            end = min(size, offset + length)
            if offset >= end:
                return None
            cache = view.cache
            cached = cache.capacity_bytes > 0
            if cached:  # the blocks the cache would fetch, read whole
                bsz = cache.block_size_bytes
                start = offset // bsz * bsz
                stop = min(((end - 1) // bsz + 1) * bsz, size)
            else:
                start, stop = offset, end
            files: OpenFiles = store.open_files
            try:
                lease = files.borrow(key, rec.version, store._open_for_read)
            except (ShuttleError, OSError) as exc:
                if isinstance(exc, OSError) and is_out_of_descriptors(exc):
                    files.clear()
                return None  # the usual way says what is wrong
            try:
                blocks = nowait.read(lease.fd, start, stop)
            except OSError:
                return None
            finally:
                files.give_back(lease)
            if blocks is None:
                return None  # not (all) resident: the thread pool reads it
            if not cached:
                data = blocks
            elif stop - start <= cache.block_size_bytes:
                data = cache.fill(key, offset, end, blocks)
            else:
                data = cache.read(key, offset, end - offset, size, _Slicer(blocks, start).fetch)
            view.counters.read_done(len(data))
            return data
        finally:
            lock.release_read()


class _Slicer:
    """The block cache's fetch over bytes read beforehand (``data`` from ``start``)."""

    def __init__(self, data: bytes, start: int) -> None:
        self.data = data
        self.start = start

    def fetch(self, lo: int, hi: int) -> bytes:
        return self.data[lo - self.start : hi - self.start]
