"""When a primary starts a worker again after it died: the restart backoff.

A worker of a node (docs/architecture.md, "Workers") can die on its own: a crash, an
OOM kill, an operator's ``kill -9``. Its clients' connections close with it (the
kernel closes its sockets; the clients reconnect, to the other processes), and the
kernel drops its listening socket from the port's ``SO_REUSEPORT`` group, so no new
connection goes to it; but the node then serves on one process fewer. The primary
starts it again (:class:`shuttle.node.worker_pool.WorkerPool`), after a delay this
policy decides: short after a worker that had been serving for a while (a crash once
in a while costs its share of the node a fraction of a second), doubled after each
worker that died soon after it was started (one that cannot start, say its key file
is gone, must not spin: it is tried again at most every :data:`RESTART_DELAY_S_MAX`,
and each try is logged).

No I/O here: the pool passes in how long the dead worker lived, and waits the delay
itself (tests/unit/node/test_worker_restarts.py checks the sequence).
"""

from __future__ import annotations

import signal
from typing import Final

#: The delay before the first restart after a worker that had been serving: about
#: what an interpreter's start takes anyway, so a lone crash costs well under a second
#: of one process fewer, and a worker killed over and over still cannot take more than
#: a few starts a second of the machine's CPU.
RESTART_DELAY_S_MIN: Final = 0.25
#: The longest delay between restarts of a worker that keeps dying (at start-up, say):
#: one start of an interpreter (about 1 s of CPU) every 30 s is noise on any machine,
#: and the node is back within half a minute of the cause being fixed.
RESTART_DELAY_S_MAX: Final = 30.0
#: Each quick death in a row multiplies the delay by this.
RESTART_DELAY_FACTOR: Final = 2.0
#: A worker that lived this long before dying counts as having been healthy: the next
#: restart waits :data:`RESTART_DELAY_S_MIN` again. Longer than any start-up
#: (``WORKER_START_TIMEOUT_S`` in the pool) and than the slowest backoff step below it.
RESTART_HEALTHY_S: Final = 60.0


class RestartBackoff:
    """The delays before one worker's restarts (see the module)."""

    def __init__(
        self,
        *,
        delay_s_min: float = RESTART_DELAY_S_MIN,
        delay_s_max: float = RESTART_DELAY_S_MAX,
        factor: float = RESTART_DELAY_FACTOR,
        healthy_s: float = RESTART_HEALTHY_S,
    ) -> None:
        if not 0 < delay_s_min <= delay_s_max:
            raise ValueError(
                f'"delay_s_min" must be > 0 and <= "delay_s_max", got {delay_s_min}, {delay_s_max}'
            )
        if factor < 1:
            raise ValueError(f'"factor" must be >= 1, got {factor}')
        self.delay_s_min = delay_s_min
        self.delay_s_max = delay_s_max
        self.factor = factor
        self.healthy_s = healthy_s
        #: The delay the last death got (0: none yet).
        self.delay_s = 0.0
        #: Deaths in a row, each soon after its start.
        self.quick_deaths = 0

    def after_death(self, lived_s: float) -> float:
        """The delay before starting the worker again, which died ``lived_s`` seconds
        after it was started."""
        if lived_s >= self.healthy_s or self.delay_s == 0:
            self.quick_deaths = 0 if lived_s >= self.healthy_s else 1
            self.delay_s = self.delay_s_min
        else:
            self.quick_deaths += 1
            self.delay_s = min(self.delay_s_max, self.delay_s * self.factor)
        return self.delay_s


def exit_reason(returncode: int) -> str:
    """What a worker's exit status says, for the log: ``killed by SIGKILL`` (an OOM
    kill or ``kill -9``), ``exited with status 1``."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (an OOM kill or kill -9)" if -returncode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {returncode}"
