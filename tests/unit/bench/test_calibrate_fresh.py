"""The per-call cost over fresh processes, and the hosted fit: the figures from made-up
timings, no node (the processes themselves: tests/integration/test_sim_predict.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shuttle.bench.calibrate.fresh import (
    ProcessReads,
    ProgramGrep,
    console_call_cost,
    fresh_reads,
    mean_blocks,
    node_cpu_per_call_s,
    per_call_cost,
    program_work,
    read_blocks,
    small_spots,
)
from shuttle.bench.calibrate.hosted import fit_hosted, nnls_small
from shuttle.bench.calibrate.link import call_residuals_s
from shuttle.bench.calibrate.result import Calibration
from shuttle.bench.calibrate.run import console_figures, with_drains
from shuttle.bench.calibrate.timing import Timed
from shuttle.bench.predict import program_reads
from shuttle.errors import ConfigError
from shuttle.net.profiles import BUILTIN_PROFILES
from shuttle.traces.io import write_csv
from shuttle.traces.record import Op, TraceRecord

LOOPBACK = BUILTIN_PROFILES["loopback"]
LAN = BUILTIN_PROFILES["lan"]


def process(
    node_s: float,
    extra_s: float,
    *,
    calls: int = 20,
    size: int = 13_000,
    first_s: float = 0.002,
    dial_s: float = 0.003,
) -> ProcessReads:
    """A process whose loopback reads each take ``node_s`` of node CPU and ``extra_s``
    more, the first ``first_s`` more again; it dialled in ``dial_s`` and made its grep
    at the node in 5 ms, then drained it in 10 calls timed alike."""
    walls = [node_s + extra_s + first_s] + [node_s + extra_s] * calls
    starts, now = [], 0.0
    for wall in walls:
        starts.append(now)
        now += wall
    call_walls = [node_s + extra_s] * 10
    call_starts = [now + 1.0 + i for i in range(len(call_walls))]
    return ProcessReads(
        tuple(starts), tuple(walls), (size,) * len(walls), node_s * calls, 0.0,
        tuple(call_starts), tuple(call_walls), node_s * 10, 0.005, 0.001,
        made_s=dial_s + 0.005, create_start=now, call_reply_bytes=(0,) * 10,
    )  # fmt: skip


def test_each_figure_is_the_median_over_processes() -> None:
    runs = [process(200e-6, 250e-6), process(210e-6, 120e-6), process(190e-6, 240e-6)]
    assert node_cpu_per_call_s(runs) == pytest.approx(200e-6)
    cost = per_call_cost(runs, LOOPBACK, 150, 34, lambda _size: 200e-6)
    # Residual per process: wall less the node's 200 µs: 250, 130, 230 -> median 230.
    assert cost.residual_s == pytest.approx(230e-6)
    assert cost.first_read_extra_s == pytest.approx(0.002)
    assert cost.wall_s == pytest.approx(430e-6)  # 450, 330, 430
    assert [p["residual_s"] for p in cost.per_process] == pytest.approx([250e-6, 130e-6, 230e-6])
    assert cost.spread("residual_s") == pytest.approx((250 - 130) / 230)
    assert cost.to_json()["processes"] == 3


def test_one_disturbed_process_does_not_move_the_median() -> None:
    quiet = [process(200e-6, 100e-6) for _ in range(4)]
    disturbed = [*quiet, process(900e-6, 3e-3)]
    cost = per_call_cost(disturbed, LOOPBACK, 150, 34, lambda _size: 200e-6)
    assert cost.residual_s == pytest.approx(100e-6)
    assert node_cpu_per_call_s(disturbed) == pytest.approx(200e-6)


def test_the_residual_is_left_after_the_links_time_for_each_reads_own_bytes() -> None:
    rate = 10e6 / 8
    sizes = [1000, 60_000, 5000]
    starts, walls, now = [], [], 0.0
    for size in sizes:  # 1 s apart: the bucket full for each read
        wall = LAN.latency_s + 150 / rate + 1e-4 + LAN.latency_s + (34 + size) / rate
        # The bucket's depth lets a burst out at once: only what exceeds it waits.
        wall -= (
            min(LAN.effective_burst_bytes, 34 + size) / rate
            + min(LAN.effective_burst_bytes, 150) / rate
        )
        starts.append(now)
        walls.append(wall + 3e-4)
        now += 1.0
    got = call_residuals_s(starts, walls, LAN, [150] * 3, [34 + s for s in sizes], [1e-4] * 3)
    assert got == pytest.approx([3e-4] * 3, abs=1e-9)


def test_console_calls_and_setup() -> None:
    runs = [process(300e-6, 200e-6), process(320e-6, 100e-6), process(280e-6, 150e-6)]
    cost = console_call_cost(runs, LOOPBACK, 153, 34, 150, call_cpu_s=100e-6)
    assert cost is not None
    # Each process's own node CPU per call; the residual is what is left of its calls.
    assert cost.node_cpu_s == pytest.approx(300e-6)
    assert cost.residual_s == pytest.approx(150e-6)  # 200, 100, 150
    assert (cost.drain_node_cpu_s, cost.calls) == (pytest.approx(3e-3), 10)
    # The making over the open connection beyond a call: its wall (5 ms) less a
    # call's own CPU and the process's residual per call.
    assert cost.server_setup_s == pytest.approx(0.005 - 100e-6 - 150e-6)
    assert cost.client_setup_s == pytest.approx(0.001)
    no_calls = ProcessReads((0.0, 1.0), (1e-3, 1e-3), (1, 1), 1e-3, 0.0)
    assert console_call_cost([no_calls], LOOPBACK, 1, 1) is None


def test_the_dial_is_the_first_making_less_the_second_not_the_first_read() -> None:
    """On wan a process's first read carried a 23.8 KB file against a median of 8 KB:
    its excess was 0.24 s, the dial 0.064 s (benchmarks/README.md)."""
    runs = [process(1e-4, 0.05, first_s=0.18, dial_s=d) for d in (0.063, 0.064, 0.070)]
    cost = console_call_cost(runs, LOOPBACK, 153, 34)
    assert cost is not None
    assert cost.connect_s == pytest.approx(0.064)
    assert per_call_cost(runs, LOOPBACK, 150, 34, lambda _s: 1e-4).first_read_extra_s == (
        pytest.approx(0.18)
    )


def test_the_making_is_replayed_through_the_bucket_with_its_arguments() -> None:
    """25 KB of keys at lan's 10 Mbit/s: 20 ms of the making is the link's (less the
    bucket's 4 KiB that leave at once), not the node's setting up."""
    rate = 10e6 / 8
    create_bytes, header = 25_000, 150
    link_s = 2 * LAN.latency_s + (header + create_bytes - LAN.effective_burst_bytes) / rate
    run = ProcessReads(
        (0.0, 1.0), (1e-3, 1e-3), (1, 1), 1e-3, 0.0,
        (10.0,), (2 * LAN.latency_s + 1e-3,), 0.0, link_s + 0.002, 0.001,
        create_bytes=create_bytes, made_s=link_s + 0.005, create_start=5.0,
        call_reply_bytes=(0,),
    )  # fmt: skip
    cost = console_call_cost([run], LAN, 153, 0, header)
    assert cost is not None
    assert cost.server_setup_s == pytest.approx(0.002 - cost.residual_s, abs=1e-6)
    assert cost.connect_s == pytest.approx(0.003)


def test_the_programs_work_at_the_node_is_its_drains_cpu_less_the_calls() -> None:
    runs = [process(1e-3, 1e-4)]  # 10 calls, 10 ms of node CPU over the drain
    cost = console_call_cost(runs, LOOPBACK, 153, 34)
    assert cost is not None
    work = program_work(cost, 2e-4, ProgramGrep({"pattern": "x"}, think_s=4e-3), factor=0.5)
    assert work["program_work_node_cpu_s"] == pytest.approx(10e-3 - 10 * 2e-4)
    # 8 ms of work at the node's factor 0.5 per 4 ms recorded: 2.0 there, 1.0 at speed 1.
    assert work["mobile_server_cpu_ratio_at_factor"] == pytest.approx(2.0)
    assert work["mobile_server_cpu_ratio"] == pytest.approx(1.0)
    assert work["local_read_cpu_per_request_s"] == work["local_read_cpu_per_block_s"] == 0.0
    # A drain cut short at 10 of the program's 40 calls did a quarter of its work.
    cut = program_work(cost, 2e-4, ProgramGrep({}, think_s=4e-3, calls=40), factor=0.5)
    assert cut["mobile_server_cpu_ratio"] == pytest.approx(4.0)


def test_blocks_and_the_calibrations_own_spots() -> None:
    assert (read_blocks(0), read_blocks(4096), read_blocks(4097)) == (1, 1, 2)
    runs = [process(1e-4, 1e-4, calls=3, size=8192)]
    assert mean_blocks(runs) == 2.0
    spots = small_spots(["a", "b"], 4)
    assert spots == [("a", 0, 64), ("b", 0, 64), ("a", 0, 64), ("b", 0, 64), ("a", 0, 64)]


def test_bad_inputs_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 2 reads"):
        fresh_reads(tmp_path / "c.toml", None, "n1", 1, [("a", 0, 1)], processes=1)
    with pytest.raises(ConfigError, match="must run on this machine"):
        fresh_reads(tmp_path / "c.toml", None, "n1", None, [("a", 0, 1)] * 2, processes=1)
    with pytest.raises(ConfigError, match="processes >= 1"):
        per_call_cost([], LOOPBACK, 1, 1, lambda _s: 0.0)
    lonely = ProcessReads((0.0,), (1e-3,), (1,), 0.0, 0.0)
    with pytest.raises(ConfigError, match="only the read that opened"):
        per_call_cost([lonely], LOOPBACK, 1, 1, lambda _s: 0.0)


def test_a_negative_process_count_is_refused(tmp_path: Path) -> None:
    from shuttle.bench.calibrate import calibrate

    with pytest.raises(ConfigError, match="processes must be 0"):
        calibrate(tmp_path / "none.toml", processes=-1)


def test_the_programs_reads_come_from_its_trace_per_stack(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    write_csv(
        trace,
        [
            TraceRecord(0.0, 0, Op.CALL, "<console>", 0, 3),
            TraceRecord(0.1, 0, Op.READ, "corpus/00.txt", 0, 13_000),
            TraceRecord(0.2, 1, Op.READ, "corpus/05.txt", 0, 65536),
            TraceRecord(0.3, 1, Op.READ, "corpus/05.txt", 65536, 100),
            TraceRecord(0.4, 0, Op.RETURN, "<console>", 0, 30),
        ],
    )
    assert program_reads(trace, 65536) == {
        0: [("corpus/00.txt", 0, 65536)],
        1: [("corpus/05.txt", 0, 65536), ("corpus/05.txt", 65536, 65536)],
    }


def test_nnls_finds_a_known_solution_and_keeps_unknowns_non_negative() -> None:
    rows = [[1.0, 10.0, 2.0], [0.1, 400.0, 400.0], [0.05, 65.0, 1000.0]]
    truth = [1.1, 2e-5, 3e-6]
    y = [sum(a * x for a, x in zip(row, truth, strict=True)) for row in rows]
    assert nnls_small(rows, y) == pytest.approx(truth, rel=1e-6)
    # A negative block cost fits best unconstrained; the constrained one is 0.
    y_neg = [sum(a * x for a, x in zip(row, [1.1, 2e-5, -3e-6], strict=True)) for row in rows]
    got = nnls_small(rows, y_neg)
    assert got[2] == 0.0 and all(v >= 0.0 for v in got)


def test_the_hosted_fit_gives_back_the_costs_its_runs_were_made_with() -> None:
    ratio, l_request, l_block, call_s = 1.2, 15e-6, 2e-6, 400e-6
    shapes = {
        "think": (0.036, 48.0, 244.0, 5.0),
        "requests": (0.005, 400.0, 400.0, 3.0),
        "bytes": (0.003, 65.0, 1025.0, 19.0),
    }
    runs = {}
    for name, (think, reads, blocks, calls) in shapes.items():
        runs[name] = {
            "think_s": think, "reads": reads, "blocks": blocks, "calls": calls,
            "node_wall_s": ratio * think + reads * l_request + blocks * l_block + calls * call_s,
        }  # fmt: skip
    small_wall, large_wall = 300e-6, 300e-6 + 15 * 5e-6
    think = shapes["think"]
    runs["think"]["client_wall_s"] = (
        1.05 * think[0] + think[1] * (small_wall - 5e-6) + think[2] * 5e-6
    )
    reads = {
        "small": Timed(small_wall, small_wall, 0.0, 0.0, 10),
        "large": Timed(large_wall, large_wall, 0.0, 0.0, 10),
    }
    call = Timed(call_s, call_s, 0.0, 0.0, 10)
    fit = fit_hosted(runs, reads, call, factor=0.5)
    assert fit["mobile_server_cpu_ratio_at_factor"] == pytest.approx(ratio)
    assert fit["mobile_server_cpu_ratio"] == pytest.approx(max(0.8, ratio * 0.5))
    assert fit["local_read_cpu_per_request_s"] == pytest.approx(l_request)
    assert fit["local_read_cpu_per_block_s"] == pytest.approx(l_block)
    assert fit["mobile_client_cpu_ratio"] == pytest.approx(1.05)


def _calibration(drains: tuple[ProcessReads, ...]) -> Calibration:
    measured = {
        "request_header_bytes": 150.0, "reply_header_bytes": 34.0, "call_request_bytes": 3.0,
        "call_node_cpu_loopback_s": 1e-4,
    }  # fmt: skip
    return Calibration("n1", LOOPBACK, 0.25, 0.25, measured, drains=drains)


def test_drains_made_between_live_runs_join_the_calibrations_own() -> None:
    """At a quarter-speed node a calibration's drains took the node 0.26-0.54 s of CPU
    where the live runs minutes later took 0.32-0.45 s: drains made between the live
    runs are of the node as the live runs found it, and every figure is then the
    median over all of them."""
    program = ProgramGrep({"pattern": "x"}, think_s=4e-3)
    own = tuple(process(1e-3, e) for e in (100e-6, 150e-6, 200e-6))  # 10 ms of node CPU each
    cal = _calibration(own)
    console_figures(cal.measured, own, LOOPBACK, program, 0.25)
    assert cal.measured["call_overhead_s"] == pytest.approx(150e-6)
    more = [process(2e-3, e) for e in (300e-6, 400e-6, 500e-6, 600e-6)]  # 20 ms each
    got = with_drains(cal, more, program)
    assert len(got.drains) == 7 and got.measured["drains_between"] == 4
    assert got.measured["call_overhead_s"] == pytest.approx(300e-6)  # the median of 7
    assert got.measured["fresh_calls"]["drain_node_cpu_s"] == pytest.approx(20e-3)
    # 20 ms less 10 calls' own 0.1 ms, per 4 ms recorded, at factor 0.25.
    assert got.measured["mobile_server_cpu_ratio"] == pytest.approx(0.25 * 19e-3 / 4e-3)
    assert cal.measured["call_overhead_s"] == pytest.approx(150e-6)  # cal itself unchanged
    with pytest.raises(ConfigError, match="drained no grep in fresh processes"):
        with_drains(_calibration(()), more, program)
