"""The discrete-event simulator of a file server that hosts mobile code.

Layout (one concept a module):

* ``kernel``    the event kernel: a heap of (time, priority+sequence, handler, arg)
* ``mm1``       M/M/1 on our kernel and on SimPy with the same draws (bench-kernel)
* ``config``    every parameter of the server and of an experiment (TOML, flags)
* ``blocks``    block keys and the splitting of requests into blocks (one definition)
* ``workload``  traces as columns, request kinds, busiest intervals, cache warm-up
* ``server``    the server model: CPU, block cache with locking, metadata cache, disk
* ``disk``      the storage device: FIFO, parallel units, read and write costs
* ``mobile``    the mobile application's dependent trace, at the client or the server
* ``metrics``   what a run counts: response-time parts, hit rates, loads
* ``prepare``   two passes over a long trace: busiest intervals, their warm caches
* ``prepcache`` prepared intervals kept on disk between sweeps
* ``run``       one interval: warm-up, background feed, mobile application, results
* ``sources``   where traces come from: files, the background generator, agrep
* ``sweep``     the paper's two experiments (cache size, CPU speed), run in parallel
* ``plots``     the figures of a sweep in the paper's layout
* ``policies``  cache policies (LRU, FIFO, CLOCK): a registry with one test suite
* ``replay``    a trace through a cache policy alone (``shuttle sim cache``)
* ``link``      a token-bucket link, one bucket a direction (the live shaper's GCRA)
* ``alone``     a mobile program's trace alone: no background, an idle server
* ``forecast``  both placements of one program, the faster side, the break-even points
* ``cli``, ``sweep_cli``   ``shuttle sim ...`` commands
* ``calibration``  how loaded a background trace keeps the server (back of the envelope)
* ``calibrate_cli``  ``shuttle trace calibrate-background`` (the top-level CLI adds it)
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shuttle.sim.config import ExperimentConfig, ServerConfig
    from shuttle.sim.kernel import Kernel
    from shuttle.sim.run import RunResult, simulate_interval

# The names below are imported on first use, not with the package: the ``shuttle``
# command imports this package's ``cli`` module to build its help and must not pay
# for the rest (tests/unit/test_cli_start.py).
_LAZY: dict[str, str] = {
    "ExperimentConfig": "shuttle.sim.config",
    "ServerConfig": "shuttle.sim.config",
    "Kernel": "shuttle.sim.kernel",
    "RunResult": "shuttle.sim.run",
    "simulate_interval": "shuttle.sim.run",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["ExperimentConfig", "Kernel", "RunResult", "ServerConfig", "simulate_interval"]
