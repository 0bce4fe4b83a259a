"""``bench netrand --clients``: the plan of its passes and what it makes of their samples.

The end-to-end run (real node, Redis, forked clients) is the smoke test in
tests/integration/test_bench_smoke.py; here, the parts that decide what is measured.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from shuttle.bench import netrand_machine
from shuttle.bench.netrand_clients import (
    PAGED_CACHES,
    SLICES_DEFAULT,
    WARM_UP,
    hot_pages,
    miss_cycle,
    paged_object_bytes,
    pass_sequence,
)
from shuttle.bench.netrand_reruns import rerun_spread
from shuttle.bench.netrand_summary import spread, summaries
from shuttle.bench.placement import cpu_ticks, cpu_time_s, cpu_use, sched_use
from shuttle.blockcache import BlockCache
from shuttle.errors import ConfigError

BLOCK = 4096
PAGE = 512


def test_the_timed_passes_alternate_in_slices_after_the_untimed_ones() -> None:
    assert pass_sequence(3.0) == [
        "remote_cold",
        WARM_UP,
        "mixed",
        *["remote_warm", "redis", "mixed_paged"] * SLICES_DEFAULT,
    ]
    # --slices: as many trios; 0 s: every pass once, reading its list once.
    assert pass_sequence(3.0, 6)[3:] == ["remote_warm", "redis", "mixed_paged"] * 6
    once = ["remote_cold", WARM_UP, "mixed", "remote_warm", "redis", "mixed_paged"]
    assert pass_sequence(0) == once
    assert pass_sequence(0, 12) == once


def test_a_slice_count_out_of_range_is_refused_with_the_range() -> None:
    from shuttle.bench.netrand import NetrandConfig

    with pytest.raises(ConfigError, match=r"--slices must be in 1\.\.64"):
        NetrandConfig(clients=(8,), slices=0)
    assert NetrandConfig(clients=(8,), slices=12).slices == 12


def test_missing_readers_share_the_paged_objects_blocks_one_page_each() -> None:
    size = paged_object_bytes(64 * BLOCK, BLOCK)
    assert size == PAGED_CACHES * 64 * BLOCK
    cycles = [miss_cycle(r, 3, size, BLOCK, PAGE, seed=r) for r in range(3)]
    per_block = BLOCK // PAGE
    blocks = [[p // per_block for p in cycle] for cycle in cycles]
    # Every block of the object once, in one reader's cycle only, in order.
    assert sorted(b for bs in blocks for b in bs) == list(range(size // BLOCK))
    assert all(bs == sorted(bs) and len(set(bs)) == len(bs) for bs in blocks)
    assert all(0 <= p < size // PAGE for cycle in cycles for p in cycle)


def test_more_missing_readers_than_blocks_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match="use fewer --clients"):
        miss_cycle(0, 9, 8 * BLOCK, BLOCK, PAGE, seed=1)


def test_the_hot_region_is_a_sixteenth_of_the_cache_or_half_the_file() -> None:
    assert hot_pages(file_pages=32768, cache_bytes=64 << 20, page_bytes=4096) == 1024
    assert hot_pages(file_pages=512, cache_bytes=64 << 20, page_bytes=4096) == 256
    assert hot_pages(file_pages=512, cache_bytes=0, page_bytes=4096) == 1


@pytest.mark.parametrize("fast", [1, 2])
def test_under_lru_every_missing_read_misses_and_every_warm_read_hits(fast: int) -> None:
    """The pass as the node's block cache sees it: warm readers picking pages of the hot
    region at random, and four missing readers cycling over the paged object, one of
    them ``fast`` times as quick as the others, as many reads as the warm ones make.
    Every missing read must miss however long it runs (the cycle comes round only
    after twice the cache), and the hot region must stay cached."""
    capacity_blocks = 256
    cache = BlockCache(capacity_bytes=capacity_blocks * BLOCK, block_size_bytes=BLOCK)
    size = paged_object_bytes(capacity_blocks * BLOCK, BLOCK)
    hot = hot_pages(file_pages=1 << 20, cache_bytes=capacity_blocks * BLOCK, page_bytes=PAGE)
    readers = 4
    cycles = [miss_cycle(r, readers, size, BLOCK, PAGE, seed=r) for r in range(readers)]
    positions = [0] * readers
    rng = random.Random(7)

    def fetch(start: int, stop: int) -> bytes:
        return bytes(stop - start)

    for p in range(hot):  # the warm-up pass
        cache.read("hot", p * PAGE, PAGE, 1 << 40, fetch)
    before = cache.stats()
    steps = 3000
    missing_reads = 0
    for _ in range(steps):
        for _ in range(readers):
            cache.read("hot", rng.randrange(hot) * PAGE, PAGE, 1 << 40, fetch)
        for r in range(readers):
            for _ in range(fast if r == 0 else 1):
                cycle = cycles[r]
                cache.read("paged", cycle[positions[r] % len(cycle)] * PAGE, PAGE, size, fetch)
                positions[r] += 1
                missing_reads += 1
    after = cache.stats()
    assert after.misses - before.misses == missing_reads
    assert after.hits - before.hits == steps * readers


def _slice(
    pages_per_s: float, p99_us: int, clients: int = 2
) -> tuple[list[int], float, float, float]:
    """One client's samples of a 1-second slice: ``pages_per_s / clients`` requests,
    and 0.1 s of its CPU."""
    n = int(pages_per_s / clients)
    return ([1000] * (n - 1) + [p99_us * 1000], 0.0, 1.0, 0.1)


def test_slices_give_their_ratios_and_the_spread_of_each_pass() -> None:
    warm = [2000.0, 1000.0]
    redis = [1000.0, 1000.0]
    paged = [1600.0, 900.0]
    outputs = [
        {
            "remote_warm": [_slice(w, 50) for w in warm],
            "redis": [_slice(r, 50) for r in redis],
            "mixed_paged_warm" if c == 0 else "mixed_paged_cold": [_slice(m, 50) for m in paged],
        }
        for c in range(2)
    ]
    report: dict[str, object] = {}
    summaries(report, outputs)
    assert [round(x["throughput"], 2) for x in report["slices"]] == [2.0, 1.0]  # type: ignore[index]
    assert [round(x["throughput"], 2) for x in report["mixed_paged_slices"]] == [0.8, 0.9]  # type: ignore[index]
    spreads = report["spread"]
    assert spreads["redis"]["range_pct"] == 0.0  # type: ignore[index]
    assert round(spreads["remote_warm"]["range_pct"]) == 67  # type: ignore[index]
    assert round(spreads["mixed_paged_over_warm"]["median"], 2) == 0.85  # type: ignore[index]
    # Each client used 0.1 s of CPU a slice: 0.4 s for 3,000 warm requests.
    assert round(report["remote_warm"]["client_cpu_us_per_req"], 1) == 133.3  # type: ignore[index]
    # Pooled: 3,000 warm and 2,500 mixed requests over 2 s each.
    assert round(report["mixed_paged_over_warm"], 3) == round(2500 / 3000, 3)  # type: ignore[arg-type]


def test_the_pair_median_stands_beside_the_pooled_ratio_and_ignores_one_slow_slice() -> None:
    """Four slice pairs at 1.1 and one whose warm slice ran at half speed: the pooled
    ratio (the headline, unchanged) falls by that slice's share, the median of the
    pairs' ratios stays 1.1; both go into the reruns' figures."""
    warm = [1100.0, 1100.0, 1100.0, 1100.0, 550.0]
    outputs = [
        {"remote_warm": [_slice(w, 50) for w in warm], "redis": [_slice(1000.0, 50)] * 5}
        for _ in range(2)
    ]
    report: dict[str, Any] = {}
    summaries(report, outputs)
    ratio = report["remote_warm_over_redis"]
    assert ratio["throughput"] == pytest.approx(4950 / 5000, rel=1e-3)
    assert ratio["throughput_pair_median"] == pytest.approx(1.1, rel=1e-3)
    again = rerun_spread([report, report])["figures"]
    assert again["remote_warm_over_redis_pair_median"] == [ratio["throughput_pair_median"]] * 2
    assert again["remote_warm_over_redis_throughput"] == [ratio["throughput"]] * 2


def test_each_slice_pair_says_which_side_moved_and_what_the_machine_did() -> None:
    """Each slice pair carries both servers' throughput, and per slice what the CPUs
    did, the server's and the clients' CPU, and what else was busy (``others_s``)."""
    outputs = [
        {
            "remote_warm": [_slice(w, 50) for w in (2000.0, 1000.0)],
            "redis": [_slice(1000.0, 50)] * 2,
        }
        for _ in range(2)
    ]
    report: dict[str, Any] = {}
    summaries(report, outputs)

    def cpus(busy: float, idle: float) -> dict[str, dict[str, float]]:
        # cpu0 is another session's: not the benchmark's CPU, so not in others_s.
        return {
            "cpu0": {"busy_s": 3.0, "irq_s": 0.0, "idle_s": 0.0, "steal_s": 0.0},
            "cpu1": {"busy_s": busy, "irq_s": 0.1, "idle_s": idle, "steal_s": 0.0},
        }

    machine = {
        # The second warm slice ran beside 0.5 s of something else: that is what moved.
        "remote_warm": [
            {"cpus": cpus(0.9, 0.0), "server_cpu_s": 0.5},
            {"cpus": cpus(1.4, 0.0), "server_cpu_s": 0.5},
        ],
        "redis": [
            {"cpus": cpus(0.8, 0.1), "server_cpu_s": 0.4},
            {"cpus": cpus(0.8, 0.1), "server_cpu_s": None},
        ],
    }
    netrand_machine.attach(report, machine, outputs, ["cpu1"])
    first, second = report["slices"]
    assert (first["warm_pages_per_s"], second["warm_pages_per_s"]) == (2000.0, 1000.0)
    assert first["redis_pages_per_s"] == second["redis_pages_per_s"] == 1000.0
    assert first["warm_requests"] == 2000 and second["warm_requests"] == 1000
    # Two clients at 0.1 s of CPU each a slice.
    assert round(first["warm_machine"]["others_s"], 6) == round(0.9 - 0.2 - 0.5, 6)
    assert round(second["warm_machine"]["others_s"], 6) == round(1.4 - 0.2 - 0.5, 6)
    assert round(second["warm_machine"]["server_cpu_us_per_req"]) == 500
    assert second["warm_machine"]["cpus"]["cpu1"]["irq_s"] == 0.1
    assert "others_s" not in second["redis_machine"]  # Redis's CPU unknown there
    assert first["redis_machine"]["clients_cpu_s"] == 0.2
    assert "server_runs_per_req" not in first["warm_machine"]  # no scheduler figures given


def test_each_slice_says_how_often_the_scheduler_ran_its_server_and_clients() -> None:
    """From the scheduler: a warm slice whose node was put on the CPU once per request
    and one where it found ten requests each time; the clients' waits and runs."""

    def sample(runs: int) -> tuple[list[int], float, float, float, float, int]:
        return ([1000] * 1000, 0.0, 1.0, 0.1, 0.25, runs)  # 1,000 requests a client

    outputs = [{"remote_warm": [sample(1000), sample(100)], "redis": [sample(500)] * 2}] * 2
    report: dict[str, Any] = {}
    summaries(report, outputs)
    cpus = {"cpu1": {"busy_s": 1.0, "irq_s": 0.0, "idle_s": 0.0, "steal_s": 0.0}}
    machine = {
        "remote_warm": [
            {"cpus": cpus, "server_cpu_s": 0.4, "server_wait_s": 0.1, "server_runs": 2000},
            {"cpus": cpus, "server_cpu_s": 0.3, "server_wait_s": 0.2, "server_runs": 200},
        ],
        "redis": [{"cpus": cpus, "server_cpu_s": None, "server_wait_s": None, "server_runs": None}]
        * 2,
    }
    netrand_machine.attach(report, machine, outputs, ["cpu1"])
    first, second = (pair["warm_machine"] for pair in report["slices"])
    assert first["server_runs_per_req"] == 1.0 and second["server_runs_per_req"] == 0.1
    assert second["server_wait_s"] == 0.2
    assert first["clients_runs_per_req"] == 1.0 and second["clients_runs_per_req"] == 0.1
    assert first["clients_wait_s"] == 0.5
    assert "server_runs_per_req" not in report["slices"][0]["redis_machine"]
    assert report["slices"][0]["redis_machine"]["clients_runs_per_req"] == 0.5


def test_sched_use_reads_this_process_and_a_server_by_pid() -> None:
    mine, by_pid = sched_use(), sched_use(os.getpid())
    assert mine[0] > 0 and mine[2] > 0 and mine[1] >= 0
    # The main thread's figures are part of every thread's, read just after.
    assert by_pid[0] >= mine[0] and by_pid[2] >= mine[2]
    assert cpu_time_s(os.getpid()) >= by_pid[0]


def test_cpu_use_reads_what_each_cpu_did_in_seconds() -> None:
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    before = {"cpu0": [10, 0, 5, 100, 1, 0, 2, 0], "cpu1": [0] * 8}
    after = {"cpu0": [30, 1, 9, 150, 2, 1, 4, 3], "cpu1": [0] * 8}
    use = cpu_use(before, after)
    assert use["cpu0"] == pytest.approx(
        {"busy_s": 25 * tick, "irq_s": 3 * tick, "idle_s": 51 * tick, "steal_s": 3 * tick}
    )
    assert set(use) == {"cpu0", "cpu1"}
    now = cpu_ticks()
    assert now and all(name.startswith("cpu") and len(v) == 8 for name, v in now.items())
    assert cpu_use(now, cpu_ticks())  # the machine's own: non-negative, one per CPU
    assert all(x >= 0 for c in cpu_use(now, cpu_ticks()).values() for x in c.values())


def test_spread_of_one_value_is_nothing() -> None:
    assert spread([5.0]) == {"median": 5.0, "min": 5.0, "max": 5.0, "range_pct": 0.0}


def test_reruns_report_each_figure_and_how_far_it_moved() -> None:
    def run(warm: float, redis: float) -> dict[str, object]:
        return {
            "remote_warm": {"pages_per_s": warm, "p99_us": 100.0},
            "redis": {"pages_per_s": redis, "p99_us": 100.0},
            "remote_warm_over_redis": {"throughput": warm / redis, "p99": 1.0},
        }

    out = rerun_spread([run(1000.0, 1000.0), run(1100.0, 1000.0)])
    assert out["runs"] == 2
    assert out["figures"]["remote_warm_pages_per_s"] == [1000.0, 1100.0]
    assert round(out["spread"]["remote_warm_pages_per_s"]["range_pct"], 1) == 9.5
    assert out["spread"]["redis_pages_per_s"]["range_pct"] == 0.0
    assert "mixed_paged_over_warm" not in out["figures"]  # not in these runs: left out


def test_rerun_noise_separates_the_slices_movement_from_the_runs() -> None:
    """Two runs whose slice pairs agree within each run but whose levels differ: the
    movement is between runs, far over what the slices predict; two runs whose slices
    scatter alike about one level: the runs differ by about what the slices predict."""

    def run(ratios: list[float]) -> dict[str, object]:
        mean = sum(ratios) / len(ratios)
        return {
            "remote_warm_over_redis": {"throughput": mean, "p99": 1.0},
            "slices": [{"throughput": r, "p99": 1.0, "requests": 1000} for r in ratios],
        }

    apart = rerun_spread([run([0.99, 1.01, 0.99, 1.01]), run([1.09, 1.11, 1.09, 1.11])])["noise"]
    assert round(apart["within_run_pct"], 2) == round(100 * 0.0115470 / 1.05, 2)
    assert apart["expected_between_pct"] == apart["within_run_pct"] / 2
    assert apart["between_runs_pct"] > 5 * apart["expected_between_pct"]
    alike = rerun_spread([run([0.9, 1.1, 0.95, 1.05]), run([1.1, 0.9, 1.05, 0.95])])["noise"]
    assert alike["between_runs_pct"] == 0.0 and alike["within_run_pct"] > 5
    assert "noise" not in rerun_spread([run([1.0]), run([1.0])])  # one pair a run: no estimate


def test_the_cli_passes_last_the_modules_default() -> None:
    """``shuttle bench netrand --pass-seconds`` shows its default without importing the
    benchmark (help stays fast): it must be the module's."""
    import inspect

    from shuttle.bench.cli import netrand
    from shuttle.bench.netrand_clients import PASS_SECONDS_DEFAULT

    assert inspect.signature(netrand).parameters["pass_seconds"].default == PASS_SECONDS_DEFAULT
    params = inspect.signature(netrand).parameters
    assert params["slices"].default == SLICES_DEFAULT
