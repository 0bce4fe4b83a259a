"""What a shipped object may use, and why its worker ended.

:class:`SandboxLimits` are the kernel's limits on one shipped object's worker process
(:mod:`shuttle.runtime.sandbox`): its memory, the CPU and wall time of one call, the
processes of its jail. :func:`diagnose_exit` turns a worker's wait status and peak RSS
into the reason its caller is told (over its memory or CPU limit, a crash, a kill
from outside), and :func:`cannot_jail` is a node's refusal of shipped code it cannot
jail. No processes here: the sandbox starts and stops them."""

from __future__ import annotations

import math
import os
import signal
from dataclasses import dataclass

from shuttle.errors import ConfigError
from shuttle.runtime import jail
from shuttle.runtime.sandbox_worker import format_bytes

#: Default memory limit. The worker's interpreter with Shuttle loaded maps about
#: 35 MiB; 512 MiB leaves an object room for a few 64 MiB messages and buffers of
#: 16 MiB wire frames, while a 2-core, few-GiB node can host several at once.
MEMORY_BYTES_DEFAULT = 512 << 20
#: Smallest memory limit accepted: below 64 MiB the interpreter itself barely starts.
MEMORY_BYTES_MIN = 64 << 20
#: Default CPU seconds per call. Filtering a 1 GiB object at a few hundred MB/s takes
#: a few seconds; 30 s is ten times that, yet stops a runaway loop in half a minute.
CPU_S_PER_CALL_DEFAULT = 30.0
#: Default wall seconds per call (callouts excluded). Ten times the CPU budget: a call
#: may wait on its own disk reads, but one blocked for five minutes is stuck.
WALL_S_PER_CALL_DEFAULT = 300.0
#: Largest per-call CPU or wall limit accepted: a call of a week is a batch job, not
#: a method call (and the value must fit the kernel's timers and poll's milliseconds).
SECONDS_PER_CALL_MAX = 7 * 24 * 3600.0
#: A worker killed with a peak RSS of at least this fraction of its memory limit is
#: reported as over that limit (the system's OOM killer, or a C allocator that
#: aborts instead of failing).
MEMORY_NEAR_LIMIT_FRACTION = 0.9
#: Signals that mean the worker crashed (a C extension), rather than was stopped.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGILL})


@dataclass(frozen=True, slots=True)
class SandboxLimits:
    """What one shipped object may use. :class:`ConfigError` names a bad field.

    * ``memory_bytes``: the worker's address space, interpreter included.
    * ``cpu_s_per_call``: CPU seconds (all the worker's threads) one call, a
      constructor or a checkpoint may use; the kernel counts whole seconds, so the
      budget is rounded up to the next whole second of the worker's total.
    * ``wall_s_per_call``: seconds the node waits for one call, not counting the time
      its callouts take.
    * ``processes_max``: processes (threads count) the object's jail may hold at once.
    * ``unsafe_code``: run the worker without the jail (``shuttle serve
      --unsafe-code``): as the node's user, seeing its files, its key and its network.
      Without it a node that cannot build the jail refuses shipped code."""

    memory_bytes: int = MEMORY_BYTES_DEFAULT
    cpu_s_per_call: float = CPU_S_PER_CALL_DEFAULT
    wall_s_per_call: float = WALL_S_PER_CALL_DEFAULT
    processes_max: int = jail.PROCESSES_MAX_DEFAULT
    unsafe_code: bool = False

    def __post_init__(self) -> None:
        memory = self.memory_bytes
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < MEMORY_BYTES_MIN:
            raise ConfigError(
                f"sandbox limits: memory_bytes must be a whole number of bytes of at least "
                f"{MEMORY_BYTES_MIN} (64 MiB), got {memory!r}"
            )
        for name in ("cpu_s_per_call", "wall_s_per_call"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or not 0 < value <= SECONDS_PER_CALL_MAX
            ):
                raise ConfigError(
                    f"sandbox limits: {name} must be a number of seconds above 0 and at most "
                    f"{SECONDS_PER_CALL_MAX:g} (a week), got {value!r}"
                )
        processes = self.processes_max
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 2:
            raise ConfigError(
                f"sandbox limits: processes_max must be a whole number of at least 2 (the "
                f"jail's init and its worker), got {processes!r}"
            )


def diagnose_exit(status: int, peak_rss_bytes: int, limits: SandboxLimits) -> tuple[str, str]:
    """Why a worker that exited on its own ended, from its wait ``status`` and peak
    RSS: ``(reason, advice)``, the reason fitting both "object X.m {reason} and was
    stopped" and "object X was stopped earlier ({reason})"."""
    memory = format_bytes(limits.memory_bytes)
    over_memory = (
        f"went over its memory limit of {memory}",
        "hold less (process the data in pieces) or give the object a larger memory limit",
    )
    if not os.WIFSIGNALED(status):
        return (
            f"ended its worker process (exit status {os.WEXITSTATUS(status)})",
            "a shipped object must not exit the interpreter (sys.exit in a thread, "
            "os._exit); the node's log has the worker's last words",
        )
    number = os.WTERMSIG(status)
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    if number == signal.SIGXCPU:
        return (
            f"used more than its CPU limit of {limits.cpu_s_per_call:g} s in one call",
            "split the work into smaller calls, or give the object a larger cpu_s_per_call",
        )
    near_limit = peak_rss_bytes >= MEMORY_NEAR_LIMIT_FRACTION * limits.memory_bytes
    if near_limit and (number == signal.SIGKILL or number in CRASH_SIGNALS):
        return over_memory
    if number in CRASH_SIGNALS:
        return (
            f"crashed its worker ({name})",
            f"a C extension failed; one that cannot allocate within the memory limit of "
            f"{memory} may do this",
        )
    return (
        f"was killed by {name} from outside the object",
        "the system's out-of-memory killer, an operator, or (for an object that ignores "
        "SIGXCPU) the kernel's hard CPU limit; the node's log may say which",
    )


def cannot_jail(missing: str) -> str:
    """The refusal of shipped code by a node that cannot build the jail."""
    return (
        f"this node cannot jail shipped code, so it refuses it: {missing}. Use a built-in "
        "object type, or start the node with --unsafe-code to run shipped code without "
        "a jail (as the node's user, with its files, key and network)"
    )
