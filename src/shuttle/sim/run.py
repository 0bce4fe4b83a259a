"""One simulation run: an interval of background traffic with the mobile application.

:func:`simulate_interval` is the unit every experiment repeats: it warms the caches
(a replay through the caches alone, then ``warmup_timed_s`` of full simulation),
starts the mobile application at the interval's start (at the client, at the
server, or not at all), feeds background requests at their traced times, and
measures until the interval's end -- or longer while the mobile application is
still running, up to ``overrun_s_max``. Background requests issued inside the
interval are measured; they are followed to completion.

Background requests are independent (section 3.2): each is issued at its traced time
(divided by the client speed) whatever happened to the ones before. Since the
network has no contention, a request's arrival at the server is known when it is
issued, so the background is fed in arrival order, one pending event at a time.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shuttle.errors import InvalidArgumentError
from shuttle.sim.blocks import block_keys
from shuttle.sim.config import ExperimentConfig, ServerConfig
from shuttle.sim.kernel import Kernel
from shuttle.sim.metrics import MobileStats, ResourceUse, TrafficStats
from shuttle.sim.mobile import PLACEMENTS, MobileApp
from shuttle.sim.server import Server
from shuttle.sim.workload import (
    BLOCK_READ,
    BLOCK_WRITE,
    Columns,
    Interval,
    WarmState,
    warm_cache_contents,
)

#: Background requests are turned into Python values this far ahead (seconds of
#: trace): the interval's records at once, the overrun only as far as it is needed.
_LOAD_AHEAD_S = 30.0


@dataclass(slots=True)
class RunResult:
    """What one run measured (deterministic: no wall-clock figures in here)."""

    interval: int
    placement: str
    background: TrafficStats
    mobile: TrafficStats
    mobile_run: MobileStats
    load: ResourceUse
    records: int
    events: int

    def to_json(self) -> dict[str, Any]:
        return {
            "interval": self.interval,
            "placement": self.placement,
            "background": self.background.to_json(),
            "mobile": self.mobile.to_json(),
            "mobile_run": self.mobile_run.to_json(),
            "load": self.load.to_json(),
            "records": self.records,
            "events": self.events,
        }


@dataclass(slots=True)
class RunTiming:
    """Wall-clock figures of one run, kept apart from the deterministic result."""

    wall_s: float = 0.0
    #: CPU seconds of this process: steadier than wall time on a shared machine.
    cpu_s: float = 0.0
    records: int = 0
    events: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class BackgroundFeeder:
    """Issues background requests in order of arrival at the server."""

    def __init__(
        self,
        server: Server,
        config: ServerConfig,
        columns: Columns,
        stats: TrafficStats,
        measure_from_s: float,
        measure_to_s: float,
        stop_s_max: float,
    ) -> None:
        self.server = server
        self.stats = stats
        self.measure_to_s = measure_to_s
        self.stop_s_max = stop_s_max
        #: Set when the mobile application finishes: the feed may stop after the interval.
        self.mobile_done = False
        self.fed = 0
        speed = config.client_speed
        issue = columns.time_s / speed
        kind = columns.kind.astype(np.int64)
        first, nblocks = columns.block_range(config.block_size_bytes)
        is_block = kind >= BLOCK_READ
        data = np.where(is_block, nblocks * config.block_size_bytes, 0)
        small = config.network_s(0)
        per_bit = 8.0 / config.network_bandwidth_bits_per_s
        with_data = small + data * per_bit
        out_s = np.where(kind == BLOCK_WRITE, with_data, small)
        back_s = np.where(kind == BLOCK_READ, with_data, small)
        arrival = issue + out_s
        order = np.argsort(arrival, kind="stable")
        issued = issue[order]
        # Sorted columns; they become Python values piece by piece (see _events).
        self._arrival = arrival[order]
        self._columns = (
            kind[order],
            columns.file[order],
            block_keys(columns.file, first)[order],
            nblocks[order],
            issued,
            (out_s + back_s)[order],
            back_s[order],
            (issued >= measure_from_s) & (issued < measure_to_s),
        )

    def _events(self) -> Iterator[tuple[float, tuple[Any, ...]]]:
        """(arrival, request) in arrival order, converted _LOAD_AHEAD_S at a time.

        A request is (kind, file, first block key, blocks, issue time, network time,
        reply time, measured). Converting lazily keeps only a slice of the trace in
        Python objects (about 350 bytes a request) and converts nothing past the
        point where the run stops.
        """
        arrival = self._arrival
        count = len(arrival)
        lo = 0
        while lo < count:
            hi = int(np.searchsorted(arrival, arrival[lo] + _LOAD_AHEAD_S, side="right"))
            hi = max(hi, lo + 1)
            requests = zip(*(c[lo:hi].tolist() for c in self._columns), strict=True)
            yield from zip(arrival[lo:hi].tolist(), requests, strict=True)
            lo = hi

    def start(self) -> None:
        """Attach the requests to the server's kernel as a stream in arrival order."""
        self.server.kernel.stream(self._events(), self._arrive)

    def _arrive(self, now: float, request: tuple[Any, ...]) -> None:
        if now > self.measure_to_s and (self.mobile_done or now > self.stop_s_max):
            # Past the interval and nobody left to load the server for: stop.
            self.server.kernel.end_stream()
            return
        self.fed += 1
        self.server.arrive_independent(now, request, self.stats)  # type: ignore[arg-type]


def simulate_interval(
    config: ServerConfig,
    experiment: ExperimentConfig,
    placement: str,
    interval: Interval,
    background: Columns,
    warm: WarmState,
    mobile_trace: Columns | None,
    timing: RunTiming | None = None,
) -> RunResult:
    """Simulate ``interval`` with the mobile application at ``placement``.

    ``background`` must hold the records from ``interval.start_s -
    experiment.warmup_timed_s`` to at least ``interval.end_s + experiment.overrun_s_max``
    (more is ignored); ``warm`` is the cache state at the start of that slice.
    """
    if placement not in PLACEMENTS:
        raise InvalidArgumentError(f"placement must be one of {PLACEMENTS}, not {placement!r}")
    began = time.perf_counter()
    began_cpu = time.process_time()
    speed = config.client_speed
    start_s = interval.start_s / speed
    end_s = interval.end_s / speed
    stop_s_max = end_s + experiment.overrun_s_max
    timed_from = interval.start_s - experiment.warmup_timed_s
    columns = background.window(timed_from, interval.end_s + experiment.overrun_s_max * speed)

    kernel = Kernel(experiment.seed)
    capacity = None if config.cache_infinite else config.cache_blocks
    server = Server(kernel, config, warm.blocks_for(capacity), warm.metadata_files.tolist())
    background_stats = TrafficStats()
    mobile_stats = TrafficStats()
    feeder = BackgroundFeeder(server, config, columns, background_stats, start_s, end_s, stop_s_max)
    feeder.start()

    app: MobileApp | None = None
    if placement != "none" and mobile_trace is not None:

        def finished(now: float) -> None:
            feeder.mobile_done = True

        app = MobileApp(server, config, mobile_trace, placement, mobile_stats, finished)
        kernel.at(start_s, lambda now, _: app.start(now))  # type: ignore[union-attr]
    else:
        feeder.mobile_done = True

    load = ResourceUse(window_s=end_s - start_s)
    marks: dict[str, float] = {}

    def mark(now: float, name: str) -> None:
        marks[name + "_cpu"] = server.cpu_work_s
        marks[name + "_disk"] = server.disk_work_s
        marks[name + "_mobile"] = server.mobile_cpu_s

    kernel.at(start_s, mark, "start")
    kernel.at(end_s, mark, "end")
    # A run allocates millions of short-lived objects and holds millions of tuples;
    # the cyclic garbage collector would traverse them again and again for nothing
    # (the model makes no reference cycles it needs collected). Off while running.
    collecting = gc.isenabled()
    gc.disable()
    try:
        kernel.run(until=stop_s_max)
        if app is not None and not app.done:
            app.abandon(kernel.now)
        kernel.run()  # the measured requests still in the server finish
    finally:
        # The model's parts refer to each other (kernel -> handlers -> server ->
        # kernel); breaking the cycles frees the run now, not at some later
        # collection (workers running many runs would otherwise grow by gigabytes).
        kernel.close()
        server.close()
        if collecting:
            gc.enable()
    load.cpu_busy_s = marks["end_cpu"] - marks["start_cpu"]
    # Per unit of the device: above 1 means saturated, whatever its parallelism.
    load.disk_busy_s = (marks["end_disk"] - marks["start_disk"]) / config.disk_parallelism
    load.mobile_cpu_s = marks["end_mobile"] - marks["start_mobile"]

    mobile_run = app.result if app is not None else MobileStats(placement=placement)
    result = RunResult(
        interval=interval.index,
        placement=placement,
        background=background_stats,
        mobile=mobile_stats,
        mobile_run=mobile_run,
        load=load,
        records=feeder.fed,
        events=kernel.events_processed,
    )
    if timing is not None:
        timing.wall_s += time.perf_counter() - began
        timing.cpu_s += time.process_time() - began_cpu
        timing.records += feeder.fed
        timing.events += kernel.events_processed
    return result


def warm_state_for(
    background: Columns, interval: Interval, experiment: ExperimentConfig, block_size_bytes: int
) -> WarmState:
    """Replay the warm-up before ``interval`` (all but its timed tail) through the caches."""
    warm_from = interval.start_s - experiment.warmup_s
    warm_to = interval.start_s - experiment.warmup_timed_s
    if warm_to <= warm_from:
        return warm_cache_contents(background.window(0.0, -math.inf), block_size_bytes)
    return warm_cache_contents(background.window(warm_from, warm_to), block_size_bytes)
