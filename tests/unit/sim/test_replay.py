"""Cache replay: every policy against a simple reference model, and block splitting."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import ConfigError
from shuttle.sim.blocks import BLOCK_BITS
from shuttle.sim.policies import POLICIES, make_policy
from shuttle.sim.replay import replay, split_accesses
from shuttle.traces.record import Op, TraceRecord

# --- reference models: the textbook definitions, written for clarity not speed -------


def reference_lru(keys: list[int], capacity: int) -> list[bool]:
    stack: list[int] = []  # least recently used first
    hits = []
    for k in keys:
        hit = k in stack
        if hit:
            stack.remove(k)
        elif len(stack) == capacity:
            stack.pop(0)
        stack.append(k)
        hits.append(hit)
    return hits


def reference_fifo(keys: list[int], capacity: int) -> list[bool]:
    queue: list[int] = []
    hits = []
    for k in keys:
        hit = k in queue
        if not hit:
            if len(queue) == capacity:
                queue.pop(0)
            queue.append(k)
        hits.append(hit)
    return hits


def reference_clock(keys: list[int], capacity: int) -> list[bool]:
    # The queue form: evict from the front; a referenced block loses its bit and
    # goes to the back instead; new blocks join the back unreferenced.
    queue: list[list[int]] = []  # [key, referenced]
    hits = []
    for k in keys:
        entry = next((e for e in queue if e[0] == k), None)
        if entry is not None:
            entry[1] = 1
            hits.append(True)
            continue
        if len(queue) == capacity:
            while queue[0][1]:
                head = queue.pop(0)
                head[1] = 0
                queue.append(head)
            queue.pop(0)
        queue.append([k, 0])
        hits.append(False)
    return hits


REFERENCES: dict[str, Callable[[list[int], int], list[bool]]] = {
    "lru": reference_lru,
    "fifo": reference_fifo,
    "clock": reference_clock,
}

key_streams = st.lists(st.integers(min_value=0, max_value=40), max_size=300)


@pytest.fixture(params=sorted(POLICIES))
def policy(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_every_policy_has_a_reference_model(policy: str) -> None:
    assert policy in REFERENCES


@settings(max_examples=100, deadline=None)
@given(keys=key_streams, capacity=st.integers(min_value=1, max_value=12))
def test_policies_match_their_reference_access_by_access(keys: list[int], capacity: int) -> None:
    for name in sorted(POLICIES):
        cache = make_policy(name, capacity)
        assert [cache.access(k) for k in keys] == REFERENCES[name](keys, capacity), name


@settings(max_examples=100, deadline=None)
@given(
    keys=key_streams,
    reads=st.lists(st.booleans(), min_size=300, max_size=300),
    capacity=st.integers(min_value=1, max_value=12),
    split=st.integers(min_value=0, max_value=300),
)
def test_fast_replay_equals_access_by_access(
    keys: list[int], reads: list[bool], capacity: int, split: int
) -> None:
    reads = reads[: len(keys)]
    for name in sorted(POLICIES):
        expected = REFERENCES[name](keys, capacity)
        cache = make_policy(name, capacity)
        # Two replay calls in a row must continue where the first stopped.
        first = cache.replay(keys[:split], reads[:split])
        second = cache.replay(keys[split:], reads[split:])
        hits = first[0] + second[0]
        read_hits = first[1] + second[1]
        assert hits == sum(expected), name
        assert read_hits == sum(h for h, r in zip(expected, reads, strict=True) if r), name
        assert len(cache) <= capacity


def test_a_working_set_that_fits_always_hits_after_the_first_pass(policy: str) -> None:
    cache = make_policy(policy, 8)
    keys = list(range(8)) * 5
    hits, _ = cache.replay(keys, [True] * len(keys))
    assert hits == len(keys) - 8


def test_a_loop_one_larger_than_the_cache_never_hits_lru_fifo(policy: str) -> None:
    cache = make_policy(policy, 8)
    keys = list(range(9)) * 5
    hits, _ = cache.replay(keys, [True] * len(keys))
    if policy in ("lru", "fifo"):
        assert hits == 0  # the classic LRU/FIFO pathology
    assert len(cache.contents()) == 8


def test_bad_policy_and_size_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="lru"):
        make_policy("mru", 4)
    with pytest.raises(ConfigError, match='"size"'):
        make_policy("lru", 0)


# --- splitting requests into blocks ----------------------------------------------------


def test_requests_split_into_the_blocks_they_cover() -> None:
    records = [
        TraceRecord(0.0, 0, Op.READ, "a", 0, 8192),  # block 0
        TraceRecord(0.1, 0, Op.READ, "a", 4096, 8192),  # blocks 0, 1
        TraceRecord(0.2, 0, Op.WRITE, "b", 16384, 1),  # block 2 of b
        TraceRecord(0.3, 0, Op.GETATTR, "a"),  # metadata: counted only
        TraceRecord(0.4, 0, Op.READ, "a", 8192, 0),  # zero bytes: still its block
    ]
    acc = split_accesses(records, 8192)
    b = 1 << BLOCK_BITS
    assert acc.keys.tolist() == [0, 0, 1, b + 2, 1]
    assert acc.reads.tolist() == [True, True, True, False, True]
    assert (acc.requests, acc.read_requests, acc.write_requests) == (4, 3, 1)
    assert acc.metadata_requests == 1 and acc.files == 2


def test_replay_counts_reads_writes_and_ratios() -> None:
    records = [
        TraceRecord(0.0, 0, Op.WRITE, "f", 0, 4096),  # miss, now cached
        TraceRecord(0.1, 0, Op.READ, "f", 0, 4096),  # hit: writes allocate
        TraceRecord(0.2, 0, Op.READ, "f", 4096, 4096),  # miss
        TraceRecord(0.3, 0, Op.WRITE, "f", 4096, 10),  # hit
    ]
    r = replay(records, "lru", 2, 4096)
    assert (r.accesses, r.hits, r.misses) == (4, 2, 2)
    assert (r.read_accesses, r.read_hits, r.write_accesses, r.write_hits) == (2, 1, 2, 1)
    assert r.hit_ratio == 0.5 and r.read_hit_ratio == 0.5
    assert r.to_dict()["misses"] == 2


def test_block_size_must_be_positive() -> None:
    with pytest.raises(ConfigError, match='"block_size"'):
        split_accesses([], 0)
