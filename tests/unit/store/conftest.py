from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.store import ObjectStore, StoreConfig


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(root: Path) -> Iterator[ObjectStore]:
    s = ObjectStore(root, StoreConfig(cache_capacity_bytes=1 << 20, cache_block_size_bytes=4096))
    try:
        yield s
    finally:
        s.close()
