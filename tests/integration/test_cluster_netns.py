"""``cluster up --netns``: nodes in network namespaces behind kernel-shaped veth links."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import shuttle
from shuttle.cluster import local
from shuttle.cluster.clusterfile import ClusterFile
from shuttle.net.netns import list_namespaces, netns_unavailable_reason
from shuttle.net.profiles import parse_link_profile

pytestmark = pytest.mark.skipif(
    netns_unavailable_reason() is not None,
    reason=f"network namespaces unavailable: {netns_unavailable_reason()}",
)


def test_netns_cluster_shapes_in_the_kernel_and_cleans_up(tmp_path: Path) -> None:
    profile = "bw=20Mbit,lat=1ms"
    cluster = local.up(tmp_path, nodes=2, netns_profile=profile)
    assert cluster.netns_tag is not None
    tag = cluster.netns_tag
    try:
        assert all(n.netns and n.host.startswith("198.18.") for n in cluster.nodes)
        assert cluster.path is not None
        body = b"n" * 500_000
        with shuttle.connect(cluster=cluster.path) as client:
            client.put("shaped", body)
            start = time.perf_counter()
            assert client.get("shaped") == body
            elapsed = time.perf_counter() - start
        # 4 Mbit at 20 Mb/s is 0.2 s of serialisation, enforced by tc tbf.
        assert elapsed >= parse_link_profile(profile).transfer_time_s(len(body)) * 0.9
        # Down removes the namespaces; up builds a new lab and the data is served again.
        local.down(ClusterFile.load(cluster.path))
        assert not [ns for ns in list_namespaces() if ns.startswith(tag)]
        cluster = local.up(tmp_path)
        assert cluster.netns_tag not in (None, tag)
        with shuttle.connect(cluster=cluster.path) as client:
            assert client.get("shaped") == body
    finally:
        final = local.down(ClusterFile.load(tmp_path / "cluster.toml"))
    assert final.netns_tag is None
    assert not [
        ns
        for ns in list_namespaces()
        if ns.startswith("shuttle-keep-")
        and any(ns.startswith(t) for t in (tag, cluster.netns_tag or tag))
    ]
