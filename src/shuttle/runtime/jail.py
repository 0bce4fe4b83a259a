"""The jail of a shipped object, as the node sees it: can this node build one, and
what each one gets.

The jail itself is built by the worker before it loads shipped code
(:mod:`shuttle.runtime.jail_enter`: namespaces, a minimal read-only root, a dedicated
uid, no capabilities, ``no_new_privs``, seccomp; :mod:`shuttle.runtime.jail_seccomp`:
the filter). This module is the node's half: :func:`unavailable` says what this
machine lacks (checked once; a node that cannot jail refuses shipped code unless it
was started with ``--unsafe-code``), :func:`new_spec` picks a jail's uid and
cgroups, :func:`release` removes the cgroups after the jail ended, and
:func:`worker_pid` finds the worker inside (for its memory, read from ``/proc``).
``docs/security.md`` (*The jail*) has the threat model and the measurements.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path

from shuttle.runtime.jail_enter import JailSpec

__all__ = [
    "JailSpec",
    "environment",
    "new_spec",
    "release",
    "sweep_stale_cgroups",
    "unavailable",
    "worker_pid",
]

#: Dedicated uids (and gids) of jails started by a node that runs as root: one drawn at
#: random per jail from this range, so no two live jails share one (a jail's processes
#: cannot then signal or share files with another's even in principle). No account
#: owns them; 0x5E000000 is far above every distribution's allocated ranges and below
#: 2^31, which some tools print as negative.
JAIL_UID_FIRST = 0x5E000000
JAIL_UID_COUNT = 1 << 24
#: Processes (threads count) one jail may have at once: an interpreter with a few
#: threads and some helpers, not a fork bomb. The cgroup's pids.max where the pids
#: controller is writable, and RLIMIT_NPROC in the jail's own user always.
PROCESSES_MAX_DEFAULT = 64
#: Size of the jail's private /tmp (and /dev/shm), and its largest file: scratch
#: space for an object, charged to its memory (tmpfs).
TMP_BYTES_DEFAULT = 64 << 20
#: What the memory cgroup allows the whole jail above one worker's memory limit: the
#: launcher and the init (two small forked interpreters) and the page tables. All of
#: the jail's processes together then stay near one worker's limit, however many it
#: forks (RLIMIT_AS bounds each process alone).
MEMORY_SLACK_BYTES = 96 << 20
#: Where cgroup v1 controllers are mounted.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The directory under each controller that holds the jails' cgroups.
CGROUP_PARENT = "shuttle-jail"
#: Seconds to keep trying to remove an ended jail's cgroup: the kernel empties it as
#: the jail's pid namespace is torn down, a few milliseconds after its init died.
CGROUP_REMOVE_WAIT_S = 2.0
#: Namespaces the jail makes (their files under /proc/self/ns).
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")

_unavailable: str | bool | None = False  # False: not checked yet


def unavailable(proc: Path = Path("/proc")) -> str | None:
    """Why this machine cannot build the jail (what is missing), or None if it can.

    Checks what the kernel and the system say without building one: Linux on x86_64
    (the seccomp filter's numbers), each namespace, user namespaces for an unprivileged
    node, seccomp and libseccomp. A failure that only building shows (a container's
    policy) comes back from the first jail, with the step that failed. ``proc`` is
    for tests; the answer for the real ``/proc`` is computed once."""
    global _unavailable
    real = proc == Path("/proc")
    if real and _unavailable is not False:
        return _unavailable  # type: ignore[return-value]
    reason = _check(proc)
    if real:
        _unavailable = reason
    return reason


def _check(proc: Path) -> str | None:
    if not sys.platform.startswith("linux"):
        return f"the jail needs Linux namespaces and seccomp; this is {sys.platform}"
    if os.uname().machine != "x86_64":
        return f"the jail's system-call numbers are x86_64's; this machine is {os.uname().machine}"
    missing = [ns for ns in NAMESPACES if not (proc / "self" / "ns" / ns).exists()]
    if missing:
        return f"the kernel has no {', '.join(missing)} namespaces (/proc/self/ns)"
    if os.geteuid() != 0:
        limit = _read_int(proc / "sys" / "user" / "max_user_namespaces")
        if limit == 0:
            return "user namespaces are off (sysctl user.max_user_namespaces = 0)"
        if _read_int(proc / "sys" / "kernel" / "unprivileged_userns_clone") == 0:
            return (
                "unprivileged user namespaces are off (sysctl kernel.unprivileged_userns_clone = 0)"
            )
    status = (proc / "self" / "status").read_text() if (proc / "self" / "status").exists() else ""
    if "Seccomp:" not in status:
        return "the kernel has no seccomp (CONFIG_SECCOMP_FILTER)"
    try:
        import pyseccomp  # noqa: F401  (loads libseccomp.so.2)
    except (ImportError, OSError) as exc:
        return f"libseccomp cannot be loaded ({exc}); install libseccomp2 and pyseccomp"
    return None


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def new_spec(
    memory_bytes: int,
    *,
    processes_max: int = PROCESSES_MAX_DEFAULT,
    tmp_bytes: int = TMP_BYTES_DEFAULT,
) -> JailSpec:
    """A jail for one worker: a fresh dedicated uid, and (when the node runs as root and
    the cgroup v1 controllers are there and writable) a pids and a memory cgroup."""
    uid = JAIL_UID_FIRST + secrets.randbelow(JAIL_UID_COUNT)
    cgroups: dict[str, dict[str, str]] = {}
    if os.geteuid() == 0:
        name = f"{os.getpid()}-{uid - JAIL_UID_FIRST:x}"
        limits = {
            "pids": {"pids.max": str(processes_max)},
            "memory": {"memory.limit_in_bytes": str(memory_bytes + tmp_bytes + MEMORY_SLACK_BYTES)},
        }
        for controller, files in limits.items():
            base = CGROUP_ROOT / controller
            if (base / "cgroup.procs").exists() and os.access(base, os.W_OK):
                cgroups[str(base / CGROUP_PARENT / name)] = files
    return JailSpec(uid, uid, processes_max, tmp_bytes, cgroups)


def release(
    spec: JailSpec,
    *,
    wait_s: float = CGROUP_REMOVE_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Remove an ended jail's cgroups; returns those that could not be removed yet.
    ``clock`` and ``sleep``: for tests (a fake clock)."""
    left = [path for path in spec.cgroups if os.path.isdir(path)]
    deadline = clock() + wait_s
    pause_s = 0.001
    while left:
        still = []
        for path in left:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError:
                still.append(path)
        left = still
        if not left or clock() >= deadline:
            break
        sleep(pause_s)  # the kernel is still tearing the namespace down
        pause_s = min(pause_s * 2, 0.05)
    return left


def sweep_stale_cgroups(root: Path = CGROUP_ROOT, proc: Path = Path("/proc")) -> list[str]:
    """Remove the cgroups of jails whose node is gone: a node killed with SIGKILL never
    ran :func:`release`, and its jails' cgroups (named ``<node pid>-<uid>``) stay behind,
    empty once their processes died with it. A node calls this as it starts; a cgroup
    whose node still runs, or that still holds processes, is left alone. Returns the
    cgroups removed."""
    removed = []
    for controller in ("pids", "memory"):
        parent = root / controller / CGROUP_PARENT
        try:
            names = [entry.name for entry in os.scandir(parent) if entry.is_dir()]
        except OSError:
            continue
        for name in names:
            node_pid, _, _ = name.partition("-")
            if not node_pid.isdigit() or (proc / node_pid).exists():
                continue
            with contextlib.suppress(OSError):  # still busy: a later start tries again
                os.rmdir(parent / name)
                removed.append(str(parent / name))
    return removed


def worker_pid(launcher_pid: int) -> int | None:
    """The worker's pid (as the node sees it): the launcher's child (the jail's init)
    has one child once the worker said STARTED. None if it is gone already."""
    pid = launcher_pid
    for _ in range(2):
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
            continue
        return None
    return pid


def environment() -> dict[str, str]:
    """The jailed worker's whole environment: none of the node's variables (they may
    carry secrets), only what Python and Shuttle read."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if "SHUTTLE_PURE" in os.environ:  # which of Shuttle's modules to run: not a secret
        env["SHUTTLE_PURE"] = os.environ["SHUTTLE_PURE"]
    return env
