"""The run-time settings a node's configuration hands to its placement."""

from __future__ import annotations

from pathlib import Path

from shuttle.node.config import NodeConfig


def test_the_nodes_cpu_budget_reaches_its_placement(tmp_path: Path) -> None:
    placed = NodeConfig(data_dir=tmp_path, cpu_budget=0.85).runtime_config().placement()
    assert placed.server_cpu_share_max == 0.85
    assert NodeConfig(data_dir=tmp_path).runtime_config().placement().server_cpu_share_max == 0.7
