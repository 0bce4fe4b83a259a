"""The client block cache and its validation (NFS-style check on open).

Blocks live in the same LRU :class:`~shuttle.blockcache.BlockCache` the node uses,
with the client's remote reads as its fetch function. Next to them the cache keeps
the object version the blocks belong to. Validation is NFS's baseline: opening an
object stats it, and the cached blocks are used only if the version still matches;
otherwise they are dropped and read again. Reads after the open carry that version,
so a change on the node between open and read is an error (``VersionMismatchError``),
never a silent mix of old and new blocks. Blocks are cached under the object's key and
version, so a block read for one version is never served for another, whatever the
threads of a client race.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shuttle.blockcache import BlockCache, Fetch
from shuttle.client.model import ObjectInfo

#: Default client cache: enough for a working set of source files or a few hot
#: objects, small next to the 24 GB of the machines we run on.
CLIENT_CACHE_BYTES_DEFAULT = 64 << 20
#: Client blocks are bigger than the node's: each miss costs a round trip, so it
#: should bring back more than a page (and 64 KiB is the average chunk size).
CLIENT_BLOCK_BYTES_DEFAULT = 64 << 10
#: Objects whose version the cache remembers; beyond this the older half is
#: forgotten with their blocks (they would only cost one refetch).
VERSIONS_KEPT_MAX = 100_000


@dataclass
class ValidationCounters:
    """How validation went: opens that found the cache valid, and those that did not."""

    validations: int = 0
    valid: int = 0
    invalidated: int = 0


class ClientCache:
    """A block cache of remote objects, validated on open."""

    def __init__(
        self,
        capacity_bytes: int = CLIENT_CACHE_BYTES_DEFAULT,
        block_size_bytes: int = CLIENT_BLOCK_BYTES_DEFAULT,
    ) -> None:
        self.blocks = BlockCache(capacity_bytes, block_size_bytes)
        self.counters = ValidationCounters()
        self._versions: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.blocks.capacity_bytes > 0

    def validate(self, info: ObjectInfo) -> bool:
        """Check-on-open: keep the cached blocks of ``info.key`` only if its version is
        the one they were read at. Returns whether the cache was valid."""
        self.counters.validations += 1
        if self._versions.get(info.key) == info.version:
            self.counters.valid += 1
            return True
        old = self._versions.get(info.key)
        if old is not None:
            self.counters.invalidated += 1
            self.blocks.invalidate(_blocks_name(info.key, old))
        if len(self._versions) >= VERSIONS_KEPT_MAX:
            self._prune()
        self._versions[info.key] = info.version
        return False

    def version(self, key: str) -> int | None:
        """The version the cached blocks of ``key`` belong to (None: none validated)."""
        return self._versions.get(key)

    def read(self, info: ObjectInfo, offset: int, length: int, fetch: Fetch) -> bytes:
        """Bytes of the validated object ``info`` through the cache; misses call ``fetch``."""
        return self.blocks.read(
            _blocks_name(info.key, info.version), offset, length, info.size, fetch
        )

    def forget(self, key: str) -> None:
        """Drop everything about ``key`` (this client changed or removed it)."""
        old = self._versions.pop(key, None)
        if old is not None:
            self.blocks.invalidate(_blocks_name(key, old))

    def clear(self) -> None:
        self.blocks.clear()
        self._versions.clear()

    def stats(self) -> dict[str, Any]:
        return {
            **self.blocks.stats().as_dict(),
            "validations": self.counters.validations,
            "validations_valid": self.counters.valid,
            "validations_invalidated": self.counters.invalidated,
        }

    def _prune(self) -> None:
        """Forget the older half of the versions (and their blocks, now unvalidatable)."""
        old = list(self._versions)[: len(self._versions) // 2]
        for key in old:
            self.forget(key)


def _blocks_name(key: str, version: int) -> str:
    """Cached blocks are named by key *and* version: a block fetched for an open of an
    older version that lands after the cache moved on (a read in flight while another
    thread validated the new version, or a callback break) is never served for the new
    one; it waits for the LRU to evict it. Keys hold no NUL, so the name is unambiguous."""
    return f"{key}\0{version}"
