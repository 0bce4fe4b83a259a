"""The server model, one scenario at a time: CPU, disk, caches, locking, mobile code."""

from __future__ import annotations

import dataclasses

import pytest

from shuttle.sim.blocks import BLOCK_BITS
from shuttle.sim.config import ServerConfig
from shuttle.sim.kernel import Kernel
from shuttle.sim.metrics import TrafficStats
from shuttle.sim.server import Request, Server
from shuttle.sim.workload import BLOCK_READ, BLOCK_WRITE, META_READ, META_WRITE

MS = 1e-3
#: One 8 KB block at 10 MB/s after an 8 ms seek.
DISK_BLOCK_S = 0.008 + 8192 / 10e6


def block(file: int, number: int) -> int:
    return (file << BLOCK_BITS) | number


class Story:
    """A server on a fresh kernel, and a log of when each named request completed."""

    def __init__(self, config: ServerConfig, warm_blocks: list[int] | None = None) -> None:
        self.kernel = Kernel()
        self.server = Server(self.kernel, config, warm_blocks)
        self.stats = TrafficStats()
        self.done: dict[str, float] = {}
        self.requests: dict[str, Request] = {}

    def request(
        self, name: str, at: float, kind: int, first: int = 0, nblocks: int = 1, file: int = 0
    ) -> None:
        req = Request(kind, file, first, nblocks, at, 0.0, 0.0, self.stats, True)
        req.on_done = lambda now, r: self.done.__setitem__(name, now)
        self.requests[name] = req
        self.kernel.at(at, self.server.arrive, req)

    def run(self) -> None:
        self.kernel.run()


# The isolation configurations of section 3.3.5.
NO_NETWORK_INSTANT_DISK = ServerConfig(
    disk_seek_s=0.0,
    disk_bandwidth_bytes_per_s=float("inf"),
    network_latency_s=0.0,
    network_bandwidth_bits_per_s=float("inf"),
)
INSTANT_CPU = ServerConfig(server_speed=float("inf"), cache_blocks=101)


def test_cpu_alone_a_request_takes_its_table_cycles_over_the_clock() -> None:
    story = Story(NO_NETWORK_INSTANT_DISK)
    story.request("getattr", 1.0, META_READ)
    story.request("setattr", 2.0, META_WRITE)
    story.request("read", 3.0, BLOCK_READ, block(1, 0))
    story.request("write", 4.0, BLOCK_WRITE, block(1, 1))
    story.request("read 4 blocks", 5.0, BLOCK_READ, block(2, 0), nblocks=4)
    story.run()
    assert story.done["getattr"] - 1.0 == pytest.approx(33_000 / 133e6)
    assert story.done["setattr"] - 2.0 == pytest.approx(64_000 / 133e6)
    assert story.done["read"] - 3.0 == pytest.approx(100_000 / 133e6)
    assert story.done["write"] - 4.0 == pytest.approx(199_000 / 133e6)
    assert story.done["read 4 blocks"] - 5.0 == pytest.approx(4 * 100_000 / 133e6)


def test_cpu_alone_cost_scales_with_server_speed() -> None:
    fast = dataclasses.replace(NO_NETWORK_INSTANT_DISK, server_speed=2.0)
    story = Story(fast)
    story.request("getattr", 0.0, META_READ)
    story.run()
    assert story.done["getattr"] == pytest.approx(33_000 / 266e6)


def test_cpu_alone_a_burst_is_served_first_come_first_served() -> None:
    """n requests at once: the k-th leaves at k*S, mean response (n+1)/2 * S."""
    story = Story(NO_NETWORK_INSTANT_DISK)
    for k in range(10):
        story.request(f"r{k}", 0.0, META_READ, file=k)
    story.run()
    service = 33_000 / 133e6
    for k in range(10):
        assert story.done[f"r{k}"] == pytest.approx((k + 1) * service)
    assert story.stats.mean_response_s == pytest.approx(5.5 * service)
    assert story.stats.cpu_queue_s == pytest.approx(sum(k * service for k in range(10)))


def test_disk_alone_a_miss_costs_a_seek_plus_transfer() -> None:
    story = Story(INSTANT_CPU)
    story.request("miss", 0.0, BLOCK_READ, block(1, 0))
    story.request("two-block miss", 1.0, BLOCK_READ, block(2, 0), nblocks=2)
    story.run()
    assert story.done["miss"] == pytest.approx(DISK_BLOCK_S)
    assert story.done["two-block miss"] - 1.0 == pytest.approx(0.008 + 2 * 8192 / 10e6)
    assert story.stats.disk_service_s == pytest.approx(DISK_BLOCK_S + 0.008 + 2 * 8192 / 10e6)


def test_disk_alone_a_burst_of_misses_queues_fifo() -> None:
    story = Story(INSTANT_CPU)
    for k in range(5):
        story.request(f"r{k}", 0.0, BLOCK_READ, block(k, 0))
    story.run()
    for k in range(5):
        assert story.done[f"r{k}"] == pytest.approx((k + 1) * DISK_BLOCK_S)
    assert story.stats.disk_queue_s == pytest.approx(sum(k * DISK_BLOCK_S for k in range(5)))


def test_a_request_for_a_block_in_flight_waits_then_hits() -> None:
    story = Story(INSTANT_CPU)
    story.request("first", 0.0, BLOCK_READ, block(1, 7))
    story.request("second", 1 * MS, BLOCK_READ, block(1, 7))
    story.request("third, later", 20 * MS, BLOCK_READ, block(1, 7))
    story.run()
    # The second finds the block locked by the first's disk read and finishes with it.
    assert story.done["first"] == pytest.approx(DISK_BLOCK_S)
    assert story.done["second"] == pytest.approx(DISK_BLOCK_S)
    assert story.done["third, later"] == pytest.approx(20 * MS)
    assert story.stats.block_accesses == 3
    assert story.stats.block_hits == 2
    assert story.stats.lock_waits == 1
    # The wait shows as cache waiting, not as disk time.
    assert story.stats.cache_wait_s == pytest.approx(DISK_BLOCK_S - 1 * MS)
    assert story.stats.disk_service_s == pytest.approx(DISK_BLOCK_S)


def test_when_every_block_is_locked_a_miss_waits_for_a_free_block() -> None:
    tiny = ServerConfig(server_speed=float("inf"), cache_blocks=2, mobile_footprint_bytes=0)
    story = Story(tiny)
    for k in range(3):
        story.request(f"r{k}", 0.0, BLOCK_READ, block(k, 0))
    story.run()
    # r0 and r1 lock both blocks; r2 may only start its read when r0's block unlocks,
    # and its disk access then queues behind r1's.
    assert story.done["r0"] == pytest.approx(DISK_BLOCK_S)
    assert story.done["r1"] == pytest.approx(2 * DISK_BLOCK_S)
    assert story.done["r2"] == pytest.approx(3 * DISK_BLOCK_S)
    r2 = story.requests["r2"]
    assert r2.disk_queue_s == pytest.approx(DISK_BLOCK_S)
    assert story.server.resident_blocks() == 2
    assert block(0, 0) not in story.server.lru  # r0's block was evicted for r2


def test_write_through_every_write_goes_to_disk_and_stays_cached() -> None:
    story = Story(INSTANT_CPU)
    story.request("write", 0.0, BLOCK_WRITE, block(3, 0))
    story.request("write again", 1.0, BLOCK_WRITE, block(3, 0))
    story.request("read back", 2.0, BLOCK_READ, block(3, 0))
    story.run()
    assert story.done["write"] == pytest.approx(DISK_BLOCK_S)
    assert story.done["write again"] - 1.0 == pytest.approx(DISK_BLOCK_S)
    assert story.done["read back"] == pytest.approx(2.0)
    assert story.stats.read_hits == 1
    assert story.stats.block_hits == 2  # the second write found its block cached


def test_lru_evicts_the_least_recently_used_block() -> None:
    config = ServerConfig(server_speed=float("inf"), cache_blocks=2, mobile_footprint_bytes=0)
    story = Story(config, warm_blocks=[block(1, 0), block(2, 0)])
    story.request("touch 1", 0.0, BLOCK_READ, block(1, 0))  # 2 is now least recent
    story.request("miss 3", 1.0, BLOCK_READ, block(3, 0))
    story.request("1 still there", 2.0, BLOCK_READ, block(1, 0))
    story.request("2 was evicted", 3.0, BLOCK_READ, block(2, 0))
    story.run()
    assert story.done["1 still there"] == pytest.approx(2.0)
    assert story.done["2 was evicted"] - 3.0 == pytest.approx(DISK_BLOCK_S)


def test_infinite_cache_grows_on_every_miss() -> None:
    config = ServerConfig(server_speed=float("inf"), cache_infinite=True, cache_blocks=101)
    story = Story(config)
    for k in range(500):
        story.request(f"miss {k}", k * 1.0, BLOCK_READ, block(k, 0))
    for k in range(500):
        story.request(f"hit {k}", 1000.0 + k, BLOCK_READ, block(k, 0))
    story.run()
    assert story.server.resident_blocks() == 500
    assert story.stats.block_hits == 500


def test_metadata_cache_is_infinite_and_metadata_writes_go_through() -> None:
    story = Story(INSTANT_CPU)
    story.request("first lookup", 0.0, META_READ, file=9)
    story.request("second lookup", 1.0, META_READ, file=9)
    story.request("setattr", 2.0, META_WRITE, file=9)
    story.run()
    metadata_disk_s = 0.008 + 8192 / 10e6
    assert story.done["first lookup"] == pytest.approx(metadata_disk_s)
    assert story.done["second lookup"] == pytest.approx(1.0)
    assert story.done["setattr"] - 2.0 == pytest.approx(metadata_disk_s)
    assert (story.stats.metadata_accesses, story.stats.metadata_hits) == (3, 2)


def test_response_parts_add_up_to_the_response_time() -> None:
    story = Story(ServerConfig(cache_blocks=101))
    for k in range(40):
        story.request(f"r{k}", k * 0.001, BLOCK_READ if k % 3 else META_READ, block(k % 7, 0))
    story.run()
    parts = sum(story.stats.breakdown_s().values())
    assert parts == pytest.approx(story.stats.mean_response_s)


def test_mobile_code_gets_only_idle_cycles() -> None:
    """1 s of mobile work on a CPU that file requests keep busy 0.25 s of every 1 s."""
    config = ServerConfig(
        metadata_read_cycles=0.25 * 133e6, disk_seek_s=0.0, disk_bandwidth_bytes_per_s=1e30
    )
    story = Story(config)
    finished: list[float] = []

    def record(now: float, _: object) -> None:
        finished.append(now)

    story.kernel.at(
        0.0, lambda now, _: story.server.compute(now, 1.0, lambda t, _: finished.append(t))
    )
    for k in range(4):
        story.request(f"r{k}", 0.5 + k, META_READ, file=0)
    story.run()
    # Idle 0-0.5 (0.5 done), busy 0.5-0.75, idle 0.75-1.25 (1.0 done).
    assert finished == [pytest.approx(1.25)]


def test_mobile_code_starves_while_the_cpu_is_saturated() -> None:
    config = ServerConfig(metadata_read_cycles=133e6, disk_seek_s=0.0)
    story = Story(config)
    finished: list[float] = []

    def record(now: float, _: object) -> None:
        finished.append(now)

    story.kernel.at(
        0.0, lambda now, _: story.server.compute(now, 0.5, lambda t, _: finished.append(t))
    )
    for k in range(10):  # ten 1-second requests, all at once
        story.request(f"r{k}", 0.0, META_READ, file=k)
    story.run()
    assert finished == [pytest.approx(10.5)]


def test_two_disk_units_serve_two_misses_at_once() -> None:
    config = ServerConfig(server_speed=float("inf"), disk_parallelism=2)
    story = Story(config)
    for i, name in enumerate("abc"):
        story.request(name, 0.0, BLOCK_READ, block(1, i))
    story.run()
    access = 0.008 + 8192 / 10e6
    assert story.done == pytest.approx({"a": access, "b": access, "c": 2 * access})


def test_the_mobile_program_takes_locked_blocks_as_they_are_unlocked() -> None:
    """Reserving more than the unlocked part: the capacity comes down block by block,
    and cached + locked never exceeds it."""
    story = Story(ServerConfig(server_speed=float("inf"), cache_blocks=4, mobile_footprint_bytes=0))
    for i in range(4):
        story.request(f"r{i}", 0.0, BLOCK_READ, block(1, i))
    resident: list[tuple[int, int | None]] = []

    def reserve(now: float, _: object) -> None:
        story.server.reserve(now, 3)
        resident.append((story.server.resident_blocks(), story.server.capacity))

    def look(now: float, _: object) -> None:
        resident.append((story.server.resident_blocks(), story.server.capacity))

    story.kernel.at(0.001, reserve)  # all 4 blocks are locked (being read)
    story.kernel.at(0.009, look)  # the first read is done
    story.run()
    assert resident[0] == (4, 4)  # nothing unlocked to evict yet
    assert resident[1] == (3, 3)  # one unlocked, evicted, capacity down by one
    assert (story.server.resident_blocks(), story.server.capacity) == (1, 1)
    story.server.release(1.0, 3)
    assert story.server.capacity == 4


def test_the_mobile_programs_requests_wait_for_idle_cycles() -> None:
    """With the paper's priority rule its request waits behind every client request,
    including those arriving after it; queued FIFO it would not."""
    cost = 33_000 / 133e6
    for idle, expected in ((True, 3 * cost), (False, 2 * cost)):
        config = dataclasses.replace(NO_NETWORK_INSTANT_DISK, mobile_requests_on_idle_cycles=idle)
        story = Story(config, warm_blocks=None)
        story.server.metadata.add(0)
        story.request("client 1", 0.0, META_READ)
        mine = Request(META_READ, 0, 0, 1, 0.0, 0.0, 0.0, story.stats, True, local=False)
        mine.on_done = lambda now, r, done=story.done: done.__setitem__("mobile", now)
        arrive = story.server.arrive_idle if idle else story.server.arrive
        story.kernel.at(cost / 2, arrive, mine)
        story.request("client 2", cost / 2 + cost / 4, META_READ)
        story.run()
        assert story.done["mobile"] == pytest.approx(expected), idle
