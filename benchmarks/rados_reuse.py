"""How a RADOS gateway's block cache fares on ``shuttle bench ceph netrand``'s reads
(issue 26, item 2): the benchmark's page sequence replayed, without Ceph, through the
node's own block cache (:class:`shuttle.blockcache.BlockCache`), once as the node read
misses before (every miss reads its whole block and caches it, LRU) and once with the
admission test of :mod:`shuttle.store.rados_admission` (a miss reads only the page,
uncached, unless the cache has room or the block missed recently).

    .venv/bin/python benchmarks/rados_reuse.py [--file-bytes 8388608]
        [--cache-bytes 1048576] [--block-bytes 4096] [--pages 400] [--rounds 10]
        [--json-out FILE]

``--block-bytes`` is the node's cache block (``shuttle serve --cache-block-bytes``,
4 KiB by default; the benchmark's ``--node-block-bytes``). With the defaults the
replay's counts are the live node's exactly (hits, misses, partial and whole reads:
the run's ``rados_counters``), so it also explains them.

The sequence is the benchmark's: round 0 reads its pages once (warm-up), every later
round reads its pages twice and times the second pass (``lcg`` generator, seed 1 +
round). Prints, over the timed reads: hits and misses, how many misses re-read a block
the cache had held and evicted (and how many of those it had evicted without a single
hit), the blocks evicted unused, the bytes read from RADOS per timed read, and the
admission's whole and partial reads. Exact (no timing): the same input gives the same
figures.
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

from shuttle.bench.netrand import GENERATORS
from shuttle.blockcache import BlockCache
from shuttle.node.config import CACHE_BLOCK_BYTES_DEFAULT
from shuttle.store.rados_admission import MissAdmission

KEY = "bench/ceph.dat"
PAGE_BYTES = 4096


def replay(args: argparse.Namespace, admit: bool) -> dict[str, Any]:
    """The benchmark's reads through one node's cache; counts over the timed passes."""
    cache = BlockCache(args.cache_bytes, args.block_bytes)
    bsz = args.block_bytes
    admission = MissAdmission(args.cache_bytes // bsz) if admit else None
    pages_in_file = args.file_bytes // PAGE_BYTES
    gen = GENERATORS["lcg"]
    # The cache's blocks in LRU order (its own policy, mirrored: which block it evicts
    # is not part of its API), each with whether it was hit since it was cached.
    resident_hit: OrderedDict[int, bool] = OrderedDict()
    capacity_blocks = args.cache_bytes // bsz
    evicted_unused: set[int] = set()  # blocks evicted without a hit, not read back yet
    evicted_used: set[int] = set()
    out = {
        "timed_reads": 0,
        "hits": 0,
        "misses": 0,
        "misses_of_a_block_evicted_before": 0,
        "misses_of_a_block_evicted_unused": 0,
        "bytes_from_rados": 0,
        "whole_reads": 0,
        "partial_reads": 0,
    }

    def read(page: int, timed: bool) -> None:
        offset = page * PAGE_BYTES
        block = offset // bsz
        c = out if timed else {k: 0 for k in out}
        c["timed_reads"] += 1
        if cache.read_hit(KEY, offset, offset + PAGE_BYTES) is not None:
            c["hits"] += 1
            resident_hit[block] = True
            resident_hit.move_to_end(block)
            return
        c["misses"] += 1
        if block in evicted_unused or block in evicted_used:
            c["misses_of_a_block_evicted_before"] += 1
            c["misses_of_a_block_evicted_unused"] += block in evicted_unused
        stats = cache.stats()
        room = stats.bytes_cached + bsz <= stats.capacity_bytes
        if admission is not None and not admission.whole(KEY, block, block, room):
            c["partial_reads"] += 1
            c["bytes_from_rados"] += PAGE_BYTES
            return
        c["whole_reads"] += 1
        cache.read(KEY, offset, PAGE_BYTES, args.file_bytes, lambda a, b: bytes(b - a))
        c["bytes_from_rados"] += bsz
        evicted_unused.discard(block)
        evicted_used.discard(block)
        resident_hit[block] = False
        while len(resident_hit) > capacity_blocks:
            gone, used = resident_hit.popitem(last=False)
            (evicted_used if used else evicted_unused).add(gone)
        assert cache.stats().blocks_cached == len(resident_hit), "the mirror lost step"

    for rnd in range(args.rounds + 1):
        pages = list(gen(1 + rnd, args.pages, pages_in_file))
        for page in pages:
            read(page, timed=False)
        if rnd:
            for page in pages:
                read(page, timed=True)
    n = out["timed_reads"] or 1
    out["hit_ratio"] = round(out["hits"] / n, 4)
    out["bytes_from_rados_per_read"] = round(out["bytes_from_rados"] / n)
    if admission is not None:
        out["ghost_hits_all_reads"] = admission.ghost_hits
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file-bytes", type=int, default=8 << 20)
    ap.add_argument("--cache-bytes", type=int, default=1 << 20)
    ap.add_argument("--block-bytes", type=int, default=CACHE_BLOCK_BYTES_DEFAULT)
    ap.add_argument("--pages", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    report = {
        "config": {k: v for k, v in vars(args).items() if k != "json_out"},
        "before": replay(args, admit=False),
        "after": replay(args, admit=True),
    }
    for name in ("before", "after"):
        print(name, json.dumps(report[name]))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
