"""The node's storage handlers, called directly (no sockets): argument checking and
the paging of long chunk lists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shuttle.errors import InvalidArgumentError, UnknownOperationError
from shuttle.net.registry import Mode, OperationRegistry, Reply
from shuttle.node import handlers
from shuttle.store import ObjectStore


@pytest.fixture
def registry(tmp_path: Path) -> OperationRegistry:
    reg = OperationRegistry()
    handlers.register_storage_ops(reg, ObjectStore(tmp_path / "data"))
    return reg


def call(reg: OperationRegistry, op: str, args: dict[str, object], payload: bytes = b"") -> object:
    out = reg.get(op).handler(args, payload)
    assert not isinstance(out, Reply) or op == "read"
    return out


def test_long_chunk_lists_are_paged(
    registry: OperationRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handlers, "STAT_CHUNKS_MAX", 5)
    call(registry, "put", {"key": "big"}, os.urandom(3 << 20))
    attrs = call(registry, "stat", {"key": "big"})
    assert isinstance(attrs, dict)
    total = attrs["chunks_total"]
    assert total > 5 and len(attrs["chunks"]) == 5
    collected, start = [], 0
    while start is not None:
        page = call(registry, "chunks", {"key": "big", "start": start})
        assert isinstance(page, dict)
        collected += page["chunks"]
        start = page["next"]
    assert len(collected) == total
    assert sum(length for _, length, _ in collected) == 3 << 20
    assert collected[:5] == attrs["chunks"]


def test_arguments_are_checked_by_name(registry: OperationRegistry) -> None:
    with pytest.raises(InvalidArgumentError, match="'key'"):
        call(registry, "stat", {})
    with pytest.raises(InvalidArgumentError, match="length"):
        call(registry, "read", {"key": "a", "length": -1})
    with pytest.raises(InvalidArgumentError, match="expected_version"):
        call(registry, "remove", {"key": "a", "expected_version": "new"})
    with pytest.raises(InvalidArgumentError, match="keys"):
        call(registry, "stat_many", {"keys": ["a", 3]})
    with pytest.raises(UnknownOperationError, match=r"serves: cache\.drop, chunks"):
        registry.get("nope")


def test_small_reads_and_cached_stats_run_inline(registry: OperationRegistry) -> None:
    call(registry, "put", {"key": "k"}, b"x" * 10)
    read, stat = registry.get("read"), registry.get("stat")
    assert read.mode is Mode.THREAD and stat.mode is Mode.THREAD
    assert read.inline_when is not None and read.inline_when({"length": 4096})
    assert not read.inline_when({"length": 1 << 20})
    assert stat.inline_when is not None and stat.inline_when({"key": "k"})
    assert not stat.inline_when({"key": "../bad"})
