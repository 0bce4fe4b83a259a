"""The storage node's object store: objects as real files, attributes, atomic durable
changes, and a block cache. A library with no networking; the node's request handlers
call :class:`ObjectStore` (from any thread), or any other :class:`~shuttle.store.interface.Store`
(:class:`~shuttle.store.rados.RadosStore` keeps objects in Ceph).

Layout:

* ``keys``       which strings are keys and listing prefixes (named limits)
* ``paths``      reaching a key's file under the root with openat, refusing symlinks
* ``chunking``   incremental re-chunking over the shared chunking core (``shuttle.cdc``)
* ``attrs``      per-object attributes, their encoding and their files
* ``journal``    the redo journal (records, checksums, group commit)
* ``recovery``   redo of journal records, online and after a crash
* ``layout``     the internal directory ``.shuttle``: lock, checkpoint, syncfs
* ``durability`` making a checkpoint durable before the journal may be emptied
* ``space``      free space on the data file system, and the reserve that keeps it emptiable
* ``locks``      reader/writer locks and the per-key lock table
* ``cache``      the block cache (CLOCK, write-through, hits without a lock) and its counters
* ``uploads``    upload sessions for large objects
* ``listing``    listing by prefix, in key order, in pages
* ``stats``      store-level counters
* ``loopreads``  what the two reads on the event loop share: the store's view, the limit
  (compiled)
* ``fastread``   a cache-hit read without the key's lock (compiled; the node's read lane)
* ``missread``   a block-cache miss the page cache holds, read on the loop (compiled; the
  node's read lane when the block cache missed)
* ``nowait``     reads that never wait for the disk (RWF_NOWAIT; ``_nowait.c`` in C)
* ``openfiles``  object files kept open across reads, one per object version, closed by
  every change
* ``generations`` change generations in shared memory: what a node's worker processes
  check their reads of the files by (a seqlock per slot of keys)
* ``config``     :class:`StoreConfig`, the size limits, the hook every change passes
* ``core``       opening, recovery, checkpoints, attribute lookup and the checks every
  change makes
* ``guards``     what wraps each call (its errors) and each change (its lock, the change
  hook, the descriptor retry)
* ``reads``      the reads: stat, read (and its two ways on the loop), list
* ``rangewrites`` the in-place changes: range write and truncate
* ``objects``    :class:`ObjectStore`, the public API tying the above together (and the
  whole-object changes, upload sessions, the node's services)
* ``interface``  :class:`Store`, what a node needs of a store (local and RADOS keep it)
* ``registry``   the stores by name (``local``, ``rados:POOL``) and :func:`open_store`
* ``rados``      :class:`RadosStore`: objects in a Ceph RADOS pool, served by many nodes
* ``rados_conn`` its librados connection: bounded waits, per-thread contexts, aio reads
* ``rados_changes`` its changes: each a guarded RADOS write, announced to every gateway
* ``rados_read`` its reads: bytes of one version, through the block cache
* ``rados_miss`` its cache misses, read on the loop: whole blocks or only the bytes asked
* ``rados_admission`` which misses are worth a whole block (a ghost queue of misses)
* ``rados_aio`` its cache misses read by a second librados client (C API), on the loop
* ``rados_watch`` cache coherence between its gateways: watch/notify on a channel object
* ``rados_index`` its key index (sharded omaps) and listing by prefix
* ``rados_uploads`` its upload sessions, staged in RADOS objects
* ``rados_locality`` where keys live: primary OSD and CRUSH host, cached per PG
* ``bench``      ``python -m shuttle.store.bench``: chunking, writes, uploads

docs/storage-format.md describes the on-disk format and the recovery procedure.
"""

from shuttle.store.attrs import ObjectAttrs, WriteResult
from shuttle.store.cache import (
    DEFAULT_BLOCK_SIZE_BYTES,
    DEFAULT_CAPACITY_BYTES,
    BlockCache,
    CacheStats,
)
from shuttle.store.chunking import (
    CHUNK_SIZE_BYTES_MAX,
    CHUNK_SIZE_BYTES_MIN,
    CHUNK_SIZE_BYTES_NORMAL,
    ChunkRef,
    chunk_buffer,
    object_hash,
)
from shuttle.store.keys import (
    INTERNAL_DIR_NAME,
    KEY_BYTES_MAX,
    KEY_COMPONENT_BYTES_MAX,
    KEY_DEPTH_MAX,
    validate_key,
    validate_prefix,
)
from shuttle.store.listing import LIST_PAGE_ENTRIES_MAX, Listing
from shuttle.store.objects import (
    OBJECT_SIZE_BYTES_MAX,
    READ_BYTES_MAX,
    WRITE_BYTES_MAX,
    ObjectStore,
    StoreConfig,
)
from shuttle.store.uploads import UPLOADS_OPEN_MAX

__all__ = [
    "CHUNK_SIZE_BYTES_MAX",
    "CHUNK_SIZE_BYTES_MIN",
    "CHUNK_SIZE_BYTES_NORMAL",
    "DEFAULT_BLOCK_SIZE_BYTES",
    "DEFAULT_CAPACITY_BYTES",
    "INTERNAL_DIR_NAME",
    "KEY_BYTES_MAX",
    "KEY_COMPONENT_BYTES_MAX",
    "KEY_DEPTH_MAX",
    "LIST_PAGE_ENTRIES_MAX",
    "OBJECT_SIZE_BYTES_MAX",
    "READ_BYTES_MAX",
    "UPLOADS_OPEN_MAX",
    "WRITE_BYTES_MAX",
    "BlockCache",
    "CacheStats",
    "ChunkRef",
    "Listing",
    "ObjectAttrs",
    "ObjectStore",
    "StoreConfig",
    "WriteResult",
    "chunk_buffer",
    "object_hash",
    "validate_key",
    "validate_prefix",
]
