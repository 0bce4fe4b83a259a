"""Queueing at the server's CPU and disk against the closed forms.

Poisson arrivals, one resource singled out as in section 3.3.5:

* M/D/1 at the CPU (no network, an instantly fast disk, metadata reads of fixed cost):
  mean response S + rho S / (2 (1 - rho)).
* M/D/1 at the disk (an infinitely fast CPU, every read a miss of one block).
* M/G/1 at the disk with geometric request sizes (Pollaczek-Khinchine):
  S_mean + lambda E[S^2] / (2 (1 - rho)).

(M/M/1 is checked on the kernel itself, in test_kernel.py.)
"""

from __future__ import annotations

import random

import pytest

from shuttle.sim.blocks import BLOCK_BITS
from shuttle.sim.config import ServerConfig
from shuttle.sim.kernel import Kernel
from shuttle.sim.metrics import TrafficStats
from shuttle.sim.server import Request, Server
from shuttle.sim.workload import BLOCK_READ, META_READ

CUSTOMERS = 60_000
#: Tolerance on the mean response time at this many customers.
RELATIVE = 0.06


def md1_response_s(service_s: float, utilisation: float) -> float:
    return service_s + utilisation * service_s / (2.0 * (1.0 - utilisation))


def poisson_run(config: ServerConfig, rate: float, make: object, seed: int) -> TrafficStats:
    """Feed CUSTOMERS Poisson arrivals; ``make(k, rng)`` gives (kind, first, nblocks, file)."""
    kernel = Kernel(seed)
    server = Server(kernel, config, warm_files=[0])
    stats = TrafficStats()
    rng = kernel.random("arrivals")
    now = 0.0
    for k in range(CUSTOMERS):
        now += rng.expovariate(rate)
        kind, first, nblocks, file = make(k, rng)  # type: ignore[operator]
        kernel.at(
            now, server.arrive, Request(kind, file, first, nblocks, now, 0.0, 0.0, stats, True)
        )
    kernel.run()
    assert stats.requests == CUSTOMERS
    return stats


@pytest.mark.parametrize("utilisation", [0.3, 0.6, 0.8])
def test_cpu_is_md1(utilisation: float) -> None:
    config = ServerConfig(
        disk_seek_s=0.0,
        disk_bandwidth_bytes_per_s=float("inf"),
        network_latency_s=0.0,
        network_bandwidth_bits_per_s=float("inf"),
    )
    service = 33_000 / 133e6
    stats = poisson_run(config, utilisation / service, lambda k, rng: (META_READ, 0, 1, 0), seed=1)
    assert stats.mean_response_s == pytest.approx(
        md1_response_s(service, utilisation), rel=RELATIVE
    )
    assert stats.disk_service_s == 0.0


@pytest.mark.parametrize("utilisation", [0.3, 0.6, 0.8])
def test_disk_is_md1(utilisation: float) -> None:
    config = ServerConfig(server_speed=float("inf"), cache_blocks=101)
    service = 0.008 + 8192 / 10e6
    stats = poisson_run(
        config,
        utilisation / service,
        lambda k, rng: (BLOCK_READ, (k + 1) << BLOCK_BITS, 1, k + 1),
        seed=2,
    )
    assert stats.block_hits == 0
    assert stats.mean_response_s == pytest.approx(
        md1_response_s(service, utilisation), rel=RELATIVE
    )


@pytest.mark.parametrize("utilisation", [0.5, 0.8])
def test_disk_with_geometric_sizes_is_mg1(utilisation: float) -> None:
    """No seek, sizes of 1, 2, 3, ... blocks with P(n) = p (1-p)^(n-1)."""
    p = 0.25
    unit = 8192 / 10e6
    config = ServerConfig(server_speed=float("inf"), cache_infinite=True, disk_seek_s=0.0)
    mean_s = unit / p
    second_moment = unit * unit * (2.0 - p) / (p * p)
    rate = utilisation / mean_s

    def make(k: int, rng: random.Random) -> tuple[int, int, int, int]:
        n = 1
        while rng.random() > p:
            n += 1
        return BLOCK_READ, (k + 1) << BLOCK_BITS, n, k + 1

    stats = poisson_run(config, rate, make, seed=3)
    expected = mean_s + rate * second_moment / (2.0 * (1.0 - utilisation))
    assert stats.mean_response_s == pytest.approx(expected, rel=RELATIVE)
