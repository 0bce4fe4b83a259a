"""``shuttle serve --scheduled-gc``: the node's full collections on their own thread,
none where an allocation tips the threshold (inside a call: burned on a slow node)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from shuttle.errors import ConfigError
from shuttle.node.config import SCHEDULED_GC_S_SLOW, NodeConfig
from shuttle.node.full_collections import FULL_THRESHOLD_OFF, FullCollections


@pytest.fixture
def full_collections() -> Iterator[list[int]]:
    """The threads of every full collection while the test runs."""
    seen: list[int] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info.get("generation") == 2:
            seen.append(threading.get_ident())

    gc.callbacks.append(on_gc)
    try:
        yield seen
    finally:
        gc.callbacks.remove(on_gc)


def _allocate_survivors(n: int) -> list[list[Any]]:
    """``n`` objects that live on: they reach the oldest generation, so the interpreter's
    own thresholds make a full collection along the way (garbage cycles would not: young
    collections free them first)."""
    return [[] for _ in range(n)]


def test_full_collections_run_on_their_thread_only(full_collections: list[int]) -> None:
    before = gc.get_threshold()
    mine = threading.get_ident()
    # The control: with the interpreter's own (default) thresholds the same allocations
    # make a full collection on this thread.
    gc.set_threshold(700, 10, 10)
    try:
        kept = _allocate_survivors(300_000)
    finally:
        gc.set_threshold(*before)
    assert mine in full_collections, "the allocations should tip a full collection"
    del kept
    full_collections.clear()
    fc = FullCollections(0.2).start()
    try:
        assert gc.get_threshold()[2] == FULL_THRESHOLD_OFF
        kept = _allocate_survivors(300_000)
        assert mine not in full_collections
        done = threading.Event()
        deadline = time.monotonic() + 30
        while fc.collections < 1 and time.monotonic() < deadline:
            done.wait(0.05)
        assert fc.collections >= 1, "the thread made no full collection in 30 s"
        assert full_collections and all(t == fc._thread.ident for t in full_collections)
        del kept
    finally:
        fc.stop()
    assert gc.get_threshold() == before


def test_an_interval_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        FullCollections(0)


def test_a_slow_node_schedules_its_full_collections_by_default(tmp_path: Path) -> None:
    slow = NodeConfig(data_dir=tmp_path, cpu_factor=0.05)
    assert slow.full_collections_s() == SCHEDULED_GC_S_SLOW
    assert NodeConfig(data_dir=tmp_path).full_collections_s() is None  # full speed
    assert replace(slow, scheduled_gc_s=0.0).full_collections_s() is None
    assert NodeConfig(data_dir=tmp_path, scheduled_gc_s=3.0).full_collections_s() == 3.0
    for bad in (-1.0, float("inf"), float("nan")):  # inf: no full collection ever
        with pytest.raises(ConfigError, match="--scheduled-gc"):
            NodeConfig(data_dir=tmp_path, scheduled_gc_s=bad)
