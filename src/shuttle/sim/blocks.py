"""Block keys and block accesses: the one definition every part of the simulator uses.

A block is named by one integer, ``file << BLOCK_BITS | block number``, so caches
hash plain ints. A read or write of ``size`` bytes at ``offset`` covers the blocks
``offset // B`` to ``(offset + size - 1) // B`` (sizes rounded up to whole blocks; a
zero-byte request still touches its block). The server model, the warm-up, the
mobile application and cache replay all split requests and pack keys here.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from shuttle.errors import ConfigError

I64 = npt.NDArray[np.int64]

#: Bits of a key that hold the block number: 2**32 blocks per file (32 TiB of 8 KB
#: blocks, 16 TiB of the 4 KB blocks of a block trace), leaving 31 bits of file id in
#: an int64 -- the background generator's ids stay below 2**28, the mobile
#: application's start at 2**28 (``workload.MOBILE_FILE_BASE``).
BLOCK_BITS = 32
#: Largest block number a key can hold.
BLOCK_NUMBER_MAX = (1 << BLOCK_BITS) - 1


def block_key(file: int, block: int) -> int:
    """The key of block ``block`` of file ``file``."""
    return (file << BLOCK_BITS) | block


def block_keys(files: I64, blocks: I64) -> I64:
    """Keys of (file, block) pairs, elementwise."""
    keys: I64 = (files << BLOCK_BITS) + blocks
    return keys


def block_span(offset: I64, size: I64, block_size_bytes: int) -> tuple[I64, I64]:
    """First block and block count of every request (sizes rounded up, at least one)."""
    first = offset // block_size_bytes
    last = (offset + np.maximum(size, 1) - 1) // block_size_bytes
    return first, last - first + 1


def block_accesses(
    file: I64, offset: I64, size: I64, block_size_bytes: int
) -> tuple[I64, I64, I64]:
    """Every block access of the requests, in order: (request index, file, block).

    Multi-block requests are expanded into consecutive blocks. Raises
    :class:`~shuttle.errors.ConfigError` if a block number does not fit a key (the
    trace names blocks beyond ``BLOCK_NUMBER_MAX``: use a larger block size).
    """
    if block_size_bytes < 1:
        raise ConfigError(f'"block_size" must be at least 1 byte, got {block_size_bytes}')
    first, count = block_span(offset, size, block_size_bytes)
    if len(first) and int((first + count).max()) > BLOCK_NUMBER_MAX + 1:
        raise ConfigError(
            f"a request reaches block 2**{BLOCK_BITS} or beyond; use a larger block size"
        )
    request = np.arange(len(first), dtype=np.int64)
    total = int(count.sum())
    if total == len(first):
        return request, file, first
    # Expand: each request repeated, its first block plus 0, 1, ... .
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    return np.repeat(request, count), np.repeat(file, count), np.repeat(first, count) + within
