"""The server's storage device: FIFO, ``parallelism`` accesses at once, read/write costs.

The paper's disk (3.3.2) is one FIFO server: every access pays an average seek plus
its size over the transfer rate. :class:`Disk` keeps that as the default
(``parallelism`` 1, writes priced like reads) and generalises it in the two ways
today's questions need:

* **Parallelism** (queue depth): up to ``parallelism`` accesses are served at once,
  each at the full per-access cost -- the spindles of a RAID set (each access on one
  spindle) or the channels of an SSD. The queue stays FIFO: an access starts when it
  arrives or when the earliest of the busy units frees, whichever is later.
* **Separate read and write costs**: an SSD writes slower than it reads; a RAID 5
  small write costs about four accesses.

Like the CPU, the device is arithmetic: an access's start and end follow from the
arrival order alone, so the model schedules only the end. With one unit the
arithmetic is exactly the paper's ``start = max(arrival, busy_until)``.
"""

from __future__ import annotations

from heapq import heapreplace

from shuttle.sim.config import ServerConfig


class Disk:
    """A FIFO device with ``parallelism`` identical units (see the module docstring).

    :meth:`access` returns when the access starts and its service time. ``work_s`` sums the
    service time offered so far (for load figures: above ``parallelism`` per second
    of time means saturated).
    """

    __slots__ = (
        "busy_until",
        "parallelism",
        "read_bandwidth",
        "read_s",
        "units",
        "work_s",
        "write_bandwidth",
        "write_s",
    )

    def __init__(self, config: ServerConfig) -> None:
        self.read_s = config.disk_seek_s
        self.read_bandwidth = config.disk_bandwidth_bytes_per_s
        self.write_s = config.disk_write_access_s
        self.write_bandwidth = config.disk_write_bandwidth
        self.parallelism = config.disk_parallelism
        #: One unit: when it is free. Several: a min-heap of when each is free.
        self.busy_until = 0.0
        self.units = [0.0] * self.parallelism
        self.work_s = 0.0

    def service_s(self, size_bytes: int, write: bool) -> float:
        """Service time of one access of ``size_bytes`` (no queueing)."""
        if write:
            return self.write_s + size_bytes / self.write_bandwidth
        return self.read_s + size_bytes / self.read_bandwidth

    def access(self, now: float, size_bytes: int, write: bool) -> tuple[float, float]:
        """An access arriving at ``now``: (start, service s); it ends at start + service.

        Accesses are served in the order of the calls (FIFO).
        """
        if write:
            service = self.write_s + size_bytes / self.write_bandwidth
        else:
            service = self.read_s + size_bytes / self.read_bandwidth
        self.work_s += service
        if self.parallelism == 1:
            busy = self.busy_until
            start = now if now > busy else busy
            self.busy_until = start + service
            return start, service
        units = self.units
        free = units[0]  # the unit that frees first
        start = now if now > free else free
        heapreplace(units, start + service)
        return start, service
