"""A node's full garbage collections on a thread of their own, at an interval, instead of
inside whatever call's allocation tips the interpreter's threshold.

On a node of ``--cpu-factor`` below 1 a collection that runs inside a section of work
is CPU the section measured, burned ``1/f - 1`` times over (``shuttle.net.cpu``): at
speed 0.05 a 76 ms full collection inside a hosted call's section was 1.45 s of the
node's core, a swing (docs/runtime.md, "The node profiled"). With
:class:`FullCollections` started the interpreter makes no full collection by itself
(the third threshold out of reach: young ones still run where they fall, 2 ms at
most) and a daemon thread, in no section, makes one every ``interval_s``: its cost is
the node's real CPU once, whatever the speed factor. ``shuttle serve --scheduled-gc S``.
"""

from __future__ import annotations

import gc
import threading

#: The third threshold while full collections are scheduled: the count of young
#: collections since the last full one never reaches it.
FULL_THRESHOLD_OFF = 1 << 30


class FullCollections:
    """The thread that makes the node's full collections (:meth:`start`, :meth:`stop`)."""

    def __init__(self, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"the interval of full collections must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self.collections = 0
        self._stop = threading.Event()
        self._before = gc.get_threshold()
        self._thread = threading.Thread(target=self._run, name="full-collections", daemon=True)

    def start(self) -> FullCollections:
        g0, g1, _ = self._before
        gc.set_threshold(g0, g1, FULL_THRESHOLD_OFF)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            gc.collect()
            self.collections += 1

    def stop(self) -> None:
        """Stop the thread and give the interpreter its own full collections back."""
        self._stop.set()
        self._thread.join()
        gc.set_threshold(*self._before)
