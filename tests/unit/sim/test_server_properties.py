"""Properties of the server's block cache under arbitrary request sequences (hypothesis)."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.sim.blocks import BLOCK_BITS
from shuttle.sim.config import ServerConfig
from shuttle.sim.kernel import Kernel
from shuttle.sim.metrics import TrafficStats
from shuttle.sim.server import Request, Server
from shuttle.sim.workload import BLOCK_READ, BLOCK_WRITE

#: (gap before the request in ms, write?, file, first block, blocks)
requests = st.lists(
    st.tuples(
        st.integers(0, 20),
        st.booleans(),
        st.integers(0, 3),
        st.integers(0, 12),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=120,
)
#: The same, with every request at a later instant than the one before it: with an
#: instant CPU and disk, two requests at the same instant still interleave (the
#: second can find the first's blocks locked), so "no overlap" needs distinct times.
spaced_requests = requests.map(lambda seq: [(max(1, gap), *rest) for gap, *rest in seq])


def replay(
    config: ServerConfig, sequence: list[tuple[int, bool, int, int, int]]
) -> tuple[Server, TrafficStats, list[float]]:
    kernel = Kernel()
    server = Server(kernel, config)
    stats = TrafficStats()
    done: list[float] = []
    now = 0.0
    for gap_ms, write, file, first, count in sequence:
        now += gap_ms / 1000.0
        kind = BLOCK_WRITE if write else BLOCK_READ
        req = Request(kind, file, (file << BLOCK_BITS) + first, count, now, 0.0, 0.0, stats, True)
        req.on_done = lambda t, r: done.append(t - r.issue_s)
        kernel.at(now, server.arrive, req)
    kernel.run()
    return server, stats, done


@settings(max_examples=150, deadline=None)
@given(sequence=requests, capacity=st.integers(1, 12))
def test_every_request_completes_and_the_cache_ends_consistent(
    sequence: list[tuple[int, bool, int, int, int]], capacity: int
) -> None:
    """Overlapping requests, locked blocks, a cache smaller than one request: no deadlock."""
    config = ServerConfig(cache_blocks=capacity, mobile_footprint_bytes=0)
    server, stats, done = replay(config, sequence)
    assert len(done) == len(sequence) == stats.requests
    assert all(response >= 0.0 for response in done)
    assert not server.locked and not server.free_waiters
    assert server.resident_blocks() <= capacity
    assert stats.block_accesses == sum(count for *_, count in sequence)
    assert 0 <= stats.block_hits <= stats.block_accesses
    parts = sum(stats.breakdown_s().values()) * stats.requests
    assert parts >= stats.response_s_sum - 1e-9 * len(sequence)


@settings(max_examples=150, deadline=None)
@given(sequence=spaced_requests, capacity=st.integers(1, 12))
def test_without_overlap_the_server_cache_is_exactly_lru(
    sequence: list[tuple[int, bool, int, int, int]], capacity: int
) -> None:
    """Instant CPU and disk: no request overlaps another, so hits are a plain LRU's."""
    config = ServerConfig(
        cache_blocks=capacity,
        mobile_footprint_bytes=0,
        server_speed=float("inf"),
        disk_seek_s=0.0,
        disk_bandwidth_bytes_per_s=float("inf"),
    )
    _, stats, _ = replay(config, sequence)
    # A plain LRU, with the model's one rule of timing: a block becomes most recent
    # when its I/O completes, after the request's hits (a read hit is touched at
    # once; a miss, and a written block, when the disk is done), and a miss takes
    # its slot (evicting the least recent block) when it is looked up, waiting for
    # the request's own blocks to arrive when they hold every slot.
    lru: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for _, write, file, first, count in sequence:
        from_disk: list[int] = []
        for block in range(first, first + count):
            key = (file << BLOCK_BITS) + block
            if key in lru:
                hits += 1
                if write:
                    del lru[key]
                    from_disk.append(key)
                else:
                    lru.move_to_end(key)
            else:
                if len(lru) + len(from_disk) >= capacity:
                    if not lru:  # every slot is this request's: wait for its I/O
                        lru.update(dict.fromkeys(from_disk))
                        from_disk.clear()
                    lru.popitem(last=False)
                from_disk.append(key)
        lru.update(dict.fromkeys(from_disk))
    assert stats.block_hits == hits
