"""A blocking socket behind an emulated link: shaping for the synchronous client.

:class:`ShapedSocket` does for a blocking socket what
:class:`~shuttle.net.shaping.ShapedStream` does for asyncio streams: both directions
of one connection cross a :class:`~shuttle.net.shaping.Link`, on the client side only.

The point of a separate class is **pipelining**. Sleeping until a request's arrival
before sending it, or until a response's arrival after parsing it, makes every
request in a window pay the latency one after the other (16 requests in flight on a
20 ms link would take 16 round trips instead of one). Here, instead:

* :meth:`ShapedSocket.sendall` hands the bytes to ``link.up`` at once and returns (as
  a kernel send buffer would); they are written to the socket at their arrival
  instants, during whatever call comes next (:meth:`~ShapedSocket.recv`,
  :meth:`~ShapedSocket.sendall`, :meth:`~ShapedSocket.drain`,
  :meth:`~ShapedSocket.flush`).
* Received bytes are handed to ``link.down`` at the instant the kernel received them
  (``SO_TIMESTAMPNS``), not when we happen to read them, so a caller that computes
  between reads does not delay a response that was already on its way;
  :meth:`~ShapedSocket.recv` returns them once they have arrived.

Waiting uses ``select`` with microsecond timeouts and a short final spin, so wake-ups
land within tens of microseconds of their instants. Real clock only.
"""

from __future__ import annotations

import collections
import errno
import math
import select
import socket
import struct
import time
from collections.abc import Iterable

from shuttle.net.shaping import RECV_BUFFER_BYTES_HIGH, SEND_BUFFER_BYTES_HIGH, Link

#: Socket option for nanosecond kernel receive timestamps (``SO_TIMESTAMPNS`` on
#: Linux); elsewhere bytes are handed over when read.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
#: Bytes asked of the kernel per read.
RECV_CHUNK_BYTES = 256 * 1024
#: Below this much waiting, poll instead of sleeping: select() overshoots by about
#: the 50 µs timer slack plus a scheduler wake-up, which is half a SAN latency.
SPIN_BELOW_S = 150e-6
#: How long close() waits for queued writes to go out before closing anyway.
CLOSE_FLUSH_TIMEOUT_S = 30.0
#: What sendall takes: one buffer, or several to send in order.
Data = bytes | bytearray | memoryview | Iterable[bytes | bytearray | memoryview]
_TIMESPEC = struct.Struct("@qq")
#: select() cannot watch descriptors at or above this (glibc's FD_SETSIZE).
_FD_SETSIZE = 1024


def _buffers(
    data: bytes | bytearray | memoryview | Iterable[bytes | bytearray | memoryview],
) -> list[bytes]:
    if isinstance(data, bytes | bytearray | memoryview):
        return [bytes(data)]
    return [bytes(b) for b in data]


class ShapedSocket:
    """A connected socket whose both directions cross ``link`` (see the module doc).

    The socket is switched to non-blocking mode and owned from here on: use only
    this object's methods. Errors are the socket's own (``OSError`` and subclasses),
    raised after the bytes that arrived before them; :meth:`recv` raises
    :class:`TimeoutError` when its timeout passes, like a socket with a timeout.
    """

    def __init__(self, sock: socket.socket, link: Link) -> None:
        self.link = link
        self.sock = sock
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
            # The emulation decides when bytes leave; Nagle's algorithm would hold a
            # small piece back until the previous one is acknowledged, and with the
            # peer's delayed ACKs that adds up to 40 ms at random.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._timestamps = True
        try:
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            self._timestamps = False
        self._sends: collections.deque[tuple[float, memoryview]] = collections.deque()
        self._received: collections.deque[tuple[float, bytes]] = collections.deque()
        self._received_bytes = 0
        self._pending_send_bytes = 0
        self._end: tuple[float, OSError | None] | None = None  # EOF or error, and when
        self._closed = False

    # -- the caller's side --------------------------------------------------------------

    def sendall(
        self, data: bytes | bytearray | memoryview | Iterable[bytes | bytearray | memoryview]
    ) -> None:
        """Queue ``data`` (one buffer or several) to reach the node when the link says.

        Raises ``OSError(EBADF)`` after :meth:`close`, or the error that broke the
        connection."""
        if self._closed:
            raise OSError(errno.EBADF, "the shaped socket is closed")
        if self._end is not None and self._end[1] is not None:
            raise self._end[1]
        up = self.link.up
        size = up.piece_bytes()
        for buf in _buffers(data):
            view = memoryview(buf)
            for i in range(0, len(view), size):
                piece = view[i : i + size]
                self._sends.append((up.transmit(len(piece)), piece))
            self._pending_send_bytes += len(view)
        self._progress()

    def recv(self, bufsize: int, timeout_s: float | None = None) -> bytes:
        """Up to ``bufsize`` bytes that have arrived, waiting up to ``timeout_s``
        (``None``: forever). ``b""`` at end of stream. Raises :class:`TimeoutError`,
        or the socket's error once every byte before it has been returned."""
        deadline_s = math.inf if timeout_s is None else time.monotonic() + timeout_s
        while True:
            self._progress()
            now_s = time.monotonic()
            if self._received and self._received[0][0] <= now_s:
                return self._take(bufsize, now_s)
            if not self._received and self._end is not None and self._end[0] <= now_s:
                if self._end[1] is not None:
                    raise self._end[1]
                return b""
            if now_s >= deadline_s:
                raise TimeoutError("timed out waiting for data on the shaped link")
            self._wait(deadline_s)

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until no more than :data:`~shuttle.net.shaping.SEND_BUFFER_BYTES_HIGH`
        bytes are queued (a send buffer's worth). A writer that drains keeps the link
        busy, where one that flushes lets it idle while the last bytes cross it."""
        self.flush(timeout_s, pending_bytes_max=SEND_BUFFER_BYTES_HIGH)

    def flush(self, timeout_s: float | None = None, pending_bytes_max: int = 0) -> None:
        """Wait until every queued write (all but ``pending_bytes_max`` bytes) has been
        written to the socket."""
        deadline_s = math.inf if timeout_s is None else time.monotonic() + timeout_s
        while self._sends and self.pending_send_bytes > pending_bytes_max:
            if self._end is not None and self._end[1] is not None:
                raise self._end[1]
            if time.monotonic() >= deadline_s:
                raise TimeoutError("timed out flushing writes to the shaped link")
            self._wait(deadline_s)
            self._progress()

    def close(self) -> None:
        """Let queued writes go out (up to :data:`CLOSE_FLUSH_TIMEOUT_S`), then close."""
        if self._closed:
            return
        try:
            if self._end is None or self._end[1] is None:
                self.flush(CLOSE_FLUSH_TIMEOUT_S)
        except (OSError, TimeoutError):
            pass
        finally:
            self._closed = True
            self.sock.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def pending_send_bytes(self) -> int:
        """Bytes queued for the node that have not been written yet."""
        return self._pending_send_bytes

    # -- moving bytes ------------------------------------------------------------------

    def _take(self, bufsize: int, now_s: float) -> bytes:
        parts: list[bytes] = []
        size = 0
        while self._received and self._received[0][0] <= now_s and size < bufsize:
            arrival_s, piece = self._received.popleft()
            room = bufsize - size
            if len(piece) > room:
                self._received.appendleft((arrival_s, piece[room:]))
                piece = piece[:room]
            parts.append(piece)
            size += len(piece)
        self._received_bytes -= size
        return b"".join(parts)

    def _progress(self) -> None:
        """Without blocking: write the sends that are due, read what the kernel has."""
        now_s = time.monotonic()
        while self._sends and self._sends[0][0] <= now_s:
            arrival_s, piece = self._sends[0]
            try:
                sent = self.sock.send(piece)
            except BlockingIOError:
                break
            except OSError as exc:
                self._fail(exc)
                return
            self._pending_send_bytes -= sent
            if sent < len(piece):
                self._sends[0] = (arrival_s, piece[sent:])
                break
            self._sends.popleft()
        while self._end is None and self._received_bytes < RECV_BUFFER_BYTES_HIGH:
            try:
                data, ancillary, _, _ = self.sock.recvmsg(
                    RECV_CHUNK_BYTES, socket.CMSG_SPACE(_TIMESPEC.size)
                )
            except BlockingIOError:
                return
            except OSError as exc:
                self._fail(exc)
                return
            down = self.link.down
            at_s = self._received_at(ancillary)
            if not data:
                self._end = (down.transmit(0, at_s), None)
                return
            size = down.piece_bytes()
            for i in range(0, len(data), size):
                part = data[i : i + size]
                self._received.append((down.transmit(len(part), at_s), part))
            self._received_bytes += len(data)

    def _received_at(self, ancillary: list[tuple[int, int, bytes]]) -> float | None:
        """The kernel's receive time of the bytes just read, on the monotonic clock."""
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack(payload[: _TIMESPEC.size])
                return float(sec + nsec * 1e-9 - (time.time() - time.monotonic()))
        return None

    def _fail(self, exc: OSError) -> None:
        self._sends.clear()
        self._pending_send_bytes = 0
        if self._end is None:
            self._end = (self.link.down.transmit(0), exc)

    def _wait(self, deadline_s: float) -> None:
        """Block until the next instant something is due, the socket has data (if we
        are reading), a stuck write can go on, or ``deadline_s``."""
        now_s = time.monotonic()
        wake_s = deadline_s
        send_blocked = bool(self._sends) and self._sends[0][0] <= now_s
        if self._sends and not send_blocked:
            wake_s = min(wake_s, self._sends[0][0])
        if self._received:
            wake_s = min(wake_s, self._received[0][0])
        elif self._end is not None:
            wake_s = min(wake_s, self._end[0])
        reading = self._end is None and self._received_bytes < RECV_BUFFER_BYTES_HIGH
        delay_s = wake_s - now_s
        if delay_s <= 0:
            return
        if delay_s < SPIN_BELOW_S:
            while time.monotonic() < wake_s:
                pass
            return
        timeout_s = None if math.isinf(delay_s) else delay_s - SPIN_BELOW_S
        if not (reading or send_blocked):
            if timeout_s is None:  # nothing can ever happen: fail rather than hang
                raise TimeoutError("waiting forever on a shaped link with nothing in flight")
            time.sleep(timeout_s)
        elif self.sock.fileno() < _FD_SETSIZE:
            # select() takes microseconds; poll() and epoll round up to milliseconds.
            readers = [self.sock] if reading else []
            writers = [self.sock] if send_blocked else []
            select.select(readers, writers, [], timeout_s)
        else:
            poller = select.poll()
            poller.register(
                self.sock,
                (select.POLLIN if reading else 0) | (select.POLLOUT if send_blocked else 0),
            )
            # Round down: the final spin covers the rest.
            poller.poll(None if timeout_s is None else math.floor(timeout_s * 1e3))
