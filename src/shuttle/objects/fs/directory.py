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
one short lock never held across an outgoing call. The cached blocks, their
promises' expiry and revalidation, and the guard against a callback that overtakes a
read are :class:`~shuttle.objects.fs.promises.PromiseCache`, as the cache object's.

**Migration.** The cache travels in the checkpoint (blocks with their timestamps):
the promises belong to the reference, not the host, and a callback that arrives while
the object moves waits at its gate and is delivered wherever it lands.

**Durable.** A directory object is durable (docs/runtime.md, "Durable objects"): if
the node it runs on dies, its home brings it back, same id, so the isolation
objects' callbacks still reach it. What it must not lose is only what it was made
with (the volume and the isolation objects): every update it acknowledged is in the
directory's blocks, committed and durable at their node before it returned, and its
cache and counters are rebuilt from there. So no call changes its durable part, and
none waits for a write.

**Serialisation (ABACUS 6.5).** Directory objects on one run-time share a manager
whose per-directory locks (:mod:`shuttle.objects.fs.dirturns`) order their updates of
one directory: moved to the directory's node, the clients' objects take turns locally
instead of retrying over the network. The lock only orders: correctness is the commit's.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    ObjectBusyError,
    ServerError,
    UsageError,
)
from shuttle.objects.fs.cache import NODE_FAILURES
from shuttle.objects.fs.dirblocks import (
    BLOCK_BYTES,
    ROOT_ID,
    DirView,
    Entries,
    Header,
    Write,
    check_entry,
    decode_entries,
    decode_header,
    encode_header,
    join,
    new_dir_id,
    plan_insert,
    plan_remove,
    split_path,
    stored_body_bytes,
)
from shuttle.objects.fs.dirturns import DirectoryTurns
from shuttle.objects.fs.promises import Held, PromiseCache, Ticket
from shuttle.rendezvous import winner
from shuttle.runtime import values
from shuttle.runtime.mobile import CallMoved, MobileObject, ObjectManager, builtin
from shuttle.runtime.refs import Ref
from shuttle.store.keys import validate_key

if TYPE_CHECKING:
    from shuttle.runtime.client import Runtime

# --- limits, each with its reason ----------------------------------------------------

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

# --- the object ----------------------------------------------------------------------


class DirectoryManager(ObjectManager):
    """One run-time's directory objects; they share the locks that order their updates
    of one directory (what serialises clients whose objects moved to one node)."""

    def __init__(self, cls: type[MobileObject], node_id: str) -> None:
        super().__init__(cls, node_id)
        self.turns = DirectoryTurns()

    def share(self, obj: MobileObject) -> None:
        if isinstance(obj, DirectoryObject):
            obj._turns = self.turns


#: A block's name: (key, offset).
Block = tuple[str, int]
#: A cached block: its bytes, decoded.
Cached = tuple[bytes, Header | Entries | None]


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
    "revalidations",  # lapsed promises renewed or found stale (PROMISE_LIFETIME_S)
    "serialised_waits",  # updates that waited for another on this run-time
)


@builtin("directory")
class DirectoryObject(MobileObject):
    """A volume's namespace for one client: ``mkdir``, ``create``, ``lookup``,
    ``listdir``, ``remove``; :meth:`invalidate` is the isolation objects' callback."""

    concurrent = True  # invalidate must get in while an update waits on a commit
    # ... and while a migration drains that update: the commit may be waiting for
    # another client's object to take its callback, while that object's own commit
    # waits for this one's; two objects moving at once must not hold each other's.
    quiesce_admits = frozenset({"invalidate"})
    manager_class = DirectoryManager
    durable = True
    #: No call changes what a directory object must keep (see "Durable" above).
    readonly = frozenset({"mkdir", "create", "lookup", "listdir", "remove", "invalidate", "stats"})

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
        #: The blocks read, under their promises; a block read or written while a
        #: callback for it arrived is not kept (it may be stale, and nobody would say).
        self._promises: PromiseCache[Block, Cached] = PromiseCache(capacity=CACHE_BLOCKS_MAX)
        #: One lock for the cache and the counters (reentrant).
        self._lock = self._promises.lock
        if not hasattr(self, "_turns"):
            self._turns = DirectoryTurns()
        self._node_ids = sorted(self.isolations)

    # --- migration ----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        state = super().state()
        state["cache"] = [[k, off, c.value[0], c.ts] for (k, off), c in self._promises.items()]
        return state

    def durable_checkpoint(self) -> bytes:
        return values.pack({"volume": self.volume, "isolations": self.isolations})

    def set_state(self, state: dict[str, Any]) -> None:
        cache = state.pop("cache", [])
        # Brought back from its durable part: counters start again.
        state.setdefault("counters", dict.fromkeys(COUNTERS, 0))
        state.setdefault("timeline", [])
        super().set_state(state)
        self._setup()
        for key, offset, raw, ts in cache:
            self._promises.keep((key, offset), (raw, self._decode(key, offset, raw)), ts)

    def memory_bytes(self) -> int:
        return len(self._promises) * BLOCK_BYTES

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
            yields=True,
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
        """The isolation object's callback: blocks ``offsets`` of ``key`` changed (none
        given: every block of ``key``, as a node that restarted says)."""
        with self._lock:
            if offsets:
                dropped = self._promises.invalidate([(key, o) for o in offsets])
            else:  # a read of any block of ``key`` under way keeps nothing either
                dropped = self._promises.invalidate_where(lambda block: block[0] == key)
            self.counters["invalidations"] += dropped

    def destroying(self) -> None:
        """The object ends: give back its promises, or the next update of each block
        waits on callbacks to an object that is gone (docs/objectfs.md)."""
        blocks = self._promises.clear()
        by_node: dict[str, list[list[Any]]] = {}
        for key, offset in blocks:
            by_node.setdefault(self._node(key), []).append([key, offset])
        me = self.self_ref()
        for node, held in sorted(by_node.items()):
            with contextlib.suppress(*NODE_FAILURES):
                self.isolations[node].release(held, me)

    def stats(self) -> dict[str, Any]:
        """Counters (see :data:`COUNTERS`), cached blocks, and the timeline."""
        with self._lock:
            return {
                **self.counters,
                "cached_blocks": len(self._promises),
                "timeline": [list(s) for s in self.timeline],
            }

    # --- reading ------------------------------------------------------------------------

    def _key(self, dir_id: str) -> str:
        return f"{self.volume}/.dirs/{dir_id}"

    def _node(self, key: str) -> str:
        return winner(self._node_ids, key)

    def _isolation(self, key: str) -> Ref:
        return self.isolations[self._node(key)]

    def _decode(self, key: str, offset: int, raw: bytes) -> Header | Entries | None:
        where = f"block {offset} of {key}"
        return decode_header(raw, where) if offset == 0 else decode_entries(raw, where)

    def _block(self, key: str, offset: int) -> Held[Cached]:
        """A block (bytes and decoded, timestamp): cached, or read with a promise."""
        block = (key, offset)
        hit, fresh = self._promises.look(block)
        if fresh and hit is not None:
            with self._lock:
                self.counters["cache_hits"] += 1
            return hit
        if hit is not None and self._revalidate(block, hit):
            return hit
        with self._promises.fetching() as ticket, self._node_failures(key):
            raw, ts = self._isolation(key).read(key, offset, BLOCK_BYTES, self.self_ref())
            value = self._decode(key, offset, raw)
            with self._lock:
                self.counters["installation_reads"] += 1
                self._promises.install(block, (raw, value), int(ts), ticket)
        return Held((raw, value), int(ts), 0.0)

    def _revalidate(self, block: Block, hit: Held[Cached]) -> bool:
        """A cached block whose promise lapsed (``PROMISE_LIFETIME_S``, as the cache
        object's): renew the promise and keep the copy if the block's timestamp is
        still the one it was cached at (after a restart of its node it never is)."""
        key, offset = block
        with self._node_failures(key):
            ts = int(self._isolation(key).promise(key, offset, BLOCK_BYTES, self.self_ref()))
            with self._lock:
                self.counters["revalidations"] += 1
                if self._promises.renew(block, hit, ts):
                    self.counters["cache_hits"] += 1
                    return True
                return False

    @contextlib.contextmanager
    def _node_failures(self, key: str) -> Iterator[None]:
        """A call to ``key``'s node failed: that node may have restarted, and lost
        the promises of every block cached from it. Drop them all (AFS's client
        revalidates after losing its server the same way); reads under way keep
        nothing either."""
        try:
            yield
        except NODE_FAILURES:
            node = self._node(key)
            self._promises.invalidate_where(lambda block: self._node(block[0]) == node)
            raise

    def _load(self, key: str, where: str, *, removed_ok: bool = False) -> DirView:
        """Directory ``key``'s blocks, all current together unless they kept changing
        (then the last try: an update's commit checks it anyway)."""
        view: DirView | None = None
        for _ in range(LOAD_ATTEMPTS_MAX):
            with self._promises.fetching() as ticket:
                view = self._load_once(key, where, removed_ok)
                blocks = [(key, BLOCK_BYTES * i) for i in range(view.header.blocks + 1)]
                changed = self._promises.invalidated_since(ticket, blocks)
            if not changed:
                break
        assert view is not None
        return view

    def _load_once(self, key: str, where: str, removed_ok: bool) -> DirView:
        head = self._block(key, 0)
        header = head.value[1]
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
            raw, value = got.value
            if not isinstance(value, dict):
                raise ServerError(f"{where}: entry block {i} of {key} is missing")
            blocks.append(value)
            stamps.append(got.ts)
            sizes.append(stored_body_bytes(raw))
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

    def _serialised(self, key: str) -> contextlib.AbstractContextManager[None]:
        """This run-time's updates of directory ``key``, one at a time (see the module
        doc); held across the commit, never taken by :meth:`invalidate`."""
        return self._turns.turn(key, lambda: self._count("serialised_waits"))

    def _update(
        self,
        key: str,
        where: str,
        plan: Callable[[DirView], tuple[list[list[Any]], list[Write]]],
        *,
        removed_ok: bool = False,
        yields: bool = False,
    ) -> None:
        """Read directory ``key``, ``plan`` the update (the read set and the writes;
        it raises if the update is not allowed), commit; on a conflict, again.

        ``yields``: the whole operation is this one update (nothing committed before
        it), so after a conflict, if the run-time is moving this object, it gives way
        (:class:`CallMoved`) and runs again where the object lands. Left at the
        client, an update that conflicts with clients already at the node (who take
        turns locally, a commit every few milliseconds) can retry for seconds and hold
        up the very move that would end its conflicts."""
        node = self._node(key)
        with self._serialised(key):
            for attempt in range(COMMIT_ATTEMPTS_MAX):
                reads, writes = plan(self._load(key, where, removed_ok=removed_ok))
                if self._commit(node, reads, writes):
                    return
                if attempt == COMMIT_ATTEMPTS_MAX - 1:
                    break
                if yields and self.moving():
                    raise CallMoved(f"{where}: moving to where the other clients commit")
                self._count("retries")
                ceiling = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2**attempt))
                pause = random.uniform(0, ceiling)
                time.sleep(pause)
                # Time lost to the conflict, outside any call: the monitor charges it
                # to the edge to the isolation object while that is remote.
                self.report_wait(self.isolations[node], pause)
        raise ObjectBusyError(
            f"{where}: {COMMIT_ATTEMPTS_MAX} attempts to update the directory conflicted "
            "with other clients' updates; try again (or move the directory object to "
            f"node {node}, where clients take turns)"
        )

    def _commit(self, node: str, reads: list[list[Any]], writes: list[Write]) -> bool:
        """One ``CommitAction``; True if it was applied (the written blocks are then
        cached: this object holds their promises), False on a conflict."""
        with (
            self._promises.fetching() as ticket,
            self._node_failures(reads[0][0] if reads else writes[0][0]),
        ):
            result = self.isolations[node].commit(reads, [list(w) for w in writes], self.self_ref())
            return self._committed(result, writes, ticket)

    def _committed(self, result: dict[str, Any], writes: list[Write], ticket: Ticket) -> bool:
        with self._lock:
            if not result["ok"]:
                self.counters["conflicts"] += 1
                for key, offset, _ in result["conflicts"]:
                    self._promises.drop((key, offset))
                return False
            self.counters["commits"] += 1
            for (key, offset, raw), ts in zip(writes, result["timestamps"], strict=True):
                value = (raw, self._decode(key, offset, raw))
                self._promises.install((key, offset), value, int(ts), ticket)
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
