"""Reads of the RADOS store: bytes of one version, through the node's block cache.

The version of an object lives in RADOS, and another gateway may change the object at
any time, so the cache holds, per key, the version its blocks are of
(:class:`VersionedReader`), and a read uses them only after RADOS confirmed that
version: a ``stat`` (one round trip, no data) for a hit. A key with nothing cached
costs one round trip too: the whole blocks around the range are read, and the read
reports the version it saw. Versions of a key only grow, which the reader relies on
twice: a cached version is only ever replaced by a newer one, and a read in several
pieces is of one version when the version before and after it is the same.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    VersionMismatchError,
)
from shuttle.store.cache import BlockCache
from shuttle.store.core import READ_BYTES_MAX, StoreConfig
from shuttle.store.keys import no_object
from shuttle.store.locks import KeyLocks
from shuttle.store.rados_conn import PIPELINE_PIECE_BYTES, RadosConnection, read_pieces

#: Versions remembered for the block cache. When full, the cache is emptied with them.
CACHED_VERSIONS_MAX = 65536


class Raced(Exception):
    """The object changed between our look and our write (or read)."""


class VersionedReader:
    """The read path of one RADOS store (thread-safe)."""

    def __init__(self, conn: RadosConnection, cache: BlockCache, config: StoreConfig) -> None:
        self.conn = conn
        self.rados = conn.rados
        self.timeout_s = conn.op_timeout_s
        self.cache = cache
        self.config = config
        self._locks = KeyLocks()
        self._versions: dict[str, int] = {}  # key -> version of its cached blocks
        self._versions_lock = threading.Lock()
        #: Reads started again because the object changed under them.
        self.races = 0

    def forget(self, k: str) -> None:
        """``k`` changed through this node: drop its cached blocks."""
        with self._locks.write(k):
            self.cache.invalidate(k)
            with self._versions_lock:
                self._versions.pop(k, None)

    def clear(self) -> None:
        self.cache.clear()
        with self._versions_lock:
            self._versions.clear()

    def size_version(self, k: str) -> tuple[int, int]:
        io = self.conn.ioctx()
        try:
            size, _mtime = io.stat(k)
        except self.rados.ObjectNotFound:
            raise no_object(k) from None
        return size, io.get_last_version()

    def read_once(
        self, k: str, offset: int, length: int | None, expected: int | None, use_cache: bool
    ) -> bytes:
        small = length is not None and length <= self.config.cache_read_bytes_max
        cached = small and use_cache and self.cache.capacity_bytes > 0
        if length is not None and length <= PIPELINE_PIECE_BYTES and not cached:
            # One round trip, of one version (one operation), which it reports: a
            # streaming client's 1 MiB pieces cost one RADOS read each.
            io = self.conn.ioctx()
            try:
                data = io.read(k, length, offset) if length else None
            except self.rados.ObjectNotFound:
                raise no_object(k) from None
            if data is not None:
                check_version_number(k, int(io.get_last_version()), expected)
                return bytes(data)
        if cached and length:
            with self._versions_lock:
                cold = k not in self._versions
            if cold:
                return self._read_cold(k, offset, length, expected)
        size, version = self.size_version(k)
        check_version_number(k, version, expected)
        end = size if length is None else min(size, offset + length)
        if end - offset > READ_BYTES_MAX:
            raise LimitExceededError(
                f"a read may return at most {READ_BYTES_MAX} bytes; asked for "
                f"{end - offset}. Read the object in pieces."
            )
        if offset >= end:
            return b""
        if cached:
            return self._cached(k, version, size, offset, end - offset)
        data = self.pipelined(k, offset, end - offset)
        if self.size_version(k)[1] != version:
            raise Raced  # versions only grow: equal before and after means one version
        return data

    def _read_cold(self, k: str, offset: int, length: int, expected: int | None) -> bytes:
        """A small read of a key with nothing cached: one round trip (the whole blocks
        around the range, and the version they are of), then into the cache."""
        bsz = self.cache.block_size_bytes
        start = offset - offset % bsz
        stop = -(-(offset + length) // bsz) * bsz
        io = self.conn.ioctx()
        try:
            data = bytes(io.read(k, stop - start, start))
        except self.rados.ObjectNotFound:
            raise no_object(k) from None
        version = int(io.get_last_version())
        check_version_number(k, version, expected)
        # A short read ends at the object's end; a full one shows whole blocks up to stop.
        size = start + len(data)
        end = min(size, offset + length)
        if offset >= end:
            return b""

        def fetch(a: int, b: int) -> bytes:
            if start <= a and b <= size:
                return data[a - start : b - start]
            return self.pipelined(k, a, b - a, version)

        return self._cached(k, version, size, offset, end - offset, fetch)

    def _cached(
        self,
        k: str,
        version: int,
        size: int,
        offset: int,
        n: int,
        fetch: Callable[[int, int], bytes] | None = None,
    ) -> bytes:
        """Cached blocks of ``version`` only (a sequence of versions per key only grows).
        ``size``: the object's, or any block boundary short of it."""
        with self._versions_lock:
            have = self._versions.get(k)
        if have is None or have < version:
            with self._locks.write(k), self._versions_lock:
                have = self._versions.get(k)
                if have is None or have < version:
                    if len(self._versions) >= CACHED_VERSIONS_MAX:
                        self._versions.clear()
                        self.cache.clear()
                    self._versions[k] = version
                    self.cache.invalidate(k)  # blocks of an older version
        with self._locks.read(k):
            with self._versions_lock:
                current = self._versions.get(k) == version
            if current:
                return self.cache.read(k, offset, n, size, fetch or self._fetcher(k, version))
        return self.pipelined(k, offset, n, version)  # an older version than cached

    def _fetcher(self, k: str, version: int) -> Callable[[int, int], bytes]:
        def fetch(start: int, stop: int) -> bytes:
            return self.pipelined(k, start, stop - start, version)

        return fetch

    def pipelined(self, k: str, offset: int, n: int, version: int | None = None) -> bytes:
        """``n`` bytes at ``offset`` (fewer at the end), in aio pieces read in parallel.
        With ``version``: raises _Raced unless a one-piece read saw exactly it."""
        io = self.conn.ioctx()
        if n <= PIPELINE_PIECE_BYTES:
            try:
                data = io.read(k, n, offset)
            except self.rados.ObjectNotFound:
                raise no_object(k) from None
            if version is not None and io.get_last_version() != version:
                raise Raced
            return bytes(data)
        data = read_pieces(io, k, offset, n, self.timeout_s)
        if version is not None and self.size_version(k)[1] != version:
            raise Raced  # versions only grow: equal after the reads means one version
        return data


def check_version_number(k: str, have: int, expected: int | None) -> None:
    """VersionMismatchError unless ``expected`` is None or ``have`` (0: missing)."""
    if expected is None:
        return
    if expected < 0:
        raise InvalidArgumentError(f'"expected_version" must be >= 0, got {expected}')
    if have != expected:
        state = "does not exist" if have == 0 else f"is at version {have}"
        want = "not to exist" if expected == 0 else f"version {expected}"
        raise VersionMismatchError(
            f"{k!r} {state}, but the caller expected {want}. Stat it and retry "
            "with the current version."
        )
