"""The mobile application: a dependent trace replayed at the client or at the server.

The trace's time gaps are pure think time (computation) measured on a CPU of speed
``mobile_trace_speed``; I/O is taken as instantaneous in the recording. Replay is
dependent (section 3.1): record *i+1* is issued when record *i* has completed and
the think time between them has passed, scaled by the speed of the CPU the
application runs on.

* At the client, thinking is a plain delay (the client CPU is the application's
  own). Block accesses go through a client LRU cache first (write-through); what
  misses goes to the server over the network in RPCs of at most
  ``client_request_bytes_max``, one after another. Every other operation is a
  metadata request to the server.
* At the server, thinking runs on the server CPU's idle cycles
  (:meth:`~shuttle.sim.server.Server.compute`); requests are local calls (no network,
  a fraction of the CPU cost) and the program holds ``mobile_footprint_bytes`` of
  the server's block cache for its whole run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.sim.blocks import block_keys
from shuttle.sim.config import ServerConfig
from shuttle.sim.metrics import MobileStats, TrafficStats
from shuttle.sim.policies import LRU
from shuttle.sim.server import Request, Server
from shuttle.sim.workload import BLOCK_READ, BLOCK_WRITE, MOBILE_FILE_BASE, Columns

#: Where the mobile application can run.
APP_PLACEMENTS = ("client", "server")
#: Where an experiment can put it: "none" measures the background alone.
PLACEMENTS = (*APP_PLACEMENTS, "none")


class MobileApp:
    """One run of the mobile application's trace, from ``start_s`` until its last I/O."""

    def __init__(
        self,
        server: Server,
        config: ServerConfig,
        trace: Columns,
        placement: str,
        stats: TrafficStats,
        on_finish: Callable[[float], None] | None = None,
    ) -> None:
        if placement not in APP_PLACEMENTS:
            raise InvalidArgumentError(
                f"placement must be one of {APP_PLACEMENTS}, not {placement!r}"
            )
        self.server = server
        self.config = config
        self.placement = placement
        self.at_server = placement == "server"
        self.stats = stats
        self.result = MobileStats(placement=placement, records=len(trace))
        self.on_finish = on_finish
        self.schedule = server.kernel.schedule
        first, count = trace.block_range(config.block_size_bytes)
        self.kinds: list[int] = trace.kind.tolist()
        self.files: list[int] = (trace.file + MOBILE_FILE_BASE).tolist()
        self.firsts: list[int] = block_keys(trace.file + MOBILE_FILE_BASE, first).tolist()
        self.counts: list[int] = count.tolist()
        speed = config.server_speed if self.at_server else config.client_speed
        scale = config.mobile_trace_speed / speed
        times = trace.time_s.tolist()
        # Think time before record i (the first: from the trace's own start).
        self.think_s: list[float] = [
            (times[i] - (times[i - 1] if i else 0.0)) * scale for i in range(len(times))
        ]
        self.index = 0
        self.done = False
        self.abandoned = False
        self.client_cache = LRU(config.client_cache_blocks)
        self.rpc_blocks = max(1, config.client_request_bytes_max // config.block_size_bytes)
        #: Server requests still to send for the current record (client placement).
        self.pending: list[tuple[int, int, int]] = []
        self.net_small_s = config.network_s(0)
        self.block_size = config.block_size_bytes

    # --- life cycle -------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Start the application at ``now`` (the interval's start)."""
        self.result.started_s = now
        if self.at_server:
            self.server.reserve(now, self.config.mobile_blocks)
        if not self.kinds:
            self._finish(now)
            return
        self._think(now)

    def abandon(self, now: float) -> None:
        """Stop where it is (the run's time limit): report it as unfinished."""
        self.abandoned = True
        self.result.run_time_s = now - self.result.started_s
        self._release(now)

    def _finish(self, now: float) -> None:
        self.done = True
        self.result.finished = True
        self.result.run_time_s = now - self.result.started_s
        self._release(now)
        if self.on_finish is not None:
            self.on_finish(now)

    def _release(self, now: float) -> None:
        if self.at_server:
            self.server.release(now, self.config.mobile_blocks)

    # --- think, issue, complete -------------------------------------------------------

    def _think(self, now: float) -> None:
        think = self.think_s[self.index]
        self.result.compute_s += think
        if self.at_server:
            if think > 0.0:
                self.server.compute(now, think, self._issue)
            else:
                self._issue(now, None)
        else:
            self.schedule(now + think, self._issue, None)

    def _issue(self, now: float, _: Any) -> None:
        if self.abandoned:
            return
        i = self.index
        kind = self.kinds[i]
        if self.at_server:
            self._send(now, kind, self.files[i], self.firsts[i], self.counts[i])
            return
        if kind < BLOCK_READ:
            self._send(now, kind, self.files[i], self.firsts[i], 1)
            return
        # Client placement: the client cache filters block accesses.
        touch = self.client_cache.access
        result = self.result
        first = self.firsts[i]
        runs: list[tuple[int, int, int]] = []
        run_start = -1
        for key in range(first, first + self.counts[i]):
            result.client_cache_accesses += 1
            hit = touch(key)
            if hit:
                result.client_cache_hits += 1
            # Reads fetch what missed; writes go through whole.
            if kind == BLOCK_WRITE or not hit:
                if run_start < 0:
                    run_start = key
            elif run_start >= 0:
                runs.extend(self._rpcs(kind, run_start, key))
                run_start = -1
        if run_start >= 0:
            runs.extend(self._rpcs(kind, run_start, first + self.counts[i]))
        if not runs:
            self._next(now)
            return
        runs.reverse()
        self.pending = runs
        kind, start, count = runs.pop()
        self._send(now, kind, self.files[i], start, count)

    def _rpcs(self, kind: int, start: int, end: int) -> list[tuple[int, int, int]]:
        step = self.rpc_blocks
        return [(kind, key, min(step, end - key)) for key in range(start, end, step)]

    def _send(self, now: float, kind: int, file: int, first: int, nblocks: int) -> None:
        config = self.config
        if self.at_server:
            req = Request(kind, file, first, nblocks, now, 0.0, 0.0, self.stats, True, True)
            req.on_done = self._reply
            if config.mobile_requests_on_idle_cycles:
                self.server.arrive_idle(now, req)
            else:
                self.server.arrive(now, req)
            return
        data = nblocks * self.block_size if kind >= BLOCK_READ else 0
        small = self.net_small_s
        if kind == BLOCK_READ:
            out_s, back_s = small, config.network_s(data)
        elif kind == BLOCK_WRITE:
            out_s, back_s = config.network_s(data), small
        else:
            out_s = back_s = small
        req = Request(kind, file, first, nblocks, now, out_s + back_s, back_s, self.stats, True)
        req.on_done = self._reply
        self.schedule(now + out_s, self.server.arrive, req)

    def _reply(self, now: float, req: Request) -> None:
        if self.abandoned:
            return
        if self.pending:
            kind, start, count = self.pending.pop()
            self._send(now, kind, self.files[self.index], start, count)
            return
        self._next(now)

    def _next(self, now: float) -> None:
        self.index += 1
        if self.index >= len(self.kinds):
            self._finish(now)
        else:
            self._think(now)
