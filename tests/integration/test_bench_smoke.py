"""Short smoke runs of the storage benchmarks: they run end to end and write the report
their READMEs promise. Figures are measured by the benchmarks, never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.nodeproc import shuttle_cli


def test_netrand_smoke_writes_every_section(tmp_path: Path) -> None:
    out = tmp_path / "netrand.json"
    result = shuttle_cli(
        "bench",
        "netrand",
        "--rounds",
        "2",
        "--pages",
        "30",
        "--file-bytes",
        str(2 << 20),
        "--clients",
        "1,2",
        "--pass-seconds",
        "0.5",
        "--slices",
        "3",
        "--node-cache-bytes",
        str(4 << 20),  # the mixed_paged object: twice that, 8 MiB
        "--json-out",
        str(out),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    one, two = report["clients"]["1"], report["clients"]["2"]
    assert "mixed_warm" not in one  # the mixed pass needs two clients
    for rep, n in ((one, 1), (two, 2)):
        for section in ("remote_cold", "remote_warm", "redis"):
            figures = rep[section]
            assert 0 < figures["p50_us"] <= figures["p99_us"] and figures["pages_per_s"] > 0
        assert rep["remote_cold"]["requests"] == 30 * n  # each page once: cold
        # Timed: every client reads its pages over and over for half a second.
        for section in ("remote_warm", "redis"):
            assert rep[section]["requests"] > 30 * n and rep[section]["elapsed_s"] >= 0.5
        assert rep["pass_seconds"] == 0.5
        # Three pairs of slices (--slices), warm and Redis alternating: the ratio of
        # each pair, the pooled ratio and the pairs' median beside it.
        assert rep["slice_count"] == 3
        assert len(rep["slices"]) == 3 and all(x["throughput"] > 0 for x in rep["slices"])
        assert rep["remote_warm_over_redis"]["throughput"] > 0
        assert rep["remote_warm_over_redis"]["throughput_pair_median"] > 0
        # From the scheduler, per slice: how often the server and the clients ran.
        for pair in rep["slices"]:
            for side in ("warm_machine", "redis_machine"):
                assert pair[side]["server_runs_per_req"] > 0
                assert pair[side]["clients_runs_per_req"] > 0
                assert pair[side]["clients_wait_s"] >= 0 and pair[side]["server_wait_s"] >= 0
        assert {"remote_warm", "redis", "remote_warm_over_redis"} <= set(rep["spread"])
        for section in ("remote_warm", "redis"):  # where the CPU went, per request
            assert rep[section]["client_cpu_us_per_req"] > 0
            assert rep[section]["server_cpu_us_per_req"] > 0
        node = rep["node"]["remote_warm"]
        assert node["inline"] + node["pooled"] == rep["remote_warm"]["requests"]
    assert two["mixed_warm"]["requests"] == two["mixed_cold"]["requests"] == 30
    assert two["node"]["remote_cold"]["pooled"] > 0  # cold reads went to the thread pool
    # Half warm, half node-cache misses the page cache holds, timed and interleaved
    # with the warm slices: all on the event loop, and every missing read a miss.
    paged, node = two["mixed_paged"], two["node"]["mixed_paged"]
    assert paged["requests"] > 60 and paged["elapsed_s"] >= 0.5
    assert node["inline"] == paged["requests"] and node["pooled"] == 0
    assert node["cache_misses"] >= two["mixed_paged_cold"]["requests"] > 30
    assert len(two["mixed_paged_slices"]) == 3 and two["mixed_paged_over_warm"] > 0
    assert two["spread"]["mixed_paged_over_warm"]["max"] > 0
    assert two["mixed_over_warm"] > 0 and "mixed_paged" not in one
    assert report["remote_miss_over_remote_warm_p50"] > 0
    for section in ("local", "local_cold", "remote_cold", "remote_warm", "remote_miss", "redis"):
        figures = report[section]
        assert figures["samples"] == 60
        for name in ("p50_us", "p90_us", "p99_us", "max_us", "mean_us", "pages_per_s"):
            assert figures[name] > 0
        assert figures["p50_us"] <= figures["p90_us"] <= figures["p99_us"] <= figures["max_us"]
    assert report["remote_over_local_p50"] > 0 and report["remote_over_redis_p50"] > 0
    assert report["config"]["pages"] == 30 and report["paper"]["pages"] == 400


def test_stream_smoke_compares_with_raw_tcp(tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    result = shuttle_cli(
        "bench",
        "stream",
        "--bytes",
        str(16 << 20),
        "--repeat",
        "1",
        "--json-out",
        str(out),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    assert report["raw_tcp"]["mib_per_s"] > 0 and report["shuttle"]["mib_per_s"] > 0
    assert report["shuttle"]["requests"] >= 16  # streamed as 1 MiB range requests
    assert report["shuttle_over_raw_throughput"] > 0
    cpu = report["shuttle"]["cpu_s_per_gib"]  # the client's and the node's, per GiB
    assert cpu["client"] > 0 and cpu["node"] is not None and cpu["node"] >= 0


def test_hostile_smoke_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    result = shuttle_cli(
        "bench",
        "hostile",
        "--stalled",
        "4",
        "--non-readers",
        "1",
        "--idle",
        "50",
        "--json-out",
        str(out),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    for name in ("stalled_frames_mib", "stalled_and_non_readers_mib", "idle_connections_mib"):
        assert isinstance(report[name], float)
    assert report["put_quiet_s"] > 0 and report["put_ratio_to_quiet"] > 0
    assert report["put_with_idle"] == "ok" and report["connections_refused"] == 0


def test_netrand_rejects_a_bad_generator() -> None:
    result = shuttle_cli("bench", "netrand", "--generator", "dice", "--no-redis")
    assert result.returncode == 2 and b"--generator must be one of lcg, seeded" in result.stderr


def test_netrand_rejects_a_bad_client_count() -> None:
    result = shuttle_cli("bench", "netrand", "--clients", "1,many", "--no-redis")
    assert result.returncode == 2 and b"'many' is not a number" in result.stderr


def test_netrand_rejects_a_negative_pass_length() -> None:
    result = shuttle_cli("bench", "netrand", "--clients", "8", "--pass-seconds", "-1")
    assert result.returncode == 2 and b"--pass-seconds must be in 0..150" in result.stderr


def test_netrand_rejects_a_repeat_out_of_range_and_an_odd_block() -> None:
    result = shuttle_cli("bench", "netrand", "--clients", "8", "--repeat", "0")
    assert result.returncode == 2 and b"--repeat must be in 1..10, got 0" in result.stderr
    result = shuttle_cli("bench", "netrand", "--node-cache-block-bytes", "1000")
    assert result.returncode == 2
    assert b"--node-cache-block-bytes must be a power of two of at least 512" in result.stderr


def test_abacus_filter_smoke_runs_all_placements_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "filter.json"
    result = shuttle_cli(
        "bench",
        "abacus",
        "filter",
        "--size",
        str(1 << 20),
        "--runs",
        "1",
        "--cases",
        "1,3",
        "--no-monitor-overhead",
        "--json-out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    assert [c["case"] for c in report["cases"]] == ["1", "3"]
    for case in report["cases"]:
        assert set(case["placements"]) == {"client", "adaptive", "server"}
        assert all(p["mean_s"] > 0 for p in case["placements"].values())
    assert report["cases"][1]["server_cpu_factor"] == 0.5
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_abacus_competition_smoke(tmp_path: Path) -> None:
    out = tmp_path / "competition.json"
    result = shuttle_cli(
        "bench",
        "abacus",
        "competition",
        "--size",
        str(2 << 20),
        "--runs",
        "1",
        "--delay",
        "0.3",
        "--json-out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    run = report["runs"]["adaptive"][0]
    assert set(run["filters"]) == {"1", "2"}
    assert all(f["blocks"] == 32 for f in run["filters"].values())  # 2 MiB in 64 KiB blocks
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_abacus_mix_smoke(tmp_path: Path) -> None:
    """Two client processes, a pass of 2 s per placement: the command runs all four
    placements (the oracle split among them) and writes the figures, the placement per
    kind and the decisions."""
    out = tmp_path / "mix.json"
    result = shuttle_cli(
        "bench",
        "abacus",
        "mix",
        "--clients",
        "2",
        "--cheap-share",
        "0.5",
        "--runs",
        "1",
        "--duration",
        "2",
        "--warmup",
        "0.5",
        "--object-bytes",
        str(1 << 20),
        "--partial",
        "1",
        "--arrivals-max",
        "3",
        "--json-out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    # The flag reaches the settings, and the nodes started with it (shuttle serve
    # refuses a flag it does not know, so the run itself checks --arrivals-max there).
    assert report["settings"]["arrivals_max"] == 3
    placements = ("client", "server", "split", "split-1", "adaptive")
    assert tuple(report["throughput"]) == placements
    assert all(report["throughput"][p] > 0 for p in placements)
    for placement, cheap, heavy in (
        ("client", 0, 0),
        ("server", 2, 2),
        ("split", 2, 0),
        ("split-1", 1, 0),
    ):
        (one,) = report["passes"][placement]
        assert one["at_server"] == {"cheap": cheap, "heavy": heavy}
        assert sum(one["total_calls"].values()) > 0
        # Per second of the pass: the filters at the node (a static placement holds
        # them there throughout) and the node's CPU busy over it.
        assert one["timeline_at_server"] == {"cheap": [cheap] * 2, "heavy": [heavy] * 2}
        assert len(one["timeline_node_cpu_busy"]) == 2
        assert all(x >= 0 for x in one["timeline_node_cpu_busy"])
        # The node and the clients (with the benchmark process) each kept to their own
        # CPU while the pass ran, read back from /proc; and what each CPU did.
        if len(os.sched_getaffinity(0)) > 1:
            part = one["partition"]
            assert part["mode"] == "partitioned" and part["held"], part
            assert part["node"]["cpus"] != part["clients"]["cpus"]
            assert part["node"]["threads"] > 1 and part["clients"]["processes"] == 3
        assert set(one["cpu_busy"]) >= {"cpu0"} and one["clients_cpu_busy"] > 0
    assert (
        report["adaptive_over_split"] > 0 and len(report["split_over_better_static_per_run"]) == 1
    )
    final = report["final_placement"]
    assert all(final[k]["server"] + final[k]["client"] == 2 for k in ("cheap", "heavy"))
    assert set(report["passes"]["adaptive"][0]["decisions"]) >= {
        "evaluations",
        "moves_made",
        "queue_s_per_call",
        "arrivals_held_back",
    }
    assert report["adaptive_over_better_static"] > 0
    # The ceiling: the best split of the run, against the better static and adaptive.
    ceiling = report["ceiling"]
    assert ceiling["placement_per_run"][0] in ("split", "split-1")
    assert ceiling["calls_per_s_per_run"][0] == max(
        report["throughput"]["split"], report["throughput"]["split-1"]
    )
    assert ceiling["adaptive_over_ceiling_per_run"][0] > 0


def test_abacus_mix_refuses_a_share_that_is_not_a_fraction() -> None:
    result = shuttle_cli("bench", "abacus", "mix", "--cheap-share", "1.5", timeout=60)
    assert result.returncode != 0
    assert "--cheap-share is the fraction of calls that are cheap" in result.stderr.decode()


def test_abacus_swing_smoke(tmp_path: Path) -> None:
    out = tmp_path / "swing.json"
    result = shuttle_cli(
        "bench",
        "abacus",
        "swing",
        "--size",
        str(1 << 20),
        "--runs",
        "1",
        "--period",
        "0.5",
        "--json-out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    assert report["runs"]["adaptive"][0]["switches"]  # the load was switched
    low, high = report["cpu_ratio_band"]
    assert low < report["cpu_ratio"] < high


def test_abacus_cache_and_phases_smoke(tmp_path: Path) -> None:
    out = tmp_path / "cache.json"
    result = shuttle_cli(
        "bench",
        "abacus",
        "cache",
        "--links",
        "lan",
        "--runs",
        "1",
        "--records",
        "60",
        "--json-out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    assert [w["workload"] for w in report["workloads"]] == ["insert", "scan"]
    assert set(report["workloads"][0]["links"][0]["placements"]) == {
        "client",
        "adaptive",
        "server",
    }
    assert out.with_suffix(".png").stat().st_size > 0
    out = tmp_path / "phases.json"
    result = shuttle_cli(
        "bench",
        "abacus",
        "phases",
        "--runs",
        "1",
        "--records",
        "60",
        "--sequence",
        "insert,scan",
        "--json-out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr.decode()
    link = json.loads(out.read_text())["links"][0]
    assert link["phases"] == ["insert", "scan"] and len(link["per_phase"]["server"]) == 2
    assert "optimal" in result.stdout.decode()


def test_abacus_raid_and_directory_smoke(tmp_path: Path) -> None:
    out = tmp_path / "raid.json"
    result = shuttle_cli(
        "bench",
        "abacus",
        "raid",
        "--links",
        "san",
        "--runs",
        "1",
        "--file-bytes",
        str(256 << 10),
        "--json-out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr.decode()
    cases = json.loads(out.read_text())["cases"]
    assert [c["workload"] for c in cases] == ["write", "degraded-read"]
    assert all(c["placements"]["server"]["mean_s"] > 0 for c in cases)
    out = tmp_path / "directory.json"
    result = shuttle_cli(
        "bench",
        "abacus",
        "directory",
        "--links",
        "lan",
        "--runs",
        "1",
        "--files",
        "15",
        "--json-out",
        str(out),
        timeout=240,
    )
    assert result.returncode == 0, result.stderr.decode()
    cases = json.loads(out.read_text())["cases"]
    assert [c["contention"] for c in cases] == ["high", "low"]
    assert cases[0]["retries"]["server"] == 0  # the node serialises the clients
    assert out.with_suffix(".png").stat().st_size > 0


def test_roundtrip_floor_smoke_measures_all_four_exchanges(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    script = Path(__file__).parents[2] / "benchmarks" / "roundtrip_floor.py"
    result = subprocess.run(
        [sys.executable, str(script), "--requests", "200", "--rounds", "1", "--json", str(out)],
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(out.read_text())
    for name in ("floor", "raw_to_node", "client_to_node", "redis"):
        figures = report["median"][name]
        assert 0 < figures["p50_us"] <= figures["p90_us"]
        assert report["p50_over_redis"][name] > 0
