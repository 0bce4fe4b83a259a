"""``shuttle sim calibrate``: measure on a live node what the simulator needs to
predict it.

Layout, one module per concept:

* ``run``  :func:`calibrate`, the phases in order (its docstring says what each
  measures and why); :func:`with_drains`, its console-call figures over more drains
  (made between live runs);
* ``result``  :class:`Calibration`: what was measured and the simulator's
  ``[server]`` table it gives (and its TOML);
* ``timing``  the node's CPU clock and calls timed back to back;
* ``link``  a call's link time replayed through the shaper's buckets, the
  residual, the rate the shaper achieved;
* ``phases``  the calibration's objects and each phase's measurement;
* ``fresh``  what a live run pays, timed in fresh processes: the dial and the
  object's making as ``shuttle grep``'s timer holds them, the program's grep drained
  at the node (its work there, its calls), the program's reads (the per-call cost);
* ``hosted``  the reference objects and the fit of the hosted costs.
"""

from shuttle.bench.calibrate.hosted import RATIO_RUNS
from shuttle.bench.calibrate.link import achieved_bandwidth_bits_per_s, link_residual_s
from shuttle.bench.calibrate.result import LIVE_BLOCK_BYTES, Calibration
from shuttle.bench.calibrate.run import calibrate, with_drains
from shuttle.bench.calibrate.timing import CALLS, Timed, node_cpu_clock, timed_calls

__all__ = [
    "CALLS",
    "LIVE_BLOCK_BYTES",
    "RATIO_RUNS",
    "Calibration",
    "Timed",
    "achieved_bandwidth_bits_per_s",
    "calibrate",
    "link_residual_s",
    "node_cpu_clock",
    "timed_calls",
    "with_drains",
]
