"""What a storage node needs of an object store: one interface, several implementations.

:class:`Store` is the contract the node's handlers, its callback promises and its mobile
objects call. Two implementations keep it: :class:`~shuttle.store.objects.ObjectStore`
(objects as files in a local directory, durable through its own journal) and
:class:`~shuttle.store.rados.RadosStore` (objects in a Ceph RADOS pool, durable through
RADOS; several nodes may serve one pool). :mod:`shuttle.store.registry` names them, and
the storage test suite (``tests/store_suite``) runs the same tests over every one.

What every store promises (the suite checks each point):

* keys are validated by :func:`shuttle.store.keys.validate_key`;
* ``put`` and an upload's commit replace a whole object atomically: a reader sees the
  old contents or the new, never a mixture;
* every change gives the object a new version, greater than any it had before, even
  across remove and re-create; ``expected_version`` (None: unconditional; 0: "must not
  exist"; else the current version) makes any change a compare-and-set;
* ``stat`` answers size, version, mtime, the blake3 of the whole object and its
  content-defined chunks, all of one version; the mtime is the time of the last
  change, or the one a put, an upload's commit or ``set_mtime`` was given;
* a read returns bytes of one version, and with ``expected_version`` only of that one;
* listing by prefix in key order, in pages, resumable after any key;
* a change is durable when it returns.

What differs (and the suite leaves to each store's own tests): the local store refuses
keys whose paths clash (``a`` and ``a/b``), the RADOS store does not; the local store
adopts files copied into its directory; the RADOS store limits the size of an object
(see its module).
"""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from shuttle.store.attrs import ObjectAttrs, WriteResult
from shuttle.store.cache import BlockCache
from shuttle.store.config import ChangeHook
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing
from shuttle.store.paths import BytesLike

__all__ = ["ChangeHook", "Store", "UploadLookup", "UploadSession"]


class UploadSession(Protocol):
    """What the node reads of an open upload session: the key it will replace."""

    @property
    def key(self) -> str: ...


class UploadLookup(Protocol):
    """The open upload sessions of a store, by id."""

    def get(self, upload_id: str) -> UploadSession:
        """The open session ``upload_id``; NotFoundError if there is none."""
        ...


class Store(Protocol):
    """An object store a node serves (see the module docstring for the contract; the
    local :class:`~shuttle.store.objects.ObjectStore` documents each method's errors)."""

    #: The node's block cache in front of the store's reads.
    cache: BlockCache
    #: Told of every change before it happens (None: nobody is). A store shared by
    #: several nodes (RADOS) tells it of the changes made through this node only.
    change_hook: ChangeHook | None

    @property
    def uploads(self) -> UploadLookup: ...

    # --- reads -------------------------------------------------------------------
    def stat(self, key: str, *, expected_version: int | None = None) -> ObjectAttrs: ...

    def stat_is_cached(self, key: str) -> bool:
        """True if :meth:`stat` would be answered from memory (the node may then run it
        on its event loop); never raises."""
        ...

    def stat_many(self, keys: Sequence[str]) -> builtins.list[ObjectAttrs | None]: ...

    def read_cached(
        self, key: str, offset: int, length: int, expected_version: int | None = None
    ) -> bytes | None:
        """:meth:`read` answered from memory alone, or None (a miss, or anything unusual);
        never blocks, never raises, so the node may call it on its event loop. A store
        that must ask elsewhere for the current version (RADOS) always answers None."""
        ...

    def read(
        self,
        key: str,
        offset: int = 0,
        length: int | None = None,
        *,
        expected_version: int | None = None,
        use_cache: bool = True,
    ) -> bytes: ...

    def list(
        self,
        prefix: str = "",
        *,
        delimiter: str | None = None,
        start_after: str | None = None,
        limit: int = LIST_PAGE_ENTRIES_MAX,
    ) -> Listing: ...

    # --- changes -----------------------------------------------------------------
    def put(
        self,
        key: str,
        data: BytesLike | Iterable[bytes],
        *,
        expected_version: int | None = None,
        mtime_ns: int | None = None,
    ) -> ObjectAttrs: ...

    def set_mtime(
        self, key: str, mtime_ns: int, *, expected_version: int | None = None
    ) -> ObjectAttrs:
        """Record a modification time a program set (a new version; contents unchanged)."""
        ...

    def create(self, key: str, *, exclusive: bool = True) -> ObjectAttrs: ...

    def remove(self, key: str, *, expected_version: int | None = None) -> None: ...

    def remove_many(self, keys: Sequence[str]) -> builtins.list[bool]: ...

    def write(
        self,
        key: str,
        offset: int,
        data: BytesLike,
        *,
        expected_version: int | None = None,
        create: bool = False,
    ) -> WriteResult: ...

    def truncate(
        self, key: str, size: int, *, expected_version: int | None = None
    ) -> WriteResult: ...

    # --- upload sessions ---------------------------------------------------------
    def begin_upload(
        self, key: str, *, expected_version: int | None = None, owner: int | None = None
    ) -> str: ...

    def upload_write(self, upload_id: str, offset: int, data: BytesLike) -> int: ...

    def commit_upload(self, upload_id: str, *, mtime_ns: int | None = None) -> ObjectAttrs: ...

    def abort_upload(self, upload_id: str) -> None: ...

    def uploads_owned_by(self, owner: int) -> int: ...

    def release_uploads(self, owner: int) -> int: ...

    def expire_uploads(self, idle_s: float) -> int: ...

    # --- node services -------------------------------------------------------------
    def drop_caches(self, keys: Sequence[str]) -> dict[str, int]:
        """Empty the block cache and drop ``keys`` from whatever cache sits below it (the
        OS page cache for local files), for cold-cache measurements. Returns
        ``block_cache_bytes_dropped`` and ``files_dropped``."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...
