"""``cache``: a file's blocks cached wherever the object runs (ABACUS 4.3.1, 6.4).

A cache object keeps an *index* of one file's blocks in the *shared block cache* of
the run-time it runs in (a node's, or an application's): one LRU of bytes for all
cache objects there, held by the type's object manager (section 4.2), so a node's
memory for caching is shared by every file it caches. A block missing from the
cache is fetched from the node's isolation object (an *installation read*), which
records a callback promise; a write is written through, a whole block at a time, and
breaks every other cache's promise on it before it returns (AFS semantics: a reader
whose promise still holds may use its copy without asking).

Where the object runs is the placement question of ABACUS 6.4: at the client, reads
that hit cost nothing on the network, but a small write (a 128-byte record) ships a
whole block, and a miss reads one first; at the node, every call crosses the network
but carries only the record. The run-time sees the bytes on the two edges and moves
the object to the cheaper side.

**Over RAID 5** (``data``, a ``raid5`` object): the file's bytes are striped over
several nodes, so the blocks are read and written through the RAID object, while the
promises stay with the isolation object of the file's home node, under the file's
own key. A block's promise is taken *before* its data is read (``promise``), and
the RAID object reports each write there (``changed``) once its stripes are written,
which breaks every other cache's promise before the write returns. A change that
lands after the promise is therefore called back, so a copy read after it is either
current or dropped: the same guarantee as a plain file's.

Which blocks are held, under which promise, until when, and whether a fetch may
keep what it read (a callback can overtake it) is
:class:`~shuttle.objects.fs.promises.PromiseCache`, the same as the directory
object's; this object keeps the bytes themselves in the run-time's shared LRU. Only
whole blocks are cached: the short block at the end of a file changes (it fills with
zeros) when anyone writes past it, which no callback on that block would announce.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    ObjectInDoubtError,
    RemoteProtocolError,
    RequestTimeoutError,
    UnreachableError,
)
from shuttle.objects.fs.promises import PromiseCache, Ticket
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject, ObjectManager, builtin
from shuttle.runtime.refs import Ref

#: Block size of a file's cache (ABACUS 6.4 uses 8 KB).
BLOCK_BYTES_DEFAULT = 8192
BLOCK_BYTES_MIN = 512
BLOCK_BYTES_MAX = 1 << 20
#: Bytes of blocks one run-time's shared cache holds for all cache objects.
SHARED_CACHE_BYTES_DEFAULT = 64 << 20
#: Largest read or write one call takes.
IO_BYTES_MAX = 4 << 20
#: Locks that order one cache object's writes of a block over RAID 5 (blocks hash
#: onto them): there a write's bytes land, and its timestamp is given, in two steps.
WRITE_LOCK_STRIPES = 16
#: Errors of a call whose node may be gone or restarted (and its promises with it): a
#: call in doubt left and got no answer (the run-time never repeats it).
NODE_FAILURES = (UnreachableError, RequestTimeoutError, RemoteProtocolError, ObjectInDoubtError)


class SharedBlockCache:
    """One run-time's LRU of blocks for all its cache objects, thread-safe."""

    def __init__(self, capacity_bytes: int = SHARED_CACHE_BYTES_DEFAULT) -> None:
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        #: (owner, block offset) -> bytes, least recently used first.
        self._blocks: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, owner: str, offset: int) -> bytes | None:
        with self._lock:
            name = (owner, offset)
            data = self._blocks.get(name)
            if data is not None:
                self._blocks.move_to_end(name)
            return data

    def put(self, owner: str, offset: int, data: bytes) -> None:
        with self._lock:
            name = (owner, offset)
            old = self._blocks.pop(name, None)
            if old is not None:
                self.used_bytes -= len(old)
            self._blocks[name] = data
            self.used_bytes += len(data)
            while self.used_bytes > self.capacity_bytes and self._blocks:
                _, evicted = self._blocks.popitem(last=False)
                self.used_bytes -= len(evicted)

    def drop(self, owner: str, offset: int) -> None:
        with self._lock:
            old = self._blocks.pop((owner, offset), None)
            if old is not None:
                self.used_bytes -= len(old)

    def drop_owner(self, owner: str) -> None:
        with self._lock:
            for name in [n for n in self._blocks if n[0] == owner]:
                self.used_bytes -= len(self._blocks.pop(name))


class CacheManager(ObjectManager):
    """All cache objects of one run-time, over one shared block cache."""

    def __init__(self, cls: type[MobileObject], node_id: str) -> None:
        super().__init__(cls, node_id)
        self.shared = SharedBlockCache()

    def share(self, obj: MobileObject) -> None:
        assert isinstance(obj, CacheObject)
        obj._shared = self.shared

    def release(self, rid: ObjectId) -> MobileObject | None:
        gone = super().release(rid)
        if gone is not None:  # its last activation: its blocks go with it
            self.shared.drop_owner(str(rid))
        return gone


def check_block_bytes(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"block_bytes must be an integer, got {value!r:.40}")
    if not BLOCK_BYTES_MIN <= value <= BLOCK_BYTES_MAX or value & (value - 1):
        raise InvalidArgumentError(
            f"block_bytes must be a power of two in {BLOCK_BYTES_MIN}..{BLOCK_BYTES_MAX}, "
            f"got {value}"
        )
    return value


def check_range(offset: Any, length: Any, what: str) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidArgumentError(f"{what}: offset must be an integer ≥ 0, got {offset!r:.40}")
    if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= IO_BYTES_MAX:
        raise InvalidArgumentError(
            f"{what}: length must be an integer in 0..{IO_BYTES_MAX}, got {length!r:.40}"
        )


@builtin("cache")
class CacheObject(MobileObject):
    """One file's blocks in the run-time's shared cache, kept coherent by callbacks."""

    manager_class = CacheManager
    concurrent = True  # callbacks must get in while a read waits on the node

    _shared: SharedBlockCache

    def __init__(
        self,
        isolation: Ref,
        key: str,
        *,
        block_bytes: int = BLOCK_BYTES_DEFAULT,
        data: Ref | None = None,
    ) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidArgumentError(f"a cache needs the file's key, got {key!r:.60}")
        if data is not None and not isinstance(data, Ref):
            raise InvalidArgumentError(
                "data must be the file's raid5 object (a reference) or None, "
                f"got {type(data).__name__}"
            )
        self.isolation = isolation
        #: The raid5 object the blocks go through (None: the isolation object's node
        #: stores the file, and reads and writes go there).
        self.data = data
        self.key = key
        self.block_bytes = check_block_bytes(block_bytes)
        self.hits = 0
        self.installation_reads = 0
        self.writes = 0
        self.invalidations = 0
        self.revalidations = 0
        self._setup()

    def _setup(self) -> None:
        #: Block offset -> the promise on our copy (its bytes are in ``_shared``).
        self._promises: PromiseCache[int, None] = PromiseCache(on_drop=self._dropped)
        #: Held across a change of the promises and the bytes together, and a hit's
        #: look at both; and for the counters. Taken before the promise cache's own.
        self._lock = threading.Lock()
        self._me: Ref | None = None
        #: Whether the raid5 object below tells the isolation object of its writes
        #: (None: not asked yet in this incarnation).
        self._data_told: bool | None = None
        self._write_locks = [threading.Lock() for _ in range(WRITE_LOCK_STRIPES)]

    # --- state that travels ------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What travels: the file, the block size and the counters; not the blocks.
        At a node they are a local read away; at a client they come back as
        installation reads when used. Shipping them would make every move cost the
        whole cache over the link, for blocks a phase may never touch again."""
        with self._lock:
            return super().state()

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        self._setup()

    def memory_bytes(self) -> int:
        return len(self._promises) * self.block_bytes

    # --- the file's interface ----------------------------------------------------------

    def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``offset`` (fewer at the end of the file)."""
        check_range(offset, length, "read")
        out = []
        b = self.block_bytes
        end = offset + length
        pos = offset
        while pos < end:
            start = pos - pos % b
            block = self._block(start)
            piece = block[pos - start : min(end, start + b) - start]
            out.append(piece)
            if len(block) < b:  # the end of the file
                break
            pos = start + b
        return b"".join(out)

    def write(self, offset: int, data: bytes) -> dict[str, int]:
        """Write ``data`` at ``offset``: each block touched is read if only part of it
        changes (an installation read, unless cached) and written through whole. A
        run of several whole blocks goes below in one call and is not cached (a
        file written whole is seldom read back by its writer; over RAID 5 the run is
        written as whole stripes, not one read-modify-write per block)."""
        check_range(offset, len(data), "write")
        self._check_data()
        b = self.block_bytes
        pos, end = offset, offset + len(data)
        view = memoryview(bytes(data))
        while pos < end:
            if pos % b == 0 and end - pos >= 2 * b:
                run = (end - pos) // b * b
                self._write_run(pos, bytes(view[pos - offset : pos - offset + run]))
                pos += run
                continue
            start = pos - pos % b
            stop = min(end, start + b)
            piece = view[pos - offset : stop - offset]
            if pos == start and stop == start + b:
                block = bytes(piece)
            else:
                old = self._block(start)
                if len(old) < pos - start:
                    old += bytes(pos - start - len(old))  # a gap reads as zeros
                block = old[: pos - start] + bytes(piece) + old[stop - start :]
            self._write_block(start, block)
            pos = stop
        return {"written": len(data), "end": end}

    def size(self) -> int:
        """The file's size (at its node, or across its RAID columns)."""
        if self.data is not None:
            return int(self.data.size())
        return int(self.isolation.size(self.key))

    def invalidate(self, key: str, offsets: list[int]) -> None:
        """The isolation object's callback: our copies of ``offsets`` are stale (none
        given: every block, as a node that restarted says)."""
        with self._lock:
            if offsets:
                self.invalidations += self._promises.invalidate(list(offsets))
            else:  # reads in flight install nothing either
                self.invalidations += self._promises.invalidate_where()

    def destroying(self) -> None:
        """The object ends: give back the callback promises of the blocks it caches
        (a later writer would otherwise wait on callbacks to an object that is gone)."""
        with self._lock:
            held = [[self.key, offset] for offset in self._promises.clear()]
        if held:
            with contextlib.suppress(*NODE_FAILURES):
                self.isolation.release(held, self._holder())

    def stats(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "cached_blocks": len(self._promises),
            "hits": self.hits,
            "installation_reads": self.installation_reads,
            "writes": self.writes,
            "invalidations": self.invalidations,
            "revalidations": self.revalidations,
        }

    # --- blocks ------------------------------------------------------------------------

    def _holder(self) -> Ref:
        if self._me is None:
            self._me = self.self_ref()
        return self._me

    def _dropped(self, start: int) -> None:
        """The promise cache let block ``start`` go (lock held): so do its bytes."""
        self._shared.drop(str(self.rid), start)

    def _block(self, start: int) -> bytes:
        with self._lock:
            held, fresh = self._promises.look(start)
            data = None if held is None else self._shared.get(str(self.rid), start)
            if held is not None and data is None:
                self._promises.drop(start)  # evicted by another file's blocks
            elif fresh and data is not None:
                self.hits += 1
                return data
        self._check_data()
        with self._promises.fetching() as ticket:
            if held is not None and data is not None and self._revalidate(start, held.ts):
                return data
            with self._home_failures():
                if self.data is None:
                    data, ts = self.isolation.read(
                        self.key, start, self.block_bytes, self._holder()
                    )
                else:  # the promise first: a write that lands after it calls back
                    try:
                        ts = self.isolation.promise(
                            self.key, start, self.block_bytes, self._holder()
                        )
                    except NODE_FAILURES:
                        # No one can keep a promise: read through the RAID object (it
                        # survives a lost node), cache nothing.
                        self._forget_all()
                        return bytes(self.data.read(start, self.block_bytes))
                    data = self.data.read(start, self.block_bytes)
            data = bytes(data)
            with self._lock:
                self.installation_reads += 1
                self._install(start, data, int(ts), ticket)
        return data

    def _revalidate(self, start: int, ts: int) -> bool:
        """A cached block whose promise lapsed: renew the promise (one small call) and
        keep the copy if the block's timestamp is still the one it was cached at.
        After a restart of its node it never is (timestamps start at the boot)."""
        try:
            now_ts = int(self.isolation.promise(self.key, start, self.block_bytes, self._holder()))
        except NODE_FAILURES:
            self._forget_all()
            return False  # the fetch decides: a RAID file reads through, a plain one fails
        with self._lock:
            self.revalidations += 1
            held = self._promises.get(start)
            if held is not None and held.ts == ts and self._promises.renew(start, held, now_ts):
                self.hits += 1
                return True
            return False

    def _install(self, start: int, block: bytes, ts: int, ticket: Ticket) -> None:
        """Cache ``block`` at timestamp ``ts`` unless a callback for it (or a lost
        node) came since ``ticket``, or a newer copy is held (lock held). A short
        block is never cached, and the copy held, if any, is stale."""
        if len(block) != self.block_bytes:
            self._promises.drop(start)
        elif self._promises.install(start, None, ts, ticket):
            self._shared.put(str(self.rid), start, block)

    def _forget_all(self) -> None:
        """Drop every cached block: their promises may be gone with their node (and a
        fetch or write under way then caches nothing either)."""
        with self._lock:
            self._promises.invalidate_where()

    @contextlib.contextmanager
    def _home_failures(self) -> Iterator[None]:
        """A call failed as if its node were lost: the home node may have restarted,
        and lost every promise this cache holds there. Drop them all (AFS's client
        revalidates after losing its server the same way), then raise."""
        try:
            yield
        except NODE_FAILURES:
            self._forget_all()
            raise

    def _check_data(self) -> None:
        """Refuse, before anything is read or written, a raid5 object below that tells
        no isolation object of its writes: other caches would keep stale blocks."""
        if self.data is None:
            return
        if self._data_told is None:
            self._data_told = bool(self.data.stats().get("callbacks"))
        if not self._data_told:
            raise InvalidArgumentError(
                f"the raid5 object under the cache of {self.key!r} tells no isolation "
                "object of its writes, so caches would keep stale blocks; make it with "
                "callbacks=Runtime.service(home node, 'isolation')"
            )

    def _write_run(self, start: int, run: bytes) -> None:
        """Whole blocks written through with no promise kept: the write breaks every
        holder's, this object's too, so a read of ours racing it cannot cache the
        old bytes (its callback comes before the write returns)."""
        with self._lock:
            for o in range(start, start + len(run), self.block_bytes):
                self._promises.drop(o)
        with self._home_failures():
            if self.data is None:
                self.isolation.write(self.key, start, run)
            else:
                self.data.write(start, run)
        with self._lock:
            self.writes += 1

    def _write_block(self, start: int, block: bytes) -> None:
        with self._promises.fetching() as ticket:
            self._write_block_with(start, block, ticket)

    def _write_block_with(self, start: int, block: bytes, ticket: Ticket) -> None:
        try:
            with self._home_failures():
                if self.data is None:
                    ts = self.isolation.write(self.key, start, block, self._holder())
                else:
                    # A promise first, as a read takes: another writer whose change
                    # is reported after ours but whose stripes landed before ours
                    # calls us back, so we never cache our bytes over theirs. Our own
                    # writes of the block go one at a time (the isolation object does
                    # not call a writer back about itself).
                    lock = self._write_locks[(start // self.block_bytes) % WRITE_LOCK_STRIPES]
                    with lock:
                        self.isolation.promise(self.key, start, self.block_bytes, self._holder())
                        ts = self.data.write(start, block, self._holder())["timestamp"]
        except BaseException:
            # Whatever the block holds now, no copy of ours is it: a read of ours
            # answered before the write may not keep its copy either (the node calls
            # no writer back about its own block).
            with self._lock:
                self._promises.invalidate([start])
            raise
        with self._lock:
            self.writes += 1
            self._install(start, block, int(ts), ticket)
