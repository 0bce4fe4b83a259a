"""The mobile program alone: no background trace, an otherwise idle server.

The paper always runs its mobile application inside an interval of background
traffic (:func:`shuttle.sim.run.simulate_interval`). To predict a program on a live
cluster that serves nobody else, :func:`simulate_alone` runs its trace by itself on the
same server model: the same CPU, caches, disk and network, with nothing competing.
``warm`` preloads the server's caches with everything the program touches (its data
in the node's memory, as it is after one run); cold, the program's first touch of
each block goes to the disk.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from typing import Any

import numpy as np

from shuttle.errors import InvalidArgumentError
from shuttle.sim.config import ServerConfig
from shuttle.sim.kernel import Kernel
from shuttle.sim.metrics import MobileStats, TrafficStats
from shuttle.sim.mobile import APP_PLACEMENTS, MobileApp
from shuttle.sim.server import Server
from shuttle.sim.workload import BLOCK_READ, MOBILE_FILE_BASE, Columns, block_keys


@dataclass(frozen=True, slots=True)
class AloneResult:
    """One run of the mobile program by itself."""

    placement: str
    run_time_s: float
    mobile: MobileStats
    requests: TrafficStats
    #: Server CPU seconds: all of it, and the mobile program's own computing.
    server_cpu_s: float
    server_mobile_cpu_s: float
    disk_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "placement": self.placement,
            "run_time_s": self.run_time_s,
            "mobile": self.mobile.to_json(),
            "requests": self.requests.to_json(),
            "server_cpu_s": self.server_cpu_s,
            "server_mobile_cpu_s": self.server_mobile_cpu_s,
            "disk_s": self.disk_s,
        }


def warm_contents(trace: Columns, config: ServerConfig) -> tuple[list[int], list[int]]:
    """The blocks (least recently used first) and metadata files of ``trace``, as the
    mobile application names them: a cache that holds everything it will touch."""
    keys = block_keys(trace, config.block_size_bytes, MOBILE_FILE_BASE)
    _, first = np.unique(keys[::-1], return_index=True)
    order = np.sort(len(keys) - 1 - first)  # each block at its last access, in order
    files = np.unique(trace.file[trace.kind < BLOCK_READ] + MOBILE_FILE_BASE)
    return keys[order].tolist(), files.tolist()


def simulate_alone(
    config: ServerConfig, trace: Columns, placement: str, *, warm: bool = True
) -> AloneResult:
    """Run ``trace`` at ``placement`` (client or server) on an idle server.

    Raises :class:`~shuttle.errors.InvalidArgumentError` for an unknown placement."""
    if placement not in APP_PLACEMENTS:
        raise InvalidArgumentError(
            f"placement must be one of {', '.join(APP_PLACEMENTS)}, not {placement!r}"
        )
    kernel = Kernel()
    blocks, files = warm_contents(trace, config) if warm else ([], [])
    server = Server(kernel, config, blocks, files)
    stats = TrafficStats()
    app = MobileApp(server, config, trace, placement, stats)
    kernel.at(0.0, lambda now, _: app.start(now))
    collecting = gc.isenabled()
    gc.disable()
    try:
        kernel.run()
    finally:
        kernel.close()
        server.close()
        if collecting:
            gc.enable()
    if not app.done:  # pragma: no cover - an idle server finishes every request
        raise AssertionError("the mobile program did not finish on an idle server")
    return AloneResult(
        placement=placement,
        run_time_s=app.result.run_time_s,
        mobile=app.result,
        requests=stats,
        server_cpu_s=server.cpu_work_s + server.mobile_cpu_s,
        server_mobile_cpu_s=server.mobile_cpu_s,
        disk_s=server.disk_work_s,
    )
