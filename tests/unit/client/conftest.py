"""An in-memory node and a client of it: the client's own code, without sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.client import Client
from shuttle.testing import MemoryNode


@pytest.fixture
def node(tmp_path: Path) -> Iterator[MemoryNode]:
    with MemoryNode(tmp_path / "node") as node:
        yield node


@pytest.fixture
def client(node: MemoryNode) -> Iterator[Client]:
    """A client with a small cache of 1 KiB blocks, and 4 KiB pieces when streaming."""
    with MemoryNode.client(
        [node], cache_bytes=8 << 10, cache_block_bytes=1 << 10, piece_bytes=4 << 10
    ) as client:
        yield client
