"""The forecast: both placements, the faster side, and where the answer flips."""

from __future__ import annotations

import pytest

from shuttle.sim.config import replace
from shuttle.sim.forecast import (
    BISECTION_RATIO,
    break_even_bandwidth,
    break_even_speed,
    forecast,
    split_stacks,
)
from shuttle.sim.workload import Columns
from shuttle.traces.record import Op, TraceRecord
from tests.unit.sim.test_live_model import LIVE

#: One console call, 20 reads of 64 KiB with 1 ms of thinking before each, a small
#: answer: a selective grep.
READS = 20
SIZE = 65536
THINK_S = 0.001


def grep_trace(client: int = 0, think_s: float = THINK_S) -> list[TraceRecord]:
    records = [TraceRecord(0.0, client, Op.CALL, "<console>", 0, 3)]
    t = 0.0
    for i in range(READS):
        t += think_s
        records.append(TraceRecord(t, client, Op.READ, f"f{i}", 0, SIZE))
    records.append(TraceRecord(t, client, Op.RETURN, "<console>", 0, 50))
    return records


GREP = Columns.from_records(grep_trace())
#: No overheads, one CPU cost: the break-even points have a closed form.
PLAIN = replace(
    LIVE,
    rpc_overhead_s=0.0,
    call_overhead_s=0.0,
    request_cycles=0.0,
    block_read_cycles=0.0,
    local_request_cycles=0.0,
    local_block_read_cycles=0.0,
    call_cycles=0.0,
    network_latency_s=0.0,
    rpc_header_bytes=0,
)


def test_the_faster_side_is_the_one_with_the_smaller_predicted_time() -> None:
    f = forecast([(LIVE, GREP)])
    assert f.client_s > f.server_s
    assert f.faster == "server"
    slow = forecast([(replace(LIVE, server_speed=0.001), GREP)])
    assert slow.faster == "client"
    assert forecast([(LIVE, GREP)]).to_json()["faster"] == "server"


def test_break_even_bandwidth_has_the_closed_form() -> None:
    """Client: think + reads over the link; server: think / speed + the answer. With
    the server at speed 1/3 the extra 2 x think must equal the reads' transfer:
    bandwidth = 8 x bytes / (2 x think)."""
    config = replace(PLAIN, server_speed=1 / 3)
    found = break_even_bandwidth([(config, GREP)])
    expected = 8 * (READS * SIZE - 50) / (2 * READS * THINK_S)
    assert found.value == pytest.approx(expected, rel=2 * (BISECTION_RATIO - 1))
    assert (found.faster_low, found.faster_high) == ("server", "client")


def test_break_even_speed_has_the_closed_form() -> None:
    """At 8 Mbit/s the reads take READS x SIZE / 1e6 s at the client; the server
    breaks even when think / speed - think equals that."""
    found = break_even_speed([(PLAIN, GREP)])
    transfer = (READS * SIZE - 50) * 8 / 8e6
    expected = READS * THINK_S / (READS * THINK_S + transfer)
    assert found.value == pytest.approx(expected, rel=2 * (BISECTION_RATIO - 1))
    assert (found.faster_low, found.faster_high) == ("client", "server")


def test_no_break_even_when_one_side_wins_throughout() -> None:
    no_think = Columns.from_records(grep_trace(think_s=0.0))
    found = break_even_speed([(PLAIN, no_think)])
    assert found.value is None
    assert found.faster_low == found.faster_high == "server"


def test_break_even_bandwidth_can_follow_the_profiles_bucket_rule() -> None:
    config = replace(PLAIN, server_speed=1 / 3, network_burst_bytes=4096)
    seen: list[float] = []

    def burst_for(bandwidth: float) -> int:
        seen.append(bandwidth)
        return max(4096, int(bandwidth / 8 * 0.001))

    break_even_bandwidth([(config, GREP)], burst_for=burst_for)
    assert seen and min(seen) == 1e3 and max(seen) == 1e12


def test_stacks_are_split_by_client_and_the_slowest_one_counts() -> None:
    both = Columns.from_records(
        sorted(grep_trace(0) + grep_trace(1, think_s=0.002), key=lambda r: r.time)
    )
    stacks = split_stacks(both)
    assert [len(s) for s in stacks] == [READS + 2, READS + 2]
    assert all(s.time_s[0] == 0.0 for s in stacks)
    f = forecast([(LIVE, s) for s in stacks])
    assert f.client_s == max(r.run_time_s for r in f.client)
    assert f.client[1].run_time_s > f.client[0].run_time_s
