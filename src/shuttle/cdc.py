"""Content-defined chunking (FastCDC 2020) and blake3 hashes: the one implementation
that the storage node (:mod:`shuttle.store.chunking`) and the client's lookaside
stores (:mod:`shuttle.client.lookaside`) share, so a file chunked on either side gives
exactly the chunk list the other computes for the same bytes. It sits below both
packages (like :mod:`shuttle.blockcache`), so neither imports the other for it.

The cut points come from ``pyfastcdc`` (a compiled FastCDC 2020 implementation, about
3 GB/s here); hashes from ``blake3``. Chunking 256 MiB and hashing every chunk takes
about 0.2 s on this machine (``python -m shuttle.store.bench``).

A cut point depends only on the bytes since the previous cut (and, within
:data:`CHUNK_SIZE_BYTES_MAX` of the end, on the distance to the end), so an insertion
early in a file changes the chunks around it and leaves later chunks as they were:
an older copy of a file still supplies its unchanged chunks by hash (lookaside), and
the node can re-chunk a range write locally (:func:`shuttle.store.chunking.rechunk`).

The same property makes runs of zeros cheap. A chunk that starts on a cut inside a run
of zeros, with at least :data:`CHUNK_SIZE_BYTES_MAX` zeros ahead of it, is always the
same :data:`ZERO_CHUNK_BYTES` zeros with the same hash, so such chunks are written
down without reading or hashing their bytes. Zero runs are the holes of a sparse file
(``SEEK_HOLE``: an extending truncate or a write past the end makes one) and ranges
the caller knows are zero; 8 GiB of them chunk in milliseconds instead of seconds.
The whole-object hash cannot skip them (blake3 mixes each 1 KiB chunk's position into
its hash), so :func:`hash_file_only` feeds holes from a cached block of zeros instead
of faulting in the file's pages: about 2.5 GB/s here.
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Generator, Sequence
from dataclasses import dataclass

import blake3
from pyfastcdc import FastCDC

#: No chunk is shorter than this (except the last one of an object). FastCDC skips this
#: many bytes before looking for a cut; 16 KiB is a quarter of the 64 KiB target.
CHUNK_SIZE_BYTES_MIN = 16 * 1024
#: FastCDC's "normal size": below it a strict mask makes cuts rare, above it a loose
#: mask makes them likely. With min 16 KiB this gives a mean chunk of about 64-69 KiB
#: on random data (measured: 68.8 KiB over 64 MiB), the size the design asks for.
CHUNK_SIZE_BYTES_NORMAL = 48 * 1024
#: A cut is forced here (four times the mean, as in the FastCDC paper).
CHUNK_SIZE_BYTES_MAX = 256 * 1024
#: blake3's default digest length.
HASH_BYTES = 32

#: Objects this small are hashed on one thread; blake3's thread pool only pays above it.
_HASH_THREADED_BYTES_MIN = 4 * 1024 * 1024

_CHUNKER = FastCDC(
    avg_size=CHUNK_SIZE_BYTES_NORMAL,
    min_size=CHUNK_SIZE_BYTES_MIN,
    max_size=CHUNK_SIZE_BYTES_MAX,
)

Buffer = bytes | bytearray | memoryview | mmap.mmap
#: ``[start, end)`` byte ranges known to hold only zeros, sorted and disjoint.
ZeroRuns = Sequence[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class ChunkRef:
    """One content-defined chunk of an object: ``length`` bytes at ``offset``."""

    offset: int
    length: int
    hash: bytes

    @property
    def end(self) -> int:
        return self.offset + self.length


def object_hash(data: Buffer) -> bytes:
    """blake3 of a whole object's bytes (threaded for large objects)."""
    if len(data) >= _HASH_THREADED_BYTES_MIN:
        return blake3.blake3(data, max_threads=blake3.blake3.AUTO).digest()
    return blake3.blake3(data).digest()


def chunk_hash(data: Buffer) -> bytes:
    return blake3.blake3(data).digest()


#: The chunk FastCDC cuts at the start of a long run of zeros: measured, not assumed
#: (the gear hash of zeros never matches the mask, so it is CHUNK_SIZE_BYTES_MAX).
ZERO_CHUNK_BYTES = next(iter(_CHUNKER.cut_buf(bytes(CHUNK_SIZE_BYTES_MAX)))).length
ZERO_CHUNK_HASH = chunk_hash(bytes(ZERO_CHUNK_BYTES))
#: Zero runs shorter than this are chunked like other bytes: a run must hold a cut
#: with CHUNK_SIZE_BYTES_MAX zeros after it, and a shorter one would save little.
ZERO_RUN_BYTES_MIN = 2 * CHUNK_SIZE_BYTES_MAX
#: Holes are hashed from this block of zeros (large blocks keep blake3's SIMD busy;
#: 4 MiB measured as fast as 16 MiB here).
_ZERO_BLOCK = bytes(4 * 1024 * 1024)


def cut_points(data: Buffer) -> list[int]:
    """The end offsets of the chunks of ``data`` (the last one is ``len(data)``)."""
    return list(iter_cut_points(data))


def iter_cut_points(data: Buffer) -> Generator[int, None, None]:
    """Like :func:`cut_points`, lazily: each cut is found only when asked for, so a caller
    that stops early does not scan the rest of the buffer."""
    view = data if not isinstance(data, mmap.mmap) else memoryview(data)
    for chunk in _CHUNKER.cut_buf(view):
        yield chunk.offset + chunk.length


def chunk_buffer(data: Buffer, base_offset: int = 0, zeros: ZeroRuns = ()) -> list[ChunkRef]:
    """Chunk all of ``data``; offsets are shifted by ``base_offset``. Empty data: no chunks.

    ``zeros`` (ranges of ``data`` that hold only zeros) changes nothing in the result,
    only the work: chunks inside long zero runs are not read or hashed.
    """
    if len(data) == 0:
        return []
    view = memoryview(data)
    try:
        if base_offset == 0:
            return list(chunks_from(view, 0, zeros))
        return [
            ChunkRef(base_offset + c.offset, c.length, c.hash) for c in chunks_from(view, 0, zeros)
        ]
    finally:
        view.release()


def chunks_from(view: memoryview, start: int, zeros: ZeroRuns) -> Generator[ChunkRef, None, None]:
    """The chunks of ``view`` from the cut point ``start`` to its end, lazily.

    Where a chunk starts inside a zero run with at least CHUNK_SIZE_BYTES_MAX zeros
    ahead, FastCDC's cut depends on nothing but those zeros (it scans at most that far
    and the end is no nearer), so the chunk is the zero chunk: emitted as such, and the
    next chunk starts ZERO_CHUNK_BYTES later. Elsewhere FastCDC runs on the bytes; it
    cuts at most CHUNK_SIZE_BYTES_MAX apart, so it lands in the skippable part of any
    run of ZERO_RUN_BYTES_MIN or more.
    """
    end = len(view)
    # The skippable part of each long run: chunk starts p with run_end - p >= MAX.
    zones = [
        (a, b - CHUNK_SIZE_BYTES_MAX)
        for a, b in zeros
        if min(b, end) - a >= ZERO_RUN_BYTES_MIN and b <= end and b - CHUNK_SIZE_BYTES_MAX >= start
    ]
    zi = 0
    pos = start
    while pos < end:
        while zi < len(zones) and zones[zi][1] < pos:
            zi += 1
        if zi < len(zones) and zones[zi][0] <= pos:
            count = (zones[zi][1] - pos) // ZERO_CHUNK_BYTES + 1
            for _ in range(count):
                yield ChunkRef(pos, ZERO_CHUNK_BYTES, ZERO_CHUNK_HASH)
                pos += ZERO_CHUNK_BYTES
            continue
        next_zone = zones[zi][0] if zi < len(zones) else end
        tail = view[pos:]
        cuts = iter_cut_points(tail)
        try:
            base = pos
            for rel in cuts:
                cut = base + rel
                yield ChunkRef(pos, cut - pos, chunk_hash(view[pos:cut]))
                pos = cut
                if pos >= next_zone:
                    break  # back to the outer loop, which skips the zone's zero chunks
        finally:
            cuts.close()  # drop the chunker's hold on the buffer before releasing it
            tail.release()


def chunk_file(fd: int, size: int) -> list[ChunkRef]:
    """The chunk list of the first ``size`` bytes of open file ``fd`` (holes unread)."""
    if size == 0:
        return []
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
        return chunk_buffer(mapped, zeros=file_holes(fd, 0, size))


def hash_file_only(fd: int, size: int) -> bytes:
    """Whole-object hash of the first ``size`` bytes of open file ``fd``; holes are
    hashed from a block of zeros in memory, not read from the file."""
    if size == 0:
        return object_hash(b"")
    holes = file_holes(fd, 0, size, min_bytes=len(_ZERO_BLOCK))
    if not holes:
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
            return object_hash(mapped)
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            pos = 0
            for a, b in [*holes, (size, size)]:
                if pos < a:
                    hasher.update(view[pos:a])
                for _ in range((b - a) // len(_ZERO_BLOCK)):
                    hasher.update(_ZERO_BLOCK)
                hasher.update(memoryview(_ZERO_BLOCK)[: (b - a) % len(_ZERO_BLOCK)])
                pos = b
        finally:
            view.release()
    return hasher.digest()


def file_holes(
    fd: int, start: int, end: int, *, min_bytes: int = ZERO_RUN_BYTES_MIN
) -> list[tuple[int, int]]:
    """The holes of open file ``fd`` in ``[start, end)`` of at least ``min_bytes``, as
    sorted ``(start, end)`` ranges (they read as zeros). A file system without
    ``SEEK_HOLE`` reports none, and chunking and hashing then just read the zeros."""
    holes = []
    pos = start
    try:
        while pos < end:
            hole = os.lseek(fd, pos, os.SEEK_HOLE)
            if hole >= end:
                break
            try:
                data = os.lseek(fd, hole, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no data after the hole
                    raise
                data = end
            data = min(data, end)
            if data - hole >= min_bytes:
                holes.append((hole, data))
            pos = data
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENXIO, errno.EOPNOTSUPP):
            raise
    return holes
