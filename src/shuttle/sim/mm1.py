"""M/M/1 on our kernel and on SimPy, with the same random draws: the kernel benchmark.

Both models serve the same customers: interarrival and service times are drawn once
(numpy, one seed) and handed to both. Arrival times are the running sum of the
interarrival times, service starts at max(arrival, previous departure), and a
customer's delay is departure minus arrival. Both kernels compute these with the same
float additions in the same order, so the mean delays are bit-identical; any
difference is a bug in one of the kernels.

Events are counted as the model sees them: one arrival and one departure per
customer. SimPy schedules more internal events than that for the same model (process
starts, resource requests and releases); its count is reported separately.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from shuttle.errors import ConfigError
from shuttle.sim.kernel import Kernel

#: Defaults of ``shuttle sim bench-kernel``: the issue's model and size.
UTILISATION = 0.8
EVENTS_DEFAULT = 1_000_000


@dataclass(frozen=True, slots=True)
class Draws:
    """Per-customer interarrival and service times (seconds, mean service 1 s)."""

    interarrival_s: list[float]
    service_s: list[float]


def draw(customers: int, utilisation: float, seed: int) -> Draws:
    """Exponential interarrival (rate ``utilisation``) and service (rate 1) times."""
    if customers < 1:
        raise ConfigError(f'"customers" must be >= 1, got {customers}')
    if not 0.0 < utilisation < 1.0:
        raise ConfigError(f'"utilisation" must be in (0, 1), got {utilisation}')
    rng = np.random.default_rng(seed)
    interarrival = rng.exponential(1.0 / utilisation, customers).tolist()
    service = rng.exponential(1.0, customers).tolist()
    return Draws(interarrival, service)


def mean_delay_theory_s(utilisation: float, service_mean_s: float = 1.0) -> float:
    """M/M/1 mean time in system: 1 / (mu - lambda)."""
    return service_mean_s / (1.0 - utilisation)


class _KernelMM1:
    """M/M/1 FIFO on :class:`Kernel`: two handlers, a deque for the queue."""

    def __init__(self, kernel: Kernel, draws: Draws) -> None:
        self.kernel = kernel
        self.interarrival = draws.interarrival_s
        self.service = draws.service_s
        self.customers = len(draws.service_s)
        self.arrival_s = [0.0] * self.customers
        self.delay_s = [0.0] * self.customers
        self.queue: deque[int] = deque()
        self.busy = False
        self.schedule = kernel.schedule

    def start(self) -> None:
        self.kernel.at(self.interarrival[0], self.arrive, 0)

    def arrive(self, now: float, customer: int) -> None:
        self.arrival_s[customer] = now
        following = customer + 1
        if following < self.customers:
            self.schedule(now + self.interarrival[following], self.arrive, following)
        if self.busy:
            self.queue.append(customer)
        else:
            self.busy = True
            self.schedule(now + self.service[customer], self.depart, customer)

    def depart(self, now: float, customer: int) -> None:
        self.delay_s[customer] = now - self.arrival_s[customer]
        if self.queue:
            waiting = self.queue.popleft()
            self.schedule(now + self.service[waiting], self.depart, waiting)
        else:
            self.busy = False


def run_kernel(draws: Draws, seed: int = 0) -> tuple[float, int, float]:
    """Run M/M/1 on our kernel: (mean delay s, events, wall s)."""
    kernel = Kernel(seed)
    model = _KernelMM1(kernel, draws)
    model.start()
    began = time.perf_counter()
    kernel.run()
    wall_s = time.perf_counter() - began
    return _mean(model.delay_s), kernel.events_processed, wall_s


def run_simpy(draws: Draws) -> tuple[float, int, float]:
    """Run M/M/1 on SimPy: (mean delay s, SimPy's internal events, wall s).

    Raises :class:`~shuttle.errors.ConfigError` if SimPy is not installed (it is a
    dev dependency: ``scripts/setup.sh --dev``).
    """
    try:
        import simpy
    except ImportError as exc:
        raise ConfigError(
            "SimPy is not installed; the kernel benchmark compares against it. "
            "Install the dev dependencies: scripts/setup.sh --dev"
        ) from exc
    interarrival = draws.interarrival_s
    service = draws.service_s
    customers = len(service)
    delay_s = [0.0] * customers
    env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)

    def customer(index: int) -> Any:
        arrived = env.now
        with server.request() as request:
            yield request
            yield env.timeout(service[index])
        delay_s[index] = env.now - arrived

    def source() -> Any:
        for index in range(customers):
            yield env.timeout(interarrival[index])
            env.process(customer(index))

    env.process(source())
    began = time.perf_counter()
    env.run()
    wall_s = time.perf_counter() - began
    # SimPy numbers every event it schedules with one counter.
    simpy_events = int(next(env._eid))
    return _mean(delay_s), simpy_events, wall_s


def _mean(values: list[float]) -> float:
    # A plain left-to-right sum: both kernels' delays are summed the same way.
    total = 0.0
    for value in values:
        total += value
    return total / len(values)


@dataclass(frozen=True, slots=True)
class KernelBench:
    """The result of ``shuttle sim bench-kernel``."""

    events: int
    customers: int
    utilisation: float
    seed: int
    events_per_s: float
    simpy_events_per_s: float
    ratio_vs_simpy: float
    mean_delay_s: float
    simpy_mean_delay_s: float
    mean_delay_theory_s: float
    identical: bool
    wall_s: float
    simpy_wall_s: float
    simpy_internal_events: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def bench(
    events: int = EVENTS_DEFAULT, utilisation: float = UTILISATION, seed: int = 0
) -> KernelBench:
    """Run the same M/M/1 (``events`` model events) on both kernels and compare."""
    if events < 2:
        raise ConfigError(f'"events" must be >= 2, got {events}')
    customers = events // 2
    draws = draw(customers, utilisation, seed)
    mean_ours, processed, wall = run_kernel(draws, seed)
    mean_simpy, simpy_internal, simpy_wall = run_simpy(draws)
    ours_per_s = processed / wall if wall > 0 else math.inf
    simpy_per_s = processed / simpy_wall if simpy_wall > 0 else math.inf
    return KernelBench(
        events=processed,
        customers=customers,
        utilisation=utilisation,
        seed=seed,
        events_per_s=ours_per_s,
        simpy_events_per_s=simpy_per_s,
        ratio_vs_simpy=ours_per_s / simpy_per_s,
        mean_delay_s=mean_ours,
        simpy_mean_delay_s=mean_simpy,
        mean_delay_theory_s=mean_delay_theory_s(utilisation),
        identical=mean_ours == mean_simpy,
        wall_s=wall,
        simpy_wall_s=simpy_wall,
        simpy_internal_events=simpy_internal,
    )
