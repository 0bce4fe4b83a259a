"""CPU per read a worker answers itself (``shuttle.node.worker_reads.WorkerReads.read``:
the generation check, the descriptor, a ``preadv2(RWF_NOWAIT)`` of 4 KiB from the page
cache, the check again), in one process over a real store, against an anchor:
another checkout's ``src`` (the code before a change), in the same run, interleaved.

    git archive main src | tar -x -C /tmp/anchor
    .venv/bin/python benchmarks/worker_read_cpu.py --anchor /tmp/anchor/src \\
        --pairs 6 --json benchmarks/results/workers/read-cpu.json

Written for issue 26, item 4's change of a worker's descriptors from its own file per
learnt object to the store's descriptor cache (``OpenFiles``): a borrow and a give-back
per read cost 0.7 µs (1.33× the anchor), so a known object holds its lease instead.
Each measurement is a fresh interpreter (``--child``) with the tree first on its path
and ``SHUTTLE_PURE=1`` (the worker's read path is not compiled in either), reporting
CPU seconds (``time.process_time``), best of 5 batches. A pair runs the anchor and
this tree back to back, alternating which goes first. Printed and written: µs per read
for each, and this tree's over the anchor's per pair, with the spread of the ratios
(the noise).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import anchor_pairs

PAGE = 4096
OBJECT_BYTES = 1 << 20
KEYS = 16
READS = 20_000


def child() -> dict[str, float]:
    """One tree's figure (runs in the child interpreter)."""
    from shuttle.node.worker_pool import GenerationHook
    from shuttle.node.worker_reads import WorkerReads
    from shuttle.store import ObjectStore, StoreConfig
    from shuttle.store.generations import ChangeGenerations

    with tempfile.TemporaryDirectory() as tmp:
        gens = ChangeGenerations.create()
        store = ObjectStore(Path(tmp) / "data", StoreConfig(cache_capacity_bytes=1 << 20))
        store.change_hook = GenerationHook(store.change_hook, gens)
        view = ChangeGenerations(os.dup(gens.fd), writer=False)

        async def stat(key: str, *chunks_max: int) -> dict[str, Any]:
            a = store.stat(key)  # this tree asks for a chunk list length, the anchor not
            return {**a.as_dict(), "chunks_total": len(a.chunks), "chunks": []}

        reads = WorkerReads(str(store.layout.root), view, stat)
        keys = [f"k{i}" for i in range(KEYS)]
        for key in keys:
            store.put(key, os.urandom(OBJECT_BYTES))

        async def learn() -> None:
            for key in keys:
                await reads.learn(key)

        asyncio.run(learn())
        pages = OBJECT_BYTES // PAGE
        for key in keys:  # resident, and every read answered
            for p in range(pages):
                assert reads.read(key, p * PAGE, PAGE, None) is not None

        def per_read() -> float:
            read = reads.read
            t = time.process_time()
            for i in range(READS):
                read(keys[i % KEYS], (i % pages) * PAGE, PAGE, None)
            return (time.process_time() - t) / READS

        best = min(per_read() for _ in range(5))
        served = reads.served
        reads.close()
        store.close()
        gens.close()
        view.close()
    assert served == KEYS * pages + 5 * READS, served  # all of them answered here
    return {"read_us": best * 1e6}


if __name__ == "__main__":
    anchor_pairs.main(child, __file__, __doc__.split("\n\n")[0], pairs=6, env={"SHUTTLE_PURE": "1"})
