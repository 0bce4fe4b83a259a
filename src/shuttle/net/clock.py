"""The clock that link shaping and timers read: real monotonic time, or a fake one in tests.

Anything in Shuttle that waits on time (link shaping, later the run-time's timers)
takes a :class:`Clock` argument instead of calling :mod:`time` itself, so a test can
pass :class:`shuttle.testing.FakeClock` and check exact instants without wall time.

Times are plain floats in seconds on the clock's own scale; only differences and
comparisons between times of the same clock mean anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import itertools
import os
import sys
import time
import weakref
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of time that coroutines can wait on.

    Contract:

    * :meth:`now` never goes backwards.
    * ``await sleep_until(t)`` returns once ``now() >= t`` (at once if ``t`` is already
      past); it may return later than ``t`` (scheduler latency), never earlier.
    """

    def now(self) -> float:
        """The current time in seconds."""
        ...

    async def sleep_until(self, deadline_s: float) -> None:
        """Wait until :meth:`now` has reached ``deadline_s``."""
        ...


class _TimerFd:
    """Wake-ups at exact ``time.monotonic()`` instants for one event loop.

    asyncio's selector rounds every timeout up to a whole millisecond (epoll's
    resolution), so ``asyncio.sleep(0.0001)`` sleeps about 1 ms: ten times a SAN
    link's latency. A Linux ``timerfd`` on ``CLOCK_MONOTONIC`` (the clock behind
    ``time.monotonic``), armed at the earliest deadline with nanosecond resolution and
    watched by the loop like a socket, wakes the loop on time instead. The fd exists
    only while someone waits, so no descriptor outlives its waiters.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fd = -1
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._sequence = itertools.count()

    def wait(self, deadline_s: float) -> asyncio.Future[None]:
        future: asyncio.Future[None] = self._loop.create_future()
        if not self._waiters or deadline_s < self._waiters[0][0]:
            self._arm(deadline_s)
        heapq.heappush(self._waiters, (deadline_s, next(self._sequence), future))
        return future

    def _arm(self, deadline_s: float) -> None:
        if self._fd < 0:
            self._fd = _timerfd_create()
            self._loop.add_reader(self._fd, self._fire)
        _timerfd_arm(self._fd, deadline_s)

    def _fire(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._fd, 8)
        now_s = time.monotonic()
        while self._waiters and self._waiters[0][0] <= now_s:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)
        if self._waiters:
            _timerfd_arm(self._fd, self._waiters[0][0])
        else:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
_libc: Any = None


def _libc_or_none() -> Any:
    global _libc
    if _libc is None and sys.platform == "linux":
        try:
            lib = ctypes.CDLL(None, use_errno=True)
            lib.timerfd_create  # noqa: B018 - raises AttributeError when missing
            _libc = lib
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


def _timerfd_create() -> int:
    fd = int(_libc_or_none().timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"timerfd_create: {os.strerror(err)}")
    return fd


def _timerfd_arm(fd: int, deadline_s: float) -> None:
    # A zero it_value would disarm the timer; deadlines are never that early anyway.
    deadline_ns = max(1, int(deadline_s * 1e9))
    spec = _Itimerspec(_Timespec(0, 0), _Timespec(deadline_ns // 10**9, deadline_ns % 10**9))
    if _libc_or_none().timerfd_settime(fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"timerfd_settime: {os.strerror(err)}")


_timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _TimerFd] = (
    weakref.WeakKeyDictionary()
)


class MonotonicClock:
    """Real time from :func:`time.monotonic`.

    On Linux, waits end within a few microseconds of the deadline (a ``timerfd``,
    see :class:`_TimerFd`); elsewhere :func:`asyncio.sleep` is used and a wake-up
    can be up to about 1 ms late. Callers that sleep until absolute deadlines (as the
    shaper does) never accumulate that error.
    """

    def __init__(self, precise: bool = True) -> None:
        self.precise = precise and _libc_or_none() is not None

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline_s: float) -> None:
        if deadline_s <= time.monotonic():
            return
        if self.precise:
            loop = asyncio.get_running_loop()
            timer = _timers.get(loop)
            if timer is None:
                timer = _timers[loop] = _TimerFd(loop)
            await timer.wait(deadline_s)
            return
        # asyncio may wake a timer a hair early (it fires callbacks due within its
        # clock resolution), so loop until the deadline has really passed.
        while True:
            delay_s = deadline_s - time.monotonic()
            if delay_s <= 0:
                return
            await asyncio.sleep(delay_s)


#: The process-wide real clock (stateless, so one instance serves everyone).
REAL_CLOCK: Clock = MonotonicClock()
