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
from collections.abc import Callable, Iterable, Iterator
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
        "_stream",
        "_stream_handler",
        "_stream_head",
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
        #: The event heap. Models schedule through :meth:`at` / :meth:`schedule`.
        self.heap: list[tuple[float, int, Handler, Any]] = []
        #: Sequence numbers start at NORMAL's base, so ``next(sequence)`` *is* the
        #: ordering key of a NORMAL event scheduled now.
        self.sequence = itertools.count(PRIORITY_NORMAL << _SEQUENCE_BITS)
        self._stream: Iterator[tuple[float, Any]] = iter(())
        self._stream_handler: Handler | None = None
        #: The stream's next event, read ahead (None: no stream, or it has ended).
        self._stream_head: tuple[float, Any] | None = None

    # --- scheduling -----------------------------------------------------------------

    def at(
        self, time: float, handler: Handler, arg: Any = None, priority: int = PRIORITY_NORMAL
    ) -> None:
        """Run ``handler(time, arg)`` at absolute ``time``.

        At NORMAL priority :meth:`schedule` is the same thing, cheaper. An event in
        the past is not refused (this is a hot path); it runs next.
        """
        key = next(self.sequence) + ((priority - PRIORITY_NORMAL) << _SEQUENCE_BITS)
        heappush(self.heap, (time, key, handler, arg))

    def schedule(self, time: float, handler: Handler, arg: Any = None) -> None:
        """Run ``handler(time, arg)`` at absolute ``time``, NORMAL priority: the hot path.

        The model's one way onto the heap (models never touch :attr:`heap`): one
        push, no checks. ``kernel.schedule`` may be kept as a bound method.
        """
        heappush(self.heap, (time, next(self.sequence), handler, arg))

    def idle_before(self, time: float) -> bool:
        """True if no heap event is due before ``time``.

        A model may then handle what would happen at ``time`` at once instead of
        scheduling it. The stream is not consulted: its events are arrivals, which
        a model orders behind work already under way (see ``server.Server.arrive``).
        """
        heap = self.heap
        return not heap or time < heap[0][0]

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

    def stream(self, events: Iterable[tuple[float, Any]], handler: Handler) -> None:
        """Merge a time-ordered source of events: ``handler(time, payload)`` for each.

        A trace replayed at its recorded times is known in advance; keeping it out of
        the heap saves a push and a pop per record, and an iterator lets the source
        make its events as they are needed (memory stays flat over hours of trace).
        At equal times heap events run first. The handler may call :meth:`end_stream`
        to drop the rest. Raises :class:`~shuttle.errors.ConfigError` if a stream is
        already attached.
        """
        if self._stream_head is not None:
            raise ConfigError("a kernel merges one stream at a time; end the first one")
        self._stream = iter(events)
        self._stream_handler = handler
        self._stream_head = next(self._stream, None)

    def end_stream(self) -> None:
        """Drop the stream's remaining events."""
        self._stream_head = None
        self._stream = iter(())

    def _stream_next(self) -> float:
        return self._stream_head[0] if self._stream_head is not None else math.inf

    def peek(self) -> float:
        """Time of the next event (heap or stream), or ``inf`` if none is scheduled."""
        top = self.heap[0][0] if self.heap else math.inf
        return min(top, self._stream_next())

    def pending(self) -> int:
        """Events scheduled on the heap, plus one if a stream has more to come."""
        return len(self.heap) + (self._stream_head is not None)

    # --- running --------------------------------------------------------------------

    def run(self, until: float = math.inf) -> float:
        """Run events in order until none is left or the next is later than ``until``.

        Returns the time of the last event run (``now``). Events scheduled at exactly
        ``until`` run. Counts events in ``events_processed``.
        """
        if self._stream_head is not None:
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
        stream = self._stream
        stream_handler = self._stream_handler
        assert stream_handler is not None
        head = self._stream_head
        following, payload = head if head is not None else (math.inf, None)
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
                    current = payload
                    head = next(stream, None)
                    self._stream_head = head
                    stream_handler(now, current)
                    if self._stream_head is None:  # exhausted, or ended by the handler
                        following, payload = math.inf, None
                    else:
                        following, payload = head  # type: ignore[misc]
                else:
                    break
                processed += 1
        finally:
            self.events_processed += processed
        return now

    def step(self) -> bool:
        """Run exactly one event (heap or stream); return False if there was none."""
        head = self._stream_head
        following = head[0] if head is not None else math.inf
        if self.heap and self.heap[0][0] <= following:
            now, _, handler, arg = heappop(self.heap)
            self.now = now
            handler(now, arg)
        elif head is not None:
            self.now = following
            self._stream_head = next(self._stream, None)
            assert self._stream_handler is not None
            self._stream_handler(following, head[1])
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
        self.end_stream()
        self._stream_handler = None

    # --- randomness -----------------------------------------------------------------

    def random(self, name: str) -> random.Random:
        """A ``random.Random`` for the stream ``name``, derived from the kernel's seed."""
        return random.Random(derive_seed(self.seed, name))

    def numpy_rng(self, name: str) -> np.random.Generator:
        """A numpy ``Generator`` for the stream ``name``, derived from the kernel's seed."""
        return np.random.default_rng(derive_seed(self.seed, name))
