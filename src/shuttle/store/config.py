"""A store's tunables (:class:`StoreConfig`), its size limits, and the hook every change
passes (:class:`ChangeHook`): what a node's configuration fills in and what other
stores (:mod:`shuttle.store.rados`) share with the local one."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from shuttle.errors import InvalidArgumentError
from shuttle.store.cache import DEFAULT_BLOCK_SIZE_BYTES, DEFAULT_CAPACITY_BYTES
from shuttle.store.durability import SyncMode
from shuttle.store.openfiles import OPEN_FILES_MAX
from shuttle.store.space import RESERVE_BYTES_DEFAULT

#: One range write or one read moves at most this much. The journal holds a range
#: write's bytes until the next checkpoint, so the bound keeps it small; bigger objects
#: stream in through an upload session, and reads come in pieces.
WRITE_BYTES_MAX = 64 * 1024 * 1024
READ_BYTES_MAX = 64 * 1024 * 1024
#: A journal record's header and metadata, about (the key is at most 1 KiB): what a
#: change's record adds to the space it is admitted for.
JOURNAL_RECORD_BYTES = 1024 + 256
#: Largest object any store accepts (sparse offsets included): 1 TiB, below every file
#: system's file size limit. A store's own limit (``StoreConfig.object_bytes_max``) is
#: at most this.
OBJECT_SIZE_BYTES_MAX = 1 << 40
#: A store's default limit on object size: 64 GiB, far above the data sets we move.
#: An object's chunk list grows with its size (64 GiB of zeros: 262,144 chunks, a
#: 9 MiB attribute file and ~50 MB in memory), so the limit keeps one object's
#: attributes affordable; raise it with ``shuttle serve --object-bytes-max``.
OBJECT_BYTES_MAX_DEFAULT = 64 << 30


class ChangeHook(Protocol):
    """Told of every change to an object before it happens (the node's callback
    promises, :mod:`shuttle.node.callbacks`: each one on the key is broken first).

    ``changing(key)`` is entered before the change takes the key's lock and exited
    after the change is applied (or failed); entering may block (it must not take
    any store lock). Every change goes through it: put, create, write, truncate,
    remove, an upload's commit, and mobile objects writing through the store.
    """

    def changing(self, key: str) -> AbstractContextManager[object]: ...


@dataclass(frozen=True)
class StoreConfig:
    """Tunables of one store (the node's configuration fills it in)."""

    #: Block cache size; 0 disables the cache.
    cache_capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    cache_block_size_bytes: int = DEFAULT_BLOCK_SIZE_BYTES
    #: Reads longer than this bypass the cache (a streaming read of a large object would
    #: otherwise evict everything for data read once).
    cache_read_bytes_max: int = 256 * 1024
    #: Puts up to this size carry their data inside the journal record: one fdatasync
    #: per put. Larger ones go through a staging file (one more fsync, no double write).
    inline_put_bytes_max: int = 1024 * 1024
    #: A checkpoint runs when the journal passes either bound. Recovery time is bounded
    #: by the work since the last checkpoint; 64 MiB replays in well under a second.
    journal_bytes_max: int = 64 * 1024 * 1024
    journal_records_max: int = 4096
    #: Largest object this store accepts (puts, writes, truncates, uploads).
    object_bytes_max: int = OBJECT_BYTES_MAX_DEFAULT
    #: Space kept back so that removes work on a full disk (at most 1/16 of the file
    #: system; 0: none). See :mod:`shuttle.store.space`.
    reserve_bytes: int = RESERVE_BYTES_DEFAULT

    #: How a checkpoint makes changes durable: "syncfs" (one call for the file system),
    #: "fsync" (each changed file and directory), or "auto": syncfs where the file system
    #: is known to honour it, fsync elsewhere (FUSE, NFS). See shuttle.store.durability.
    sync_mode: SyncMode = "auto"
    #: Object files kept open across reads (shuttle.store.openfiles; 0: open each
    #: time), fitted to a sixteenth of the process's descriptor limit.
    open_files_max: int = OPEN_FILES_MAX

    def __post_init__(self) -> None:
        if not 0 < self.object_bytes_max <= OBJECT_SIZE_BYTES_MAX:
            raise InvalidArgumentError(
                f'"object_bytes_max" must be in 1..{OBJECT_SIZE_BYTES_MAX} (1 TiB), got '
                f"{self.object_bytes_max}"
            )
        if self.reserve_bytes < 0:
            raise InvalidArgumentError(f'"reserve_bytes" must be >= 0, got {self.reserve_bytes}')
        if self.open_files_max < 0:
            raise InvalidArgumentError(
                f'"open_files_max" must be >= 0 (0: keep no file open), got {self.open_files_max}'
            )
