"""The event kernel: a deterministic heap of (time, priority+sequence, handler, argument).

An event is a plain tuple on a binary heap. Handlers are ordinary callables
``handler(now, arg)``: the kernel pops the earliest event and calls its handler with
the event's time and argument. There are no generator coroutines, no event objects
and no callbacks lists, which is what makes this loop several times faster than
SimPy's on the same model (see ``shuttle sim bench-kernel``).

Ordering is total and reproducible: events at the same time run in priority order
(lower first) and then in the order they were scheduled, exactly SimPy's rule. The
priority and the sequence number share one integer so the heap compares at most two
fields before it finds a difference.

Randomness: a kernel is built from one ``seed``; every random generator a model
needs is derived from it by name (:meth:`Kernel.random`, :meth:`Kernel.numpy_rng`),
so adding a generator never shifts the draws of another.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

import numpy as np

from shuttle.errors import ConfigError

#: A handler receives the event's time and the argument it was scheduled with.
Handler = Callable[[float, Any], None]

#: Events at the same time run in priority order: URGENT before NORMAL before LATE.
PRIORITY_URGENT = 0
PRIORITY_NORMAL = 1
PRIORITY_LATE = 2

# The priority sits above the sequence number in one integer; 2**48 sequence numbers
# is far more events than any run can schedule (a year at 10 M events/s is 2**48).
_SEQUENCE_BITS = 48
_PRIORITY_MAX = 15


def derive_seed(seed: int, name: str) -> int:
    """A 64-bit seed for the stream ``name``, a pure function of ``seed`` and ``name``."""
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class Kernel:
    """A discrete-event kernel. ``now`` is the time of the event being handled.

    Schedule with :meth:`at` (absolute time) or :meth:`after` (relative); drive with
    :meth:`run` or :meth:`step`.
    """

    __slots__ = (
        "_stream_handler",
        "_stream_index",
        "_stream_open",
        "_stream_times",
        "events_processed",
        "heap",
        "now",
        "seed",
        "sequence",
    )

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.now = 0.0
        self.events_processed = 0
        #: The event heap. Hot paths may push onto it directly (see :meth:`at`).
        self.heap: list[tuple[float, int, Handler, Any]] = []
        #: Sequence numbers start at NORMAL's base, so ``next(sequence)`` *is* the
        #: ordering key of a NORMAL event scheduled now.
        self.sequence = itertools.count(PRIORITY_NORMAL << _SEQUENCE_BITS)
        self._stream_times: list[float] = []
        self._stream_handler: Handler | None = None
        self._stream_index = 0
        self._stream_open = False

    # --- scheduling -----------------------------------------------------------------

    def at(
        self, time: float, handler: Handler, arg: Any = None, priority: int = PRIORITY_NORMAL
    ) -> None:
        """Run ``handler(time, arg)`` at absolute ``time``.

        Hot paths skip this call and push the event themselves, which is the same
        thing at NORMAL priority::

            heappush(kernel.heap, (time, next(kernel.sequence), handler, arg))

        An event in the past is not refused (this is the hot path); it runs next.
        """
        key = next(self.sequence) + ((priority - PRIORITY_NORMAL) << _SEQUENCE_BITS)
        heappush(self.heap, (time, key, handler, arg))

    def after(
        self, delay_s: float, handler: Handler, arg: Any = None, priority: int = PRIORITY_NORMAL
    ) -> None:
        """Run ``handler`` ``delay_s`` seconds after ``now``.

        Raises :class:`~shuttle.errors.ConfigError` if ``delay_s`` is negative or not
        a number, or ``priority`` is outside 0..15.
        """
        if not delay_s >= 0.0:
            raise ConfigError(f'"delay_s" must be >= 0, got {delay_s!r}')
        if not 0 <= priority <= _PRIORITY_MAX:
            raise ConfigError(f'"priority" must be in 0..{_PRIORITY_MAX}, got {priority!r}')
        self.at(self.now + delay_s, handler, arg, priority)

    def stream(self, times: list[float], handler: Handler) -> None:
        """Merge a time-ordered source of events: ``handler(times[i], i)`` for each ``i``.

        A trace replayed at its recorded times is known in advance; keeping it out of
        the heap saves a push and a pop per record. At equal times heap events run
        first. The handler may call :meth:`end_stream` to drop the rest, or append
        to ``times`` (later times only) to continue it. Raises
        :class:`~shuttle.errors.ConfigError` if a stream is already attached.
        """
        if self._stream_open:
            raise ConfigError("a kernel merges one stream at a time; end the first one")
        self._stream_times = times
        self._stream_handler = handler
        self._stream_index = 0
        self._stream_open = bool(times)

    def end_stream(self) -> None:
        """Drop the stream's remaining events."""
        self._stream_open = False

    def _stream_next(self) -> float:
        if self._stream_open and self._stream_index < len(self._stream_times):
            return self._stream_times[self._stream_index]
        return math.inf

    def peek(self) -> float:
        """Time of the next event (heap or stream), or ``inf`` if none is scheduled."""
        top = self.heap[0][0] if self.heap else math.inf
        return min(top, self._stream_next())

    def pending(self) -> int:
        """Number of events scheduled and not yet run (the stream's included)."""
        left = len(self._stream_times) - self._stream_index if self._stream_open else 0
        return len(self.heap) + left

    # --- running --------------------------------------------------------------------

    def run(self, until: float = math.inf) -> float:
        """Run events in order until none is left or the next is later than ``until``.

        Returns the time of the last event run (``now``). Events scheduled at exactly
        ``until`` run. Counts events in ``events_processed``.
        """
        if self._stream_open:
            return self._run_merged(until)
        heap = self.heap
        pop = heappop
        processed = 0
        now = self.now
        try:
            if until == math.inf:
                # The common case gets a loop without the bound check.
                while heap:
                    now, _, handler, arg = pop(heap)
                    self.now = now
                    handler(now, arg)
                    processed += 1
            else:
                while heap and heap[0][0] <= until:
                    now, _, handler, arg = pop(heap)
                    self.now = now
                    handler(now, arg)
                    processed += 1
        finally:
            self.events_processed += processed
        return now

    def _run_merged(self, until: float) -> float:
        """:meth:`run` with a stream: take the earlier of the heap's top and the stream's."""
        heap = self.heap
        pop = heappop
        times = self._stream_times
        count = len(times)
        stream_handler = self._stream_handler
        assert stream_handler is not None
        index = self._stream_index
        following = times[index] if index < count else math.inf
        processed = 0
        now = self.now
        try:
            while True:
                if heap and heap[0][0] <= following:
                    if heap[0][0] > until:
                        break
                    now, _, handler, arg = pop(heap)
                    self.now = now
                    handler(now, arg)
                elif following <= until and following != math.inf:
                    now = following
                    self.now = now
                    index += 1
                    self._stream_index = index
                    stream_handler(now, index - 1)
                    if index < count and self._stream_open:
                        following = times[index]
                    else:
                        count = len(times)  # the handler may have extended the stream
                        if index < count and self._stream_open:
                            following = times[index]
                        else:
                            following = math.inf
                            self._stream_open = False
                else:
                    break
                processed += 1
        finally:
            self.events_processed += processed
        return now

    def step(self) -> bool:
        """Run exactly one event (heap or stream); return False if there was none."""
        following = self._stream_next()
        if self.heap and self.heap[0][0] <= following:
            now, _, handler, arg = heappop(self.heap)
            self.now = now
            handler(now, arg)
        elif following != math.inf:
            self.now = following
            self._stream_index += 1
            assert self._stream_handler is not None
            self._stream_handler(following, self._stream_index - 1)
            if self._stream_index >= len(self._stream_times):
                self._stream_open = False
        else:
            return False
        self.events_processed += 1
        return True

    def close(self) -> None:
        """Drop every pending event and the stream.

        Handlers are bound methods of the model, which usually holds the kernel:
        a reference cycle. Closing breaks it so a finished run is freed at once by
        reference counting, without waiting for the cyclic garbage collector.
        """
        self.heap.clear()
        self._stream_open = False
        self._stream_times = []
        self._stream_handler = None

    # --- randomness -----------------------------------------------------------------

    def random(self, name: str) -> random.Random:
        """A ``random.Random`` for the stream ``name``, derived from the kernel's seed."""
        return random.Random(derive_seed(self.seed, name))

    def numpy_rng(self, name: str) -> np.random.Generator:
        """A numpy ``Generator`` for the stream ``name``, derived from the kernel's seed."""
        return np.random.default_rng(derive_seed(self.seed, name))
