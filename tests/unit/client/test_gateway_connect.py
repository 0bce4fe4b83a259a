"""``shuttle.connect`` gives a failing-over client to a cluster of gateways (nodes that
all serve one shared store) and a plain one otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.client.connect import connect
from shuttle.client.gateways import GatewayClient
from shuttle.cluster.clusterfile import ClusterFile, NodeEntry


def _cluster(tmp_path: Path, *node_args: tuple[str, ...]) -> Path:
    nodes = tuple(
        NodeEntry(f"n{i}", "127.0.0.1", 7401 + i, tmp_path / f"n{i}", args=args)
        for i, args in enumerate(node_args)
    )
    path = tmp_path / "cluster.toml"
    ClusterFile("local", tmp_path, nodes, {"default": "loopback"}, path).save()
    return path


@pytest.mark.parametrize(
    ("args", "gateway"),
    [
        ((("--store", "rados:shuttle"), ("--window", "1", "--store", "rados:shuttle")), True),
        ((("--store=rados:p/ns",), ("--store=rados:p/ns",)), True),
        (((), ()), False),
        ((("--store", "local"), ("--store", "local")), False),
        ((("--store", "rados:a"), ("--store", "rados:b")), False),  # two stores
        ((("--store", "rados:a"), ()), False),
    ],
)
def test_gateway_clusters_get_a_gateway_client(
    tmp_path: Path, args: tuple[tuple[str, ...], ...], gateway: bool
) -> None:
    with connect(cluster=_cluster(tmp_path, *args), lookaside=()) as client:
        assert isinstance(client, GatewayClient) == gateway
