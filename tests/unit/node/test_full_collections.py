"""``shuttle serve --scheduled-gc``: the node's full collections on their own thread,
none where an allocation tips the threshold (inside a call: burned on a slow node)."""

from __future__ import annotations

import gc
import threading
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


def _allocate_cycles(n: int) -> None:
    for _ in range(n):
        a: list[Any] = []
        a.append(a)  # garbage only a collection frees


def test_full_collections_run_on_their_thread_only(full_collections: list[int]) -> None:
    before = gc.get_threshold()
    fc = FullCollections(0.2).start()
    try:
        assert gc.get_threshold()[2] == FULL_THRESHOLD_OFF
        # Enough young collections that the interpreter's own threshold (10 young
        # ones a full one, at most) would have made several full collections.
        _allocate_cycles(200_000)
        mine = threading.get_ident()
        assert mine not in full_collections
        done = threading.Event()
        while fc.collections < 1:
            done.wait(0.05)
        assert full_collections and all(t == fc._thread.ident for t in full_collections)
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
    with pytest.raises(ConfigError, match="--scheduled-gc"):
        NodeConfig(data_dir=tmp_path, scheduled_gc_s=-1.0)
