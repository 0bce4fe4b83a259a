"""Link emulation: a token bucket for bandwidth plus a fixed one-way delay, per direction.

Two layers:

* :class:`LinkShaper` is the model of one direction of one link, with no I/O: given
  ``nbytes`` handed to the link now, :meth:`LinkShaper.transmit` returns the clock
  time at which their last byte has arrived at the far end. Serialisation is a
  fluid token bucket (rate = bandwidth, depth = the profile's burst), FIFO, and the
  one-way latency is added after it, so frames in flight share the latency instead
  of queueing behind it (the link pipelines).
* :class:`ShapedStream` wraps a connection's asyncio ``StreamReader``/``StreamWriter``
  on the client side and applies a :class:`Link` (one shaper per direction) there:
  written bytes reach the socket only when they would have reached the node, and
  received bytes reach the application only when they would have reached the
  client. The node needs no knowledge of shaping, and order is preserved.

All connections from one client to one node should share one :class:`Link`, so that
they share its bandwidth, as they would on a real wire.

Closed form, for ``n`` bytes handed to an idle link at time ``t``: the last byte
arrives at ``t + max(0, n - burst) * 8 / bandwidth + latency``
(:meth:`LinkProfile.transfer_time_s`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
from dataclasses import dataclass
from typing import Any

from shuttle.net.clock import REAL_CLOCK, Clock
from shuttle.net.profiles import LinkProfile

#: Delivery granularity in time: a large write or read is cut into pieces of about
#: this much serialisation time, each delivered at its own instant, so a reader sees
#: a response's header before its payload has crossed a slow link. 1 ms matches the
#: granularity of asyncio's timers (the epoll selector rounds to milliseconds).
PIECE_WINDOW_S = 0.001
#: Bounds on a piece: small enough that a 1 Mbit/s link still delivers every 2 ms,
#: large enough that the per-piece cost (one timer, one write) stays negligible.
PIECE_BYTES_MIN = 256
PIECE_BYTES_MAX = 64 * 1024
#: How much the reader side takes from the socket at a time.
READ_CHUNK_BYTES = 64 * 1024
#: Bytes written but not yet due at the node above which :meth:`ShapedStream.drain`
#: waits (like a socket send buffer): 1 MiB covers 84 ms of a 100 Mbit/s link, so
#: the link never idles while a writer that drains is ready to send.
SEND_BUFFER_BYTES_HIGH = 1024 * 1024
#: Bytes received but not yet read by the application above which the stream stops
#: reading the socket (so a slow reader pushes back on the node through TCP).
RECV_BUFFER_BYTES_HIGH = 1024 * 1024


@dataclass
class LinkCounters:
    """What one direction of a link carried. Tests, benchmarks and the monitor read
    these.

    * ``bytes``: payload bytes handed to the link.
    * ``frames``: non-empty units handed to the link (writes, or received chunks).
    * ``delay_s_total``: sum over frames of (arrival time - time handed over): the
      time the emulation added, queueing + serialisation + latency.
    """

    bytes: int = 0
    frames: int = 0
    delay_s_total: float = 0.0


class LinkShaper:
    """One direction of one link: a FIFO token bucket followed by a fixed delay.

    The bucket is kept as GCRA's *theoretical arrival time* ``tat``: the instant at
    which the bucket would be back to full. Handing over ``n`` bytes at ``now`` moves
    ``tat`` to ``max(tat, now) + n / rate``; the bytes have left once the debt is no
    larger than the bucket, at ``max(now, tat - burst / rate)``, and arrive one
    latency later. This equals a fluid token bucket with a FIFO queue.
    """

    def __init__(self, profile: LinkProfile, clock: Clock = REAL_CLOCK) -> None:
        self.profile = profile
        self.clock = clock
        self.counters = LinkCounters()
        rate = profile.bandwidth_bytes_per_s
        self._rate_bytes_per_s = math.inf if rate is None else rate
        self._burst_s = profile.effective_burst_bytes / self._rate_bytes_per_s
        self._tat_s = -math.inf
        self._last_departure_s = -math.inf
        self._last_handover_s = -math.inf

    def transmit(self, nbytes: int, at_s: float | None = None) -> float:
        """Hand ``nbytes`` to the link; return when the last of them has arrived at the
        far end. Arrival times of successive calls never decrease (FIFO). ``nbytes``
        may be 0 (e.g. an end-of-stream marker: it arrives after everything handed
        over before it).

        ``at_s`` is the hand-over time when it was earlier than now (bytes a socket
        received a while ago, by its kernel timestamp); it is clamped between the
        previous hand-over time and ``clock.now()``. Default: now."""
        assert nbytes >= 0, f"nbytes must be >= 0, got {nbytes}"
        now_s = self.clock.now()
        if at_s is not None:
            now_s = min(now_s, max(at_s, self._last_handover_s))
        self._last_handover_s = now_s
        if math.isinf(self._rate_bytes_per_s):
            departure_s = now_s
        else:
            self._tat_s = max(self._tat_s, now_s) + nbytes / self._rate_bytes_per_s
            departure_s = max(now_s, self._tat_s - self._burst_s)
        # Hand-over times never go backwards, but guard FIFO against float rounding.
        departure_s = max(departure_s, self._last_departure_s)
        self._last_departure_s = departure_s
        arrival_s = departure_s + self.profile.latency_s
        if nbytes:
            self.counters.bytes += nbytes
            self.counters.frames += 1
            self.counters.delay_s_total += arrival_s - now_s
        return arrival_s

    def idle_at(self) -> float:
        """When everything handed over so far has left (not arrived): the link is idle
        from then on."""
        return max(self._last_departure_s, self.clock.now())

    def piece_bytes(self) -> int:
        """How large a piece to deliver at once on this link (see
        :data:`PIECE_WINDOW_S`)."""
        if math.isinf(self._rate_bytes_per_s):
            return PIECE_BYTES_MAX
        window = int(self._rate_bytes_per_s * PIECE_WINDOW_S)
        return min(PIECE_BYTES_MAX, max(PIECE_BYTES_MIN, window))


class Link:
    """A client–node link: ``up`` (client to node) and ``down`` (node to client)
    shapers with one profile and one clock. Share one instance among all connections
    from this client to the same node."""

    def __init__(self, profile: LinkProfile, clock: Clock = REAL_CLOCK) -> None:
        self.profile = profile
        self.clock = clock
        self.up = LinkShaper(profile, clock)
        self.down = LinkShaper(profile, clock)

    def wrap(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> ShapedStream:
        """Shape an open connection over this link (see :class:`ShapedStream`)."""
        return ShapedStream(reader, writer, self)


async def open_shaped_connection(host: str, port: int, link: Link) -> ShapedStream:
    """``asyncio.open_connection`` followed by :meth:`Link.wrap`."""
    reader, writer = await asyncio.open_connection(host, port)
    return link.wrap(reader, writer)


def _pieces(data: bytes, size: int) -> list[memoryview]:
    view = memoryview(data)
    return [view[i : i + size] for i in range(0, len(view), size)]


class ShapedStream:
    """A connection whose both directions cross an emulated :class:`Link`.

    It offers the parts of ``StreamReader`` and ``StreamWriter`` a client needs:
    :meth:`read`, :meth:`readexactly`, :meth:`at_eof`, :meth:`write`, :meth:`drain`,
    :meth:`close`, :meth:`wait_closed`, :meth:`is_closing`, :meth:`get_extra_info`.

    * Writes: each write is cut into pieces; piece *i* is handed to ``link.up`` at the
      time of the write and written to the socket at its arrival time, by one
      background task, in order. :meth:`write` never blocks; :meth:`drain` waits
      while more than :data:`SEND_BUFFER_BYTES_HIGH` bytes are not yet due, and
      raises the error that broke the connection, if any.
    * Reads: a background task reads the socket as bytes come, hands each chunk to
      ``link.down`` at that moment, and a second one releases it to the application
      at its arrival time. End of stream and socket errors arrive after the bytes
      before them.
    * :meth:`close` lets queued writes arrive first, then closes the socket;
      :meth:`wait_closed` waits for that. Always close the stream: its background
      tasks live until then.

    A profile that adds nothing (``loopback``) passes every call straight through.
    Must be created inside a running event loop.
    """

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: Link
    ) -> None:
        self.link = link
        self._reader = reader
        self._writer = writer
        self._clock = link.clock
        self._passthrough = link.profile.is_unshaped
        self._closing = False
        self._error: BaseException | None = None
        # send side
        self._send_queue: collections.deque[tuple[float, memoryview | None]] = collections.deque()
        self._send_pending_bytes = 0
        self._send_wakeup = asyncio.Event()
        self._send_progress = asyncio.Event()
        # receive side
        self._recv_queue: collections.deque[tuple[float, bytes | BaseException | None]] = (
            collections.deque()
        )
        self._recv_pending_bytes = 0  # queued on the link + buffered, not yet read
        self._recv_buffer = bytearray()
        self._recv_eof = False
        self._recv_error: BaseException | None = None
        self._recv_wakeup = asyncio.Event()
        self._recv_data = asyncio.Event()
        self._recv_space = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        if not self._passthrough:
            self._tasks = [
                asyncio.create_task(self._sender(), name="shaped-send"),
                asyncio.create_task(self._pump(), name="shaped-recv-pump"),
                asyncio.create_task(self._deliverer(), name="shaped-recv-deliver"),
            ]

    # -- writing -----------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data``; it reaches the socket when it would have reached the node.

        Raises :class:`ConnectionResetError` after :meth:`close` or once the
        connection has failed."""
        if self._passthrough:
            self._writer.write(data)
            return
        if self._closing or self._error is not None:
            raise ConnectionResetError("the shaped stream is closed or broken; reconnect")
        if not data:
            return
        payload = bytes(data)  # our own immutable copy: the caller may reuse its buffer
        up = self.link.up
        for piece in _pieces(payload, up.piece_bytes()):
            self._send_queue.append((up.transmit(len(piece)), piece))
        self._send_pending_bytes += len(payload)
        self._send_wakeup.set()

    async def drain(self) -> None:
        """Wait until no more than :data:`SEND_BUFFER_BYTES_HIGH` bytes are queued.

        Raises the error that broke the connection (e.g. ``ConnectionResetError``)."""
        if self._passthrough:
            await self._writer.drain()
            return
        while self._error is None and self._send_pending_bytes > SEND_BUFFER_BYTES_HIGH:
            self._send_progress.clear()
            await self._send_progress.wait()
        if self._error is not None:
            raise self._error

    async def _sender(self) -> None:
        try:
            while True:
                while not self._send_queue:
                    self._send_wakeup.clear()
                    await self._send_wakeup.wait()
                await self._clock.sleep_until(self._send_queue[0][0])
                now_s = self._clock.now()
                while self._send_queue and self._send_queue[0][0] <= now_s:
                    _, piece = self._send_queue.popleft()
                    if piece is None:  # the close marker: everything before it is out
                        self._writer.close()
                        return
                    self._writer.write(piece)
                    self._send_pending_bytes -= len(piece)
                self._send_progress.set()
                # The real socket pushes back too (the node is slow to read).
                await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._error = exc
            self._send_progress.set()

    # -- reading -----------------------------------------------------------------------

    async def _pump(self) -> None:
        down = self.link.down
        while True:
            try:
                chunk = await self._reader.read(READ_CHUNK_BYTES)
            except (ConnectionError, OSError) as exc:
                self._recv_queue.append((down.transmit(0), exc))
                self._recv_wakeup.set()
                return
            if not chunk:
                self._recv_queue.append((down.transmit(0), None))
                self._recv_wakeup.set()
                return
            for piece in _pieces(chunk, down.piece_bytes()):
                self._recv_queue.append((down.transmit(len(piece)), bytes(piece)))
            self._recv_pending_bytes += len(chunk)
            self._recv_wakeup.set()
            while self._recv_pending_bytes > RECV_BUFFER_BYTES_HIGH:
                self._recv_space.clear()
                await self._recv_space.wait()

    async def _deliverer(self) -> None:
        while True:
            while not self._recv_queue:
                self._recv_wakeup.clear()
                await self._recv_wakeup.wait()
            await self._clock.sleep_until(self._recv_queue[0][0])
            now_s = self._clock.now()
            while self._recv_queue and self._recv_queue[0][0] <= now_s:
                _, item = self._recv_queue.popleft()
                if isinstance(item, bytes):
                    self._recv_buffer += item
                else:
                    self._recv_eof = True
                    self._recv_error = item
                    self._recv_data.set()
                    return
            self._recv_data.set()

    async def _wait_readable(self, nbytes: float) -> None:
        while len(self._recv_buffer) < nbytes and not self._recv_eof:
            self._recv_data.clear()
            await self._recv_data.wait()

    def _take(self, nbytes: int) -> bytes:
        data = bytes(self._recv_buffer[:nbytes])
        del self._recv_buffer[:nbytes]
        self._recv_pending_bytes -= len(data)
        self._recv_space.set()
        return data

    async def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes as soon as any have arrived (``n < 0``: everything up to
        end of stream); ``b""`` at end of stream. Raises the socket's error if the
        connection broke and nothing is left to return."""
        if self._passthrough:
            return await self._reader.read(n)
        if n == 0:
            return b""
        if n < 0:
            await self._wait_readable(math.inf)
            n = len(self._recv_buffer)
        else:
            await self._wait_readable(1)
        if not self._recv_buffer and self._recv_error is not None:
            raise self._recv_error
        return self._take(n)

    async def readexactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes. Raises :class:`asyncio.IncompleteReadError` (with the
        partial bytes) if the stream ends first, or the socket's error."""
        if self._passthrough:
            return await self._reader.readexactly(n)
        await self._wait_readable(n)
        if len(self._recv_buffer) < n:
            if self._recv_error is not None:
                raise self._recv_error
            raise asyncio.IncompleteReadError(self._take(len(self._recv_buffer)), n)
        return self._take(n)

    def at_eof(self) -> bool:
        """True once the end of stream has arrived and every byte has been read."""
        if self._passthrough:
            return self._reader.at_eof()
        return self._recv_eof and not self._recv_buffer

    # -- lifecycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting writes; queued writes still arrive, then the socket closes."""
        if self._passthrough:
            self._writer.close()
            return
        if self._closing:
            return
        self._closing = True
        if self._error is not None or self._tasks[0].done():
            self._writer.close()
            return
        self._send_queue.append((self.link.up.transmit(0), None))
        self._send_wakeup.set()

    def abort(self) -> None:
        """Drop queued writes and close the socket at once."""
        self._closing = True
        for task in self._tasks:
            task.cancel()
        self._writer.transport.abort()

    async def wait_closed(self) -> None:
        """Wait until :meth:`close` has finished (queued writes sent, socket closed)."""
        if self._tasks:
            await asyncio.wait([self._tasks[0]])
            for task in self._tasks[1:]:
                task.cancel()
            for task in self._tasks[1:]:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    def is_closing(self) -> bool:
        """True after :meth:`close` (or :meth:`abort`)."""
        return self._closing or self._writer.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The underlying transport's information (``peername``, ``sockname``, ...)."""
        return self._writer.get_extra_info(name, default)
