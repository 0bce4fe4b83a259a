"""The node's block cache: the shared CLOCK policy of :mod:`shuttle.blockcache`.

The policy lives below both the store and the client, which use the same one; the
store's modules import it under this name.
"""

from shuttle.blockcache import (
    BLOCK_SIZE_BYTES_MIN,
    DEFAULT_BLOCK_SIZE_BYTES,
    DEFAULT_CAPACITY_BYTES,
    BlockCache,
    CacheStats,
    Fetch,
)

__all__ = [
    "BLOCK_SIZE_BYTES_MIN",
    "DEFAULT_BLOCK_SIZE_BYTES",
    "DEFAULT_CAPACITY_BYTES",
    "BlockCache",
    "CacheStats",
    "Fetch",
]
