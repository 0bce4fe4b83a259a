from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import shuttle
from tests.integration.nodeproc import NodeProcess


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    """One real storage node on 127.0.0.1, stopped (SIGTERM) after the test."""
    proc = NodeProcess(tmp_path / "node").start()
    yield proc
    status = proc.terminate()
    assert status in (0, None, -9), (
        f"node exited with {status}; log:\n{proc.log.read_text()[-3000:]}"
    )


@pytest.fixture
def client(node: NodeProcess) -> Iterator[shuttle.Client]:
    c = shuttle.connect(node=node.address, request_timeout_s=30)
    yield c
    c.close()
