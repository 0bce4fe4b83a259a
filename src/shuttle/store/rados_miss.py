"""Reads that miss a RADOS gateway's block cache, started and completed on its event loop.

A small read of a key whose cached version the gateway trusts (its watch healthy, its
probation over: :mod:`shuttle.store.rados_watch`) but whose blocks are not all
resident is read from RADOS by an asynchronous read the node's event loop starts
(:mod:`shuttle.store.rados_aio`), and answered there when RADOS answers: no thread of
the node's pool takes part. What it reads is :class:`~shuttle.store.rados_admission.
MissAdmission`'s decision:

* *whole*: the blocks around the range, which go into the cache (the cache has room
  for them, or one of them was missed recently enough that it would stay);
* *partial*: only the bytes asked for, cached nowhere (a block admitted now would be
  evicted before its next use: the working set is larger than the cache).

Either way the version check is the thread path's (:meth:`VersionedReader.read_once
<shuttle.store.rados_read.VersionedReader.read_once>`): the read is one RADOS
operation, which reports the version of the bytes it returned; bytes of the trusted
entry's version are answered (and, whole, cached), bytes of a newer version (a change
written with librados directly, or one whose announcement is on its way) are answered
uncached after the ``expected`` check and drop the stale entry. A read never returns
bytes of a version other than the one it names.

The node's read lane calls these reads through :class:`InlineReads`, one object for
the hit (:meth:`VersionedReader.read_cached
<shuttle.store.rados_read.VersionedReader.read_cached>`, as the store counts it) and the
miss, limited to the node's inline reads: compiled with the mypyc group
(:mod:`shuttle.compiled`, as this module, :mod:`~shuttle.store.rados_read`,
:mod:`~shuttle.store.rados_admission` and :mod:`~shuttle.store.rados_aio` are), so
neither a hit nor a miss runs an interpreted frame of the store's between the node's
dispatch and librados (benchmarks/README.md, "Warm reads on a RADOS gateway": the
interpreted Python was about 55 µs of a miss's CPU before).

Counters (in the store's ``stats()["rados"]``): ``aio_reads`` (misses answered this
way), ``aio_newer`` (of those, reads that found a newer version than the entry's),
``aio_bytes`` (bytes they read from RADOS), and the admission's ``whole_reads``,
``partial_reads`` and ``ghost_hits``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar, final

from shuttle.blockcache import NO_SPAN, SpanReader
from shuttle.errors import ShuttleError
from shuttle.store.rados_admission import MissAdmission
from shuttle.store.rados_aio import AioClient, read_error
from shuttle.store.rados_read import Entry, VersionedReader, check_version_number, small_read
from shuttle.store.stats import StoreCounters

T = TypeVar("T")


class LoopReads:
    """The reads of one RADOS store that its event loop answers (see the module): its
    trusted cache hits (:meth:`read_cached`) and its misses (:meth:`read_async`)."""

    def __init__(self, reader: VersionedReader, aio: AioClient | None) -> None:
        self.reader = reader
        self.aio = aio
        #: The store's counters (the reader's).
        self.counters: StoreCounters = reader.counters
        cache = reader.cache
        self.admission = MissAdmission(
            cache.capacity_bytes // cache.block_size_bytes if cache.capacity_bytes else 0
        )
        self.aio_reads = 0
        self.aio_newer = 0
        self.aio_bytes = 0
        #: Direct reads answered with the object's location instead of its bytes.
        self.direct_answers = 0

    def read_cached(self, k: str, offset: int, length: int, expected: int | None) -> bytes | None:
        """A small read answered from trusted cached blocks, counted as the store counts
        its reads, or None (:meth:`VersionedReader.read_cached`: a miss, no trust,
        anything unusual). Never blocks, never raises."""
        data = self.reader.read_cached(k, offset, length, expected)
        if data is not None:
            self.counters.read_done(len(data))
        return data

    def limited(self, max_bytes: int) -> InlineReads:
        """These reads as the node's read lane calls them, for at most ``max_bytes``."""
        return InlineReads(self, max_bytes)

    def read_async(
        self,
        k: str,
        offset: int,
        length: int,
        expected: int | None,
        wrap: Callable[[bytes], T],
    ) -> asyncio.Future[T] | None:
        """A small read of a key whose entry is trusted but whose blocks are not all
        resident, started on the running event loop: a future of ``wrap(bytes)`` that
        the loop completes when RADOS answers, or None (no trusted entry, a change
        under way, anything unusual: the thread path answers it). Never blocks;
        returns None rather than raising.

        The key's lock is held shared from the start until the answer is in the cache
        (taken only if no change holds it or waits for it, and given back on the
        loop), as the thread path holds it around its fetch. The future fails with the
        errors the thread path raises (NotFoundError, VersionMismatchError,
        StorageIOError naming a timeout)."""
        aio, reader = self.aio, self.reader
        cache = reader.cache
        if aio is None:
            return None
        span = self._trusted_span(k, offset, length, expected)
        if span is None:
            return None
        e, end = span
        lock = reader.lock_for(k)
        if not lock.try_acquire_read():
            return None  # a change through this node under way or waiting
        if reader.entry(k) is not e:  # replaced before the lock was taken
            lock.release_read()
            return None
        bsz = cache.block_size_bytes
        first, last = offset // bsz, (end - 1) // bsz
        room = cache.stats()
        whole = self.admission.whole(
            k, first, last, room.bytes_cached + (last - first + 1) * bsz <= room.capacity_bytes
        )
        start, stop = (first * bsz, (last + 1) * bsz) if whole else (offset, end)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        counters = self.counters
        t0 = time.monotonic()

        def done(rv: int, version: int, data: bytes) -> None:
            try:
                if rv < 0:
                    raise read_error(k, -rv, reader.timeout_s)
                # A short read ends at the object's end; a full one says it is longer.
                seen = Entry(version, start + len(data), len(data) < stop - start, t0)
                out = self._answer(k, e, seen, start, data, offset, length, expected, whole)
                counters.read_done(len(out))
                if not future.cancelled():
                    future.set_result(wrap(out))
            except ShuttleError as exc:  # as the thread path's ``_op`` counts it
                counters.op("read")
                counters.error(exc.code)
                if not future.cancelled():
                    future.set_exception(exc)
            except Exception as exc:  # a bug: answered (as an internal error), not hung
                if not future.done():
                    future.set_exception(exc)
            finally:
                lock.release_read()

        if not aio.read(k, start, stop - start, done, loop):
            lock.release_read()
            return None
        reader.stat_free_hits += 1  # trusted, as the thread path counts its reads of it
        return future

    def located(self, k: str, offset: int, length: int, expected: int | None) -> Any:
        """A client's ``direct`` read (docs/ceph.md, "A client that reads a miss from the
        OSD itself"), on the event loop, where it missed the block cache: where the
        client reads the bytes itself, ``{pool, namespace, object, version}`` (each key
        is one RADOS object named by the key; the version its bytes must be at least:
        the trusted entry's), or None, and the node reads them its usual way (no
        trusted entry, a change through this node under way, anything unusual, or
        blocks the admission would cache: the cache fills for the next reader as
        without ``direct``). Never blocks, never raises; reads nothing.

        Named, the miss counts as a partial one in the admission (its blocks go into
        the ghost queue, so that the same blocks asked again through the node within
        the cache's reach are read whole)."""
        reader = self.reader
        cache = reader.cache
        span = self._trusted_span(k, offset, length, expected)
        if span is None:
            return None
        e, end = span
        lock = reader.lock_for(k)
        if not lock.try_acquire_read():
            return None  # a change through this node under way or waiting
        lock.release_read()
        if reader.entry(k) is not e:
            return None
        bsz = cache.block_size_bytes
        first, last = offset // bsz, (end - 1) // bsz
        room = cache.stats()
        admission = self.admission
        fits = room.bytes_cached + (last - first + 1) * bsz <= room.capacity_bytes
        if admission.would_keep(k, first, last, fits) or admission.whole(k, first, last, fits):
            return None
        self.direct_answers += 1
        reader.stat_free_hits += 1  # trusted: RADOS was not asked
        conn = reader.conn
        return {"pool": conn.pool, "namespace": conn.namespace, "object": k, "version": e.version}

    def _trusted_span(
        self, k: str, offset: int, length: int, expected: int | None
    ) -> tuple[Entry, int] | None:
        """A small read's trusted entry and the end of what it reads, or None: a bad
        or large request, no cache, no trusted entry, a version mismatch (the thread
        path words it) or nothing to read (the thread path answers b"")."""
        reader = self.reader
        if not (
            small_read(k, offset, length, reader.config.cache_read_bytes_max)
            and reader.cache.capacity_bytes > 0
        ):
            return None
        e = reader.trusted_entry(k)
        if e is None or (expected is not None and expected != e.version):
            return None
        end = min(offset + length, e.size) if e.exact else offset + length
        return None if offset >= end else (e, end)

    def _answer(
        self,
        k: str,
        e: Entry,
        seen: Entry,
        start: int,
        data: bytes,
        offset: int,
        length: int,
        expected: int | None,
        whole: bool,
    ) -> bytes:
        """:meth:`read_async`'s answer from the bytes from ``start`` that RADOS returned
        (fewer at the object's end: ``seen.exact``) at ``seen.version``, the key's read
        lock held (``e``: the trusted entry the read began with); ``whole``: they are
        whole blocks, for the cache."""
        self.aio_reads += 1
        self.aio_bytes += len(data)
        reader = self.reader
        version = seen.version
        if version != e.version:  # changed since the entry was made (unannounced, or
            self.aio_newer += 1  # its announcement still on its way): not trusted now
            reader.drop_older(k, version)
        check_version_number(k, version, expected)
        size = seen.size  # a short read ends at the object's end
        end = min(size, offset + length)
        if offset >= end:
            return b""
        current = reader.still_current(k, e, seen)
        if not (current and whole):  # the right bytes, not for the cache
            return data[offset - start : end - start]

        def fetch(a: int, b: int) -> bytes:
            return data[a - start : b - start]

        return reader.cache.read(k, offset, end - offset, size, fetch)

    def stats(self) -> dict[str, int]:
        return {
            "aio_reads": self.aio_reads,
            "aio_newer": self.aio_newer,
            "aio_bytes": self.aio_bytes,
            "direct_answers": self.direct_answers,
            **self.admission.stats(),
        }


@final
class InlineReads(SpanReader):
    """A RADOS store's reads on the event loop for the node's read lane (see the
    module), of at most ``max_bytes``: the calls the lane and ``Operation.start`` make,
    ``(key, offset, length, expected_version)`` with the request's values, compiled, so
    none of them runs an interpreted frame (the lane's hit, :meth:`lane_span`, is a
    :class:`~shuttle.blockcache.SpanReader`'s: a native call)."""

    def __init__(self, reads: LoopReads, max_bytes: int) -> None:
        self.reads = reads
        self.max_bytes = max_bytes

    def read(self, key: str, offset: int, length: int, version: int | None) -> bytes | None:
        """A trusted cache hit's bytes, or None (:meth:`LoopReads.read_cached`)."""
        if length <= self.max_bytes:
            return self.reads.read_cached(key, offset, length, version)
        return None

    def lane_span(
        self, key: str, offset: int, length: int, expected_version: int | None
    ) -> tuple[bytes, int, int]:
        """:meth:`read` as the read lane's span of the bytes, ``(bytes, 0, len)``, or
        ``NO_SPAN``."""
        if length <= self.max_bytes:
            data = self.reads.read_cached(key, offset, length, expected_version)
            if data:
                return data, 0, len(data)
        return NO_SPAN

    def read_async(
        self,
        key: str,
        offset: int,
        length: int,
        version: int | None,
        wrap: Callable[[bytes], Any],
    ) -> asyncio.Future[Any] | None:
        """A miss started on the running loop, or None (:meth:`LoopReads.read_async`)."""
        if length <= self.max_bytes:
            return self.reads.read_async(key, offset, length, version, wrap)
        return None

    def located(self, key: str, offset: int, length: int, version: int | None) -> Any:
        """A ``direct`` miss's location, or None (:meth:`LoopReads.located`)."""
        if length <= self.max_bytes:
            return self.reads.located(key, offset, length, version)
        return None
