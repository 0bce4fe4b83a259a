"""An in-memory node and clients of it (the faces' own code, without sockets)."""

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
    with MemoryNode.client([node]) as client:
        yield client
