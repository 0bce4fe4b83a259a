"""The resource monitor (ABACUS 5.3): what each object costs, learned at calls and returns.

The binding manager tells the monitor when a call enters an object and when it
returns; nothing inside an object's methods is instrumented, so monitoring costs
the same whatever the object does. From those two events it keeps, per object and
per edge of the object graph:

* **CPU seconds** per object, from the thread's CPU clock (``time.thread_time``,
  which counts only this thread's time on a CPU, not time it waited or was
  preempted): the time between entering and leaving the object minus what nested
  calls into other local objects used. A shipped object reports its worker's CPU.
* **Bytes moved** on each edge ``caller -> callee``: the data the call carried down
  (arguments) and up (the result), measured by :func:`values.byte_size` without
  encoding anything.
* **Stall time**: the wall time a caller waited on a remote callee (network plus
  the callee's work): what ABACUS's ``ITIMER_BLOCKING`` measured; and, per edge, the
  part of it the callee reported as its own (``far_s``: its wall time in the call
  less what it blocked on remote calls of its own), so the rest is the network's and
  the contention's (:meth:`ResourceMonitor.exit` gives a call's own time).
* Calls and inclusive wall time per object.
* Calls **in flight** per edge: a window shows an edge with a call in progress for
  a whole window even if none completed in it (a console blocked in one long update
  under contention is a stack the resource manager must still see), and a remote
  call's stall is counted as it accrues, at every tick, not all at once when it
  returns: a window sees the time it spent blocked, not the calls that happened to
  end in it. A window also says how many calls were in progress on each of its edges
  as it ended (``in_flight``: the reads below such a call are counted, its CPU and
  its result not yet), and how many calls were inside this run-time's objects on
  average (``calls_in_progress``, one per thread: at a node, those beyond the one
  holding the interpreter's lock wait for it asleep, which the load ``L`` misses).

Counters only grow. Every tick (a few per window) the monitor keeps a snapshot, so
the counts over the last ``H`` are one subtraction: a moving window, as the paper's
moving averages, without decaying anything per call.

A call from application code outside any object is charged to the thread's
*console* (:meth:`ResourceMonitor.console`), the anchored object that stands for
the application in the object graph.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from shuttle.net.clock import REAL_CLOCK, Clock

#: A window shows an edge with no completed call if a call on it has been in flight
#: this many windows.
IN_FLIGHT_WINDOWS = 1.0
#: Snapshots kept: enough to cover a window at the tick rate with room to spare.
HISTORY_MAX = 64


@dataclass(slots=True)
class ObjectCounters:
    """What one object did (cumulative, or over a window)."""

    calls: int = 0
    #: CPU seconds of the object itself at this node (nested calls excluded).
    cpu_s: float = 0.0
    #: Wall seconds inside its calls (nested calls included).
    wall_s: float = 0.0
    bytes_in: int = 0
    bytes_out: int = 0

    def minus(self, other: ObjectCounters) -> ObjectCounters:
        return ObjectCounters(
            self.calls - other.calls,
            self.cpu_s - other.cpu_s,
            self.wall_s - other.wall_s,
            self.bytes_in - other.bytes_in,
            self.bytes_out - other.bytes_out,
        )


@dataclass(slots=True)
class EdgeCounters:
    """Traffic on one edge ``caller -> callee`` (cumulative, or over a window)."""

    calls: int = 0
    bytes_down: int = 0
    bytes_up: int = 0
    #: Wall seconds the caller spent waiting on remote calls on this edge.
    stall_s: float = 0.0
    remote: bool = False
    #: Of ``stall_s``, the seconds the callee reported as its own time in the calls.
    far_s: float = 0.0

    @property
    def bytes(self) -> int:
        return self.bytes_down + self.bytes_up

    def minus(self, other: EdgeCounters) -> EdgeCounters:
        return EdgeCounters(
            self.calls - other.calls,
            self.bytes_down - other.bytes_down,
            self.bytes_up - other.bytes_up,
            self.stall_s - other.stall_s,
            self.remote,
            self.far_s - other.far_s,
        )


Edge = tuple[str, str]
#: A tick's snapshot: when, the cumulative counters, and the call-seconds in objects.
_Snapshot = tuple[float, dict[str, ObjectCounters], dict[Edge, EdgeCounters], float]


@dataclass(frozen=True)
class Window:
    """Counts over the last window: ``span_s`` seconds (``H``, or less after a start).

    ``active_s`` says, per object and per edge, how much of the window it existed
    for (first seen less than ``span_s`` ago: a new stack, an object that just
    arrived): its rates are its counts over that, not over the whole window."""

    span_s: float
    objects: dict[str, ObjectCounters] = field(default_factory=dict)
    edges: dict[Edge, EdgeCounters] = field(default_factory=dict)
    active_s: dict[str | Edge, float] = field(default_factory=dict)
    #: Per edge of the window, the calls on it still in progress as it ended.
    in_flight: dict[Edge, int] = field(default_factory=dict)
    #: Calls in progress in this run-time's objects (outermost ones: one per thread
    #: inside an object), on average over the window.
    calls_in_progress: float = 0.0


@dataclass(slots=True)
class Frame:
    """One active call into an object on this thread."""

    rid: str
    cpu0: float
    wall0: float
    child_cpu: float = 0.0
    #: Wall seconds this call (and its nested local calls) blocked on remote calls.
    remote_s: float = 0.0


class ResourceMonitor:
    """Per-object and per-edge counters of one run-time. Thread-safe."""

    def __init__(self, window_s: float, clock: Clock = REAL_CLOCK) -> None:
        self.window_s = window_s
        self._clock = clock.now
        self._lock = threading.Lock()
        self._objects: dict[str, ObjectCounters] = {}
        self._edges: dict[Edge, EdgeCounters] = {}
        #: When each object and edge was first counted (since its last forget).
        self._first_seen: dict[str | Edge, float] = {}
        #: Calls in progress: token -> [edge, stall already counted, counted up to,
        #: started at].
        self._open: dict[int, list[Any]] = {}
        self._tokens = itertools.count(1)
        self._local = threading.local()
        #: Outermost calls in progress in objects here, and their count integrated
        #: over time (call-seconds) up to ``_busy_t``.
        self._busy_calls = 0
        self._busy_call_s = 0.0
        self._busy_t = self._clock()
        self._history: deque[_Snapshot] = deque(maxlen=HISTORY_MAX)
        self._history.append((self._busy_t, {}, {}, 0.0))

    # --- who is running ------------------------------------------------------------

    def _stack(self) -> list[Frame]:
        stack: list[Frame] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def current(self) -> str | None:
        """The object running on this thread: the innermost call, else the console."""
        stack = self._stack()
        if stack:
            return stack[-1].rid
        console: str | None = getattr(self._local, "console", None)
        return console

    @contextmanager
    def console(self, rid: str) -> Iterator[None]:
        """Charge calls made by this thread outside any object to console ``rid``."""
        before = getattr(self._local, "console", None)
        self._local.console = rid
        try:
            yield
        finally:
            self._local.console = before

    # --- calls and returns ------------------------------------------------------------

    def enter(self, rid: str) -> Frame:
        """A call enters object ``rid`` on this thread."""
        frame = Frame(rid, time.thread_time(), self._clock())
        stack = self._stack()
        if not stack:  # an outermost call: one more thread inside an object here
            with self._lock:
                self._busy_accrue(frame.wall0)
                self._busy_calls += 1
        stack.append(frame)
        return frame

    def _busy_accrue(self, now: float) -> None:
        """Integrate the calls in progress up to ``now`` (lock held)."""
        if now > self._busy_t:
            self._busy_call_s += self._busy_calls * (now - self._busy_t)
            self._busy_t = now

    def own_cpu_s(self, frame: Frame) -> float:
        """CPU the object has used in this call so far, nested calls excluded."""
        return time.thread_time() - frame.cpu0 - frame.child_cpu

    def exit(
        self,
        frame: Frame,
        *,
        bytes_in: int = 0,
        bytes_out: int = 0,
        external_cpu_s: float | None = None,
    ) -> float:
        """The call ``frame`` returns (normally or not). ``external_cpu_s``: CPU the
        object used elsewhere (a shipped object's worker process). Returns the call's
        own wall time: its wall time less what it blocked on remote calls (what a
        remote caller's stall was not the network's)."""
        stack = self._stack()
        popped = stack.pop()
        assert popped is frame, "monitor frames must be exited in order"
        total_cpu = time.thread_time() - frame.cpu0
        own = total_cpu - frame.child_cpu if external_cpu_s is None else external_cpu_s
        end = self._clock()
        wall = end - frame.wall0
        if stack:
            stack[-1].child_cpu += total_cpu
            stack[-1].remote_s += frame.remote_s
        with self._lock:
            if not stack:
                self._busy_accrue(end)
                self._busy_calls -= 1
            c = self._objects.get(frame.rid)
            if c is None:
                c = self._objects[frame.rid] = ObjectCounters()
                self._first_seen[frame.rid] = frame.wall0
            c.calls += 1
            c.cpu_s += max(0.0, own)
            c.wall_s += wall
            c.bytes_in += bytes_in
            c.bytes_out += bytes_out
        return max(0.0, wall - frame.remote_s)

    def _calls(self) -> list[int]:
        calls: list[int] | None = getattr(self._local, "calls", None)
        if calls is None:
            calls = self._local.calls = []
        return calls

    def begin_call(self, caller: str, callee: str) -> int:
        """A call on ``caller -> callee`` starts on this thread; a token for
        :meth:`end_call`."""
        now = self._clock()
        token = next(self._tokens)
        with self._lock:
            self._open[token] = [(caller, callee), 0.0, now, now]
            self._first_seen.setdefault((caller, callee), now)
        self._calls().append(token)
        return token

    def end_call(self, token: int) -> None:
        with self._lock:
            self._open.pop(token, None)
        calls = self._calls()
        if token in calls:
            calls.remove(token)

    def _accrue(self, now: float) -> None:
        """Count the stall of remote calls still in progress up to ``now`` (lock held)."""
        for call in self._open.values():
            e = self._edges.get(call[0])
            if e is not None and e.remote and now > call[2]:
                e.stall_s += now - call[2]
                call[1] += now - call[2]
                call[2] = now

    def record_edge(
        self,
        caller: str,
        callee: str,
        *,
        bytes_down: int,
        bytes_up: int,
        stall_s: float = 0.0,
        remote: bool = False,
        far_s: float = 0.0,
    ) -> None:
        """One call on the edge ``caller -> callee`` completed; ``far_s``: of the
        ``stall_s`` a remote call took, what the callee reported as its own time."""
        counted = 0.0
        if remote:
            stack = self._stack()
            if stack and stack[-1].rid == caller:
                stack[-1].remote_s += stall_s
        with self._lock:
            if remote:  # what ticks counted of this call already
                for token in reversed(self._calls()):
                    call = self._open.get(token)
                    if call is not None and call[0] == (caller, callee):
                        counted, call[1], call[2] = call[1], 0.0, self._clock()
                        break
            e = self._edges.get((caller, callee))
            if e is None:
                e = self._edges[(caller, callee)] = EdgeCounters(remote=remote)
                self._first_seen[(caller, callee)] = self._clock() - stall_s
            e.calls += 1
            e.bytes_down += bytes_down
            e.bytes_up += bytes_up
            e.stall_s += max(0.0, stall_s - counted)
            e.far_s += min(far_s, stall_s)
            e.remote = remote

    def record_wait(self, caller: str, callee: str, seconds: float) -> None:
        """``caller`` waited ``seconds`` on account of its remote calls to ``callee``
        between them (a retry's back-off): stall on the edge, no call. Counted only
        on an edge that has had a call (the wait belongs to calls that were made)."""
        stack = self._stack()
        if stack and stack[-1].rid == caller:
            stack[-1].remote_s += seconds
        with self._lock:
            e = self._edges.get((caller, callee))
            if e is not None:
                e.stall_s += seconds

    # --- windows -----------------------------------------------------------------------

    def totals(self) -> tuple[dict[str, ObjectCounters], dict[Edge, EdgeCounters]]:
        """Copies of the cumulative counters."""
        with self._lock:
            return (
                {k: replace(v) for k, v in self._objects.items()},
                {k: replace(v) for k, v in self._edges.items()},
            )

    def tick(self) -> None:
        """Keep a snapshot (call a few times per window)."""
        now = self._clock()
        with self._lock:
            self._accrue(now)
            self._busy_accrue(now)
            busy = self._busy_call_s
        objects, edges = self.totals()
        self._history.append((now, objects, edges, busy))

    def window(self) -> Window:
        """Counts over the last ``H`` (or since the monitor started, if sooner)."""
        now = self._clock()
        with self._lock:
            self._accrue(now)
            self._busy_accrue(now)
            busy = self._busy_call_s
        objects, edges = self.totals()
        base_t, base_o, base_e, base_busy = self._history[0]
        for t, o, e, b in self._history:
            if t > now - self.window_s:
                break
            base_t, base_o, base_e, base_busy = t, o, e, b
        zero_o, zero_e = ObjectCounters(), EdgeCounters()
        win_o = {
            rid: c.minus(base_o.get(rid, zero_o))
            for rid, c in objects.items()
            if c.calls != base_o.get(rid, zero_o).calls
        }
        win_e = {
            k: c.minus(base_e.get(k, zero_e))
            for k, c in edges.items()
            if c.calls != base_e.get(k, zero_e).calls or c.stall_s != base_e.get(k, zero_e).stall_s
        }
        span = max(0.0, now - base_t)
        with self._lock:
            first = dict(self._first_seen)
            # Calls in flight for a whole window: no digest would ever see them end.
            # (A shorter one shows when it returns: a warm-up read of a table is
            # not a stack stuck under contention.)
            stuck = now - IN_FLIGHT_WINDOWS * self.window_s
            stuck_edges = {c[0] for c in self._open.values() if c[3] <= stuck and c[0] not in win_e}
            open_edges = [c[0] for c in self._open.values()]
        for k in stuck_edges:  # a call in progress, none completed in the window
            win_e[k] = EdgeCounters(remote=edges[k].remote if k in edges else False)
        in_flight: dict[Edge, int] = {}
        for k in open_edges:
            if k in win_e:
                in_flight[k] = in_flight.get(k, 0) + 1
        active: dict[str | Edge, float] = {}
        keys: list[str | Edge] = [*win_o, *win_e]
        for key in keys:
            seen = first.get(key)
            if seen is not None and seen > base_t:
                active[key] = max(0.0, now - seen)
        in_progress = (busy - base_busy) / span if span > 0 else 0.0
        return Window(span, win_o, win_e, active, in_flight, max(0.0, in_progress))

    def forget(self, rid: str) -> None:
        """Drop the counters of an object that left or is gone (its edges too), from
        the snapshots as well: counts start again from zero if it comes back."""
        with self._lock:
            self._objects.pop(rid, None)
            self._first_seen.pop(rid, None)
            for key in [k for k in self._edges if rid in k]:
                del self._edges[key]
                self._first_seen.pop(key, None)
            for _, objects, edges, _ in self._history:
                objects.pop(rid, None)
                for key in [k for k in edges if rid in k]:
                    del edges[key]

    def snapshot_json(self) -> dict[str, Any]:
        """Cumulative counters, JSON-ready (``shuttle objects``)."""
        objects, edges = self.totals()
        return {
            "objects": {rid: _counters_json(c) for rid, c in objects.items()},
            "edges": [{"caller": a, "callee": b, **_edge_json(e)} for (a, b), e in edges.items()],
        }


def _counters_json(c: ObjectCounters) -> dict[str, Any]:
    return {
        "calls": c.calls,
        "cpu_s": round(c.cpu_s, 6),
        "wall_s": round(c.wall_s, 6),
        "bytes_in": c.bytes_in,
        "bytes_out": c.bytes_out,
    }


def _edge_json(e: EdgeCounters) -> dict[str, Any]:
    return {
        "calls": e.calls,
        "bytes_down": e.bytes_down,
        "bytes_up": e.bytes_up,
        "stall_s": round(e.stall_s, 6),
        "far_s": round(e.far_s, 6),
        "remote": e.remote,
    }
