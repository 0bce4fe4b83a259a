"""``directory``: POSIX-like hierarchical names over directory blocks, cached at the
client and updated optimistically (ABACUS 4.3.1 and 6.5).

One directory object per client and volume. It starts at the client and may move to
a node; wherever it runs it reaches every node's ``isolation`` object (the
``isolations`` map it is made with) and finds the node of a directory's key by
rendezvous hashing over those node ids, as :meth:`Runtime.node_for` does.

**Format.** Directory ``D`` of volume ``V`` is the object ``V/.dirs/D`` (the root's
``D`` is ``root``), made of :data:`BLOCK_BYTES` blocks: block 0 is the *header*
(the directory's id, its parent's id, how many entry blocks follow, a removed flag),
blocks ``1..n`` hold *entries* (``[name, entry]`` pairs, sorted by name). Each block is
``magic | version | kind | body length | crc32 | msgpack body | zero padding``. An entry
is a map with a ``type``: ``{"type": "dir", "id": D}`` for a subdirectory, anything
else (``{"type": "file", "key": ...}``) is the file layer's. The root needs no
formatting: a root with no header yet is empty.

**Updates** (ABACUS's optimistic concurrency control). An update reads every block of
the directory (from the cache when it holds a callback promise), checks the name,
builds the new blocks and calls ``isolation.commit(reads, writes, writer)`` with every
block it read as the read set. A conflict (another client changed a block since)
drops the stale blocks, re-reads and tries again, with jittered back-off, up to
:data:`COMMIT_ATTEMPTS_MAX` attempts, then :class:`ObjectBusyError`. Writes of one
update that land on one node (an entry block and the header; a mkdir's parent block
and the child's header) go in one commit, which the node's atomicity object makes all
or nothing. Across two nodes the order keeps a crash harmless: mkdir writes the
child's header first (a crash leaves an unreferenced directory, never an entry without
its directory); rmdir marks the child removed first (conditional on it being empty),
then drops the parent's entry (a crash leaves an entry that resolves as "removed", and
``remove`` again finishes the job).

**Callbacks.** Every read registers this object (its reference, the same wherever it
runs) as the block's holder; the isolation object calls :meth:`invalidate` before any
other client's update returns, and the block is dropped. ``invalidate`` runs
concurrently with operations in progress (``concurrent = True``); state is guarded by
one short lock never held across an outgoing call.

**Migration.** The cache travels in the checkpoint (blocks with their timestamps):
the promises belong to the reference, not the host, and a callback that arrives while
the object moves waits at its gate and is delivered wherever it lands.

**Serialisation (ABACUS 6.5).** Directory objects on one run-time share a manager
whose per-directory locks order their updates of one directory: moved to the
directory's node, the clients' objects take turns locally instead of retrying over
the network. The lock only orders: correctness is the commit's.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from shuttle.client.model import NodeAddress
from shuttle.client.routing import node_for_key
from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    ObjectBusyError,
    RemoteProtocolError,
    RequestTimeoutError,
    ServerError,
    UnreachableError,
    UsageError,
)
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject, ObjectManager, builtin
from shuttle.runtime.refs import Invoker, Ref
from shuttle.store.keys import KEY_COMPONENT_BYTES_MAX, validate_key

if TYPE_CHECKING:
    from shuttle.runtime.client import Runtime

# --- limits, each with its reason ----------------------------------------------------

#: A directory block: a page, and ext4's default block size.
BLOCK_BYTES = 4096
#: magic, format version, kind, body length, crc32 of the body.
_BLOCK_HEAD = struct.Struct("<4sBBHI")
BLOCK_MAGIC = b"SDIR"
FORMAT_VERSION = 1
KIND_HEADER = 1
KIND_ENTRIES = 2
BODY_BYTES_MAX = BLOCK_BYTES - _BLOCK_HEAD.size
#: NAME_MAX, as for store keys (a name is also a key component in the file layer).
NAME_BYTES_MAX = KEY_COMPONENT_BYTES_MAX
#: PATH_MAX on Linux.
PATH_BYTES_MAX = 4096
#: One entry's encoded ``[name, entry]``: at least three fit in a block.
ENTRY_BYTES_MAX = 1024
#: Entry blocks per directory (1 MiB, some 20,000 short entries): an update reads
#: them all, so a bigger directory makes every insert slower; past it, "full".
DIR_BLOCKS_MAX = 256
#: Commit attempts per update before giving up (the paper's contended benchmark saw
#: under one retry per insert on average; 200 in a row means something is wrong).
COMMIT_ATTEMPTS_MAX = 200
#: Back-off after the k-th conflict: uniform in [0, min(MAX, BASE * 2^k)] ("full
#: jitter"), so colliding clients spread out instead of colliding again in step.
BACKOFF_BASE_S = 0.0005
BACKOFF_MAX_S = 0.02
#: Re-reads of a directory whose blocks changed while it was being read.
LOAD_ATTEMPTS_MAX = 8
#: Cached blocks (4 MiB); past it, the least recently used go.
CACHE_BLOCKS_MAX = 1024
#: Samples of (time, inserts, retries) kept for the Figure 11 timeline; when full,
#: every other one goes, so the list spans the whole run at a coarser grain.
TIMELINE_SAMPLES_MAX = 2048
#: How long an update waits for its turn among this run-time's directory objects;
#: past it, it goes ahead optimistically (the lock orders, it does not protect).
SERIALISE_WAIT_S = 1.0
#: Locks shared by one run-time's directory objects (directories hash onto them).
LOCK_STRIPES = 64
ROOT_ID = "root"

# --- blocks (pure) -------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """Block 0 of a directory: ``blocks`` entry blocks follow at ``BLOCK_BYTES * i``."""

    dir_id: str
    parent_id: str
    blocks: int
    removed: bool = False


Entries = dict[str, dict[str, Any]]


def _encode(kind: int, body: Any) -> bytes:
    raw = msgpack.packb(body, use_bin_type=True)
    if len(raw) > BODY_BYTES_MAX:
        raise LimitExceededError(
            f"directory block body of {len(raw)} bytes exceeds {BODY_BYTES_MAX}"
        )
    head = _BLOCK_HEAD.pack(BLOCK_MAGIC, FORMAT_VERSION, kind, len(raw), zlib.crc32(raw))
    return (head + raw).ljust(BLOCK_BYTES, b"\0")


def encode_header(header: Header) -> bytes:
    return _encode(
        KIND_HEADER,
        {
            "id": header.dir_id,
            "parent": header.parent_id,
            "blocks": header.blocks,
            "removed": header.removed,
        },
    )


def encode_entries(entries: Mapping[str, Mapping[str, Any]]) -> bytes:
    """An entry block; :class:`LimitExceededError` if the entries do not fit."""
    return _encode(KIND_ENTRIES, [[name, dict(entries[name])] for name in sorted(entries)])


def _decode(data: bytes, kind: int, where: str) -> Any:
    if len(data) < _BLOCK_HEAD.size:
        raise ServerError(f"{where}: directory block of {len(data)} bytes is cut short")
    magic, version, got_kind, length, crc = _BLOCK_HEAD.unpack_from(data)
    body = data[_BLOCK_HEAD.size : _BLOCK_HEAD.size + length]
    if magic != BLOCK_MAGIC or version != FORMAT_VERSION or got_kind != kind:
        raise ServerError(
            f"{where}: not a directory block of kind {kind} (magic {magic!r}, version "
            f"{version}, kind {got_kind}); the volume's directory objects are damaged"
        )
    if len(body) != length or zlib.crc32(body) != crc:
        raise ServerError(f"{where}: directory block fails its checksum")
    return msgpack.unpackb(body, raw=False)


def decode_header(data: bytes, where: str = "directory") -> Header | None:
    """The header in ``data``; None for b"" (no such block: the directory was never
    made, or is a root not written yet)."""
    if not data:
        return None
    b = _decode(data, KIND_HEADER, where)
    return Header(str(b["id"]), str(b["parent"]), int(b["blocks"]), bool(b["removed"]))


def stored_body_bytes(data: bytes) -> int:
    """The body size a block's head records (0 for no block)."""
    return int(_BLOCK_HEAD.unpack_from(data)[3]) if len(data) >= _BLOCK_HEAD.size else 0


def decode_entries(data: bytes, where: str = "directory") -> Entries:
    return {str(name): dict(entry) for name, entry in _decode(data, KIND_ENTRIES, where)}


def body_bytes(entries: Mapping[str, Mapping[str, Any]]) -> int:
    """The encoded size of an entry block's body."""
    return len(msgpack.packb([[n, dict(entries[n])] for n in sorted(entries)], use_bin_type=True))


# --- names (pure) --------------------------------------------------------------------


def split_path(path: Any) -> list[str]:
    """``/a/b`` as ``["a", "b"]`` (``/`` as ``[]``), or :class:`InvalidArgumentError`."""
    if not isinstance(path, str):
        raise InvalidArgumentError(f"a path is a string, got {type(path).__name__}")
    if not path.startswith("/"):
        raise InvalidArgumentError(f"path {path!r:.80} is not absolute: start it with /")
    if len(path.encode()) > PATH_BYTES_MAX:
        raise InvalidArgumentError(f"path of {len(path.encode())} bytes is over {PATH_BYTES_MAX}")
    if path == "/":
        return []
    names = path[1:].split("/")
    for name in names:
        check_name(name, path)
    return names


def check_name(name: str, path: str) -> None:
    if not name:
        raise InvalidArgumentError(f"path {path!r:.80} has an empty component (// or a final /)")
    if name in (".", ".."):
        raise InvalidArgumentError(
            f"path {path!r:.80}: {name!r} is not allowed; give the full path"
        )
    if "\0" in name:
        raise InvalidArgumentError(f"path {path!r:.80} contains a NUL character")
    if len(name.encode()) > NAME_BYTES_MAX:
        raise InvalidArgumentError(
            f"name {name[:40]!r}… is {len(name.encode())} bytes; at most {NAME_BYTES_MAX}"
        )


def new_dir_id() -> str:
    """A new directory's id: 64 random bits, never reused in practice."""
    return secrets.token_hex(8)


def join(names: list[str]) -> str:
    return "/" + "/".join(names)


def check_entry(entry: Any, name: str) -> dict[str, Any]:
    if not isinstance(entry, dict) or not all(isinstance(k, str) for k in entry):
        raise InvalidArgumentError(f"an entry is a map with string keys, got {entry!r:.80}")
    kind = entry.get("type")
    if not isinstance(kind, str) or not kind or kind == "dir":
        raise InvalidArgumentError(
            f'an entry needs a "type" ("file", say), got {kind!r:.40}; make directories with mkdir'
        )
    try:
        size = len(msgpack.packb([name, entry], use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgumentError(f"entry {entry!r:.80} cannot be encoded: {exc}") from None
    if size > ENTRY_BYTES_MAX:
        raise InvalidArgumentError(
            f"entry of {size} bytes is over {ENTRY_BYTES_MAX}; keep it short"
        )
    return dict(entry)


# --- a directory as read, and the blocks an update writes (pure) ----------------------


@dataclass
class DirView:
    """One directory's blocks as read: the header and entry blocks with timestamps."""

    key: str
    header: Header
    header_ts: int
    blocks: list[Entries]
    block_ts: list[int]
    #: Each entry block's encoded body size (from its block head), when known.
    sizes: list[int] | None = None

    def body_bytes(self, i: int) -> int:
        return self.sizes[i] if self.sizes is not None else body_bytes(self.blocks[i])

    def find(self, name: str) -> tuple[int, dict[str, Any]] | None:
        """(entry block index from 0, entry) of ``name``, or None."""
        for i, entries in enumerate(self.blocks):
            if name in entries:
                return i, entries[name]
        return None

    def listing(self) -> list[list[Any]]:
        """``[[name, entry], ...]`` by name; copies (a plain call's caller may change
        them, and these are the cache's)."""
        return sorted([n, dict(e)] for entries in self.blocks for n, e in entries.items())

    def reads(self) -> list[list[Any]]:
        """The read set: every block, at the timestamp it was read at."""
        return [[self.key, 0, self.header_ts]] + [
            [self.key, BLOCK_BYTES * (i + 1), ts] for i, ts in enumerate(self.block_ts)
        ]


Write = tuple[str, int, bytes]


def plan_insert(view: DirView, name: str, entry: dict[str, Any], where: str) -> list[Write]:
    """The blocks that insert ``name`` into ``view``: the first entry block with room,
    or a new one and the header's count. :class:`AlreadyExistsError` if it is there."""
    if view.find(name) is not None:
        raise AlreadyExistsError(f"{where} already exists")
    pair = len(msgpack.packb([name, entry], use_bin_type=True))
    for i, entries in enumerate(view.blocks):
        # Adding a pair adds at least its bytes: a cheap test before the exact one.
        if view.body_bytes(i) + pair <= BODY_BYTES_MAX:
            grown = {**entries, name: entry}
            if body_bytes(grown) <= BODY_BYTES_MAX:
                return [(view.key, BLOCK_BYTES * (i + 1), encode_entries(grown))]
    n = len(view.blocks)
    if n >= DIR_BLOCKS_MAX:
        raise LimitExceededError(
            f"{where}: the directory is full ({DIR_BLOCKS_MAX} blocks of {BLOCK_BYTES} "
            "bytes); use a subdirectory"
        )
    header = Header(view.header.dir_id, view.header.parent_id, n + 1, view.header.removed)
    return [
        (view.key, BLOCK_BYTES * (n + 1), encode_entries({name: entry})),
        (view.key, 0, encode_header(header)),
    ]


def plan_remove(view: DirView, name: str, where: str) -> tuple[list[Write], dict[str, Any]]:
    """The block that drops ``name`` (blocks are never freed: a later insert fills the
    hole), and the entry removed. :class:`NotFoundError` if it is not there."""
    found = view.find(name)
    if found is None:
        raise NotFoundError(f"{where}: no such file or directory")
    i, entry = found
    rest = {n: e for n, e in view.blocks[i].items() if n != name}
    return [(view.key, BLOCK_BYTES * (i + 1), encode_entries(rest))], entry


def view_of(key: str, blocks: Mapping[int, bytes], dir_id: str = ROOT_ID) -> DirView:
    """A :class:`DirView` of raw blocks by offset (timestamps 0), for tests and tools."""
    header = decode_header(blocks.get(0, b""), key) or Header(dir_id, "", 0)
    entries = [decode_entries(blocks[BLOCK_BYTES * i], key) for i in range(1, header.blocks + 1)]
    return DirView(key, header, 0, entries, [0] * len(entries))


# --- the object ----------------------------------------------------------------------


class DirectoryManager(ObjectManager):
    """One run-time's directory objects; they share the locks that order their updates
    of one directory (what serialises clients whose objects moved to one node)."""

    def __init__(self, cls: type[MobileObject], node_id: str) -> None:
        super().__init__(cls, node_id)
        self.stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]

    def create(self, rid: ObjectId, invoker: Invoker, params: dict[str, Any]) -> MobileObject:
        obj = super().create(rid, invoker, params)
        if isinstance(obj, DirectoryObject):
            obj._stripes = self.stripes
        return obj

    def adopt(self, rid: ObjectId, invoker: Invoker, checkpoint: bytes) -> MobileObject:
        obj = super().adopt(rid, invoker, checkpoint)
        if isinstance(obj, DirectoryObject):
            obj._stripes = self.stripes
        return obj


@dataclass
class _Cached:
    raw: bytes
    ts: int
    value: Header | Entries | None


#: Counters :meth:`DirectoryObject.stats` reports (all start at 0).
COUNTERS = (
    "inserts",  # entries made (create and mkdir)
    "removes",
    "lookups",
    "commits",  # successful commits
    "conflicts",  # commits refused: another client changed a block read
    "retries",  # updates tried again after a conflict
    "cache_hits",
    "installation_reads",  # blocks read from an isolation object (cache misses)
    "invalidations",  # blocks dropped by callbacks
    "serialised_waits",  # updates that waited for another on this run-time
)


@builtin("directory")
class DirectoryObject(MobileObject):
    """A volume's namespace for one client: ``mkdir``, ``create``, ``lookup``,
    ``listdir``, ``remove``; :meth:`invalidate` is the isolation objects' callback."""

    concurrent = True  # invalidate must get in while an update waits on a commit
    manager_class = DirectoryManager

    def __init__(self, volume: str, isolations: dict[str, Ref]) -> None:
        if not isinstance(volume, str) or not volume:
            raise InvalidArgumentError(f"volume must be a non-empty string, got {volume!r:.60}")
        validate_key(f"{volume}/.dirs/{ROOT_ID}")
        if not isinstance(isolations, dict) or not isolations:
            raise InvalidArgumentError("isolations must map each node id to its isolation object")
        for node, ref in isolations.items():
            if not isinstance(node, str) or not isinstance(ref, Ref):
                raise InvalidArgumentError(
                    f"isolations maps node ids to references, got {node!r:.40}: {ref!r:.60}"
                )
        self.volume = volume
        self.isolations = dict(isolations)
        self.counters = dict.fromkeys(COUNTERS, 0)
        #: [[wall-clock time, inserts, retries], ...]: wall clock, because the samples
        #: travel with the object between machines.
        self.timeline: list[list[float]] = []
        self._setup()

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, int], _Cached] = {}
        # Invalidations are numbered; a block read or written while one for it
        # arrived is not cached (it may already be stale, and nobody would tell us).
        self._inval_seq = 0
        self._inval_at: dict[tuple[str, int], int] = {}
        self._watchers = 0
        if not hasattr(self, "_stripes"):
            self._stripes = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._nodes = [NodeAddress(n, "", 0) for n in sorted(self.isolations)]

    # --- migration ----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        state = super().state()
        with self._lock:
            state["cache"] = [[k, off, c.raw, c.ts] for (k, off), c in self._cache.items()]
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        cache = state.pop("cache", [])
        super().set_state(state)
        self._setup()
        for key, offset, raw, ts in cache:
            self._cache[(key, offset)] = _Cached(raw, ts, self._decode(key, offset, raw))

    def memory_bytes(self) -> int:
        with self._lock:
            return len(self._cache) * BLOCK_BYTES

    # --- the interface ------------------------------------------------------------------

    def mkdir(self, path: str) -> dict[str, Any]:
        """Make directory ``path``; its entry (``{"type": "dir", "id": ...}``).
        Raises AlreadyExistsError, NotFoundError (a parent), InvalidArgumentError."""
        names = split_path(path)
        if not names:
            raise AlreadyExistsError("/ already exists")
        parent_id = self._resolve(names[:-1], path)
        parent_key = self._key(parent_id)
        if self._load(parent_key, join(names[:-1])).find(names[-1]) is not None:
            raise AlreadyExistsError(f"{path} already exists")
        child_id = new_dir_id()
        child_key = self._key(child_id)
        child_header = (child_key, 0, encode_header(Header(child_id, parent_id, 0)))
        entry = {"type": "dir", "id": child_id}
        same_node = self._node(child_key) == self._node(parent_key)
        if not same_node:
            # The child first, on its own node: a crash before the parent's entry
            # leaves an unreferenced directory, never an entry without a directory.
            self._commit_or_fail(self._node(child_key), [], [child_header], path)

        def plan(view: DirView) -> tuple[list[list[Any]], list[Write]]:
            writes = plan_insert(view, names[-1], entry, path)
            return view.reads(), ([*writes, child_header] if same_node else writes)

        try:
            self._update(parent_key, join(names[:-1]), plan)
        except (UsageError, AlreadyExistsError, NotFoundError, ObjectBusyError):
            # The parent's entry certainly was not written (a lost reply is another
            # error: the entry may exist, so the child stays).
            if not same_node:
                self._forget_orphan(child_key, child_id, parent_id)
            raise
        self._count("inserts")
        return entry

    def create(self, path: str, entry: dict[str, Any]) -> dict[str, Any]:
        """Insert ``entry`` (a map with a ``type`` other than ``dir``) as ``path``.
        Raises AlreadyExistsError, NotFoundError (a parent), InvalidArgumentError."""
        names = split_path(path)
        if not names:
            raise AlreadyExistsError("/ already exists")
        entry = check_entry(entry, names[-1])
        parent_key = self._key(self._resolve(names[:-1], path))
        self._update(
            parent_key,
            join(names[:-1]),
            lambda view: (view.reads(), plan_insert(view, names[-1], entry, path)),
        )
        self._count("inserts")
        return entry

    def lookup(self, path: str) -> dict[str, Any] | None:
        """``path``'s entry, or None if its directory has no such name.
        NotFoundError if a parent is missing."""
        names = split_path(path)
        self._count("lookups")
        if not names:
            return {"type": "dir", "id": ROOT_ID}
        view = self._load(self._key(self._resolve(names[:-1], path)), join(names[:-1]))
        found = view.find(names[-1])
        return None if found is None else dict(found[1])

    def listdir(self, path: str) -> list[list[Any]]:
        """``[[name, entry], ...]`` of directory ``path``, sorted by name."""
        names = split_path(path)
        return self._load(self._key(self._resolve(names, path)), path).listing()

    def remove(self, path: str) -> dict[str, Any]:
        """Remove ``path`` (a directory only if empty); its entry, for the caller to
        drop what it names (a file's data)."""
        names = split_path(path)
        if not names:
            raise InvalidArgumentError("the root directory cannot be removed")
        parent_key = self._key(self._resolve(names[:-1], path))
        parent_path = join(names[:-1])
        found = self._load(parent_key, parent_path).find(names[-1])
        if found is None:
            raise NotFoundError(f"{path}: no such file or directory")
        removed: dict[str, Any] = {}
        if found[1].get("type") == "dir":
            child_id = str(found[1]["id"])
            child_key = self._key(child_id)
            same_node = self._node(child_key) == self._node(parent_key)
            if not same_node:
                # Mark the child removed first, if still empty: inserts into it
                # conflict (they read its header) and then find it gone.
                self._update(child_key, path, lambda v: self._plan_rmdir(v, path), removed_ok=True)

            def plan(view: DirView) -> tuple[list[list[Any]], list[Write]]:
                writes, entry = plan_remove(view, names[-1], path)
                if entry != found[1]:
                    raise NotFoundError(f"{path} was replaced while being removed")
                removed.update(entry)
                if not same_node:
                    return view.reads(), writes
                child = self._load(child_key, path, removed_ok=True)
                reads, tomb = self._plan_rmdir(child, path)
                return view.reads() + reads, writes + tomb

            self._update(parent_key, parent_path, plan)
        else:

            def plan(view: DirView) -> tuple[list[list[Any]], list[Write]]:
                writes, entry = plan_remove(view, names[-1], path)
                removed.update(entry)
                return view.reads(), writes

            self._update(parent_key, parent_path, plan)
        self._count("removes")
        return removed

    def invalidate(self, key: str, offsets: list[int]) -> None:
        """The isolation object's callback: blocks ``offsets`` of ``key`` changed."""
        with self._lock:
            self._inval_seq += 1
            for offset in offsets:
                if self._watchers:
                    self._inval_at[(key, offset)] = self._inval_seq
                if self._cache.pop((key, offset), None) is not None:
                    self.counters["invalidations"] += 1

    def stats(self) -> dict[str, Any]:
        """Counters (see :data:`COUNTERS`), cached blocks, and the timeline."""
        with self._lock:
            return {
                **self.counters,
                "cached_blocks": len(self._cache),
                "timeline": [list(s) for s in self.timeline],
            }

    # --- reading ------------------------------------------------------------------------

    def _key(self, dir_id: str) -> str:
        return f"{self.volume}/.dirs/{dir_id}"

    def _node(self, key: str) -> str:
        return node_for_key(self._nodes, key).node_id

    def _isolation(self, key: str) -> Ref:
        return self.isolations[self._node(key)]

    def _decode(self, key: str, offset: int, raw: bytes) -> Header | Entries | None:
        where = f"block {offset} of {key}"
        return decode_header(raw, where) if offset == 0 else decode_entries(raw, where)

    def _block(self, key: str, offset: int) -> _Cached:
        """A block (bytes, timestamp, decoded): cached, or read with a promise."""
        block = (key, offset)
        with self._lock:
            hit = self._cache.get(block)
            if hit is not None:
                self.counters["cache_hits"] += 1
                self._cache[block] = self._cache.pop(block)  # most recently used last
                return hit
        with self._watch() as seq, self._node_failures(key):
            raw, ts = self._isolation(key).read(key, offset, BLOCK_BYTES, self.self_ref())
            value = self._decode(key, offset, raw)
            with self._lock:
                self.counters["installation_reads"] += 1
                self._install(block, raw, int(ts), value, seq)
        return _Cached(raw, int(ts), value)

    @contextlib.contextmanager
    def _node_failures(self, key: str) -> Iterator[None]:
        """A call to ``key``'s node failed: that node may have restarted, and lost
        the promises of every block cached from it. Drop them all (AFS's client
        revalidates after losing its server the same way)."""
        try:
            yield
        except (UnreachableError, RequestTimeoutError, RemoteProtocolError):
            node = self._node(key)
            with self._lock:
                for block in [b for b in self._cache if self._node(b[0]) == node]:
                    del self._cache[block]
            raise

    @contextlib.contextmanager
    def _watch(self) -> Iterator[int]:
        """The invalidation number now. While any watch is open, invalidations are
        remembered per block (and forgotten when none is: nobody needs them)."""
        with self._lock:
            self._watchers += 1
            seq = self._inval_seq
        try:
            yield seq
        finally:
            with self._lock:
                self._watchers -= 1
                if not self._watchers:
                    self._inval_at.clear()

    def _install(
        self, block: tuple[str, int], raw: bytes, ts: int, value: Header | Entries | None, seq: int
    ) -> None:
        """Cache a block read or written when ``_inval_seq`` was ``seq`` (lock held)."""
        if self._inval_at.get(block, 0) > seq:
            return  # a callback for it came meanwhile: this copy may be stale already
        old = self._cache.get(block)
        if old is not None and old.ts >= ts:
            return
        self._cache[block] = _Cached(raw, ts, value)
        while len(self._cache) > CACHE_BLOCKS_MAX:
            del self._cache[next(iter(self._cache))]  # its promise lapses harmlessly

    def _load(self, key: str, where: str, *, removed_ok: bool = False) -> DirView:
        """Directory ``key``'s blocks, all current together unless they kept changing
        (then the last try: an update's commit checks it anyway)."""
        view: DirView | None = None
        for _ in range(LOAD_ATTEMPTS_MAX):
            with self._watch() as seq:
                view = self._load_once(key, where, removed_ok)
                with self._lock:
                    changed = any(
                        self._inval_at.get((key, BLOCK_BYTES * i), 0) > seq
                        for i in range(view.header.blocks + 1)
                    )
            if not changed:
                break
        assert view is not None
        return view

    def _load_once(self, key: str, where: str, removed_ok: bool) -> DirView:
        head = self._block(key, 0)
        header = head.value
        if header is None:
            if not key.endswith(f"/.dirs/{ROOT_ID}"):
                raise NotFoundError(f"{where}: its directory blocks are missing ({key})")
            header = Header(ROOT_ID, "", 0)
        assert isinstance(header, Header)
        if header.removed and not removed_ok:
            raise NotFoundError(
                f"{where}: the directory was removed (if it is still listed, its "
                "removal was cut short: remove it again)"
            )
        blocks, stamps, sizes = [], [], []
        for i in range(1, header.blocks + 1):
            got = self._block(key, BLOCK_BYTES * i)
            if not isinstance(got.value, dict):
                raise ServerError(f"{where}: entry block {i} of {key} is missing")
            blocks.append(got.value)
            stamps.append(got.ts)
            sizes.append(stored_body_bytes(got.raw))
        return DirView(key, header, head.ts, blocks, stamps, sizes)

    def _resolve(self, names: list[str], path: str) -> str:
        """The id of directory ``names`` (walking from the root)."""
        dir_id = ROOT_ID
        for i, name in enumerate(names):
            view = self._load(self._key(dir_id), join(names[:i]))
            found = view.find(name)
            if found is None:
                raise NotFoundError(f"{join(names[: i + 1])}: no such directory (in {path})")
            if found[1].get("type") != "dir":
                raise InvalidArgumentError(f"{join(names[: i + 1])} is not a directory (in {path})")
            dir_id = str(found[1]["id"])
        return dir_id

    # --- updating -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _serialised(self, key: str) -> Iterator[None]:
        """This run-time's updates of directory ``key``, one at a time (see the module
        doc); held across the commit, never taken by :meth:`invalidate`."""
        lock = self._stripes[zlib.crc32(key.encode()) % LOCK_STRIPES]
        if not lock.acquire(blocking=False):
            self._count("serialised_waits")
            if not lock.acquire(timeout=SERIALISE_WAIT_S):
                yield  # a slow peer: go ahead optimistically
                return
        try:
            yield
        finally:
            lock.release()

    def _update(
        self,
        key: str,
        where: str,
        plan: Callable[[DirView], tuple[list[list[Any]], list[Write]]],
        *,
        removed_ok: bool = False,
    ) -> None:
        """Read directory ``key``, ``plan`` the update (the read set and the writes;
        it raises if the update is not allowed), commit; on a conflict, again."""
        node = self._node(key)
        with self._serialised(key):
            for attempt in range(COMMIT_ATTEMPTS_MAX):
                reads, writes = plan(self._load(key, where, removed_ok=removed_ok))
                if self._commit(node, reads, writes):
                    return
                if attempt == COMMIT_ATTEMPTS_MAX - 1:
                    break
                self._count("retries")
                ceiling = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2**attempt))
                time.sleep(random.uniform(0, ceiling))
        raise ObjectBusyError(
            f"{where}: {COMMIT_ATTEMPTS_MAX} attempts to update the directory conflicted "
            "with other clients' updates; try again (or move the directory object to "
            f"node {node}, where clients take turns)"
        )

    def _commit(self, node: str, reads: list[list[Any]], writes: list[Write]) -> bool:
        """One ``CommitAction``; True if it was applied (the written blocks are then
        cached: this object holds their promises), False on a conflict."""
        with self._watch() as seq, self._node_failures(reads[0][0] if reads else writes[0][0]):
            result = self.isolations[node].commit(reads, [list(w) for w in writes], self.self_ref())
            return self._committed(result, writes, seq)

    def _committed(self, result: dict[str, Any], writes: list[Write], seq: int) -> bool:
        with self._lock:
            if not result["ok"]:
                self.counters["conflicts"] += 1
                for key, offset, _ in result["conflicts"]:
                    self._cache.pop((key, offset), None)
                return False
            self.counters["commits"] += 1
            for (key, offset, raw), ts in zip(writes, result["timestamps"], strict=True):
                self._install((key, offset), raw, int(ts), self._decode(key, offset, raw), seq)
            return True

    def _commit_or_fail(
        self, node: str, reads: list[list[Any]], writes: list[Write], where: str
    ) -> None:
        if not self._commit(node, reads, writes):
            raise ObjectBusyError(f"{where}: a new directory's header conflicted; try again")

    def _plan_rmdir(self, child: DirView, path: str) -> tuple[list[list[Any]], list[Write]]:
        """Mark directory ``child`` removed, conditional (read set) on it being empty."""
        if any(child.blocks):
            raise InvalidArgumentError(
                f"{path} is a directory that is not empty; remove its entries first"
            )
        h = child.header
        return child.reads(), [
            (child.key, 0, encode_header(Header(h.dir_id, h.parent_id, h.blocks, True)))
        ]

    def _forget_orphan(self, child_key: str, child_id: str, parent_id: str) -> None:
        """A mkdir whose parent entry failed: mark the child removed (best effort; a
        failure leaves an unreferenced directory, which nothing can reach)."""
        with contextlib.suppress(Exception):
            tomb = encode_header(Header(child_id, parent_id, 0, True))
            self._commit(self._node(child_key), [], [(child_key, 0, tomb)])

    def _count(self, counter: str) -> None:
        with self._lock:
            self.counters[counter] += 1
            if counter in ("inserts", "retries"):
                if len(self.timeline) >= TIMELINE_SAMPLES_MAX:
                    self.timeline = self.timeline[::2]
                self.timeline.append(
                    [time.time(), self.counters["inserts"], self.counters["retries"]]
                )


def open_directory(
    rt: Runtime, volume: str, *, at: str | None = None, placement: str = "auto"
) -> Ref:
    """A directory object of ``volume`` for ``rt``'s application, here (``at=None``)
    or on node ``at``, over every node's isolation object."""
    isolations = {n.node_id: rt.service(n.node_id, "isolation") for n in rt.nodes}
    return rt.create("directory", at=at, placement=placement, volume=volume, isolations=isolations)
