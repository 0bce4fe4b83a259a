"""Changes of the RADOS store: each one guarded RADOS write operation, announced first.

Every change of a key is a compare-and-set on its RADOS version (docs/storage-format.md,
"The RADOS store"): look at the attributes and version now (:meth:`Changes.load`), plan
the write from them, announce the change to every gateway (which drop the key from
their caches: :mod:`shuttle.store.rados_watch`), then write it in one operation guarded
by ``assert_version`` (an exclusive create for a new key), atomic on the OSDs and
durable on every replica when it returns. A change that loses a race with another
gateway is planned again from the new state (or fails with VersionMismatchError when
the caller named the version it expected). New keys are listed in the key index
(:mod:`shuttle.store.rados_index`) before they exist and again after, removed keys
unlisted after.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from shuttle.errors import NotFoundError, StorageIOError
from shuttle.store.attrs import StoredAttrs, decode_attrs, encode_attrs
from shuttle.store.chunking import ChunkRef, chunk_buffer
from shuttle.store.core import ChangeHook
from shuttle.store.rados_conn import VERSION_ERRNOS, RadosConnection, error_errno
from shuttle.store.rados_index import shard_of
from shuttle.store.rados_read import Raced, VersionedReader, check_version_number
from shuttle.store.rados_watch import Coherence
from shuttle.store.stats import StoreCounters

#: The xattr that holds an object's attributes.
ATTRS_XATTR = "shuttle.attrs"

#: Times a change is redone after losing a race with another gateway before giving up.
#: Each loss means another change succeeded, so a livelock needs that many writers.
CAS_ATTEMPTS_MAX = 64
#: Chunk lists of pre-upgrade records kept in memory (a few KiB each for small
#: objects; the memo only spares re-reading an object each stat until it changes).
RECHUNK_MEMO_ENTRIES_MAX = 4096

#: ``plan(rec)``: the write op's builder and the new attributes (their version unused),
#: from the key's attributes now (None: missing); raises Raced if it read a newer one.
Plan = Callable[[StoredAttrs | None], tuple[Callable[[Any], None], StoredAttrs]]


class Changes:
    """The changes of one RADOS store (thread-safe; see the module)."""

    def __init__(
        self,
        conn: RadosConnection,
        reader: VersionedReader,
        coherence: Coherence,
        counters: StoreCounters,
    ) -> None:
        self.conn = conn
        self._rados = conn.rados
        self.reader = reader
        self.coherence = coherence
        self.counters = counters
        #: Changes redone after losing a race.
        self.races = 0
        #: Chunk lists of objects whose records predate the chunking, by (key, version).
        self._rechunk_memo: dict[tuple[str, int], tuple[ChunkRef, ...]] = {}
        self._rechunk_lock = threading.Lock()

    def contents(self, rec: StoredAttrs) -> bytearray:
        """The whole current contents of ``rec``'s version (raises Raced if it moved)."""
        if rec.size == 0:
            return bytearray()
        return bytearray(self.reader.pipelined(rec.key, 0, rec.size, rec.version))

    def load(self, k: str) -> StoredAttrs | None:
        """The attributes of ``k`` with its current version, or None if it is missing."""
        io = self.conn.ioctx()
        try:
            # All xattrs in one operation: get_xattr's binding may ask twice for a
            # record over 4 KiB (it grows its buffer), and measured slower even below.
            blob = dict(io.get_xattrs(k)).get(ATTRS_XATTR)
        except self._rados.ObjectNotFound:
            return None
        if blob is None:
            raise StorageIOError(
                f"RADOS object {k!r} has no Shuttle attributes: another tool wrote it. "
                "Remove it with `rados rm`, or write it through Shuttle."
            )
        version = io.get_last_version()
        rec = decode_attrs(blob)
        chunks = rec.chunks
        if rec.stale_chunks:
            chunks = self._rechunked(StoredAttrs(k, rec.size, version, rec.mtime_ns, None, ()))
        return StoredAttrs(k, rec.size, version, rec.mtime_ns, rec.hash, chunks)

    def _rechunked(self, rec: StoredAttrs) -> tuple[ChunkRef, ...]:
        """The chunk list of an object whose record predates the chunking in use (an
        older Shuttle wrote it): computed from its contents, kept in memory by version
        (a gateway cannot rewrite the record without a new version that every other
        gateway would have to be told of); the object's next change writes a fresh one."""
        known = self._rechunk_memo.get((rec.key, rec.version))
        if known is not None:
            return known
        chunks = tuple(chunk_buffer(self.contents(rec)))
        with self._rechunk_lock:
            self._rechunk_memo[(rec.key, rec.version)] = chunks
            while len(self._rechunk_memo) > RECHUNK_MEMO_ENTRIES_MAX:
                self._rechunk_memo.pop(next(iter(self._rechunk_memo)))
        self.counters.add(objects_rechunked=1)
        return chunks

    def _commit(
        self, k: str, rec: StoredAttrs | None, build: Callable[[Any], None], new: StoredAttrs
    ) -> int:
        """One guarded write operation on ``k``: ``build(op)`` plus the new attributes,
        if ``k`` is still as ``rec`` says. Returns the new version; raises Raced."""
        io = self.conn.ioctx()
        with self._rados.WriteOpCtx() as op:
            if rec is None:
                op.new(self._rados.LIBRADOS_CREATE_EXCLUSIVE)
            else:
                op.assert_version(rec.version)
            build(op)
            op.set_xattr(ATTRS_XATTR, encode_attrs(new))
            try:
                io.operate_write_op(op, k)
            except self._rados.Error as exc:
                if error_errno(exc) in VERSION_ERRNOS:
                    raise Raced from exc
                raise
        return int(io.get_last_version())

    def _index(self, k: str, *, add: bool) -> None:
        io = self.conn.ioctx()
        with self._rados.WriteOpCtx() as op:
            if add:
                io.set_omap(op, (k,), (b"",))
            else:
                io.remove_omap_keys(op, (k,))
            # Removing from a shard that was never written finds no object: fine.
            with contextlib.suppress(self._rados.ObjectNotFound):
                io.operate_write_op(op, shard_of(k))

    def change(
        self,
        k: str,
        expected: int | None,
        plan: Plan,
        hook: ChangeHook | None = None,
    ) -> StoredAttrs:
        """Change ``k``: look, ``plan(rec)`` (the write op's builder and the new
        attributes, from the attributes now, None if missing), announce, write guarded;
        again from the new state after losing a race (VersionMismatchError instead if
        ``expected`` no longer holds). ``hook`` (the node's) brackets the change."""
        with hook.changing(k) if hook is not None else contextlib.nullcontext():
            for _attempt in range(CAS_ATTEMPTS_MAX):
                rec = self.load(k)
                check_attrs_version(k, rec, expected)
                try:
                    build, new = plan(rec)
                except Raced:  # it changed while the plan read it
                    self.races += 1
                    continue
                if rec is None:
                    self._index(k, add=True)  # listed before it exists (rados_index)
                else:  # every gateway drops the key first (rados_watch)
                    announced_s = self.coherence.announce(k, rec.version + 1)
                try:
                    version = self._commit(k, rec, build, new)
                except Raced:
                    self.races += 1
                    if expected is not None:
                        check_attrs_version(k, self.load(k), expected)  # raises: it changed
                    continue
                if rec is None:
                    self._index(k, add=True)  # and after, should a remove have raced
                self.reader.forget(k)
                if rec is not None:  # last: it may raise, and the change is made already
                    self.coherence.committed(k, version, announced_s)
                return StoredAttrs(k, new.size, version, new.mtime_ns, new.hash, new.chunks)
        raise StorageIOError(
            f"{k!r} changed {CAS_ATTEMPTS_MAX} times under this change (other gateways "
            "write it constantly); nothing was changed by this call: retry later"
        )

    def remove(self, k: str, expected: int | None, hook: ChangeHook | None = None) -> None:
        """Remove ``k`` (guarded by its version, announced first, unlisted after);
        NotFoundError if it is missing."""
        with hook.changing(k) if hook is not None else contextlib.nullcontext():
            for _attempt in range(CAS_ATTEMPTS_MAX):
                rec = self.load(k)
                if rec is None:
                    self._index(k, add=False)  # a dangling entry (rados_index) goes
                    raise NotFoundError(f"no object {k!r} to remove.")
                check_attrs_version(k, rec, expected)
                announced_s = self.coherence.announce(k, rec.version + 1)
                io = self.conn.ioctx()
                with self._rados.WriteOpCtx() as op:
                    op.assert_version(rec.version)
                    op.remove()
                    try:
                        io.operate_write_op(op, k)
                    except self._rados.Error as exc:
                        if error_errno(exc) not in VERSION_ERRNOS:
                            raise
                        self.races += 1
                        continue
                self.reader.forget(k)
                self._index(k, add=False)
                if self.load(k) is not None:
                    self._index(k, add=True)  # re-created meanwhile: keep it listed
                # Last: it may raise, and the key must be unlisted whatever it says.
                self.coherence.committed(k, rec.version + 1, announced_s)
                return
        raise StorageIOError(f"{k!r} kept changing under a remove; retry later")


def check_attrs_version(k: str, rec: StoredAttrs | None, expected: int | None) -> None:
    """VersionMismatchError unless ``expected`` is None or ``rec``'s version (0: missing)."""
    check_version_number(k, 0 if rec is None else rec.version, expected)
