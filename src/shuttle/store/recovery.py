"""Redo: applying journal records to the data tree, online and after a crash.

Every record is *redoable*: applying it again on top of any state that the crash may
have left (some of its effects on disk, some not) gives the same result. That holds
for range writes (same bytes, same place), truncates (same size) and puts of inline data,
provided each key's records are replayed in order *from its last base record*: a put or
a remove, which sets the whole object regardless of what was there. A staged put whose
staging file is gone was already renamed into place, so the object file is the staged
file and only the records after it need replaying. docs/storage-format.md has the
argument in full.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from shuttle.errors import NotFoundError, ShuttleError
from shuttle.store.attrs import AttrTable, StoredAttrs
from shuttle.store.chunking import chunk_file
from shuttle.store.journal import Record
from shuttle.store.layout import Layout
from shuttle.store.paths import BytesLike, SafeRoot, pwrite_all
from shuttle.store.space import is_disk_full

log = logging.getLogger(__name__)

#: Operations that replace the whole object (replay of a key starts at the last one).
BASE_OPS = frozenset({"put", "remove"})


def write_staging_file(layout: Layout, data: BytesLike) -> str:
    """Write ``data`` to a new staging file (not synced); return its path. On an error
    (a full disk) the partial file is deleted."""
    path = os.path.join(layout.staging_dir, f"put-{uuid.uuid4().hex}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        pwrite_all(fd, data, 0)
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    return path


def rename_into_place(root: SafeRoot, src_path: str, key: str) -> None:
    """Rename a staging file onto the object path of ``key`` (making directories)."""
    dir_fd, leaf = root.open_parent(key, create=True)
    try:
        os.rename(src_path, leaf, dst_dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def overwrite_object(root: SafeRoot, key: str, data: BytesLike) -> None:
    """Make ``data`` the whole contents of ``key``'s file, in place (creating it and its
    directories if needed). Not atomic by itself: the journal record that carries
    ``data`` makes it so, since redoing it after a crash finishes the job. In place is
    about 3x cheaper than a new file and a rename (no inode to allocate and free)."""
    fd = root.open_file(key, os.O_WRONLY | os.O_CREAT, create_dirs=True)
    try:
        pwrite_all(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def unlink_object(root: SafeRoot, key: str) -> bool:
    """Remove the object file of ``key``; False if it was not there."""
    try:
        dir_fd, leaf = root.open_parent(key, create=False)
    except NotFoundError:
        return False
    try:
        os.unlink(leaf, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dir_fd)


def redo(root: SafeRoot, layout: Layout, rec: Record) -> None:
    """Apply one record's effect on the data tree (idempotently; see the module doc)."""
    meta = rec.meta
    op, key = meta["op"], meta["key"]
    if op == "put":
        staged = meta.get("staged")
        if staged is None:
            overwrite_object(root, key, rec.data)
        else:
            path = os.path.join(layout.internal, staged)
            if os.path.exists(path):
                rename_into_place(root, path, key)
    elif op == "remove":
        unlink_object(root, key)
    elif op == "write":
        flags = os.O_WRONLY | (os.O_CREAT if meta.get("create") else 0)
        fd = root.open_file(key, flags, create_dirs=bool(meta.get("create")))
        try:
            pwrite_all(fd, rec.data, int(meta["offset"]))
        finally:
            os.close(fd)
    elif op == "truncate":
        fd = root.open_file(key, os.O_WRONLY)
        try:
            os.ftruncate(fd, int(meta["size"]))
        finally:
            os.close(fd)
    elif op in ("adopt", "set_mtime"):
        # A version bump (for a file the store found without attributes; or a new
        # mtime): the contents stay, and the attributes take the last record's mtime.
        pass
    else:
        raise ValueError(f"unknown journal operation {op!r}")


@dataclass
class RecoveryReport:
    """What :func:`replay` did, for the log and the counters."""

    records: int = 0
    keys: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)


def replay(
    records: Iterable[Record], root: SafeRoot, layout: Layout, attrs: AttrTable
) -> RecoveryReport:
    """Redo ``records`` (in sequence order) and rebuild the attributes of every key they
    touch from the resulting file contents, in memory (dirty, as after the changes
    themselves): the caller's checkpoint writes them and empties the journal. Until it
    does, the journal keeps every change, so recovery needs no free space of its own
    and a node whose disk is full comes back (the checkpoint waits for space).

    Raises OSError if a redo meets a full disk (ENOSPC): the journal must be kept, and
    the caller may free space and replay again (every record is redoable). Other
    failures to redo a record are logged and reported, and replay carries on."""
    report = RecoveryReport()
    by_key: dict[str, list[Record]] = {}
    for rec in records:
        by_key.setdefault(rec.meta["key"], []).append(rec)
        report.records += 1
    for key, recs in by_key.items():
        report.keys += 1
        start = 0
        for i, rec in enumerate(recs):
            if rec.meta["op"] in BASE_OPS:
                start = i
        report.skipped += start
        for rec in recs[start:]:
            try:
                redo(root, layout, rec)
            except (OSError, ShuttleError) as exc:
                if is_disk_full(exc):
                    raise
                msg = f"could not redo {rec.meta['op']} of {key!r} (seq {rec.seq}): {exc}"
                log.error(msg)
                report.failures.append(msg)
        rebuild_attrs(root, attrs, key, version=recs[-1].seq, mtime_ns=recs[-1].meta["mtime_ns"])
    return report


def rebuild_attrs(
    root: SafeRoot, attrs: AttrTable, key: str, *, version: int, mtime_ns: int
) -> None:
    """Recompute ``key``'s attributes from its file into ``attrs`` (or mark it removed).

    The chunk list skips the file's holes; the whole-object hash is left pending for
    the first stat, so recovering an extending truncate of gigabytes is quick."""
    try:
        fd = root.open_file(key, os.O_RDONLY)
    except (ShuttleError, OSError):
        attrs.remove(key)
        return
    try:
        size = os.fstat(fd).st_size
        chunks = chunk_file(fd, size)
    finally:
        os.close(fd)
    attrs.set(key, StoredAttrs(key, size, version, mtime_ns, None, tuple(chunks)))
