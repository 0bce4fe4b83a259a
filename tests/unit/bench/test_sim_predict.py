"""The parts of ``shuttle sim calibrate|predict`` that need no node: the calibration's
configuration and its file, the run-time model's inputs, the corpus."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from shuttle.bench.calibrate import (
    LIVE_BLOCK_BYTES,
    Calibration,
    Timed,
    achieved_bandwidth_bits_per_s,
    link_residual_s,
    timed_calls,
)
from shuttle.bench.corpus import CorpusSpec, corpus_digest, generate_corpus
from shuttle.bench.predict import burst_for, load_calibration, runtime_model, stack_counts
from shuttle.errors import ConfigError
from shuttle.net.profiles import BUILTIN_PROFILES, LinkProfile
from shuttle.sim.link import Link
from shuttle.sim.workload import Columns
from shuttle.traces.record import Op, TraceRecord

MEASURED = {
    "cpu_reference_hz": 2.5e9,
    "read_node_cpu_per_block_s": 2e-6,
    "read_node_cpu_per_request_s": 200e-6,
    "local_read_cpu_per_request_s": 25e-6,
    "local_read_cpu_per_block_s": 3e-6,
    "call_node_cpu_s": 230e-6,
    "request_header_bytes": 154.4,
    "reply_header_bytes": 33.5,
    "rpc_overhead_s": 300e-6,
    "call_overhead_s": -5e-6,  # a measurement below the model: no overhead
    "mobile_client_cpu_ratio": 1.1,
    "mobile_server_cpu_ratio": 1.2,
    "disk": {"seek_s": 0.0, "bandwidth_bytes_per_s": 1e9},
}


def calibration(factor: float = 0.5, speed: float = 0.5) -> Calibration:
    return Calibration("n1", BUILTIN_PROFILES["lan"], factor, speed, dict(MEASURED))


def test_costs_measured_on_a_slow_node_are_stated_at_speed_one() -> None:
    config = calibration(factor=0.5, speed=0.25).server_config()
    # Measured at factor 0.5: the work is half of what was burned; cycles at 2.5 GHz.
    assert config.request_cycles == pytest.approx(200e-6 * 0.5 * 2.5e9)
    assert config.block_read_cycles == pytest.approx(2e-6 * 0.5 * 2.5e9)
    assert config.server_speed == 0.25
    assert config.cpu_cost_s(config.request_cycles) == pytest.approx(200e-6 * 0.5 / 0.25)
    assert config.call_overhead_s == 0.0
    assert config.network_bandwidth_bits_per_s == 10e6
    assert config.network_burst_bytes == BUILTIN_PROFILES["lan"].effective_burst_bytes
    assert config.block_size_bytes == LIVE_BLOCK_BYTES
    assert config.client_cache_blocks == 0 and config.network_exact_bytes


def test_the_calibration_file_reads_back_as_the_same_configuration(tmp_path: Path) -> None:
    cal = calibration()
    path = tmp_path / "c.toml"
    path.write_text(cal.to_toml())
    assert load_calibration(path) == cal.server_config()
    assert "# node n1 (CPU factor 0.5)" in path.read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text("[sweep]\npoints = [1]\n")
    with pytest.raises(ConfigError, match=r"no \[server\] table"):
        load_calibration(bad)


def test_loopback_has_an_unlimited_link() -> None:
    cal = Calibration("n1", BUILTIN_PROFILES["loopback"], 1.0, 1.0, dict(MEASURED))
    assert math.isinf(cal.server_config().network_bandwidth_bits_per_s)


def test_timed_calls_reports_per_call_figures() -> None:
    node = {"cpu": 0.0}

    def call() -> None:
        node["cpu"] += 0.5  # the node's CPU clock moves by half a second a call

    timed = timed_calls(call, lambda: node["cpu"], calls=10)
    assert timed.calls == 10 and len(timed.walls) == 10 + timed.warmup
    assert timed.node_cpu_s == pytest.approx(0.5)
    assert list(timed.starts) == sorted(timed.starts)
    assert timed.wall_s >= 0.0


def test_the_link_residual_replays_the_calls_through_the_bucket() -> None:
    lan = BUILTIN_PROFILES["lan"]
    rate = 10e6 / 8
    # Two calls 1 s apart (the bucket full for each), each taking the link's time
    # plus 1 ms of node CPU plus 0.3 ms more: the residual is that 0.3 ms.
    one = (lan.transfer_time_s(100) + 0.001 + lan.transfer_time_s(65636)) + 0.0003
    timed = Timed(0.0, 0.0, 0.0, 0.0, 2, (0.0, 1.0), (one, one), 0)
    assert link_residual_s(timed, lan, 100, 65636, 0.001) == pytest.approx(0.0003)
    # Back to back, the second reply waits for tokens: the replay knows it.
    back = 0.0 + one
    tat = lan.latency_s + 0.001 + 65636 / rate  # reply 1 handed over after the request
    second = max(tat, back + lan.latency_s + 0.001) + 65636 / rate - 4096 / rate
    wall_2 = second + lan.latency_s - back + 0.0003
    timed = Timed(0.0, 0.0, 0.0, 0.0, 2, (0.0, back), (one, wall_2), 0)
    assert link_residual_s(timed, lan, 100, 65636, 0.001) == pytest.approx(0.0003)


def back_to_back(
    profile: LinkProfile, rate_bits: float, calls: int, reply: int, node_s: float, extra_s: float
) -> Timed:
    """``calls`` reads made back to back over a link that moves ``rate_bits`` a second
    (with the profile's bucket and latency), each ``extra_s`` beyond the link and node."""
    link = Link(rate_bits, profile.effective_burst_bytes, profile.latency_s)
    starts, walls, now = [], [], 0.0
    for _ in range(calls):
        arrive = link.up.transmit(now, 100)
        wall = link.down.transmit(arrive + node_s, reply) - now + extra_s
        starts.append(now)
        walls.append(wall)
        now += wall
    return Timed(0.0, 0.0, 0.0, 0.0, calls, tuple(starts), tuple(walls), 0)


@pytest.mark.parametrize("fraction", [0.55, 0.8, 0.97])
def test_the_achieved_rate_is_the_one_the_large_reads_moved_at(fraction: float) -> None:
    lan = BUILTIN_PROFILES["lan"]
    timed = back_to_back(lan, 10e6 * fraction, 60, 62_500, 0.0002, 0.002)
    got = achieved_bandwidth_bits_per_s(timed, lan, 100, 62_500, 0.0002, 0.002)
    assert got == pytest.approx(10e6 * fraction, rel=1e-3)
    # The calibration's configuration carries it in place of the profile's rate.
    measured = dict(MEASURED, link_bandwidth_bits_per_s=got)
    config = Calibration("n1", lan, 1.0, 1.0, measured).server_config()
    assert config.network_bandwidth_bits_per_s == got


def test_the_achieved_rate_is_never_above_the_profiles_nor_below_the_floor() -> None:
    lan = BUILTIN_PROFILES["lan"]
    fast = back_to_back(lan, 10e6, 30, 62_500, 0.0002, 0.001)
    # The per-message residual is larger than the large reads': nothing is charged.
    assert achieved_bandwidth_bits_per_s(fast, lan, 100, 62_500, 0.0002, 0.002) == 10e6
    crawl = back_to_back(lan, 10e6 * 0.05, 30, 62_500, 0.0002, 0.0)
    assert achieved_bandwidth_bits_per_s(crawl, lan, 100, 62_500, 0.0002, 0.0) == 2e6
    loop = BUILTIN_PROFILES["loopback"]
    assert achieved_bandwidth_bits_per_s(fast, loop, 100, 62_500, 0.0002, 0.0) is None


def test_stack_counts_and_the_runtime_models_two_splits() -> None:
    trace = Columns.from_records(
        [
            TraceRecord(0.01, 0, Op.CALL, "<console>", 0, 3),
            TraceRecord(0.03, 0, Op.READ, "a", 0, 65536),
            TraceRecord(0.05, 0, Op.READ, "b", 0, 100),
            TraceRecord(0.06, 0, Op.RETURN, "<console>", 0, 30),
        ]
    )
    counts = stack_counts(trace, 4096)
    assert counts.console_cpu_s == pytest.approx(0.01)
    assert counts.object_cpu_s == pytest.approx(0.05)
    assert (counts.reads, counts.read_bytes, counts.read_blocks) == (2, 65636, 17)
    assert (counts.calls, counts.call_bytes) == (1, 33)
    config = calibration(factor=1.0, speed=1.0).server_config()
    model = runtime_model(counts, config, node_speed=1.0)
    storage_s = (2 * config.request_cycles + 17 * config.block_read_cycles) / 2.5e9
    bw = 10e6 / 8
    lat = 0.5e-3
    cpu = 0.01 + 0.05 * 1.1 + storage_s
    assert model["client_s"] == pytest.approx(cpu + 65636 / bw + 2 * 2 * lat)
    assert model["server_s"] == pytest.approx(cpu + 33 / bw + 2 * 1 * lat)
    assert model["faster"] == "server"


def test_the_break_even_search_uses_the_profiles_bucket_rule() -> None:
    assert burst_for(10e6) == BUILTIN_PROFILES["lan"].effective_burst_bytes
    assert burst_for(1e9) == 125_000


def test_the_corpus_is_the_same_bytes_from_the_same_seed() -> None:
    spec = CorpusSpec(files=20, median_bytes=2048, seed=3)
    first = list(generate_corpus(spec))
    assert first == list(generate_corpus(spec))
    assert [k for k, _ in first][:2] == ["corpus/00.txt", "corpus/01.txt"]
    assert all(data.endswith(b"\n") and data.isascii() for _, data in first)
    assert first != list(generate_corpus(CorpusSpec(files=20, median_bytes=2048, seed=4)))
    digest, size = corpus_digest(spec)
    assert size == sum(len(d) for _, d in first) and len(digest) == 64


def test_the_validation_corpus_is_the_one_the_table_names() -> None:
    """benchmarks/README.md names the corpus by this digest; a change of the generator
    (or of NumPy's streams) shows here first."""
    digest, size = corpus_digest(CorpusSpec())
    assert (digest[:16], size) == ("ef4c11437d926387", 16_137_430)


def test_a_bad_corpus_spec_is_refused() -> None:
    with pytest.raises(ConfigError, match='"files"'):
        CorpusSpec(files=0)


def _row(
    link: str, live: tuple[float, float], sim: tuple[float, float], model: tuple[float, float]
) -> dict[str, object]:
    def side(c: float, s: float) -> str:
        return "client" if c < s else "server"

    def error(p: tuple[float, float]) -> dict[str, object]:
        return {
            "client": p[0] / live[0] - 1,
            "server": p[1] / live[1] - 1,
            "faster_right": side(*p) == side(*live),
        }

    return {
        "link": link,
        "speed": 0.5,
        "bytes": 2_500_000,
        "live": {
            "client_s": live[0],
            "server_s": live[1],
            "faster": side(*live),
            "spread": {"client": 0.04, "server": 0.1},
            "runs": {"client_s": [live[0]] * 5, "server_s": [live[1]] * 9},
        },
        "predicted": {"client_s": sim[0], "server_s": sim[1], "faster": side(*sim)},
        "runtime_model": {"client_s": model[0], "server_s": model[1], "faster": side(*model)},
        "error": error(sim),
        "runtime_model_error": error(model),
        "load_average_before": [1.25, 1.0, 1.0],
    }


def test_the_validation_summary_counts_each_models_errors_and_sides() -> None:
    from shuttle.bench.simpredict import summary

    rows = [
        _row("lan", (2.0, 1.0), (2.2, 0.9), (1.0, 1.5)),  # model: wrong side
        _row("wan", (4.0, 1.0), (4.0, 1.2), (4.0, 1.0)),  # simulator: +20 % at the server
    ]
    s = summary(rows)
    assert s["simulator"] == {
        "worst_error": pytest.approx(0.2),
        "within_15_percent": 3,
        "predictions": 4,
        "faster_right": 2,
        "rows": 2,
    }
    assert s["runtime_model"]["worst_error"] == pytest.approx(0.5)
    assert s["runtime_model"]["within_15_percent"] == 2
    assert s["runtime_model"]["faster_right"] == 1


def test_the_validation_tables_show_each_model_on_the_same_runs() -> None:
    from shuttle.bench.simpredict import markdown_table

    table = markdown_table({"rows": [_row("lan", (2.0, 1.0), (2.2, 0.9), (1.0, 1.5))]})
    simulator, model = table.split("**The run-time's placement model")
    assert simulator.startswith("**The simulator")
    sim_row = [line for line in simulator.splitlines() if line.startswith("| lan")]
    model_row = [line for line in model.splitlines() if line.startswith("| lan")]
    assert sim_row == [
        "| lan | 0.5 | 2.5 | 2.000 (4%, 5) | 1.000 (10%, 9) | 2.200 / 0.900 | +10.0% / -10.0% "
        "| server / server | 1.2 |"
    ]
    assert model_row == [
        "| lan | 0.5 | 2.5 | 2.000 (4%, 5) | 1.000 (10%, 9) | 1.000 / 1.500 | -50.0% / +50.0% "
        "| server / client ✗ | 1.2 |"
    ]


def test_the_live_timers_phases_are_summed_up_over_runs() -> None:
    from shuttle.bench.liveruns import phase_summary

    runs = [
        {"n1": {"made_s": 0.11, "calls_s": [0.04, 0.05, 0.04]}},
        {"n1": {"made_s": 0.10, "calls_s": [0.04, 0.04]}},
        {"n1": {"made_s": 0.12, "calls_s": [0.06, 0.05, 0.07]}},
    ]
    got = phase_summary(runs)
    assert got["made_s"] == pytest.approx(0.11)
    assert got["call_s"] == pytest.approx(0.04)  # each run's median: 0.04, 0.04, 0.06
    assert got["calls"] == 3
    assert got["calls_total_s"] == pytest.approx(0.13)  # 0.13, 0.08, 0.18
    assert got["runs"] == runs
    assert phase_summary([{}]) == {}


def test_the_models_phases_are_the_times_between_its_answers() -> None:
    from types import SimpleNamespace

    from shuttle.bench.predict import model_phases

    def run(total: float, answers: list[float]) -> SimpleNamespace:
        return SimpleNamespace(
            run_time_s=total, mobile=SimpleNamespace(extra={"answers_s": answers})
        )

    # Two stacks: the slowest one's answers count.
    got = model_phases([run(0.2, [0.05, 0.1, 0.2]), run(0.5, [0.1, 0.15, 0.3, 0.5])])
    assert got == {
        "made_s": 0.1,
        "call_s": pytest.approx(0.15),  # 0.05, 0.15, 0.2
        "calls": 3,
        "calls_total_s": pytest.approx(0.4),
    }
    assert model_phases([run(0.1, [0.1])]) == {}


def test_the_validation_table_sets_the_server_timers_phases_beside_the_models() -> None:
    from shuttle.bench.simpredict import markdown_table

    row = _row("wan", (16.0, 0.45), (16.1, 0.44), (20.0, 0.5))
    row["live"]["phases"] = {  # type: ignore[index]
        "server": {"made_s": 0.111, "call_s": 0.0425, "calls": 8, "calls_total_s": 0.344}
    }
    row["predicted"]["phases"] = {  # type: ignore[index]
        "server": {"made_s": 0.107, "call_s": 0.0445, "calls": 8, "calls_total_s": 0.356}
    }
    row["calibration"] = {"n1": {"measured": {"connect_s": 0.063}}}
    table = markdown_table({"rows": [row]})
    assert "**The server placement's timer, live / simulated**" in table
    assert "| wan | 0.5 | 0.111 / 0.107 (0.063) | 42.5 / 44.5 | 8 / 8 | 0.344 / 0.356 |" in table


def test_the_median_interval_is_the_order_statistics_the_binomial_gives() -> None:
    from shuttle.bench.liveruns import median_interval, median_stable

    # Below 7 runs the 80 % interval is the whole range (n = 6: 78 % between the 2nd
    # and the 5th); at 9 the 3rd to the 7th (82 %); at 15 the 5th to the 11th (88 %).
    assert median_interval([5.0, 1.0, 3.0, 2.0, 4.0]) == (1.0, 5.0)
    assert median_interval(list(range(1, 7))) == (1, 6)
    assert median_interval(list(range(1, 10))) == (3, 7)
    assert median_interval(list(range(1, 16))) == (5, 11)
    assert median_interval([2.0]) == (2.0, 2.0)
    # Stable: the interval within 7.5 % of the median either side, from 3 runs on.
    assert median_stable([1.0, 1.05, 0.95, 1.02, 0.98])
    assert not median_stable([1.0, 1.2, 0.95, 1.02, 0.98])
    assert not median_stable([1.0]) and not median_stable([1.0, 1.0])
    with pytest.raises(ConfigError, match="at least one value"):
        median_interval([])
    with pytest.raises(ConfigError, match="between 0 and 1"):
        median_interval([1.0], confidence=1.0)


def test_live_runs_go_on_while_a_median_is_not_stable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's runs hold still and stop at --runs; the server's spread, so they go
    on to the most allowed; a drain follows every server run."""
    from shuttle.bench import liveruns as predict

    server = iter([0.3, 0.45, 0.28, 0.39, 0.41, 0.33, 0.44, 0.30, 0.36, 0.29])
    made: list[str] = []

    def report(cluster: Path, pattern: str, keys: object, placement: str, **_: object) -> dict:
        made.append(placement)
        elapsed = 13.0 if placement == "client" else next(server)
        return {"elapsed_s": elapsed, "phases": {}}

    monkeypatch.setattr(predict, "live_grep_report", report)
    drains: list[int] = []
    live = predict.run_live(
        Path("c.toml"), "x", ["k"], link=None, runs=3, runs_max=8,
        after_server=lambda: drains.append(len(made)),
    )  # fmt: skip
    assert live.client_s == [13.0] * 3 and len(live.server_s) == 8
    assert made[:6] == ["client", "server"] * 3 and made[6:] == ["server"] * 5
    assert drains == [i for i, p in enumerate(made, 1) if p == "server"]
    got = live.to_json()
    assert got["stable"]["client"] and not got["stable"]["server"]
    assert got["median_interval"]["server"] == [0.30, 0.44]  # the 2nd and 7th of 8
    # A server that holds still stops at --runs too.
    server = iter([0.30, 0.31, 0.30, 0.50])
    assert len(predict.run_live(Path("c"), "x", ["k"], link=None, runs=3).server_s) == 3
