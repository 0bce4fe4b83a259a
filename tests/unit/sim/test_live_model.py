"""What the model gained from the live system (issue 24), against hand sums: console
calls at the server placement, a token-bucket link, exact message bytes, per-request
CPU, measured local reads, hosted-object ratios, a run of the program alone."""

from __future__ import annotations

import math

import pytest

from shuttle.errors import ConfigError
from shuttle.sim.alone import simulate_alone
from shuttle.sim.config import ServerConfig, replace
from shuttle.sim.workload import Columns
from shuttle.traces.record import Op, TraceRecord

HZ = 1e6  # one cycle a microsecond: cycle counts below read as µs
LAT = 0.001
BW = 8e6  # 1 MB/s
HEADER = 100
LIVE = ServerConfig(
    block_size_bytes=4096,
    cache_infinite=True,
    disk_seek_s=0.0,
    disk_bandwidth_bytes_per_s=math.inf,
    cpu_reference_hz=HZ,
    metadata_read_cycles=0.0,
    request_cycles=200.0,
    block_read_cycles=10.0,
    local_request_cycles=50.0,
    local_block_read_cycles=5.0,
    call_cycles=300.0,
    network_latency_s=LAT,
    network_bandwidth_bits_per_s=BW,
    rpc_header_bytes=HEADER,
    network_exact_bytes=True,
    rpc_overhead_s=0.0005,
    call_overhead_s=0.0007,
    mobile_footprint_bytes=0,
    client_cache_blocks=0,
    client_request_bytes_max=1 << 20,
)


def msg(nbytes: int) -> float:
    """The paper's formula: latency plus header and payload over the bandwidth."""
    return LAT + (HEADER + nbytes) * 8 / BW


def trace(*records: tuple[float, Op, str, int, int]) -> Columns:
    return Columns.from_records(
        TraceRecord(t, 0, op, f, off, size) for t, op, f, off, size in records
    )


#: A console call; the object thinks 10 ms, reads 5,000 bytes (2 blocks), thinks 2 ms,
#: reads 1,000 bytes at offset 8192 (1 block), thinks 1 ms and answers 40 bytes; the
#: console thinks 2 ms, calls again, the object answers 20 bytes 1 ms later.
GREP = trace(
    (0.000, Op.CALL, "<console>", 0, 3),
    (0.010, Op.READ, "a", 0, 5000),
    (0.012, Op.READ, "a", 8192, 1000),
    (0.013, Op.RETURN, "<console>", 0, 40),
    (0.015, Op.CALL, "<console>", 0, 3),
    (0.016, Op.RETURN, "<console>", 0, 20),
)
OBJECT_THINK_S = 0.014
CONSOLE_THINK_S = 0.002


def test_at_the_client_console_calls_are_free_and_reads_cross_the_link() -> None:
    run = simulate_alone(LIVE, GREP, "client")
    read_1 = msg(0) + (200 + 2 * 10) / HZ + msg(5000) + 0.0005
    read_2 = msg(0) + (200 + 1 * 10) / HZ + msg(1000) + 0.0005
    assert run.run_time_s == pytest.approx(OBJECT_THINK_S + CONSOLE_THINK_S + read_1 + read_2)
    # When each answer reached the console (set beside a live run's console calls).
    first = 0.013 + read_1 + read_2
    assert run.mobile.extra == {
        "console_calls": 2,
        "console_returns": 2,
        "answers_s": [pytest.approx(first), pytest.approx(run.run_time_s)],
    }
    assert run.requests.requests == 2


def test_at_the_server_console_calls_cross_the_link_and_reads_are_local() -> None:
    run = simulate_alone(LIVE, GREP, "server")
    calls = 2 * (msg(3) + 300 / HZ)
    answers = msg(40) + msg(20) + 2 * 0.0007
    reads = (50 + 2 * 5) / HZ + (50 + 1 * 5) / HZ
    expected = OBJECT_THINK_S + CONSOLE_THINK_S + calls + answers + reads
    assert run.run_time_s == pytest.approx(expected)
    assert run.mobile.extra["console_bytes"] == 3 + 40 + 3 + 20
    # The first answer: the call across, the object's 13 ms and reads, the answer back.
    first = msg(3) + 300 / HZ + 0.013 + reads + msg(40) + 0.0007
    assert run.mobile.extra["answers_s"] == [pytest.approx(first), pytest.approx(expected)]


def test_server_speed_scales_the_program_and_the_node_but_not_the_console() -> None:
    slow = simulate_alone(replace(LIVE, server_speed=0.25), GREP, "server")
    calls = 2 * (msg(3) + 4 * 300 / HZ)
    answers = msg(40) + msg(20) + 2 * 0.0007
    reads = 4 * ((50 + 2 * 5) / HZ + (50 + 1 * 5) / HZ)
    expected = 4 * OBJECT_THINK_S + CONSOLE_THINK_S + calls + answers + reads
    assert slow.run_time_s == pytest.approx(expected)
    # At the client the node's CPU per read is what slows down.
    client = simulate_alone(replace(LIVE, server_speed=0.25), GREP, "client")
    fast = simulate_alone(LIVE, GREP, "client")
    assert client.run_time_s - fast.run_time_s == pytest.approx(3 * (220 + 210) / HZ)


def test_hosted_ratios_scale_the_objects_think_time_where_it_runs() -> None:
    config = replace(LIVE, mobile_client_cpu_ratio=1.5, mobile_server_cpu_ratio=2.0)
    base_client = simulate_alone(LIVE, GREP, "client").run_time_s
    base_server = simulate_alone(LIVE, GREP, "server").run_time_s
    assert simulate_alone(config, GREP, "client").run_time_s == pytest.approx(
        base_client + 0.5 * OBJECT_THINK_S
    )
    assert simulate_alone(config, GREP, "server").run_time_s == pytest.approx(
        base_server + 1.0 * OBJECT_THINK_S
    )


def test_a_token_bucket_lets_a_reply_leave_in_a_burst() -> None:
    burst = 4096
    config = replace(LIVE, network_burst_bytes=burst)
    run = simulate_alone(config, GREP, "client")

    def link(nbytes: int) -> float:
        return LAT + max(0, HEADER + nbytes - burst) * 8 / BW

    # The link idles for milliseconds between reads: the bucket is full for each.
    read_1 = link(0) + 220 / HZ + link(5000) + 0.0005
    read_2 = link(0) + 210 / HZ + link(1000) + 0.0005
    assert run.run_time_s == pytest.approx(OBJECT_THINK_S + CONSOLE_THINK_S + read_1 + read_2)
    # Back to back (no think), the second reply finds the bucket not yet full again.
    tight = trace(
        (0.0, Op.READ, "a", 0, 65536),
        (0.0, Op.READ, "b", 0, 65536),
    )
    no_cpu = replace(config, rpc_overhead_s=0.0, request_cycles=0.0, block_read_cycles=0.0)
    rate = BW / 8
    reply = HEADER + 65536
    handed_1 = LAT  # the request (100 bytes) leaves at once from a full bucket
    tat = handed_1 + reply / rate  # GCRA: the bucket's theoretical arrival time
    arrived_1 = tat - burst / rate + LAT
    handed_2 = arrived_1 + LAT
    tat = max(tat, handed_2) + reply / rate
    arrived_2 = tat - burst / rate + LAT
    assert simulate_alone(no_cpu, tight, "client").run_time_s == pytest.approx(arrived_2)
    # ... which is later than two idle-link replies would be.
    assert arrived_2 > 2 * (link(0) + link(65536))


def test_opening_the_connection_is_paid_once_at_either_placement() -> None:
    config = replace(LIVE, connect_s=0.004)
    for placement in ("client", "server"):
        base = simulate_alone(LIVE, GREP, placement).run_time_s
        assert simulate_alone(config, GREP, placement).run_time_s == pytest.approx(base + 0.004)


def test_making_the_object_is_paid_once_at_its_own_placement() -> None:
    config = replace(LIVE, connect_s=0.004, client_setup_s=0.001, server_setup_s=0.003)
    for placement, setup in (("client", 0.001), ("server", 0.003)):
        base = simulate_alone(LIVE, GREP, placement).run_time_s
        run = simulate_alone(config, GREP, placement).run_time_s
        assert run == pytest.approx(base + 0.004 + setup)


def test_request_headers_can_differ_from_reply_headers() -> None:
    config = replace(LIVE, rpc_request_header_bytes=300)
    run = simulate_alone(config, GREP, "server")
    base = simulate_alone(LIVE, GREP, "server")
    # Two calls went up with 200 more header bytes each; the answers did not change.
    assert run.run_time_s - base.run_time_s == pytest.approx(2 * 200 * 8 / BW)
    client = simulate_alone(config, GREP, "client").run_time_s
    assert client - simulate_alone(LIVE, GREP, "client").run_time_s == pytest.approx(
        2 * 200 * 8 / BW
    )


def test_exact_bytes_against_whole_blocks() -> None:
    one_read = trace((0.0, Op.READ, "a", 0, 100))
    exact = simulate_alone(LIVE, one_read, "client").run_time_s
    blocks = simulate_alone(replace(LIVE, network_exact_bytes=False), one_read, "client")
    assert blocks.run_time_s - exact == pytest.approx((4096 - 100) * 8 / BW)


def test_without_measured_local_costs_a_local_read_is_the_papers_fraction() -> None:
    config = ServerConfig(
        **{**_fields(LIVE), "local_request_cycles": None, "local_block_read_cycles": None}
    )
    read = trace((0.0, Op.READ, "a", 0, 5000))
    run = simulate_alone(config, read, "server")
    assert run.run_time_s == pytest.approx(0.5 * (200 + 2 * 10) / HZ)


def test_cold_runs_go_to_the_disk_and_warm_ones_do_not() -> None:
    config = replace(LIVE, disk_seek_s=0.004, disk_bandwidth_bytes_per_s=1e7)
    read = trace((0.0, Op.READ, "a", 0, 8192))
    warm = simulate_alone(config, read, "server")
    cold = simulate_alone(config, read, "server", warm=False)
    assert warm.disk_s == 0.0
    assert cold.disk_s == pytest.approx(0.004 + 8192 / 1e7)
    assert cold.run_time_s - warm.run_time_s == pytest.approx(cold.disk_s)


def test_the_new_parameters_are_checked() -> None:
    with pytest.raises(ConfigError, match='"rpc_overhead_s"'):
        replace(LIVE, rpc_overhead_s=-1.0)
    with pytest.raises(ConfigError, match='"mobile_server_cpu_ratio"'):
        replace(LIVE, mobile_server_cpu_ratio=0.0)
    with pytest.raises(ConfigError, match='"local_request_cycles"'):
        replace(LIVE, local_request_cycles=-5.0)


def test_an_unknown_placement_is_refused() -> None:
    with pytest.raises(Exception, match="placement must be one of"):
        simulate_alone(LIVE, GREP, "osd")


def _fields(config: ServerConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}
