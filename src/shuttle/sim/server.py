"""The file server: CPU, block cache with locking, metadata cache, disk (section 3.3).

A :class:`Request` arrives at the server CPU, is processed there (FIFO, one at a
time, a fixed number of cycles per kind), then goes to the caches: a metadata
request to the infinite metadata cache, a block request to the LRU block cache.
Misses and every write (write-through) go to the disk (FIFO, one at a time, seek +
size / bandwidth). When its last disk access completes the request is done and its
reply goes back over the network.

Block locking: a block being read from or written to disk is locked. A request for a
locked block waits until the I/O completes and then hits. A miss needs a free block;
if every block is locked the request waits for one to be unlocked (an overloaded
server can find its whole cache locked).

The CPU and the disk are FIFO single servers, so their finish times follow from the
arrival order alone (``start = max(arrival, busy_until)``); the kernel only carries
the moments where something observable happens: arrival at the CPU, access to the
cache, end of a disk access.

Mobile code at the server gets only idle CPU cycles: file requests pre-empt it
(pre-emptive resume). :meth:`Server.compute` tracks the remaining work and re-checks
its finish time whenever it comes due, so a busy server pushes it back.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from heapq import heappush
from typing import Any

from shuttle.sim.config import ServerConfig
from shuttle.sim.kernel import Kernel
from shuttle.sim.metrics import TrafficStats
from shuttle.sim.workload import BLOCK_READ, BLOCK_WRITE, META_READ, META_WRITE

#: Remaining mobile work below this is rounding, not work (seconds).
_WORK_EPSILON_S = 1e-9


class Request:
    """One file request on its way through the server.

    ``first`` is the first block's key (``file << 32 | block``); the request covers
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
        self.config = config
        self.heap = kernel.heap
        self.sequence = kernel.sequence
        self.capacity: int | None = None if config.cache_infinite else config.cache_blocks
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
        self.cpu_busy_until = 0.0
        self.cpu_cost_s = [
            config.cpu_cost_s(config.metadata_read_cycles),
            config.cpu_cost_s(config.metadata_write_cycles),
            config.cpu_cost_s(config.block_read_cycles),
            config.cpu_cost_s(config.block_write_cycles),
        ]
        self.local_fraction = config.local_request_cpu_fraction
        #: Offered CPU and disk work (seconds), for load figures.
        self.cpu_work_s = 0.0
        self.disk_work_s = 0.0

        # Disk: a FIFO single server.
        self.disk_busy_until = 0.0
        self.seek_s = config.disk_seek_s
        self.disk_bandwidth = config.disk_bandwidth_bytes_per_s
        self.block_size = config.block_size_bytes
        self.metadata_io_bytes = config.metadata_io_bytes
        self.metadata_write_through = config.metadata_write_through

        # Mobile code computing on idle cycles.
        self.mobile_computing = False
        self.mobile_remaining_s = 0.0
        self.mobile_since_s = 0.0
        self.mobile_done: Callable[[float, Any], None] | None = None
        self.mobile_cpu_s = 0.0

    # --- the CPU ----------------------------------------------------------------------

    def arrive(self, now: float, req: Request) -> None:
        """``req`` reaches the server CPU at ``now`` (call at that time)."""
        kind = req.kind
        service = self.cpu_cost_s[kind]
        if kind >= BLOCK_READ:
            service *= req.nblocks
        if req.local:
            service *= self.local_fraction
        busy = self.cpu_busy_until
        if self.mobile_computing:
            self._mobile_advance(now, busy)
        start = now if now > busy else busy
        done = start + service
        self.cpu_busy_until = done
        self.cpu_work_s += service
        req.cpu_queue_s = start - now
        req.cpu_service_s = service
        heap = self.heap
        # Nothing else can happen before ``done``: handle the cache access now.
        if not heap or done < heap[0][0]:
            self.access(done, req)
        else:
            heappush(heap, (done, next(self.sequence), self.access, req))

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
        busy = self.cpu_busy_until
        if self.mobile_computing:
            self._mobile_advance(now, busy)
        start = now if now > busy else busy
        done = start + service
        self.cpu_busy_until = done
        self.cpu_work_s += service
        if measured:
            response = done + reply_s - issue_s
            stats.requests += 1
            stats.response_s_sum += response
            if response > stats.response_s_max:
                stats.response_s_max = response
            stats.cpu_queue_s += start - now
            stats.cpu_service_s += service
            stats.network_s += network_s
            stats.metadata_accesses += 1
            stats.metadata_hits += 1

    def compute(self, now: float, work_s: float, done: Callable[[float, Any], None]) -> None:
        """Run ``work_s`` seconds of mobile code on idle cycles; then call ``done(t, None)``."""
        self.mobile_computing = True
        self.mobile_remaining_s = work_s
        self.mobile_since_s = now
        self.mobile_done = done
        self.mobile_cpu_s += work_s
        busy = self.cpu_busy_until
        finish = (now if now > busy else busy) + work_s
        heappush(self.heap, (finish, next(self.sequence), self._mobile_check, None))

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
            done = self.mobile_done
            self.mobile_done = None
            assert done is not None
            done(now, None)
        else:
            finish = (now if now > busy else busy) + remaining
            heappush(self.heap, (finish, next(self.sequence), self._mobile_check, None))

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
        if req.file in self.metadata:
            if measured:
                stats.metadata_hits += 1
            if kind == META_WRITE and self.metadata_write_through:
                self._disk(now, req, self.metadata_io_bytes, None)
            else:
                self._complete(now, req)
        else:
            self.metadata.add(req.file)
            self._disk(now, req, self.metadata_io_bytes, None)

    def _scan(self, now: float, req: Request) -> None:
        """Walk the request's blocks from its cursor; wait, hit or miss each one."""
        lru = self.lru
        locked = self.locked
        capacity = self.capacity
        write = req.kind == BLOCK_WRITE
        stats = req.stats
        measured = req.measured
        first = req.first
        index = req.cursor
        nblocks = req.nblocks
        to_disk: list[int] | None = None
        while index < nblocks:
            key = first + index
            count = index >= req.scanned
            if key in lru:
                if count and measured:
                    stats.block_accesses += 1
                    stats.block_hits += 1
                    if not write:
                        stats.read_accesses += 1
                        stats.read_hits += 1
                if write:
                    # Write-through: lock the cached block while the disk writes it.
                    del lru[key]
                    locked[key] = []
                    if to_disk is None:
                        to_disk = [key]
                    else:
                        to_disk.append(key)
                else:
                    lru.move_to_end(key)
            elif key in locked:
                # In flight: wait for the I/O, then look again (and hit).
                if count:
                    req.scanned = index + 1
                    if measured:
                        stats.block_accesses += 1
                        stats.block_hits += 1
                        stats.lock_waits += 1
                        if not write:
                            stats.read_accesses += 1
                            stats.read_hits += 1
                locked[key].append(req)
                req.cursor = index
                req.waited = True
                if to_disk is not None:
                    self._disk(now, req, len(to_disk) * self.block_size, to_disk)
                return
            else:
                if capacity is not None and len(lru) + len(locked) >= capacity:
                    if lru:
                        lru.popitem(last=False)
                    else:
                        # Every block is locked: wait for one to be unlocked.
                        req.cursor = index
                        req.waited = True
                        self.free_waiters.append(req)
                        if to_disk is not None:
                            self._disk(now, req, len(to_disk) * self.block_size, to_disk)
                        return
                if count and measured:
                    stats.block_accesses += 1
                    if not write:
                        stats.read_accesses += 1
                locked[key] = []
                if to_disk is None:
                    to_disk = [key]
                else:
                    to_disk.append(key)
            if count:
                req.scanned = index + 1
            index += 1
        req.cursor = nblocks
        if to_disk is not None:
            self._disk(now, req, len(to_disk) * self.block_size, to_disk)
        elif req.outstanding == 0:
            self._complete(now, req)

    # --- the disk ---------------------------------------------------------------------

    def _disk(self, now: float, req: Request, size_bytes: int, blocks: list[int] | None) -> None:
        service = self.seek_s + size_bytes / self.disk_bandwidth
        busy = self.disk_busy_until
        start = now if now > busy else busy
        done = start + service
        self.disk_busy_until = done
        self.disk_work_s += service
        req.disk_queue_s += start - now
        req.disk_service_s += service
        req.outstanding += 1
        heappush(self.heap, (done, next(self.sequence), self._disk_done, (req, blocks)))

    def _disk_done(self, now: float, arg: tuple[Request, list[int] | None]) -> None:
        req, blocks = arg
        if blocks is not None:
            lru = self.lru
            locked = self.locked
            capacity = self.capacity
            for key in blocks:
                waiters = locked.pop(key)
                lru[key] = None
                if capacity is not None:
                    while len(lru) + len(locked) > capacity and lru:
                        lru.popitem(last=False)
                for waiter in waiters:
                    self._scan(now, waiter)
            free_waiters = self.free_waiters
            while free_waiters and (capacity is None or lru or len(locked) < capacity):
                self._scan(now, free_waiters.popleft())
        req.outstanding -= 1
        if req.outstanding == 0 and req.cursor >= req.nblocks:
            self._complete(now, req)

    def set_capacity(self, now: float, capacity: int | None) -> None:
        """Resize the block cache (the mobile program arriving or leaving).

        Shrinking evicts least recently used unlocked blocks at once; locked blocks go
        when they are unlocked. Growing lets requests waiting for a free block go on.
        """
        self.capacity = capacity
        lru = self.lru
        if capacity is not None:
            while len(lru) + len(self.locked) > capacity and lru:
                lru.popitem(last=False)
        free_waiters = self.free_waiters
        while free_waiters and (capacity is None or lru or len(self.locked) < capacity):
            self._scan(now, free_waiters.popleft())

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
            heappush(self.heap, (now + req.reply_s, next(self.sequence), on_done, req))

    def close(self) -> None:
        """Forget the cache contents and any waiting request (see :meth:`Kernel.close`)."""
        self.lru.clear()
        self.locked.clear()
        self.free_waiters.clear()
        self.metadata.clear()
        self.mobile_done = None
        self.mobile_computing = False

    # --- inspection (tests, reports) --------------------------------------------------

    def resident_blocks(self) -> int:
        """Blocks in the cache, locked or not."""
        return len(self.lru) + len(self.locked)


__all__ = ["BLOCK_READ", "BLOCK_WRITE", "META_READ", "META_WRITE", "Request", "Server"]
