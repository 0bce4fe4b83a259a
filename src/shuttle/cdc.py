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


@dataclass(frozen=True, slots=True)
class Chunking:
    """FastCDC 2020's parameters for one size class of objects, and what follows from
    them: no chunk shorter than ``min_bytes`` (except an object's last), a strict mask
    below ``normal_bytes`` and a loose one above (the mean chunk is about 1.3 times
    ``normal_bytes`` on random data), a cut forced at ``max_bytes``."""

    min_bytes: int
    normal_bytes: int
    max_bytes: int

    @property
    def name(self) -> str:
        return f"{self.min_bytes}:{self.normal_bytes}:{self.max_bytes}"


#: The chunking of each size class: ``(largest object size, chunking)``, smallest
#: first. The mean chunk grows with the object (about 1/32 to 1/8 of its size, from
#: 1 KiB to the 48 KiB "normal" of large objects), min a quarter and max eight times
#: the normal size: small source files get chunks of a few hundred bytes to a few KiB,
#: so an older release still supplies the parts of a file that did not change (the
#: copyright line at the top of every file changed, the rest did not), while a large
#: object's chunk list stays short (a 32 MiB object: about 1,000 chunks). Measured on
#: sympy 1.14.0 against 1.12.1: 77% of the bytes rsync finds unchanged, against 25%
#: with one class of 16/48/256 KiB (docs/lookaside.md, "Chunks that fit the object").
#: The node and every lookaside index must agree on this table: changing it changes
#: :data:`CHUNKING_ID` (indexes rebuild themselves) and the store's attribute format
#: (docs/storage-format.md).
TIERS: tuple[tuple[int, Chunking], ...] = (
    (32 << 10, Chunking(256, 1 << 10, 8 << 10)),
    (128 << 10, Chunking(512, 2 << 10, 16 << 10)),
    (512 << 10, Chunking(1 << 10, 4 << 10, 32 << 10)),
    (2 << 20, Chunking(2 << 10, 8 << 10, 64 << 10)),
    (8 << 20, Chunking(4 << 10, 16 << 10, 128 << 10)),
    (32 << 20, Chunking(8 << 10, 32 << 10, 256 << 10)),
    (1 << 62, Chunking(16 << 10, 48 << 10, 256 << 10)),
)
#: blake3's default digest length.
HASH_BYTES = 32
#: What a chunk hash means: the tiers and the hash. A lookaside index made under
#: another (an older Shuttle's) would never match, so it is rebuilt, not consulted.
CHUNKING_ID = (
    "fastcdc2020-tiers:"
    + ",".join(f"{limit}={c.name}" for limit, c in TIERS)
    + f":blake3-{HASH_BYTES}"
)

#: The chunking of the largest objects (the only one before size classes): no chunk
#: shorter than 16 KiB, a mean of about 64-69 KiB on random data, a cut forced at
#: 256 KiB (four times the mean, as in the FastCDC paper).
CHUNK_SIZE_BYTES_MIN = TIERS[-1][1].min_bytes
CHUNK_SIZE_BYTES_NORMAL = TIERS[-1][1].normal_bytes
CHUNK_SIZE_BYTES_MAX = max(c.max_bytes for _, c in TIERS)

#: Objects this small are hashed on one thread; blake3's thread pool only pays above it.
_HASH_THREADED_BYTES_MIN = 4 * 1024 * 1024

Buffer = bytes | bytearray | memoryview | mmap.mmap
#: ``[start, end)`` byte ranges known to hold only zeros, sorted and disjoint.
ZeroRuns = Sequence[tuple[int, int]]


def chunking_for(size: int) -> Chunking:
    """The chunking of an object of ``size`` bytes (:data:`TIERS`)."""
    for limit, chunking in TIERS:
        if size <= limit:
            return chunking
    return TIERS[-1][1]


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


@dataclass(frozen=True)
class _Cutter:
    """A chunking's FastCDC instance and its zero chunk, made once per size class."""

    chunker: FastCDC
    #: The chunk FastCDC cuts at the start of a long run of zeros: measured, not
    #: assumed (the gear hash of zeros never matches the mask, so it is max_bytes).
    zero_bytes: int
    zero_hash: bytes
    #: Zero runs shorter than this are chunked like other bytes: a run must hold a cut
    #: with max_bytes zeros after it, and a shorter one would save little.
    zero_run_bytes_min: int


def _cutter_of(chunking: Chunking) -> _Cutter:
    chunker = FastCDC(
        avg_size=chunking.normal_bytes, min_size=chunking.min_bytes, max_size=chunking.max_bytes
    )
    zero = next(iter(chunker.cut_buf(bytes(chunking.max_bytes)))).length
    return _Cutter(chunker, zero, chunk_hash(bytes(zero)), 2 * chunking.max_bytes)


_CUTTERS = {chunking: _cutter_of(chunking) for _, chunking in TIERS}
_LARGE = _CUTTERS[TIERS[-1][1]]
#: The zero chunk of large objects (each size class has its own: ``zero_chunk``).
ZERO_CHUNK_BYTES = _LARGE.zero_bytes
ZERO_CHUNK_HASH = _LARGE.zero_hash
#: Holes shorter than this are never worth skipping in any size class.
ZERO_RUN_BYTES_MIN = min(c.zero_run_bytes_min for c in _CUTTERS.values())
_ZERO_HASHES = frozenset(c.zero_hash for c in _CUTTERS.values())
#: Holes are hashed from this block of zeros (large blocks keep blake3's SIMD busy;
#: 4 MiB measured as fast as 16 MiB here).
_ZERO_BLOCK = bytes(4 * 1024 * 1024)


def zero_chunk(chunking: Chunking) -> tuple[int, bytes]:
    """``(length, hash)`` of the chunk ``chunking`` cuts at the start of a long zero run."""
    cutter = _CUTTERS[chunking]
    return cutter.zero_bytes, cutter.zero_hash


def is_zero_chunk(chunk: ChunkRef) -> bool:
    """True for a zero chunk of any size class emitted without reading its bytes."""
    return chunk.hash in _ZERO_HASHES


def cut_points(data: Buffer, chunking: Chunking | None = None) -> list[int]:
    """The end offsets of the chunks of ``data`` (the last one is ``len(data)``), in the
    chunking of an object of ``len(data)`` bytes unless ``chunking`` is given."""
    return list(iter_cut_points(data, chunking))


def iter_cut_points(data: Buffer, chunking: Chunking | None = None) -> Generator[int, None, None]:
    """Like :func:`cut_points`, lazily: each cut is found only when asked for, so a caller
    that stops early does not scan the rest of the buffer."""
    cutter = _CUTTERS[chunking or chunking_for(len(data))]
    view = data if not isinstance(data, mmap.mmap) else memoryview(data)
    for chunk in cutter.chunker.cut_buf(view):
        yield chunk.offset + chunk.length


def chunk_buffer(
    data: Buffer,
    base_offset: int = 0,
    zeros: ZeroRuns = (),
    *,
    chunking: Chunking | None = None,
) -> list[ChunkRef]:
    """Chunk all of ``data`` (in the chunking of an object of ``len(data)`` bytes unless
    ``chunking`` is given); offsets are shifted by ``base_offset``. Empty data: no chunks.

    ``zeros`` (ranges of ``data`` that hold only zeros) changes nothing in the result,
    only the work: chunks inside long zero runs are not read or hashed.
    """
    if len(data) == 0:
        return []
    chosen = chunking or chunking_for(len(data))
    view = memoryview(data)
    try:
        if base_offset == 0:
            return list(chunks_from(view, 0, zeros, chosen))
        return [
            ChunkRef(base_offset + c.offset, c.length, c.hash)
            for c in chunks_from(view, 0, zeros, chosen)
        ]
    finally:
        view.release()


def chunks_from(
    view: memoryview, start: int, zeros: ZeroRuns, chunking: Chunking | None = None
) -> Generator[ChunkRef, None, None]:
    """The chunks of ``view`` (a whole object; ``chunking`` defaults to its size's) from
    the cut point ``start`` to its end, lazily.

    Where a chunk starts inside a zero run with at least max_bytes zeros ahead,
    FastCDC's cut depends on nothing but those zeros (it scans at most that far and the
    end is no nearer), so the chunk is the zero chunk: emitted as such, and the next
    chunk starts that many bytes later. Elsewhere FastCDC runs on the bytes; it cuts at
    most max_bytes apart, so it lands in the skippable part of any run of twice that.
    """
    end = len(view)
    chosen = chunking or chunking_for(end)
    cutter = _CUTTERS[chosen]
    longest = chosen.max_bytes
    # The skippable part of each long run: chunk starts p with run_end - p >= max_bytes.
    zones = [
        (a, b - longest)
        for a, b in zeros
        if min(b, end) - a >= cutter.zero_run_bytes_min and b <= end and b - longest >= start
    ]
    zi = 0
    pos = start
    while pos < end:
        while zi < len(zones) and zones[zi][1] < pos:
            zi += 1
        if zi < len(zones) and zones[zi][0] <= pos:
            count = (zones[zi][1] - pos) // cutter.zero_bytes + 1
            for _ in range(count):
                yield ChunkRef(pos, cutter.zero_bytes, cutter.zero_hash)
                pos += cutter.zero_bytes
            continue
        next_zone = zones[zi][0] if zi < len(zones) else end
        tail = view[pos:]
        cuts = iter_cut_points(tail, chosen)
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
