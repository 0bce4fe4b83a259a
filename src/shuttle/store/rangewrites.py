"""The store's in-place changes: a range ``write`` and ``truncate``.

:class:`RangeWriteOps` is one part of :class:`~shuttle.store.objects.ObjectStore`
(which documents the errors every operation shares). Both follow the change protocol
of :mod:`shuttle.store.core` under the key's exclusive lock, patch the object's file
where it is, bring the block cache up to date (write-through), and update the chunk
list from the changed range on (:func:`~shuttle.store.chunking.rechunk_file`); the
whole-object hash is recomputed on the next stat.
"""

from __future__ import annotations

import contextlib
import os
import time

from shuttle.errors import InvalidArgumentError, LimitExceededError, NotFoundError
from shuttle.store.attrs import StoredAttrs, WriteResult
from shuttle.store.chunking import ChunkRef, RechunkStats, rechunk_file
from shuttle.store.config import JOURNAL_RECORD_BYTES, WRITE_BYTES_MAX
from shuttle.store.core import StoreCore
from shuttle.store.keys import validate_key
from shuttle.store.paths import BytesLike, pwrite_all
from shuttle.store.space import footprint_bytes


class RangeWriteOps(StoreCore):
    """The in-place changes of :class:`~shuttle.store.objects.ObjectStore` (see the
    module)."""

    def write(
        self,
        key: str,
        offset: int,
        data: BytesLike,
        *,
        expected_version: int | None = None,
        create: bool = False,
    ) -> WriteResult:
        """Write ``data`` at ``offset``, extending the object if needed (a gap reads as
        zeros). Atomic and durable when it returns.

        The chunk list is updated from the chunk before the change until the cut points
        fall back into step; the whole-object hash is recomputed on the next stat.

        Raises:
            NotFoundError: no such object and not ``create``.
            VersionMismatchError: ``expected_version`` given and different.
            InvalidArgumentError: negative offset.
            LimitExceededError: more than :data:`WRITE_BYTES_MAX` bytes, or the object
                would pass ``StoreConfig.object_bytes_max``.
            DiskFullError: the disk cannot hold it (nothing changed).
        """
        k = validate_key(key)
        with self._op("write"):
            if offset < 0:
                raise InvalidArgumentError(f"offset must be >= 0, got {offset}")
            if len(data) > WRITE_BYTES_MAX:
                raise LimitExceededError(
                    f"a range write carries at most {WRITE_BYTES_MAX} bytes, got {len(data)}. "
                    "Write in pieces, or use an upload session for a whole large object."
                )
            self._check_size(offset + len(data), f"a write at offset {offset}")
            self._make_room(self._write_footprint(offset, len(data)))
            result = self._write(k, offset, data, expected_version, create)
        self._maybe_checkpoint()
        return result

    def _write(
        self,
        k: str,
        offset: int,
        data: BytesLike,
        expected_version: int | None,
        create: bool,
    ) -> WriteResult:
        with self._change_lock(k):
            rec = self._current(k, create_ok=create)
            if rec is None and not create:
                raise NotFoundError(f"no object {k!r} to write; pass create=True to make it.")
            self._check_version(k, rec, expected_version)
            self._check_usable()
            mtime_ns = time.time_ns()
            old_size = 0 if rec is None else rec.size
            # Like pwrite(2), writing nothing extends nothing (but still bumps the version).
            new_size = max(old_size, offset + len(data)) if data else old_size
            meta = {"op": "write", "key": k, "mtime_ns": mtime_ns, "offset": offset}
            if rec is None:
                meta["create"] = True
            admit = self.space.admit(self._write_footprint(offset, len(data)), f"a write to {k!r}")
            with admit, self._gate.read(), self._reserve(k, rec):
                seq = self._append(meta, data)

                def apply() -> None:
                    flags = os.O_RDWR | (os.O_CREAT if rec is None else 0)
                    fd = self.paths.open_file(k, flags, create_dirs=rec is None)
                    try:
                        pwrite_all(fd, data, offset)
                        chunks = self._rechunk(fd, rec, old_size, new_size, offset, len(data))
                    finally:
                        os.close(fd)
                    new = StoredAttrs(k, new_size, seq, mtime_ns, None, chunks)
                    self.attrs.set(k, new)
                    self.cache.write(k, offset, data, old_size)

                self._apply(apply)
            self.counters.add(bytes_written=len(data))
            return WriteResult(k, new_size, seq, mtime_ns)

    @staticmethod
    def _write_footprint(offset: int, length: int) -> int:
        # A gap before ``offset`` is a hole: it takes no blocks.
        return footprint_bytes(
            data_bytes=length,
            journal_bytes=length + JOURNAL_RECORD_BYTES,
            size_bytes=offset + length,
        )

    def _rechunk(
        self,
        fd: int,
        rec: StoredAttrs | None,
        old_size: int,
        new_size: int,
        changed_start: int,
        changed_len: int,
    ) -> tuple[ChunkRef, ...]:
        stats = RechunkStats()
        chunks = rechunk_file(
            fd,
            rec.chunks if rec is not None else (),
            old_size=old_size,
            new_size=new_size,
            changed_start=min(changed_start, old_size),
            changed_end=changed_start + changed_len,
            stats=stats,
        )
        self.counters.add(bytes_rechunked=stats.bytes_rechunked, chunks_reused=stats.chunks_reused)
        return tuple(chunks)

    def truncate(self, key: str, size: int, *, expected_version: int | None = None) -> WriteResult:
        """Set the size of ``key`` (cut, or extend with zeros). Atomic and durable.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different.
            InvalidArgumentError: negative size.
            LimitExceededError: size above ``StoreConfig.object_bytes_max``.
            DiskFullError: an extending truncate on a full disk (a shrinking one always
                works: it frees space).

        Extending costs what the chunk list costs, not what the zeros would: the new
        range is a hole, chunked without reading it (and recovered the same way).
        """
        k = validate_key(key)
        with self._op("truncate"):
            if size < 0:
                raise InvalidArgumentError(f"size must be >= 0, got {size}")
            self._check_size(size, f"a truncate to {size} bytes")
            with self._change_lock(k):
                rec = self._current(k)
                if rec is None:
                    raise NotFoundError(f"no object {k!r} to truncate.")
                self._check_version(k, rec, expected_version)
                self._check_usable()
                mtime_ns = time.time_ns()
                meta = {"op": "truncate", "key": k, "mtime_ns": mtime_ns, "size": size}
                shrinks = size <= rec.size
                need = (
                    0
                    if shrinks
                    else footprint_bytes(
                        data_bytes=0, journal_bytes=JOURNAL_RECORD_BYTES, size_bytes=size
                    )
                )
                admit = (
                    contextlib.nullcontext()
                    if shrinks
                    else self.space.admit(need, f"a truncate of {k!r} to {size} bytes")
                )
                with admit, self._gate.read():
                    seq = self._append(meta, frees_space=shrinks)

                    def apply() -> None:
                        fd = self.paths.open_file(k, os.O_RDWR)
                        try:
                            os.ftruncate(fd, size)
                            start = min(size, rec.size)
                            chunks = self._rechunk(fd, rec, rec.size, size, start, 0)
                        finally:
                            os.close(fd)
                        self.attrs.set(k, StoredAttrs(k, size, seq, mtime_ns, None, chunks))
                        self.cache.truncate(k, rec.size, size)

                    self._apply(apply)
                result = WriteResult(k, size, seq, mtime_ns)
        self._maybe_checkpoint()
        return result
