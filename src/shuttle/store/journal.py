"""The redo journal: one append-only file of change records, made durable before a change
is applied and replayed on open after a crash (see docs/storage-format.md).

A record is a fixed header, a msgpack map (the change's metadata) and raw data bytes
(a range write's bytes, or a small put's contents), written with one ``pwritev``:

    magic "SHJ1" | meta_len u32 | data_len u64 | blake3(meta + data) 32 bytes | meta | data

Readers stop at the first record that is incomplete, fails its checksum, or does not
carry the next higher sequence number: that is the torn tail of an append the crash
interrupted, which was never acknowledged.

Durability uses group commit: each appender writes its record under a mutex, then
waits for an ``fdatasync`` that covers its record; one sync serves every record
appended before it started, so concurrent writers share syncs.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import blake3
import msgpack

from shuttle.store.paths import BytesLike, fsync_dir

MAGIC = b"SHJ1"
_HEADER = struct.Struct("<4sIQ32s")
HEADER_BYTES = _HEADER.size

#: A record's metadata is a handful of small fields; 64 KiB bounds it generously (a
#: key is at most 1 KiB) and lets recovery reject garbage lengths without allocating.
META_BYTES_MAX = 64 * 1024
#: Data in one record: the largest range write or inline put (the store's limits are
#: lower); recovery treats a larger length as a torn tail.
DATA_BYTES_MAX = 1 << 30


@dataclass(frozen=True, slots=True)
class Record:
    """One journal record. ``meta`` holds ``seq``, ``op``, ``key`` and the op's arguments."""

    meta: dict[str, Any]
    data: bytes

    @property
    def seq(self) -> int:
        return int(self.meta["seq"])


class Journal:
    """The journal file. Thread-safe; sequence numbers are assigned in append order."""

    def __init__(self, path: str, *, next_seq: int) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        # The file's name must survive a power cut before the first record is
        # acknowledged; on a fresh store nothing else has synced the directory since.
        fsync_dir(os.path.dirname(path))
        self._append_lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._end = 0  # bytes of valid records
        self._synced = 0  # bytes known durable
        self._next_seq = next_seq
        self.records_appended = 0
        self.syncs = 0
        self.bytes_appended = 0
        self.records_since_reset = 0

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def size_bytes(self) -> int:
        return self._end

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def read_valid(self, *, after_seq: int) -> Iterator[Record]:
        """Yield the valid records with ``seq > after_seq`` in order; position the append
        point after the last valid record (so a torn tail is overwritten).

        Records with ``seq <= after_seq`` (already checkpointed) are checked but skipped.
        Call before any append.
        """
        offset = 0
        prev_seq = -1
        size = os.fstat(self._fd).st_size
        while offset + HEADER_BYTES <= size:
            header = os.pread(self._fd, HEADER_BYTES, offset)
            magic, meta_len, data_len, digest = _HEADER.unpack(header)
            if magic != MAGIC or meta_len > META_BYTES_MAX or data_len > DATA_BYTES_MAX:
                break
            body_len = meta_len + data_len
            if offset + HEADER_BYTES + body_len > size:
                break
            body = os.pread(self._fd, body_len, offset + HEADER_BYTES)
            if len(body) != body_len or blake3.blake3(body).digest() != digest:
                break
            try:
                meta = msgpack.unpackb(body[:meta_len], raw=False)
                seq = int(meta["seq"])
            except (ValueError, KeyError, TypeError, msgpack.UnpackException):
                break
            if seq <= prev_seq:
                break
            prev_seq = seq
            offset += HEADER_BYTES + body_len
            self._next_seq = max(self._next_seq, seq + 1)
            if seq > after_seq:
                yield Record(meta, body[meta_len:])
        self._end = self._synced = offset

    def append(self, meta: dict[str, Any], data: BytesLike = b"") -> int:
        """Append a record and return its sequence number once the record is durable.

        ``meta`` gets a ``seq`` entry. On an I/O error (e.g. a full disk) nothing is
        acknowledged and the next append overwrites the partial record.
        """
        with self._append_lock:
            seq = self._next_seq
            meta["seq"] = seq
            meta_blob = msgpack.packb(meta, use_bin_type=True)
            hasher = blake3.blake3(meta_blob)
            hasher.update(data)
            header = _HEADER.pack(MAGIC, len(meta_blob), len(data), hasher.digest())
            total = len(header) + len(meta_blob) + len(data)
            written = os.pwritev(self._fd, [header, meta_blob, data], self._end)
            if written != total:  # a short write: finish it the slow way
                blob = header + meta_blob + bytes(data)
                view = memoryview(blob)[written:]
                pos = self._end + written
                while view:
                    n = os.pwrite(self._fd, view, pos)
                    view, pos = view[n:], pos + n
            self._next_seq = seq + 1
            self._end += total
            end = self._end
            self.records_appended += 1
            self.records_since_reset += 1
            self.bytes_appended += total
        self._sync_to(end)
        return seq

    def _sync_to(self, end: int) -> None:
        with self._sync_lock:
            if self._synced >= end:
                return  # another thread's sync already covered our record
            target = self._end
            os.fdatasync(self._fd)
            self.syncs += 1
            self._synced = max(self._synced, target)

    def reset(self) -> None:
        """Empty the journal durably (after a checkpoint made every record redundant).

        The caller guarantees no append is in flight.
        """
        with self._append_lock, self._sync_lock:
            os.ftruncate(self._fd, 0)
            os.fsync(self._fd)
            self._end = self._synced = 0
            self.records_since_reset = 0
