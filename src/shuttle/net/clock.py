"""The clock that link shaping and timers read: real monotonic time, or a fake one in tests.

Anything in Shuttle that waits on time (link shaping, later the run-time's timers)
takes a :class:`Clock` argument instead of calling :mod:`time` itself, so a test can
pass :class:`shuttle.testing.FakeClock` and check exact instants without wall time.

Times are plain floats in seconds on the clock's own scale; only differences and
comparisons between times of the same clock mean anything.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable


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


class MonotonicClock:
    """Real time from :func:`time.monotonic`, waited on with :func:`asyncio.sleep`.

    asyncio's selector rounds timeouts up to whole milliseconds, so a wake-up can be up
    to about 1 ms late; callers that sleep until absolute deadlines (as the shaper
    does) do not accumulate that error.
    """

    def now(self) -> float:
        return time.monotonic()

    async def sleep_until(self, deadline_s: float) -> None:
        # asyncio may wake a timer a hair early (it fires callbacks due within its
        # clock resolution), so loop until the deadline has really passed.
        while True:
            delay_s = deadline_s - time.monotonic()
            if delay_s <= 0:
                return
            await asyncio.sleep(delay_s)


#: The process-wide real clock (stateless, so one instance serves everyone).
REAL_CLOCK: Clock = MonotonicClock()
