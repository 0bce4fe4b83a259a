"""The mobile application alone, at the client and at the server, against hand sums."""

from __future__ import annotations

import pytest

from shuttle.sim.config import ServerConfig
from shuttle.sim.kernel import Kernel
from shuttle.sim.metrics import TrafficStats
from shuttle.sim.mobile import MobileApp
from shuttle.sim.server import Server
from shuttle.sim.workload import Columns
from shuttle.traces.record import Op, TraceRecord

CONFIG = ServerConfig()
DISK_BLOCK_S = 0.008 + 8192 / 10e6
CPU_META_S = 33_000 / 133e6
CPU_READ_S = 100_000 / 133e6
NET_SMALL_S = 20e-6 + 128 * 8 / 100e6
NET_BLOCK_S = 20e-6 + (128 + 8192) * 8 / 100e6


def trace(*records: tuple[float, Op, str, int, int]) -> Columns:
    return Columns.from_records(
        TraceRecord(t, 0, op, f, off, size) for t, op, f, off, size in records
    )


#: Open a file, think 10 ms, read its first two blocks (5 ms apart), close it.
SEARCH = trace(
    (0.000, Op.OPEN, "a", 0, 0),
    (0.010, Op.READ, "a", 0, 8192),
    (0.015, Op.READ, "a", 8192, 8192),
    (0.015, Op.CLOSE, "a", 0, 0),
)
THINK_S = 0.015


def run_alone(
    columns: Columns, placement: str, config: ServerConfig = CONFIG
) -> tuple[MobileApp, Server, TrafficStats]:
    kernel = Kernel()
    server = Server(kernel, config)
    stats = TrafficStats()
    app = MobileApp(server, config, columns, placement, stats)
    kernel.at(100.0, lambda now, _: app.start(now))
    kernel.run()
    assert app.done
    return app, server, stats


def test_alone_at_the_client_run_time_is_think_plus_each_round_trip() -> None:
    app, _, stats = run_alone(SEARCH, "client")
    open_s = 2 * NET_SMALL_S + CPU_META_S + DISK_BLOCK_S  # metadata miss
    read_s = NET_SMALL_S + CPU_READ_S + DISK_BLOCK_S + NET_BLOCK_S
    close_s = 2 * NET_SMALL_S + CPU_META_S  # metadata hit
    assert app.result.run_time_s == pytest.approx(THINK_S + open_s + 2 * read_s + close_s)
    assert stats.requests == 4
    assert stats.block_hits == 0
    assert stats.network_s == pytest.approx(6 * NET_SMALL_S + 2 * NET_BLOCK_S)


def test_alone_at_the_server_requests_are_local_calls() -> None:
    app, _, stats = run_alone(SEARCH, "server")
    half = CONFIG.local_request_cpu_fraction
    expected = THINK_S + half * (2 * CPU_META_S + 2 * CPU_READ_S) + DISK_BLOCK_S + 2 * DISK_BLOCK_S
    assert app.result.run_time_s == pytest.approx(expected)
    assert stats.network_s == 0.0


def test_think_time_scales_with_the_speed_of_the_cpu_it_runs_on() -> None:
    slow, _, _ = run_alone(SEARCH, "client")
    fast, _, _ = run_alone(SEARCH, "client", ServerConfig(client_speed=3.0))
    assert slow.result.run_time_s - fast.result.run_time_s == pytest.approx(THINK_S - THINK_S / 3.0)
    at_slow_server, _, _ = run_alone(SEARCH, "server", ServerConfig(server_speed=0.5))
    assert at_slow_server.result.compute_s == pytest.approx(THINK_S * 2.0)


def test_the_client_cache_filters_rereads_at_the_client_only() -> None:
    reread = trace(
        (0.0, Op.READ, "a", 0, 4096),
        (0.0, Op.READ, "a", 4096, 4096),  # same 8 KB block
        (0.0, Op.READ, "a", 0, 8192),
    )
    client, _, client_stats = run_alone(reread, "client")
    assert client.result.client_cache_accesses == 3
    assert client.result.client_cache_hits == 2
    assert client_stats.block_accesses == 1  # only the first read reached the server
    _, _, server_stats = run_alone(reread, "server")
    assert (server_stats.block_accesses, server_stats.block_hits) == (3, 2)


def test_client_reads_are_split_into_rsize_rpcs_for_the_blocks_that_missed() -> None:
    big = trace((0.0, Op.READ, "a", 0, 4 * 8192))
    _, _, stats = run_alone(big, "client")
    assert stats.requests == 4  # 8 KB RPCs
    _, _, local = run_alone(big, "server")
    assert local.requests == 1  # one local call for the whole read


def test_at_the_server_the_program_holds_its_footprint_of_the_cache() -> None:
    config = ServerConfig(cache_blocks=300)
    kernel = Kernel()
    server = Server(kernel, config, warm_blocks=list(range(300)))
    app = MobileApp(server, config, SEARCH, "server", TrafficStats())
    seen: list[tuple[int | None, bool, bool]] = []
    kernel.at(1.0, lambda now, _: app.start(now))
    kernel.at(
        1.001, lambda now, _: seen.append((server.capacity, 99 in server.lru, 100 in server.lru))
    )
    kernel.run()
    # The 100 least recently used warm blocks went when the program arrived ...
    assert seen == [(200, False, True)]
    # ... and the memory came back when it finished.
    assert server.capacity == 300


def test_an_empty_trace_finishes_at_once() -> None:
    app, _, _ = run_alone(Columns.from_records([]), "server")
    assert app.result.run_time_s == 0.0
