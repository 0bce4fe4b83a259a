"""The file server: CPU, block cache with locking, metadata cache, disk (section 3.3).

A :class:`Request` arrives at the server CPU, is processed there (FIFO, one at a
time, a fixed number of cycles per kind), then goes to the caches: a metadata
request to the infinite metadata cache, a block request to the LRU block cache.
Misses and every write (write-through) go to the disk (:class:`~shuttle.sim.disk.Disk`:
FIFO, by default the paper's one disk, seek + size / bandwidth). When its last disk
access completes the request is done and its reply goes back over the network.

Block locking: a block being read from or written to disk is locked. A request for a
locked block waits until the I/O completes and then hits. A miss needs a free block;
if every block is locked the request waits for one to be unlocked (an overloaded
server can find its whole cache locked).

The CPU and the disk are FIFO servers, so their finish times follow from the
arrival order alone (``start = max(arrival, busy_until)``); the kernel only carries
the moments where something observable happens: arrival at the CPU, access to the
cache, end of a disk access. The model schedules through the kernel's API
(:meth:`Kernel.schedule <shuttle.sim.kernel.Kernel.schedule>`), never its heap.

Invariant: cached + locked blocks never exceed the cache's capacity (asserted
where a block is added). When the mobile program takes its blocks while more of
the cache is locked than it leaves (:meth:`Server.reserve`), the capacity comes down
as those blocks are unlocked.

Mobile code at the server gets only idle CPU cycles: file requests pre-empt it
(pre-emptive resume). :meth:`Server.compute` tracks the remaining work and re-checks
its finish time whenever it comes due, so a busy server pushes it back.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from shuttle.sim.config import ServerConfig
from shuttle.sim.disk import Disk
from shuttle.sim.kernel import Kernel
from shuttle.sim.metrics import TrafficStats
from shuttle.sim.workload import BLOCK_READ, BLOCK_WRITE, META_READ, META_WRITE

#: Remaining mobile work below this is rounding, not work (seconds).
_WORK_EPSILON_S = 1e-9


class Request:
    """One file request on its way through the server.

    ``first`` is the first block's key (:func:`~shuttle.sim.blocks.block_key`); the request covers
    ``nblocks`` consecutive keys. Times are seconds; the ``*_s`` sums are filled in
    by the server as the request passes through.
    """

    __slots__ = (
        "cache_start_s",
        "cpu_queue_s",
        "cpu_service_s",
        "cursor",
        "disk_queue_s",
        "disk_service_s",
        "file",
        "first",
        "issue_s",
        "kind",
        "local",
        "measured",
        "nblocks",
        "network_s",
        "on_done",
        "outstanding",
        "reply_s",
        "scanned",
        "stats",
        "waited",
    )

    def __init__(
        self,
        kind: int,
        file: int,
        first: int,
        nblocks: int,
        issue_s: float,
        network_s: float,
        reply_s: float,
        stats: TrafficStats,
        measured: bool,
        local: bool = False,
        on_done: Callable[[float, Request], None] | None = None,
    ) -> None:
        self.kind = kind
        self.file = file
        self.first = first
        self.nblocks = nblocks
        self.issue_s = issue_s
        #: Total network time of request and reply; ``reply_s`` is the reply's part.
        self.network_s = network_s
        self.reply_s = reply_s
        self.stats = stats
        self.measured = measured
        self.local = local
        self.on_done = on_done
        self.cpu_queue_s = 0.0
        self.cpu_service_s = 0.0
        self.disk_queue_s = 0.0
        self.disk_service_s = 0.0
        self.cache_start_s = 0.0
        #: Blocks examined so far (the scan resumes here after a wait).
        self.cursor = 0
        #: Accesses counted so far (a block waited on is counted once).
        self.scanned = 0
        self.outstanding = 0
        self.waited = False


class Server:
    """The simulated file server on a :class:`~shuttle.sim.kernel.Kernel`.

    ``warm_blocks`` (least recently used first) and ``warm_files`` preload the block
    and metadata caches. ``capacity_blocks`` None is an infinite block cache.
    """

    def __init__(
        self,
        kernel: Kernel,
        config: ServerConfig,
        warm_blocks: list[int] | None = None,
        warm_files: list[int] | None = None,
    ) -> None:
        self.kernel = kernel
        self.schedule = kernel.schedule
        self.config = config
        #: Blocks the cache may hold now (None: infinite). At most ``capacity_target``
        #: plus the blocks still owed by a reservation (see :meth:`reserve`).
        self.capacity: int | None = None if config.cache_infinite else config.cache_blocks
        self.capacity_target = self.capacity
        #: Resident, unlocked blocks, least recently used first.
        self.lru: OrderedDict[int, None] = OrderedDict.fromkeys(warm_blocks or ())
        #: Resident blocks locked by a disk access -> requests waiting for them.
        self.locked: dict[int, list[Request]] = {}
        #: Requests waiting for a free block (every block locked).
        self.free_waiters: deque[Request] = deque()
        self.metadata: set[int] = set(warm_files or ())
        if self.capacity is not None:
            while len(self.lru) > self.capacity:
                self.lru.popitem(last=False)

        # CPU: a FIFO single server; cost in seconds per kind (per block for blocks).
        # A metadata request's cost includes the per-request part; a block request
        # adds it once to its blocks' cost (``request_cost_s``; 0 in the paper).
        self.cpu_busy_until = 0.0
        request = config.request_cycles
        self.cpu_cost_s = [
            config.cpu_cost_s(config.metadata_read_cycles + request),
            config.cpu_cost_s(config.metadata_write_cycles + request),
            config.cpu_cost_s(config.block_read_cycles),
            config.cpu_cost_s(config.block_write_cycles),
        ]
        self.request_cost_s = config.cpu_cost_s(request)
        self.local_fraction = config.local_request_cpu_fraction
        #: A local read's measured cost (per request, per block), or None: the
        #: local fraction of a remote read's.
        self.local_read_cost_s: tuple[float, float] | None = None
        if config.local_request_cycles is not None or config.local_block_read_cycles is not None:
            local_request = config.local_request_cycles
            local_block = config.local_block_read_cycles
            self.local_read_cost_s = (
                config.cpu_cost_s(request * self.local_fraction)
                if local_request is None
                else config.cpu_cost_s(local_request),
                config.cpu_cost_s(config.block_read_cycles * self.local_fraction)
                if local_block is None
                else config.cpu_cost_s(local_block),
            )
        #: Offered CPU work (seconds), for load figures (the disk keeps its own).
        self.cpu_work_s = 0.0

        self.disk = Disk(config)
        self.block_size = config.block_size_bytes
        self.metadata_io_bytes = config.metadata_io_bytes
        self.metadata_write_through = config.metadata_write_through

        # Mobile code computing on idle cycles.
        self.mobile_computing = False
        self.mobile_remaining_s = 0.0
        self.mobile_since_s = 0.0
        self.mobile_done: Callable[[float, Any], None] | None = None
        self.mobile_arg: Any = None
        self.mobile_cpu_s = 0.0

    @property
    def disk_work_s(self) -> float:
        """Offered disk work so far (seconds of service, summed over the device's units)."""
        return self.disk.work_s

    # --- the CPU ----------------------------------------------------------------------

    def _cpu(self, now: float, service: float) -> float:
        """Queue ``service`` seconds of file work at the CPU at ``now``; return its start.

        File work pre-empts mobile code: the idle time before ``now`` is credited to
        it first.
        """
        busy = self.cpu_busy_until
        if self.mobile_computing:
            self._mobile_advance(now, busy)
        start = now if now > busy else busy
        self.cpu_busy_until = start + service
        self.cpu_work_s += service
        return start

    def cpu_service_s(self, req: Request) -> float:
        """CPU seconds ``req`` costs: its kind's cycles (per block, plus the per-request
        part), a fraction of that if local -- or a local read's measured cost."""
        kind = req.kind
        if req.local and kind == BLOCK_READ and self.local_read_cost_s is not None:
            per_request, per_block = self.local_read_cost_s
            return per_request + per_block * req.nblocks
        service = self.cpu_cost_s[kind]
        if kind >= BLOCK_READ:
            service *= req.nblocks
            if self.request_cost_s:
                service += self.request_cost_s
        if req.local:
            service *= self.local_fraction
        return service

    def arrive(self, now: float, req: Request) -> None:
        """``req`` reaches the server CPU at ``now`` (call at that time)."""
        service = self.cpu_service_s(req)
        start = self._cpu(now, service)
        done = start + service
        req.cpu_queue_s = start - now
        req.cpu_service_s = service
        # Nothing else can happen before ``done``: handle the cache access now.
        if self.kernel.idle_before(done):
            self.access(done, req)
        else:
            self.schedule(done, self.access, req)

    def arrive_independent(
        self,
        now: float,
        request: tuple[int, int, int, int, float, float, float, bool],
        stats: TrafficStats,
    ) -> None:
        """A request nobody waits for (background) reaches the CPU at ``now``.

        ``request`` is (kind, file, first block key, blocks, issue time, network time,
        reply time, measured). The common case -- a metadata read of a file the
        metadata cache holds -- is finished here by arithmetic, without a Request or
        an event. That is exact: the metadata cache never evicts, so a file present now
        is present when the CPU is done, and a hit changes no state.
        """
        kind, file, first, nblocks, issue_s, network_s, reply_s, measured = request
        if kind != META_READ or file not in self.metadata:
            self.arrive(
                now,
                Request(kind, file, first, nblocks, issue_s, network_s, reply_s, stats, measured),
            )
            return
        service = self.cpu_cost_s[META_READ]
        start = self._cpu(now, service)
        if measured:
            response = start + service + reply_s - issue_s
            stats.requests += 1
            stats.response_s_sum += response
            if response > stats.response_s_max:
                stats.response_s_max = response
            stats.cpu_queue_s += start - now
            stats.cpu_service_s += service
            stats.network_s += network_s
            stats.metadata_accesses += 1
            stats.metadata_hits += 1

    def arrive_idle(self, now: float, req: Request) -> None:
        """``req`` from the mobile program at the server: its CPU work on idle cycles.

        The request is a call the mobile code makes, so it runs at the mobile code's
        priority (``ServerConfig.mobile_requests_on_idle_cycles``): file requests
        from clients pre-empt it, and the time it is held back is its CPU queueing.
        """
        service = self.cpu_service_s(req)
        req.cpu_service_s = service
        req.cache_start_s = now  # when it reached the CPU, until its work is done
        self.cpu_work_s += service
        self._idle_work(now, service, self._idle_request_done, req)

    def _idle_request_done(self, now: float, req: Request) -> None:
        req.cpu_queue_s = now - req.cache_start_s - req.cpu_service_s
        self.access(now, req)

    def compute(self, now: float, work_s: float, done: Callable[[float, Any], None]) -> None:
        """Run ``work_s`` seconds of mobile code on idle cycles; then call ``done(t, None)``."""
        self.mobile_cpu_s += work_s
        self._idle_work(now, work_s, done, None)

    def _idle_work(
        self, now: float, work_s: float, done: Callable[[float, Any], None], arg: Any
    ) -> None:
        self.mobile_computing = True
        self.mobile_remaining_s = work_s
        self.mobile_since_s = now
        self.mobile_done = done
        self.mobile_arg = arg
        busy = self.cpu_busy_until
        self.schedule((now if now > busy else busy) + work_s, self._mobile_check, None)

    def _mobile_advance(self, now: float, busy_until: float) -> None:
        # The CPU was idle from max(since, busy_until) to now: that went to mobile code.
        idle_from = busy_until if busy_until > self.mobile_since_s else self.mobile_since_s
        if now > idle_from:
            self.mobile_remaining_s -= now - idle_from
        self.mobile_since_s = now

    def _mobile_check(self, now: float, _: Any) -> None:
        busy = self.cpu_busy_until
        self._mobile_advance(now, busy)
        remaining = self.mobile_remaining_s
        if remaining <= _WORK_EPSILON_S:
            self.mobile_computing = False
            done, arg = self.mobile_done, self.mobile_arg
            self.mobile_done = self.mobile_arg = None
            assert done is not None
            done(now, arg)
        else:
            self.schedule((now if now > busy else busy) + remaining, self._mobile_check, None)

    # --- the caches -------------------------------------------------------------------

    def access(self, now: float, req: Request) -> None:
        """``req`` has left the CPU at ``now``: look it up in the caches."""
        req.cache_start_s = now
        kind = req.kind
        if kind >= BLOCK_READ:
            self._scan(now, req)
            return
        req.cursor = req.nblocks  # nothing to scan: the disk access completes it
        stats = req.stats
        measured = req.measured
        if measured:
            stats.metadata_accesses += 1
        write = kind == META_WRITE
        if req.file in self.metadata:
            if measured:
                stats.metadata_hits += 1
            if write and self.metadata_write_through:
                self._disk(now, req, self.metadata_io_bytes, True, None)
            else:
                self._complete(now, req)
        else:
            self.metadata.add(req.file)
            self._disk(now, req, self.metadata_io_bytes, write, None)

    def _scan(self, now: float, req: Request) -> None:
        """Walk the request's blocks from its cursor; hit, wait for or miss each one.

        A block is counted once, the first time the scan reaches it: a hit if it is
        cached or locked (a lock wait: the request waits for the I/O, then hits), else
        a miss. A miss with every block locked waits for a free block and is counted
        when the scan resumes.
        """
        lru = self.lru
        locked = self.locked
        capacity = self.capacity
        write = req.kind == BLOCK_WRITE
        stats = req.stats
        measured = req.measured
        first = req.first
        index = req.cursor
        nblocks = req.nblocks
        to_disk: list[int] = []
        waiting = False
        while index < nblocks:
            key = first + index
            cached = key in lru
            in_flight = False if cached else key in locked
            full = False
            if not (cached or in_flight):
                full = capacity is not None and len(lru) + len(locked) >= capacity
                if full and not lru:
                    # Every block is locked: wait for one to be unlocked.
                    self.free_waiters.append(req)
                    waiting = True
                    break
            if index >= req.scanned:
                req.scanned = index + 1
                if measured:
                    hit = cached or in_flight
                    stats.block_accesses += 1
                    stats.block_hits += hit
                    stats.lock_waits += in_flight
                    if not write:
                        stats.read_accesses += 1
                        stats.read_hits += hit
            if in_flight:
                # Wait for the I/O, then look again (and hit).
                locked[key].append(req)
                waiting = True
                break
            if cached:
                if write:
                    # Write-through: lock the cached block while the disk writes it.
                    del lru[key]
                    locked[key] = []
                    to_disk.append(key)
                else:
                    lru.move_to_end(key)
            else:
                if full:
                    lru.popitem(last=False)
                locked[key] = []
                assert capacity is None or len(lru) + len(locked) <= capacity, "cache overfull"
                to_disk.append(key)
            index += 1
        req.cursor = index
        if waiting:
            req.waited = True
        if to_disk:
            self._disk(now, req, len(to_disk) * self.block_size, write, to_disk)
        elif not waiting and req.outstanding == 0:
            self._complete(now, req)

    # --- the disk ---------------------------------------------------------------------

    def _disk(
        self, now: float, req: Request, size_bytes: int, write: bool, blocks: list[int] | None
    ) -> None:
        start, service = self.disk.access(now, size_bytes, write)
        req.disk_queue_s += start - now
        req.disk_service_s += service
        req.outstanding += 1
        self.schedule(start + service, self._disk_done, (req, blocks))

    def _disk_done(self, now: float, arg: tuple[Request, list[int] | None]) -> None:
        req, blocks = arg
        if blocks is not None:
            lru = self.lru
            locked = self.locked
            for key in blocks:
                waiters = locked.pop(key)
                lru[key] = None
                if self.capacity != self.capacity_target:
                    # A reservation is still owed blocks: this one pays one back.
                    lru.popitem(last=False)
                    self.capacity -= 1  # type: ignore[operator]
                for waiter in waiters:
                    self._scan(now, waiter)
            self._wake_free_waiters(now)
        req.outstanding -= 1
        if req.outstanding == 0 and req.cursor >= req.nblocks:
            self._complete(now, req)

    def _wake_free_waiters(self, now: float) -> None:
        free_waiters = self.free_waiters
        lru = self.lru
        while free_waiters and (self.capacity is None or lru or len(self.locked) < self.capacity):
            self._scan(now, free_waiters.popleft())

    # --- capacity (the mobile program's footprint) ------------------------------------

    def reserve(self, now: float, blocks: int) -> None:
        """Take ``blocks`` out of the block cache (the mobile program arriving).

        Least recently used unlocked blocks are evicted at once. If more of the cache
        is locked than the reservation leaves, the rest is taken as those blocks are
        unlocked (each unlocked block is evicted, and the capacity comes down by one),
        so cached + locked never exceeds the capacity. No-op for an infinite cache.
        """
        if self.capacity_target is None:
            return
        target = self.capacity_target - blocks
        if target < 1:
            raise ValueError(f"cannot reserve {blocks} of {self.capacity_target} cache blocks")
        self.capacity_target = target
        lru = self.lru
        while len(lru) + len(self.locked) > target and lru:
            lru.popitem(last=False)
        self.capacity = max(target, len(lru) + len(self.locked))

    def release(self, now: float, blocks: int) -> None:
        """Give ``blocks`` back to the block cache (the mobile program leaving).

        Requests waiting for a free block go on.
        """
        if self.capacity_target is None:
            return
        self.capacity_target += blocks
        self.capacity = max(self.capacity_target, len(self.lru) + len(self.locked))
        self._wake_free_waiters(now)

    # --- completion -------------------------------------------------------------------

    def _complete(self, now: float, req: Request) -> None:
        """The server is done with ``req`` at ``now``; its reply reaches the client later."""
        if req.measured:
            stats = req.stats
            response = now + req.reply_s - req.issue_s
            stats.requests += 1
            stats.response_s_sum += response
            if response > stats.response_s_max:
                stats.response_s_max = response
            if req.kind >= BLOCK_READ:
                stats.block_requests += 1
                stats.block_response_s_sum += response
            stats.cpu_queue_s += req.cpu_queue_s
            stats.cpu_service_s += req.cpu_service_s
            stats.disk_queue_s += req.disk_queue_s
            stats.disk_service_s += req.disk_service_s
            stats.network_s += req.network_s
            # What is left of the time between leaving the CPU and finishing was spent
            # waiting at the cache (for locked blocks or a free block).
            wait = now - req.cache_start_s - req.disk_queue_s - req.disk_service_s
            if wait > 0.0:
                stats.cache_wait_s += wait
        on_done = req.on_done
        if on_done is not None:
            self.schedule(now + req.reply_s, on_done, req)

    def close(self) -> None:
        """Forget the cache contents and any waiting request (see :meth:`Kernel.close`)."""
        self.lru.clear()
        self.locked.clear()
        self.free_waiters.clear()
        self.metadata.clear()
        self.mobile_done = None
        self.mobile_arg = None
        self.mobile_computing = False

    # --- inspection (tests, reports) --------------------------------------------------

    def resident_blocks(self) -> int:
        """Blocks in the cache, locked or not."""
        return len(self.lru) + len(self.locked)


__all__ = ["BLOCK_READ", "BLOCK_WRITE", "META_READ", "META_WRITE", "Request", "Server"]
