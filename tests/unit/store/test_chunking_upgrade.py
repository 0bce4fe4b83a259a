"""A store written before chunks came in size classes: its attribute records (format
1) hold chunk lists of the old single chunking. Opened by this version, each object is
re-chunked on first use, keeping its version, mtime and hash, and its record is written
in format 2 at the next checkpoint."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import msgpack
from pyfastcdc import FastCDC

from shuttle.store import ObjectStore, chunk_buffer
from shuttle.store.attrs import ATTR_FORMAT, decode_attrs
from shuttle.store.chunking import chunk_hash

#: The chunking every object had before size classes (format-1 records).
_OLD = FastCDC(avg_size=48 << 10, min_size=16 << 10, max_size=256 << 10)


def _rewrite_as_format_1(path: str, data: bytes) -> None:
    """Turn a record into what an older Shuttle wrote for the same object."""
    with open(path, "rb") as f:
        rec = msgpack.unpackb(f.read(), raw=False)
    cuts = [(c.offset, c.length) for c in _OLD.cut_buf(data)]
    rec["fmt"] = 1
    rec["chunk_lengths"] = struct.pack(f"<{len(cuts)}I", *(n for _, n in cuts))
    rec["chunk_hashes"] = b"".join(chunk_hash(data[o : o + n]) for o, n in cuts)
    with open(path, "wb") as f:
        f.write(msgpack.packb(rec, use_bin_type=True))


def test_records_of_the_old_chunking_are_rechunked_on_first_use(root: Path) -> None:
    rng = random.Random(3)
    objects = {
        "src/small.py": rng.randbytes(20_000),
        "src/medium.py": rng.randbytes(300_000),
        "data/large.bin": rng.randbytes(3 << 20),
        "empty": b"",
        "data/written.bin": rng.randbytes(1 << 20),  # changed before any stat
    }
    store = ObjectStore(root)
    before = {k: store.put(k, v, mtime_ns=1_600_000_000_000_000_000) for k, v in objects.items()}
    store.close()  # checkpointed: every record is on disk
    for key, data in objects.items():
        _rewrite_as_format_1(store.attrs.path_of(key), data)
        with open(store.attrs.path_of(key), "rb") as f:
            assert decode_attrs(f.read()).stale_chunks

    store = ObjectStore(root)
    try:
        # A range write on an object still in the old chunking re-chunks it exactly.
        store.write("data/written.bin", 1000, b"edit")
        edited = bytearray(objects.pop("data/written.bin"))
        edited[1000:1004] = b"edit"
        assert list(store.stat("data/written.bin").chunks) == chunk_buffer(bytes(edited))
        for key, data in objects.items():
            after = store.stat(key)
            assert list(after.chunks) == chunk_buffer(data), key
            old = before[key]
            assert (after.version, after.mtime_ns, after.hash, after.size) == (
                old.version,
                old.mtime_ns,
                old.hash,
                old.size,
            )
            assert store.read(key) == data
        # The small file's old list was one chunk; now several (lookaside can match).
        assert len(store.stat("src/small.py").chunks) > 5
        assert store.stats()["objects_rechunked"] == len(objects) + 1
    finally:
        store.close()
    for key in objects:
        with open(store.attrs.path_of(key), "rb") as f:
            raw = msgpack.unpackb(f.read(), raw=False)
        assert raw["fmt"] == ATTR_FORMAT == 2
    store = ObjectStore(root)  # nothing left to re-chunk
    try:
        store.stat("src/small.py")
        assert store.stats()["objects_rechunked"] == 0
    finally:
        store.close()
    assert os.path.exists(root)
