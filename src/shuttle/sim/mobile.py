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

What the live system adds (issue 24; every default leaves the above unchanged):

* A trace of one mobile object (``shuttle trace record-object``) holds the console's
  calls to it and its answers (kinds ``CALL`` and ``RETURN``). At the client they are
  in-process calls and cost nothing; at the server each call crosses the link to the
  server (its bytes and ``rpc_header_bytes``), costs ``call_cycles`` of server CPU
  there (on idle cycles, as the program's work), and each answer crosses back and
  costs ``call_overhead_s`` at the client. The think time before a call is the
  console's, so it runs at the client wherever the object is.
* With ``network_burst_bytes`` the application's link is a token bucket per direction
  (:mod:`shuttle.sim.link`): a reply is handed to it when the server has done the
  request, so the bucket refills while the program thinks, as a live link's does.
* ``connect_s`` and ``client_setup_s`` / ``server_setup_s``: opening the connection
  and making the object at its placement, paid once before the first record.
* ``network_exact_bytes``: messages carry the trace's bytes instead of whole blocks;
  ``rpc_overhead_s``: the client's own time per storage request besides the link.
* ``mobile_client_cpu_ratio`` / ``mobile_server_cpu_ratio`` scale the program's think
  time where a run-time hosts it (its monitor, its threads), relative to the trace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.sim.blocks import block_keys
from shuttle.sim.config import ServerConfig
from shuttle.sim.link import Link
from shuttle.sim.metrics import MobileStats, TrafficStats
from shuttle.sim.policies import LRU
from shuttle.sim.server import Request, Server
from shuttle.sim.workload import (
    BLOCK_READ,
    BLOCK_WRITE,
    CALL,
    MOBILE_FILE_BASE,
    RETURN,
    Columns,
)

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
        #: Bytes each record carries (``network_exact_bytes``; console records' sizes).
        self.sizes: list[int] = trace.size.tolist()
        speed = config.server_speed if self.at_server else config.client_speed
        scale = config.mobile_trace_speed / speed
        ratio = config.mobile_server_cpu_ratio if self.at_server else config.mobile_client_cpu_ratio
        if ratio != 1.0:
            scale *= ratio
        times = trace.time_s.tolist()
        # Think time before record i (the first: from the trace's own start).
        self.think_s: list[float] = [
            (times[i] - (times[i - 1] if i else 0.0)) * scale for i in range(len(times))
        ]
        #: Records whose think time is the console's, not the object's: a call. The
        #: console runs in process at the client, wherever the object is.
        self.console_think: list[bool] = [k == CALL for k in self.kinds]
        if any(self.console_think):
            console_scale = config.mobile_trace_speed / config.client_speed
            for i, console in enumerate(self.console_think):
                if console:
                    self.think_s[i] = (times[i] - (times[i - 1] if i else 0.0)) * console_scale
        self.index = 0
        self.done = False
        self.abandoned = False
        #: The client cache (None: none, every access goes to the server).
        self.client_cache = LRU(config.client_cache_blocks) if config.client_cache_blocks else None
        self.rpc_blocks = max(1, config.client_request_bytes_max // config.block_size_bytes)
        #: Server requests still to send for the current record (client placement).
        self.pending: list[tuple[int, int, int]] = []
        self.net_small_s = config.network_s(0)
        self.block_size = config.block_size_bytes
        #: The application's own link as a token bucket (None: the paper's formula).
        self.link: Link | None = None
        if config.network_burst_bytes > 0:
            self.link = Link(
                config.network_bandwidth_bits_per_s,
                config.network_burst_bytes,
                config.network_latency_s,
            )
        self.exact_bytes = config.network_exact_bytes
        self.header = config.rpc_header_bytes
        #: A request's header (``rpc_request_header_bytes``, else a reply's).
        self.request_header = (
            config.rpc_header_bytes
            if config.rpc_request_header_bytes is None
            else config.rpc_request_header_bytes
        )
        self.rpc_overhead_s = config.rpc_overhead_s
        self.call_overhead_s = config.call_overhead_s
        self.call_cost_s = config.cpu_cost_s(config.call_cycles)
        #: Bytes of the record being sent (network_exact_bytes), spread over its RPCs.
        self.record_blocks = 0

    # --- life cycle -------------------------------------------------------------------

    def start(self, now: float) -> None:
        """Start the application at ``now`` (the interval's start)."""
        self.result.started_s = now
        if self.at_server:
            self.server.reserve(now, self.config.mobile_blocks)
        if not self.kinds:
            self._finish(now)
            return
        setup_s = self.config.server_setup_s if self.at_server else self.config.client_setup_s
        startup_s = self.config.connect_s + setup_s
        if startup_s > 0.0:
            # Opening the connection and making the object come before the first
            # remote call; the program is sequential, so paying them first gives the
            # same finish.
            self.schedule(now + startup_s, self._connected, None)
            return
        self._think(now)

    def _connected(self, now: float, _: Any) -> None:
        if not self.abandoned:
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
        if self.at_server and not self.console_think[self.index]:
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
        if kind >= CALL:
            self._console(now, kind, self.sizes[i])
            return
        if self.at_server:
            self._send(now, kind, self.files[i], self.firsts[i], self.counts[i])
            return
        self.record_blocks = self.counts[i]
        if kind < BLOCK_READ:
            self._send(now, kind, self.files[i], self.firsts[i], 1)
            return
        # Client placement: the client cache filters block accesses.
        first = self.firsts[i]
        if self.client_cache is None:
            self.pending = self._rpcs(kind, first, first + self.counts[i])
            self.pending.reverse()
            kind, start, count = self.pending.pop()
            self._send(now, kind, self.files[i], start, count)
            return
        touch = self.client_cache.access
        result = self.result
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
        if self.exact_bytes and kind >= BLOCK_READ:
            # The record's own bytes, shared by its RPCs in proportion to their blocks.
            data = self.sizes[self.index] * nblocks // max(1, self.record_blocks)
        link = self.link
        if link is not None:
            # Each direction a token bucket; the reply is handed over when the server
            # has done the request (``_reply_over_link``).
            up = data if kind == BLOCK_WRITE else 0
            arrive = link.up.transmit(now, self.request_header + up)
            req = Request(kind, file, first, nblocks, now, arrive - now, 0.0, self.stats, True)
            req.on_done = self._reply_over_link
            self.schedule(arrive, self.server.arrive, req)
            return
        small = self.net_small_s
        if kind == BLOCK_READ:
            out_s, back_s = small, config.network_s(data)
        elif kind == BLOCK_WRITE:
            out_s, back_s = config.network_s(data), small
        else:
            out_s = back_s = small
        if config.rpc_request_header_bytes is not None:
            up = data if kind == BLOCK_WRITE else 0
            out_s = self._message_s(self.request_header + up)
        if self.rpc_overhead_s:
            back_s += self.rpc_overhead_s
        req = Request(kind, file, first, nblocks, now, out_s + back_s, back_s, self.stats, True)
        req.on_done = self._reply
        self.schedule(now + out_s, self.server.arrive, req)

    def _message_s(self, nbytes: int) -> float:
        """One message of ``nbytes`` (header included) by the paper's formula."""
        config = self.config
        return config.network_latency_s + 8.0 * nbytes / config.network_bandwidth_bits_per_s

    def _reply_over_link(self, now: float, req: Request) -> None:
        """The server has done ``req`` at ``now``: its reply crosses the link back."""
        assert self.link is not None
        data = 0
        if req.kind == BLOCK_READ:
            data = req.nblocks * self.block_size
            if self.exact_bytes:
                data = self.sizes[self.index] * req.nblocks // max(1, self.record_blocks)
        back = self.link.down.transmit(now, self.header + data) - now
        stats = self.stats
        stats.network_s += back
        stats.response_s_sum += back
        if req.kind >= BLOCK_READ:
            stats.block_response_s_sum += back
        self.schedule(now + back + self.rpc_overhead_s, self._reply, req)

    # --- console calls (a trace of one object) ---------------------------------------

    def _console(self, now: float, kind: int, size: int) -> None:
        """A call from the console to the object (``CALL``) or its answer (``RETURN``).

        In process at the client; across the link at the server: a call then costs
        the server ``call_cycles`` before the object goes on, an answer the client
        ``call_overhead_s`` after it arrives."""
        extra = self.result.extra
        name = "console_calls" if kind == CALL else "console_returns"
        extra[name] = extra.get(name, 0) + 1
        if not self.at_server:
            if kind == RETURN:
                self._answered(now)
            self._next(now)
            return
        extra["console_bytes"] = extra.get("console_bytes", 0) + size
        nbytes = (self.request_header if kind == CALL else self.header) + size
        if self.link is not None:
            bucket = self.link.up if kind == CALL else self.link.down
            arrive = bucket.transmit(now, nbytes)
        else:
            arrive = now + self._message_s(nbytes)
        if kind == RETURN:
            self.schedule(arrive + self.call_overhead_s, self._returned, None)
        elif self.call_cost_s > 0.0:
            self.schedule(arrive, self._call_arrived, None)
        else:
            self.schedule(arrive, self._console_done, None)

    def _answered(self, now: float) -> None:
        """The console has an answer (``extra["answers_s"]``: when each arrived, from
        the run's start; what a live run's console calls are set beside)."""
        self.result.extra.setdefault("answers_s", []).append(now - self.result.started_s)

    def _returned(self, now: float, _: Any) -> None:
        self._answered(now)
        self._console_done(now, None)

    def _call_arrived(self, now: float, _: Any) -> None:
        self.server.compute(now, self.call_cost_s, self._console_done)

    def _console_done(self, now: float, _: Any) -> None:
        if not self.abandoned:
            self._next(now)

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
