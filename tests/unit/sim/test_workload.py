"""Traces as columns, the busiest intervals, and the cache-only warm-up."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import ConfigError
from shuttle.sim.blocks import BLOCK_BITS
from shuttle.sim.workload import (
    BLOCK_READ,
    BLOCK_WRITE,
    META_READ,
    META_WRITE,
    Columns,
    block_keys,
    busiest_intervals,
    warm_cache_contents,
)
from shuttle.traces.record import Op, TraceRecord


def test_operations_become_request_kinds_and_files_are_interned() -> None:
    columns = Columns.from_records(
        [
            TraceRecord(0.0, 1, Op.GETATTR, "x"),
            TraceRecord(0.1, 1, Op.CREATE, "y"),
            TraceRecord(0.2, 2, Op.READ, "x", 8192, 100),
            TraceRecord(0.3, 2, Op.WRITE, "z", 0, 20000),
        ]
    )
    assert columns.kind.tolist() == [META_READ, META_WRITE, BLOCK_READ, BLOCK_WRITE]
    assert columns.file.tolist() == [0, 1, 0, 2]
    assert columns.file_count == 3
    first, count = columns.block_range(8192)
    assert first.tolist() == [0, 0, 1, 0]
    assert count.tolist() == [1, 1, 1, 3]  # 20000 bytes round up to 3 blocks


def test_a_trace_out_of_time_order_is_refused() -> None:
    with pytest.raises(ConfigError, match="not in time order"):
        Columns.from_records([TraceRecord(1.0, 0, Op.READ, "a"), TraceRecord(0.5, 0, Op.READ, "a")])


def test_window_selects_by_time() -> None:
    columns = Columns.from_records(TraceRecord(float(t), 0, Op.READ, "a") for t in range(10))
    assert columns.window(2.0, 5.0).time_s.tolist() == [2.0, 3.0, 4.0]


def test_the_busiest_intervals_after_a_full_warm_up_are_chosen() -> None:
    # One request a second for 100 s, with bursts in windows 3 (of 10 s) and 7.
    times = [float(t) for t in range(100)]
    times += [35.0 + i / 100 for i in range(50)] + [75.0 + i / 100 for i in range(30)]
    times += [5.0 + i / 100 for i in range(90)]  # busiest of all, but too early to warm
    chosen = busiest_intervals(np.sort(np.asarray(times)), 10.0, 2, warmup_s=20.0)
    assert [(i.start_s, i.end_s, i.requests) for i in chosen] == [
        (30.0, 40.0, 60),
        (70.0, 80.0, 40),
    ]
    assert [i.index for i in chosen] == [0, 1]


def test_too_short_a_trace_says_how_long_it_must_be() -> None:
    with pytest.raises(ConfigError, match="needs at least 560 s"):
        busiest_intervals(np.arange(100.0), 10.0, 6, warmup_s=500.0)


def test_multi_block_requests_expand_to_every_block() -> None:
    columns = Columns.from_records(
        [TraceRecord(0.0, 0, Op.READ, "a", 8192, 3 * 8192), TraceRecord(1.0, 0, Op.LOOKUP, "a")]
    )
    assert block_keys(columns, 8192).tolist() == [1, 2, 3]
    assert block_keys(columns, 8192, file_base=5).tolist() == [
        (5 << BLOCK_BITS) + 1,
        (5 << BLOCK_BITS) + 2,
        (5 << BLOCK_BITS) + 3,
    ]


@settings(max_examples=60, deadline=None)
@given(
    accesses=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 3)), max_size=200),
    capacity=st.integers(1, 40),
)
def test_warm_up_equals_replaying_an_lru_of_any_size(
    accesses: list[tuple[int, int]], capacity: int
) -> None:
    """The LRU stack property: one pass gives every cache size's contents."""
    records = [
        TraceRecord(float(i), 0, Op.READ, "f", block * 8192, count * 8192)
        for i, (block, count) in enumerate(accesses)
    ]
    columns = Columns.from_records(records)
    lru: OrderedDict[int, None] = OrderedDict()
    for block, count in accesses:
        for key in range(block, block + count):
            lru.pop(key, None)
            lru[key] = None
            if len(lru) > capacity:
                lru.popitem(last=False)
    warm = warm_cache_contents(columns, 8192)
    assert warm.blocks_for(capacity) == list(lru)


def test_warm_up_fills_the_metadata_cache_with_every_file_seen() -> None:
    columns = Columns.from_records(
        [
            TraceRecord(0.0, 0, Op.LOOKUP, "a"),
            TraceRecord(1.0, 0, Op.READ, "b"),
            TraceRecord(2.0, 0, Op.SETATTR, "c"),
        ]
    )
    warm = warm_cache_contents(columns, 8192)
    assert warm.metadata_files.tolist() == [0, 2]
    assert warm.blocks_for(None) == [1 << BLOCK_BITS]
    assert warm.records == 3
