"""The node's chunking: incremental re-chunking after range writes, over the shared
content-defined chunking core (:mod:`shuttle.cdc`, re-exported here).

Because a cut point depends only on the bytes since the previous cut (and, near the
end, on the distance to the end), a range write can re-chunk from the chunk that holds
the first changed byte until a new cut lands on an old cut past the change
(:func:`rechunk`), instead of re-chunking the whole object. Both properties are tested.
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from shuttle.cdc import (
    CHUNK_SIZE_BYTES_MAX,
    CHUNK_SIZE_BYTES_MIN,
    CHUNK_SIZE_BYTES_NORMAL,
    HASH_BYTES,
    ZERO_CHUNK_BYTES,
    ZERO_CHUNK_HASH,
    ZERO_RUN_BYTES_MIN,
    Buffer,
    Chunking,
    ChunkRef,
    ZeroRuns,
    chunk_buffer,
    chunk_file,
    chunk_hash,
    chunking_for,
    chunks_from,
    cut_points,
    file_holes,
    hash_file_only,
    is_zero_chunk,
    iter_cut_points,
    object_hash,
    zero_chunk,
)

__all__ = [
    "CHUNK_SIZE_BYTES_MAX",
    "CHUNK_SIZE_BYTES_MIN",
    "CHUNK_SIZE_BYTES_NORMAL",
    "HASH_BYTES",
    "ZERO_CHUNK_BYTES",
    "ZERO_CHUNK_HASH",
    "ZERO_RUN_BYTES_MIN",
    "Buffer",
    "ChunkRef",
    "Chunking",
    "RechunkStats",
    "ZeroRuns",
    "chunk_buffer",
    "chunk_file",
    "chunk_hash",
    "chunking_for",
    "chunks_from",
    "cut_points",
    "file_holes",
    "hash_file",
    "hash_file_only",
    "is_zero_chunk",
    "iter_cut_points",
    "object_hash",
    "rechunk",
    "rechunk_file",
    "zero_chunk",
]


@dataclass(slots=True)
class RechunkStats:
    """What one :func:`rechunk` call had to redo (for benchmarks and tests)."""

    bytes_rechunked: int = 0
    chunks_rehashed: int = 0
    chunks_reused: int = 0


def rechunk(
    old: Sequence[ChunkRef],
    data: Buffer,
    *,
    old_size: int,
    changed_start: int,
    changed_end: int,
    stats: RechunkStats | None = None,
    zeros: ZeroRuns = (),
) -> list[ChunkRef]:
    """The chunk list of ``data`` (an object's new contents), reusing ``old`` where valid.

    Args:
        old: the chunk list of the previous contents (``old_size`` bytes), as made by
            :func:`chunk_buffer` or this function.
        data: the complete new contents (an ``mmap`` is fine; only the re-chunked range
            is touched).
        changed_start, changed_end: the new contents differ from the old only in
            ``[changed_start, changed_end)`` and in the size.
        stats: if given, counts what had to be redone (zero chunks skipped unread
            count as reused, not rechunked).
        zeros: ranges of ``data`` known to hold only zeros (see :func:`chunk_buffer`).

    Returns the same list :func:`chunk_buffer` would return for ``data``.
    """
    new_size = len(data)
    st = stats if stats is not None else RechunkStats()
    chunking = chunking_for(new_size)
    if not old or new_size == 0 or chunking_for(old_size) != chunking:
        # Nothing to reuse, or the object moved to another size class: every cut moves.
        refs = chunk_buffer(data, zeros=zeros, chunking=chunking)
        _count_new(st, refs)
        return refs
    lo = changed_start
    if new_size != old_size:
        # Within max_bytes of the end, FastCDC's cut depends on how much data remains,
        # so chunks near either end of file must be redone too.
        lo = min(lo, min(old_size, new_size) - chunking.max_bytes)
    lo = max(0, min(lo, old_size - 1))
    # Binary searches over the old list, not a dict or list built from it: this runs on
    # every range write, and a 256 MiB object has ~4,000 chunks.
    first = bisect.bisect_right(old, lo, key=_offset) - 1
    start = old[first].offset
    # Old cuts past the change are where the new cuts can fall back into step; only
    # when the size is unchanged (a changed size moves the end-of-file effects).
    same_size = new_size == old_size
    out = list(old[:first])
    st.chunks_reused += first
    view = memoryview(data)
    try:
        chunks = chunks_from(view, start, zeros, chunking)
        try:
            for chunk in chunks:
                out.append(chunk)
                _count_new(st, (chunk,))
                cut = chunk.end
                if same_size and cut >= changed_end and cut < new_size:
                    i = bisect.bisect_left(old, cut, key=_offset)
                    if i < len(old) and old[i].offset == cut:
                        rest = old[i:]
                        out.extend(rest)
                        st.chunks_reused += len(rest)
                        break
        finally:
            chunks.close()  # release the sub-views before the view
    finally:
        view.release()
    return out


def _count_new(st: RechunkStats, refs: Iterable[ChunkRef]) -> None:
    for ref in refs:
        if is_zero_chunk(ref):
            st.chunks_reused += 1
        else:
            st.chunks_rehashed += 1
            st.bytes_rechunked += ref.length


def _offset(chunk: ChunkRef) -> int:
    return chunk.offset


def hash_file(fd: int, size: int) -> tuple[bytes, list[ChunkRef]]:
    """Whole-object hash and chunk list of the first ``size`` bytes of open file ``fd``."""
    return hash_file_only(fd, size), chunk_file(fd, size)


def rechunk_file(
    fd: int,
    old: Sequence[ChunkRef],
    *,
    old_size: int,
    new_size: int,
    changed_start: int,
    changed_end: int,
    stats: RechunkStats | None = None,
) -> list[ChunkRef]:
    """:func:`rechunk` over the first ``new_size`` bytes of open file ``fd`` (memory-mapped).

    Holes past the start of the re-chunked range are not read: an extending truncate
    or a write past the end costs what its non-zero bytes cost."""
    if new_size == 0:
        return []
    if os.fstat(fd).st_size < new_size:
        raise ValueError("file is shorter than the size being chunked")
    lo = max(0, min(changed_start, old_size, new_size) - 2 * CHUNK_SIZE_BYTES_MAX)
    with mmap.mmap(fd, new_size, access=mmap.ACCESS_READ) as mapped:
        return rechunk(
            old,
            mapped,
            old_size=old_size,
            changed_start=changed_start,
            changed_end=changed_end,
            stats=stats,
            zeros=file_holes(fd, lo, new_size),
        )
