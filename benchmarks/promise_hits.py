"""CPU per hit of the two objects that keep copies under callback promises: the cache
object (an 8 KiB block read that hits) and the directory object (a lookup whose blocks
are all cached), in one process over in-memory isolation objects, as on one node.
Against an anchor: another checkout's ``src`` (the code before a change), measured in
the same run, interleaved, so the machine's load falls on both alike.

    git archive main src | tar -x -C /tmp/anchor
    .venv/bin/python benchmarks/promise_hits.py --anchor /tmp/anchor/src \\
        --pairs 5 --json benchmarks/results/promise-hits.json

Each measurement is a fresh interpreter (``--child``) with the tree first on its path;
it reports CPU seconds (``time.process_time``: less swayed by other processes than
the wall clock), best of 5 batches. A pair runs the anchor and this tree back to back,
alternating which goes first. Printed and written: µs per hit for each, and this
tree's over the anchor's per pair, with the spread of the ratios (the noise).
"""

from __future__ import annotations

import time
from typing import Any

import anchor_pairs

BLOCK = 8192
BLOCKS = 256
HITS = 20_000
LOOKUPS = 5_000


def child() -> dict[str, float]:
    """One tree's figures (runs in the child interpreter)."""
    from shuttle.errors import NotFoundError
    from shuttle.objects.fs.cache import CacheObject, SharedBlockCache
    from shuttle.objects.fs.directory import DirectoryObject
    from shuttle.objects.fs.isolation import IsolationObject
    from shuttle.runtime.ids import ObjectId
    from shuttle.runtime.refs import Ref

    class Store:
        def __init__(self) -> None:
            self.objects: dict[str, bytearray] = {}

        def read(self, key: str, offset: int, length: int) -> bytes:
            if key not in self.objects:
                raise NotFoundError(key)
            return bytes(self.objects[key][offset : offset + length])

        def write(self, key: str, offset: int, data: bytes, create: bool = True) -> None:
            obj = self.objects.setdefault(key, bytearray())
            obj[offset : offset + len(data)] = data

    class Atomicity:
        applied = 0

        def __init__(self, store: Store) -> None:
            self.store = store

        def apply(self, writes: list[Any]) -> dict[str, int]:
            for key, offset, data in writes:
                self.store.write(key, offset, data)
            return {"seq": 0, "blocks": len(writes)}

    class Local:
        """Calls objects in this process, as a node calls its own."""

        def __init__(self) -> None:
            self.objects: dict[ObjectId, Any] = {}

        def add(self, rid: ObjectId, obj: Any) -> Ref:
            obj.attach(rid, self)
            self.objects[rid] = obj
            return self.own_ref(rid)

        def own_ref(self, rid: ObjectId) -> Ref:
            return Ref(rid, "local", self)

        def invoke(self, ref: Ref, method: str, args: Any, kwargs: dict[str, Any]) -> Any:
            return getattr(self.objects[ref.rid], method)(*args, **kwargs)

    rt, store = Local(), Store()
    iso = rt.add(ObjectId("n1", "isolation"), IsolationObject(store, Atomicity(store)))  # type: ignore[arg-type]
    cache = CacheObject.__new__(CacheObject)
    cache.attach(ObjectId("c1", "1"), rt)  # type: ignore[arg-type]
    cache.__init__(iso, "vol/.files/f")  # type: ignore[misc]
    cache._shared = SharedBlockCache()
    rt.add(ObjectId("c1", "1"), cache)
    cache.write(0, b"x" * (BLOCK * BLOCKS))
    for o in range(0, BLOCK * BLOCKS, BLOCK):
        cache.read(o, BLOCK)
    d = DirectoryObject.__new__(DirectoryObject)
    d.attach(ObjectId("c1", "2"), rt)  # type: ignore[arg-type]
    d.__init__("vol", {"n1": iso})  # type: ignore[misc]
    rt.add(ObjectId("c1", "2"), d)
    for i in range(20):
        d.create(f"/f{i}", {"type": "file", "key": f"k{i}"})

    def per_hit() -> float:
        t = time.process_time()
        for i in range(HITS):
            cache.read((i % BLOCKS) * BLOCK, BLOCK)
        return (time.process_time() - t) / HITS

    def per_lookup() -> float:
        t = time.process_time()
        for i in range(LOOKUPS):
            d.lookup(f"/f{i % 20}")
        return (time.process_time() - t) / LOOKUPS

    hit = min(per_hit() for _ in range(5))
    lookup = min(per_lookup() for _ in range(5))
    stats = cache.stats()
    # Every read after the warm-up hit: the figure is the hit path's, nothing else.
    assert stats["installation_reads"] == BLOCKS and stats["hits"] == 5 * HITS, stats
    return {"cache_hit_us": hit * 1e6, "directory_lookup_us": lookup * 1e6}


if __name__ == "__main__":
    anchor_pairs.main(child, __file__, __doc__.split("\n\n")[0], pairs=5)
