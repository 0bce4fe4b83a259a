"""The object store: a flat namespace of objects kept as real files under a data
directory, with attributes, atomic durable changes, and a block cache in front.

:class:`ObjectStore` is the public API. Its operations are split by concept: the reads
(:mod:`shuttle.store.reads`), the in-place changes (:mod:`shuttle.store.rangewrites`),
and here the whole-object changes (put, create, remove, set_mtime), upload sessions
and the node's services; :mod:`shuttle.store.core` has the machinery they share
(recovery, checkpoints, the change protocol, version checks).
"""

from __future__ import annotations

import builtins
import contextlib
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    VersionMismatchError,
)
from shuttle.store.attrs import ObjectAttrs, StoredAttrs
from shuttle.store.chunking import (
    ChunkRef,
    chunk_buffer,
    object_hash,
)
from shuttle.store.config import (
    JOURNAL_RECORD_BYTES,
    OBJECT_SIZE_BYTES_MAX,
    READ_BYTES_MAX,
    WRITE_BYTES_MAX,
    StoreConfig,
)
from shuttle.store.core import StoreCore
from shuttle.store.keys import validate_key
from shuttle.store.paths import BytesLike, pwrite_all
from shuttle.store.rangewrites import RangeWriteOps
from shuttle.store.reads import ReadOps
from shuttle.store.recovery import (
    overwrite_object,
    rename_into_place,
    unlink_object,
    write_staging_file,
)
from shuttle.store.space import footprint_bytes
from shuttle.store.uploads import discard_all

__all__ = [
    "OBJECT_SIZE_BYTES_MAX",
    "READ_BYTES_MAX",
    "WRITE_BYTES_MAX",
    "ObjectStore",
    "StoreConfig",
]


class ObjectStore(ReadOps, RangeWriteOps, StoreCore):
    """An object store over the data directory ``root``.

    Opening runs recovery (redo of the journal), so an instance always starts from a
    consistent state. One process at a time may open a directory. All methods are
    thread-safe; operations on different keys run in parallel, and on one key reads
    share and changes exclude.

    Conditional operations take ``expected_version``: None means unconditional, 0
    means "the object must not exist", any other value must equal the current version
    (else :class:`VersionMismatchError`, and nothing changes).

    Errors common to all methods: :class:`InvalidKeyError` (bad key, or a symlink on
    its path), :class:`KeyConflictError` (the key's path clashes with another object),
    :class:`StorageIOError` (the disk failed). If a change fails with StorageIOError
    after its journal record was written, the store refuses further changes until it
    is reopened, and reopening completes that change; the caller should treat the
    change as "maybe applied" and stat after restart.
    """

    # --- whole-object changes ----------------------------------------------------------

    def put(
        self,
        key: str,
        data: BytesLike | Iterable[bytes],
        *,
        expected_version: int | None = None,
        mtime_ns: int | None = None,
    ) -> ObjectAttrs:
        """Create or replace ``key`` with ``data`` (bytes, or an iterable of byte pieces
        that is consumed once). Atomic: readers and a crash see the old or the new object.
        ``mtime_ns``: the modification time to record (a copy keeps its source's, as
        ``cp -p`` does); None: now.

        Returns the new attributes (durable when this returns).

        Raises:
            VersionMismatchError: ``expected_version`` given and different.
            LimitExceededError: more than ``StoreConfig.object_bytes_max`` bytes.
            DiskFullError: the disk cannot hold it (nothing changed).
        """
        k = validate_key(key)
        with self._op("put"):
            self._check_usable()
            if isinstance(data, (bytes, bytearray, memoryview)):
                self._check_size(len(data), "this put")
                blob: BytesLike | None = data
                staged = None
            else:
                blob, staged = self._spool(data)
            if blob is not None and len(blob) <= self.config.inline_put_bytes_max:
                whole, chunks = object_hash(blob), chunk_buffer(blob)
                return self._commit_put(
                    k, expected_version, len(blob), whole, chunks, blob, None, mtime_ns
                )
            if staged is None:
                assert blob is not None
                self._make_room(len(blob))
                with self.space.admit(len(blob), f"a put of {k!r}"):
                    staged = write_staging_file(self.layout, blob)
            try:
                size, whole, chunks = self._seal(staged)
                return self._commit_put(
                    k, expected_version, size, whole, chunks, b"", staged, mtime_ns
                )
            finally:
                # After a failure past the journal record, recovery needs the staged file.
                if self._broken is None:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(staged)

    def _commit_put(
        self,
        key: str,
        expected_version: int | None,
        size: int,
        whole: bytes,
        chunks: builtins.list[ChunkRef],
        inline: BytesLike,
        staged: str | None,
        mtime_ns: int | None = None,
    ) -> ObjectAttrs:
        # A staged put's bytes are on disk already (the rename moves them).
        need = footprint_bytes(
            data_bytes=len(inline),
            journal_bytes=len(inline) + JOURNAL_RECORD_BYTES,
            size_bytes=size,
        )
        self._make_room(need)
        with self._change_lock(key):
            rec = self._current(key, create_ok=True)
            self._check_version(key, rec, expected_version)
            self._check_usable()
            if mtime_ns is None:
                mtime_ns = time.time_ns()
            meta: dict[str, Any] = {"op": "put", "key": key, "mtime_ns": mtime_ns}
            if staged is not None:
                meta["staged"] = os.path.relpath(staged, self.layout.internal)
            admit = self.space.admit(need, f"a put of {key!r}")
            with admit, self._gate.read(), self._reserve(key, rec):
                seq = self._append(meta, inline if staged is None else b"")

                def apply() -> StoredAttrs:
                    if staged is None:
                        overwrite_object(self.paths, key, inline)
                    else:
                        rename_into_place(self.paths, staged, key)
                    new = StoredAttrs(key, size, seq, mtime_ns, whole, tuple(chunks))
                    self.attrs.set(key, new)
                    self.cache.invalidate(key)
                    return new

                new = self._apply(apply)
            self.counters.add(bytes_written=size)
        self._maybe_checkpoint()
        return new.complete(whole)

    def create(self, key: str, *, exclusive: bool = True) -> ObjectAttrs:
        """Create an empty object.

        With ``exclusive`` an existing object is an error; without, an existing object is
        left as it is and its attributes are returned.

        Raises:
            AlreadyExistsError: ``exclusive`` and the object exists.
        """
        k = validate_key(key)
        with self._op("create"):
            try:
                return self._commit_put(k, 0, 0, object_hash(b""), [], b"", None)
            except VersionMismatchError:
                if exclusive:
                    raise AlreadyExistsError(
                        f"{k!r} already exists. Use create(exclusive=False) or put to replace it."
                    ) from None
            return self.stat(k)

    def remove(self, key: str, *, expected_version: int | None = None) -> None:
        """Delete ``key``. Its version number is never reused.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different.
        """
        k = validate_key(key)
        with self._op("remove"):
            self._remove(k, expected_version)
        self._maybe_checkpoint()

    def _remove(self, k: str, expected_version: int | None) -> None:
        with self._change_lock(k):
            rec = self._current(k)
            if rec is None:
                raise NotFoundError(f"no object {k!r} to remove.")
            self._check_version(k, rec, expected_version)
            self._check_usable()
            with self._gate.read():
                meta = {"op": "remove", "key": k, "mtime_ns": time.time_ns()}
                self._append(meta, frees_space=True)

                def apply() -> None:
                    unlink_object(self.paths, k)
                    self.attrs.remove(k)
                    self.cache.invalidate(k)
                    if "/" in k:
                        self._prune.add(k.rpartition("/")[0])

                self._apply(apply)

    def remove_many(self, keys: Sequence[str]) -> builtins.list[bool]:
        """Remove each key; True where it existed. Keys are validated first (one invalid
        key fails the call before anything is removed); the removals that happened before
        a disk error stay done."""
        checked = [validate_key(k) for k in keys]
        out = []
        with self._op("remove_many"):
            for k in checked:
                try:
                    self._remove(k, None)
                    out.append(True)
                except NotFoundError:
                    out.append(False)
        self._maybe_checkpoint()
        return out

    def set_mtime(
        self, key: str, mtime_ns: int, *, expected_version: int | None = None
    ) -> ObjectAttrs:
        """Record ``mtime_ns`` as the object's modification time (what ``touch -d``,
        ``utime`` and ``rsync -t`` set): a change like any other (a new version, durable
        when it returns, promises broken first); the contents, hash and chunks stay.

        Raises:
            NotFoundError: no such object.
            VersionMismatchError: ``expected_version`` given and different.
            InvalidArgumentError: ``mtime_ns`` negative.
        """
        k = validate_key(key)
        if mtime_ns < 0:
            raise InvalidArgumentError(
                f"mtime_ns must be >= 0 (ns since the epoch), got {mtime_ns}"
            )
        with self._op("set_mtime"), self._change_lock(k):
            rec = self._current(k)
            if rec is None:
                raise NotFoundError(f"no object {k!r} to set the mtime of.")
            self._check_version(k, rec, expected_version)
            self._check_usable()
            with self._gate.read():
                # Redo does nothing: recovery takes the mtime of a key's last record.
                seq = self._append({"op": "set_mtime", "key": k, "mtime_ns": mtime_ns})

                def apply() -> StoredAttrs:
                    new = StoredAttrs(k, rec.size, seq, mtime_ns, rec.hash, rec.chunks)
                    self.attrs.set(k, new)
                    return new

                new = self._apply(apply)
            done = self._complete(new)
        self._maybe_checkpoint()
        return done

    # --- upload sessions ---------------------------------------------------------------

    def begin_upload(
        self, key: str, *, expected_version: int | None = None, owner: int | None = None
    ) -> str:
        """Start streaming a whole new version of ``key``; returns the upload id.

        Nothing is visible until :meth:`commit_upload`. ``expected_version`` is checked
        at commit. Sessions do not survive a restart of the node; those of an ``owner``
        (a client connection) end when :meth:`release_uploads` is called for it.

        Raises:
            LimitExceededError: the owner has too many sessions open.
            NodeBusyError: the node's sessions are all in use.
        """
        k = validate_key(key)
        with self._op("begin_upload"):
            self._check_usable()
            return self.uploads.begin(k, expected_version, owner).upload_id

    def upload_write(self, upload_id: str, offset: int, data: BytesLike) -> int:
        """Write a range of the upload (any order; gaps read as zeros). Returns the
        session's size so far (its highest written end). Not durable until commit.

        Raises:
            NotFoundError: no such open session.
            InvalidArgumentError / LimitExceededError: bad offset, or too large.
        """
        with self._op("upload_write"):
            upload = self.uploads.get(upload_id)
            if offset < 0:
                raise InvalidArgumentError(f"offset must be >= 0, got {offset}")
            self._check_size(offset + len(data), f"an upload write at offset {offset}")
            with upload.lock, self.space.admit(len(data), f"an upload write to {upload.key!r}"):
                if upload.fd < 0:
                    raise NotFoundError(
                        f"upload session {upload_id!r} was committed or aborted meanwhile."
                    )
                pwrite_all(upload.fd, data, offset)
                upload.size = max(upload.size, offset + len(data))
                upload.bytes_written += len(data)
                return upload.size

    def commit_upload(self, upload_id: str, *, mtime_ns: int | None = None) -> ObjectAttrs:
        """Make the upload the object's new contents, atomically and durably; the session
        ends whatever the outcome. ``mtime_ns`` as for :meth:`put`.

        Raises:
            NotFoundError: no such open session.
            VersionMismatchError: the session's ``expected_version`` no longer holds.
        """
        with self._op("commit_upload"):
            upload = self.uploads.pop(upload_id)
            try:
                with upload.lock:
                    os.ftruncate(upload.fd, upload.size)  # a no-op unless writes were sparse
                    upload.close()
                    size, whole, chunks = self._seal(upload.path)
                return self._commit_put(
                    upload.key,
                    upload.expected_version,
                    size,
                    whole,
                    chunks,
                    b"",
                    upload.path,
                    mtime_ns,
                )
            finally:
                if self._broken is None:
                    upload.discard()

    def abort_upload(self, upload_id: str) -> None:
        """End a session and delete its staging file. Raises NotFoundError if not open."""
        with self._op("abort_upload"):
            upload = self.uploads.pop(upload_id)
            with upload.lock:
                upload.discard()

    def uploads_owned_by(self, owner: int) -> int:
        """How many open upload sessions ``owner`` (a connection) has."""
        return self.uploads.owned_by(owner)

    def release_uploads(self, owner: int) -> int:
        """Abort the sessions ``owner`` opened (its connection closed); returns how many."""
        theirs = self.uploads.release(owner)
        discard_all(theirs)
        return len(theirs)

    def expire_uploads(self, idle_s: float) -> int:
        """Abort sessions idle for more than ``idle_s`` seconds; returns how many."""
        stale = self.uploads.expire(idle_s)
        discard_all(stale)
        return len(stale)

    # --- node services -------------------------------------------------------------

    def drop_caches(self, keys: Sequence[str]) -> dict[str, int]:
        """Empty the block cache, close the object files kept open for reads, and drop
        ``keys`` from the OS page cache (cold runs).
        Returns ``block_cache_bytes_dropped`` and ``files_dropped``.

        Raises NotFoundError (or InvalidKeyError) for a key that names no object file."""
        before = self.cache.stats().bytes_cached
        self.cache.clear()
        self.open_files.clear()  # cold: no file kept open either
        dropped = 0
        for key in keys:
            fd = self.paths.open_file(validate_key(key), os.O_RDONLY)
            try:
                # Written back first: the kernel keeps dirty pages through DONTNEED, and
                # a node reads what the page cache holds on its event loop (nowait.py),
                # so a "cold" read of a just-written object would not be cold at all.
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                dropped += 1
            finally:
                os.close(fd)
        return {"block_cache_bytes_dropped": before, "files_dropped": dropped}

    # --- counters --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of the store, its journal and its block cache, and the space on its
        file system (``space``: total, used and free bytes, the reserve, and the
        journal's bytes and share of the used space), as plain types."""
        out = self.counters.snapshot()
        out["journal"] = {
            "records": self.journal.records_appended,
            "syncs": self.journal.syncs,
            "bytes": self.journal.bytes_appended,
            "pending_bytes": self.journal.size_bytes,
        }
        out["cache"] = self.cache.stats().as_dict()
        out["nowait"] = self.nowait.stats()
        out["open_files"] = self.open_files.stats()
        out["uploads_open"] = len(self.uploads)
        space = self.space.snapshot()
        # The journal's share of the used space: a second copy of small puts and range
        # writes, freed at the next checkpoint (docs/operations.md).
        space["journal_bytes"] = self.journal.size_bytes
        space["journal_share"] = self.journal.size_bytes / max(1, space["used_bytes"])
        out["space"] = space
        return out
