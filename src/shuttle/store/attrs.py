"""Per-object attributes: what they are, how they are encoded, where they live.

Each object has one attribute file, ``.shuttle/attrs/<h[:2]>/<h>`` with ``h`` the first
32 hex digits of blake3(key); the file holds the key itself, so a collision would be
detected, not served. Attribute files are written only at a checkpoint; between
checkpoints the authoritative attributes of changed objects are in memory (and can be
rebuilt from the journal after a crash), so a write costs no attribute I/O.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

import blake3
import msgpack
from mypy_extensions import mypyc_attr

from shuttle.store.chunking import HASH_BYTES, ChunkRef

#: Attribute records of clean objects kept in memory. A record of a small object is a
#: few hundred bytes; one of a 256 MiB object (~4,000 chunks) about 400 KiB, so the
#: bound is on count and kept modest.
ATTR_CACHE_ENTRIES_MAX = 8192

#: On-disk attribute record format; bump when the encoding or the chunking changes.
#: 2: chunks in size classes (:data:`shuttle.cdc.TIERS`). A format-1 record (one
#: chunking for every object) is still read: its chunk list is marked stale and the
#: store re-chunks the object on first use (docs/storage-format.md).
ATTR_FORMAT = 2
#: Formats :func:`decode_attrs` reads, and whether their chunk lists are current.
_CHUNKS_CURRENT = {1: False, 2: True}


@dataclass(frozen=True, slots=True)
class ObjectAttrs:
    """An object's attributes.

    Attributes:
        key: the object's key.
        size: length in bytes.
        version: changes on every change of the object and is never reused in this store
            (it is the journal sequence number of the last change), so a client may
            compare versions to validate a cached copy, even across remove and re-create.
        mtime_ns: wall-clock time of the last change, ns since the epoch.
        hash: blake3 of the whole contents (32 bytes).
        chunks: content-defined chunks covering the object in order.
    """

    key: str
    size: int
    version: int
    mtime_ns: int
    hash: bytes
    chunks: tuple[ChunkRef, ...] = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        """Plain types for a wire header: chunks as ``[offset, length, hash]`` triples."""
        return {
            "key": self.key,
            "size": self.size,
            "version": self.version,
            "mtime_ns": self.mtime_ns,
            "hash": self.hash,
            "chunks": [[c.offset, c.length, c.hash] for c in self.chunks],
        }


@dataclass(frozen=True, slots=True)
class StoredAttrs:
    """Attributes as kept by the store: like :class:`ObjectAttrs`, but the whole-object
    hash may be pending (None) after a range write or truncate; it is computed on the
    next stat, so a run of small writes to a big object does not rehash it each time."""

    key: str
    size: int
    version: int
    mtime_ns: int
    hash: bytes | None
    chunks: tuple[ChunkRef, ...] = field(repr=False)
    #: The chunk list was made under an older chunking (a format-1 record): right in
    #: its offsets and lengths' sum, wrong in its cuts; the store re-chunks it.
    stale_chunks: bool = False

    def complete(self, whole_hash: bytes) -> ObjectAttrs:
        return ObjectAttrs(
            self.key, self.size, self.version, self.mtime_ns, whole_hash, self.chunks
        )


@dataclass(frozen=True, slots=True)
class WriteResult:
    """What a range write or truncate returns: the object's new size and version."""

    key: str
    size: int
    version: int
    mtime_ns: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "size": self.size,
            "version": self.version,
            "mtime_ns": self.mtime_ns,
        }


def encode_attrs(attrs: StoredAttrs) -> bytes:
    lengths = struct.pack(f"<{len(attrs.chunks)}I", *[c.length for c in attrs.chunks])
    hashes = b"".join([c.hash for c in attrs.chunks])
    record = {
        "fmt": ATTR_FORMAT,
        "key": attrs.key,
        "size": attrs.size,
        "version": attrs.version,
        "mtime_ns": attrs.mtime_ns,
        "hash": attrs.hash,
        "chunk_lengths": lengths,
        "chunk_hashes": hashes,
    }
    return msgpack.packb(record, use_bin_type=True)


def decode_attrs(blob: bytes) -> StoredAttrs:
    """Decode an attribute record. Raises ValueError if it is malformed."""
    try:
        rec = msgpack.unpackb(blob, raw=False)
        if rec["fmt"] not in _CHUNKS_CURRENT:
            raise ValueError(f"attribute format {rec['fmt']} is not {ATTR_FORMAT} (or 1)")
        lengths_blob: bytes = rec["chunk_lengths"]
        hashes: bytes = rec["chunk_hashes"]
        count = len(lengths_blob) // 4
        lengths = struct.unpack(f"<{count}I", lengths_blob)
        if len(hashes) != count * HASH_BYTES:
            raise ValueError("chunk hash list does not match chunk length list")
        chunks = []
        offset = 0
        for i, length in enumerate(lengths):
            chunks.append(ChunkRef(offset, length, hashes[i * HASH_BYTES : (i + 1) * HASH_BYTES]))
            offset += length
        if offset != rec["size"]:
            raise ValueError("chunks do not cover the object")
        return StoredAttrs(
            key=rec["key"],
            size=rec["size"],
            version=rec["version"],
            mtime_ns=rec["mtime_ns"],
            hash=rec["hash"],
            chunks=tuple(chunks),
            stale_chunks=not _CHUNKS_CURRENT[rec["fmt"]],
        )
    except (KeyError, TypeError, struct.error, msgpack.UnpackException) as exc:
        raise ValueError(f"malformed attribute record: {exc}") from exc


class _Absent:
    """The object is known not to exist (removed since the last checkpoint)."""


ABSENT: Final = _Absent()


# Compiled with the mypyc group for its records (the warm read loads a StoredAttrs'
# size and version as native fields); the table is not on that path and stays a plain
# Python class, whose methods a test can replace on an instance (a full disk at the
# checkpoint's attribute write, tests/unit/store/test_space.py).
@mypyc_attr(native_class=False)
class AttrTable:
    """Attribute records: dirty ones (changed since the last checkpoint) pinned in memory,
    clean ones cached (LRU) over the attribute files.

    Thread-safe. The store holds a key's lock around get-then-set sequences.
    """

    def __init__(self, attrs_dir: str, staging_dir: str) -> None:
        self.attrs_dir = attrs_dir
        self.staging_dir = staging_dir
        self._lock = threading.Lock()
        self._dirty: dict[str, StoredAttrs | _Absent] = {}
        self._clean: OrderedDict[str, StoredAttrs] = OrderedDict()

    def path_of(self, key: str) -> str:
        digest = blake3.blake3(key.encode("utf-8")).hexdigest()[:32]
        return os.path.join(self.attrs_dir, digest[:2], digest)

    def get(self, key: str) -> StoredAttrs | _Absent | None:
        """The record of ``key``; :data:`ABSENT` if removed since the last checkpoint;
        None if no record exists (or the record file is unreadable)."""
        with self._lock:
            rec = self._dirty.get(key)
            if rec is not None:
                return rec
            clean = self._clean.get(key)
            if clean is not None:
                self._clean.move_to_end(key)
                return clean
        loaded = self._load(key)
        if loaded is not None:
            with self._lock:
                if key not in self._dirty:
                    self._remember_clean(key, loaded)
        return loaded

    def peek(self, key: str) -> StoredAttrs | _Absent | None:
        """Like :meth:`get` from memory only: None if the record is not in memory."""
        with self._lock:
            rec = self._dirty.get(key)
            return rec if rec is not None else self._clean.get(key)

    def maps(self) -> tuple[dict[str, StoredAttrs | _Absent], dict[str, StoredAttrs]]:
        """The dirty and clean maps themselves, for a reader that looks without the
        table's lock (:mod:`shuttle.store.fastread`): the table never rebinds them."""
        return self._dirty, self._clean

    def _load(self, key: str) -> StoredAttrs | None:
        try:
            with open(self.path_of(key), "rb") as f:
                rec = decode_attrs(f.read())
        except (FileNotFoundError, ValueError):
            return None
        return rec if rec.key == key else None

    def set(self, key: str, attrs: StoredAttrs) -> None:
        with self._lock:
            self._clean.pop(key, None)
            self._dirty[key] = attrs

    def remove(self, key: str) -> None:
        with self._lock:
            self._clean.pop(key, None)
            self._dirty[key] = ABSENT

    def dirty_count(self) -> int:
        with self._lock:
            return len(self._dirty)

    def dirty_keys(self) -> list[str]:
        """The keys changed (or removed) since the last :meth:`flush`."""
        with self._lock:
            return list(self._dirty)

    def flush(self) -> int:
        """Write every dirty record to its file (removed ones: delete the file).

        Not durable by itself: the checkpoint makes them durable afterwards. Call it
        only while no change is in flight (the store's checkpoint gate). Returns the
        number of records written or deleted.
        """
        with self._lock:
            dirty = list(self._dirty.items())
        for key, rec in dirty:
            if isinstance(rec, _Absent):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path_of(key))
            else:
                self.write_file(rec)
        with self._lock:
            for key, rec in dirty:
                if self._dirty.get(key) is rec:
                    del self._dirty[key]
                    if isinstance(rec, StoredAttrs):
                        self._remember_clean(key, rec)
        return len(dirty)

    def write_file(self, rec: StoredAttrs) -> None:
        """Replace the attribute file of ``rec.key`` (write a staging file, rename it)."""
        path = self.path_of(rec.key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(self.staging_dir, f"attr-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(encode_attrs(rec))
        os.replace(tmp, path)

    def delete_file(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path_of(key))
        with self._lock:
            self._clean.pop(key, None)
            self._dirty.pop(key, None)

    def forget(self) -> None:
        """Drop every cached record (tests and recovery)."""
        with self._lock:
            self._clean.clear()
            self._dirty.clear()

    def _remember_clean(self, key: str, rec: StoredAttrs) -> None:
        self._clean[key] = rec
        self._clean.move_to_end(key)
        while len(self._clean) > ATTR_CACHE_ENTRIES_MAX:
            self._clean.popitem(last=False)
