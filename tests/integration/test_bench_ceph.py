"""``shuttle bench ceph``, small: each starts its own local Ceph and nodes, measures, and
reports every mode, or names the one it could not run. The filter experiment checks
that every site (the OSD's ``osdgrep`` through a node included) finds the same lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.bench.ceph_filter import FilterSettings, run_filter
from shuttle.bench.ceph_netrand import CephNetrandConfig, run_netrand
from shuttle.errors import ConfigError


def test_filter_runs_at_every_site_and_where_the_model_puts_it() -> None:
    settings = FilterSettings(
        size_bytes=512 << 10,
        link="bw=10Mbit,lat=0.5ms",
        runs=1,
        shaping="emulated",
        osds=1,
    )
    report = run_filter(settings, lambda _msg: None)
    # run_filter raises if any site finds other lines than the text holds.
    assert report["matching_lines"] > 0
    assert set(report["sites"]) == {"client", "node", "osd", "model"}
    # 512 KiB over 10 Mbit/s is 0.42 s at the client: the selective grep goes near the data.
    assert report["model_sites"][0] in ("node", "osd")
    assert report["model_plan"]["response_s"]["client"] > 0.4
    assert "osd" in report["model_plan"]["response_s"]  # a fixed string: the OSD is a site


def test_netrand_compares_the_nodes_with_librados() -> None:
    report = run_netrand(
        CephNetrandConfig(pages=20, rounds=1, file_bytes=1 << 20, osds=1), lambda _msg: None
    )
    assert {"file_node", "librados"} <= set(report["modes"])
    assert ("rados_node" in report["modes"]) != ("rados_node" in report["skipped"])
    assert report["modes"]["librados"]["samples"] == 20
    # Each node process's CPU over its timed passes (coarse: /proc's 10 ms ticks).
    assert {"file_node"} <= set(report["node_cpu_us_per_read"])
    assert all(v >= 0 for v in report["node_cpu_us_per_read"].values())
    if "rados_node" in report["modes"]:
        # How the RADOS node answered its timed reads: all warm, after its probation,
        # so all from its cache on its event loop, none confirmed with a stat.
        counters = report["rados_counters"]["rados_node"]
        assert counters["timed_reads"] == 20
        assert counters["inline_hits"] == 20
        assert counters["validations"] == 0
        assert counters["at_start"]["probation_s_left"] == 0
        assert report["target"]["fits_cache"] is True
        assert "met" in report["target"]
        # The fourth way: a client with Ceph credentials beside its own RADOS node. The
        # object fits the node's cache, which keeps what it reads: the node answers every
        # timed read from its cache, and names no object for the client to read.
        direct = report["rados_counters"]["rados_node_direct"]
        assert report["modes"]["rados_node_direct"]["samples"] == 20
        assert direct["inline_hits"] == 20 and direct["direct_answers"] == 0
        # All 60 reads answered by the node with bytes, asked with ``direct``.
        client = report["direct_client"]
        assert client["node_bytes"] == 60 and client["direct"] == 0, client
        assert "p50_over_librados" in report and "met" in report["target_direct"]


def test_netrand_refuses_a_compare_folder_without_shuttle(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no shuttle package there"):
        CephNetrandConfig(compare_src=str(tmp_path))


def test_the_stream_default_fits_one_rados_object() -> None:
    from shuttle.bench import ceph_cli
    from shuttle.store.rados import RADOS_OBJECT_BYTES_MAX

    assert ceph_cli.STREAM_BYTES_MAX == RADOS_OBJECT_BYTES_MAX
