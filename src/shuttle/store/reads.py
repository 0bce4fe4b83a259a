"""The store's reads: ``stat``, ``read`` and its two ways that an event loop may
take (a block-cache hit, a miss the page cache holds), and ``list``.

:class:`ReadOps` is one part of :class:`~shuttle.store.objects.ObjectStore` (which
documents the errors every operation shares); the machinery under it is in
:mod:`shuttle.store.core`. A read holds the key's lock shared, so it never sees half
of a change; the two loop-side reads are compiled modules of their own
(:mod:`shuttle.store.fastread`, :mod:`shuttle.store.missread`), called from here and
directly by a node's read lane.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Sequence

from shuttle.errors import InvalidArgumentError, LimitExceededError, ShuttleError
from shuttle.store.attrs import ObjectAttrs, StoredAttrs
from shuttle.store.cache import Fetch
from shuttle.store.config import READ_BYTES_MAX
from shuttle.store.core import StoreCore
from shuttle.store.keys import no_object, validate_key, validate_prefix
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing, list_page
from shuttle.store.paths import pread_exact


class ReadOps(StoreCore):
    """The reads of :class:`~shuttle.store.objects.ObjectStore` (see the module)."""

    def stat(self, key: str, *, expected_version: int | None = None) -> ObjectAttrs:
        """The attributes of ``key``: size, version, mtime, whole-object blake3 hash and
        chunk list.

        The first stat after a range write or truncate hashes the whole object once.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different.
        """
        k = validate_key(key)
        with self._op("stat"), self._locks.read(k):
            rec = self._current(k)
            if rec is None:
                raise no_object(k)
            self._check_version(k, rec, expected_version)
            return self._complete(rec)

    def stat_is_cached(self, key: str) -> bool:
        """True if :meth:`stat` of ``key`` would be answered from memory (attributes cached,
        whole-object hash known). An event-loop server can run such stats inline and send
        the others to a thread: the first stat after a range write hashes the whole object
        (about 0.15 s per 256 MiB here), and a stat of an uncached key reads its attribute
        file. Never raises; an invalid key gives False."""
        try:
            rec = self.attrs.peek(validate_key(key))
        except ShuttleError:
            return False
        return isinstance(rec, StoredAttrs) and rec.hash is not None and not rec.stale_chunks

    def stat_many(self, keys: Sequence[str]) -> builtins.list[ObjectAttrs | None]:
        """:meth:`stat` of each key, None for a missing object.

        Every key is validated first: one invalid key fails the whole call
        (InvalidKeyError) before any is looked up.
        """
        checked = [validate_key(k) for k in keys]
        out: builtins.list[ObjectAttrs | None] = []
        with self._op("stat_many"):
            for k in checked:
                with self._locks.read(k):
                    rec = self._current(k)
                    out.append(None if rec is None else self._complete(rec))
        return out

    def read_cached(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | None:
        """:meth:`read` of ``[offset, offset+length)`` if the block cache holds all of
        it, else None. Never touches the disk and never waits for the key's lock, so an
        event loop may call it (the node answers hits there and sends the rest to its
        thread pool); never raises: None for anything unusual too (a miss, a bad
        argument, a read at or past the end, a change under way), which :meth:`read`
        then answers or raises."""
        # The lookup is CachedReads.read (shuttle.store.fastread, compiled, where the
        # argument for reading without the key's lock is), which a node's read lane
        # calls directly.
        if _loop_read_args(key, offset, length, expected_version):
            return self.cached_reads.read(key, offset, length, expected_version)
        return None

    def read_nowait(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | None:
        """:meth:`read` of ``[offset, offset+length)`` when the kernel's page cache holds
        the blocks it needs, else None; never waits for the disk or for a writer, so an
        event loop may call it after :meth:`read_cached` missed (a node does, and sends
        only what this declines to its thread pool). Never raises: None for anything
        unusual too, which :meth:`read` then answers or raises.

        Exactly the thread path's read, but for how the file is read: under the key's
        lock held shared (taken only if no writer holds it or waits), the same checks,
        and the same fill of the block cache, whose blocks are read beforehand with
        ``RWF_NOWAIT`` (:mod:`shuttle.store.nowait`): the cache's fill rules and
        counters see them like any other fetch. A read the kernel could not answer
        whole counts nothing here.
        """
        # The read is MissReads.read (shuttle.store.missread, compiled, where each step
        # is argued), which a node's read lane calls directly.
        if _loop_read_args(key, offset, length, expected_version):
            return self.miss_reads.read(key, offset, length, expected_version)
        return None

    def read(
        self,
        key: str,
        offset: int = 0,
        length: int | None = None,
        *,
        expected_version: int | None = None,
        use_cache: bool = True,
    ) -> bytes:
        """Up to ``length`` bytes of ``key`` from ``offset`` (to the end if None).

        Returns fewer bytes only at the end of the object (``b""`` at or past it).
        Reads up to ``cache_read_bytes_max`` go through the block cache.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different (nothing read).
            InvalidArgumentError: negative offset or length.
            LimitExceededError: more than :data:`READ_BYTES_MAX` requested at once.
        """
        if use_cache and length is not None:
            data = self.read_cached(key, offset, length, expected_version)
            if data is not None:
                return data
        k = validate_key(key)
        with self._op("read"), self._locks.read(k):
            rec = self._current(k)
            if rec is None:
                raise no_object(k)
            self._check_version(k, rec, expected_version)
            if offset < 0 or (length is not None and length < 0):
                raise InvalidArgumentError(
                    f"offset and length must be >= 0, got offset={offset} length={length}"
                )
            end = rec.size if length is None else min(rec.size, offset + length)
            if end - offset > READ_BYTES_MAX:
                raise LimitExceededError(
                    f"a read may return at most {READ_BYTES_MAX} bytes; asked for "
                    f"{end - offset}. Read the object in pieces."
                )
            if offset >= end:
                return b""
            n = end - offset
            if use_cache and self.cache.capacity_bytes and n <= self.config.cache_read_bytes_max:
                data = self.cache.read(k, offset, n, rec.size, self._fetcher(k, rec.version))
            else:
                fd = self.paths.open_file(k, os.O_RDONLY)
                try:
                    data = pread_exact(fd, n, offset)
                finally:
                    os.close(fd)
            self.counters.add(bytes_read=len(data))
            return data

    def _fetcher(self, key: str, version: int) -> Fetch:
        """The block cache's fetch of ``key`` at ``version``, through the kept open file
        (:class:`~shuttle.store.openfiles.OpenFiles`). Caller holds the key's lock."""

        def fetch(start: int, stop: int) -> bytes:
            files = self.open_files
            lease = files.borrow(key, version, self._open_for_read)
            try:
                return pread_exact(lease.fd, stop - start, start)
            finally:
                files.give_back(lease)

        return fetch

    def list(
        self,
        prefix: str = "",
        *,
        delimiter: str | None = None,
        start_after: str | None = None,
        limit: int = LIST_PAGE_ENTRIES_MAX,
    ) -> Listing:
        """A page of the keys that start with ``prefix``, in string order.

        With ``delimiter="/"`` keys below the next ``/`` are folded into ``prefixes``
        ("directories"). Keep calling with ``start_after=page.next_start_after`` until
        it is None. A listing is not a snapshot: keys changed meanwhile may or may not
        appear.

        Raises:
            InvalidKeyError: malformed prefix.
            InvalidArgumentError: delimiter other than "/" or limit out of range.
        """
        p = validate_prefix(prefix)
        with self._op("list"):
            return list_page(self.paths, p, delimiter, start_after, limit)


def _loop_read_args(key: object, offset: object, length: object, version: object) -> bool:
    """True if a read's arguments have the exact types the compiled loop-side reads
    take (:mod:`shuttle.store.loopreads`): they would refuse anything else with
    TypeError, and :meth:`ReadOps.read_cached` and :meth:`ReadOps.read_nowait` promise
    never to raise. Anything else is for :meth:`ReadOps.read` to check and name."""
    return (
        type(key) is str
        and type(offset) is int
        and type(length) is int
        and (version is None or type(version) is int)
    )
