"""Run real programs: under ``strace`` to record their file I/O, or bare to measure CPU.

:func:`record_strace` runs a command under ``strace -f -tt -T`` (plus ``-s 0``, since
only file names matter and they are always printed in full, and a syscall filter
that keeps the file, descriptor and process calls the reader understands) and
returns the log's path. :func:`run_measured` runs a command without tracing and
returns the CPU time the kernel charged to it (``wait4``'s rusage, which is exactly
that child's, unlike a before/after ``getrusage(RUSAGE_CHILDREN)`` that would also
count other children reaped in between).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shuttle.errors import ExternalToolError, UsageError

#: strace options: the brief's ``-f -tt -T``; ``-s 0`` drops data bytes from the log
#: (file names are always printed whole); the filter keeps what the reader uses.
STRACE_OPTIONS = ("-f", "-tt", "-T", "-s", "0", "-e", "trace=%file,%desc,%process")


def require_tool(name: str, package: str | None = None) -> str:
    """The path of program ``name``; :class:`ExternalToolError` says how to install it."""
    found = shutil.which(name)
    if found is None:
        raise ExternalToolError(
            f"{name} is not installed; install the Debian package {package or name} "
            "(scripts/setup.sh does) and try again"
        )
    return found


def record_strace(
    command: Sequence[str],
    log: str | Path,
    *,
    cwd: str | Path | None = None,
    stdout: int | None = subprocess.DEVNULL,
    check: bool = True,
) -> int:
    """Run ``command`` under strace, writing the trace to ``log``; return its exit code.

    Raises :class:`UsageError` for an empty command and :class:`ExternalToolError` if
    strace is missing, records nothing (it could not start the command), or (with
    ``check``) the command exits with a status above 1 (grep-like tools exit 1 for
    "no match").
    """
    if not command:
        raise UsageError("no command to record; put it after --, e.g. -- cat README.md")
    strace = require_tool("strace")
    argv = [strace, *STRACE_OPTIONS, "-o", str(log), "--", *command]
    try:
        done = subprocess.run(argv, cwd=cwd, stdout=stdout, stderr=subprocess.PIPE, check=False)
    except OSError as exc:
        raise ExternalToolError(f"cannot run strace: {exc}") from exc
    err = done.stderr.decode(errors="replace").strip().splitlines()
    if not Path(log).exists() or Path(log).stat().st_size == 0:
        # strace could not start the command (not found, not executable).
        raise ExternalToolError(
            f"strace recorded nothing for {command[0]!r}"
            + (f": {err[-1]}" if err else f" (exit status {done.returncode})")
        )
    if check and done.returncode > 1:
        raise ExternalToolError(
            f"{command[0]} exited with status {done.returncode} under strace"
            + (f": {err[-1]}" if err else "")
        )
    return done.returncode


@dataclass(frozen=True)
class Measured:
    """CPU and wall time of one untraced run."""

    user_s: float
    system_s: float
    wall_s: float
    returncode: int

    @property
    def cpu_s(self) -> float:
        """User plus system CPU seconds."""
        return self.user_s + self.system_s


def run_measured(
    command: Sequence[str], *, cwd: str | Path | None = None, check: bool = True
) -> Measured:
    """Run ``command`` (output discarded) and return its own CPU time from ``wait4``.

    Raises :class:`ExternalToolError` if it cannot start or (with ``check``) exits
    with a status above 1.
    """
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            list(command), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
    except OSError as exc:
        raise ExternalToolError(f"cannot run {command[0]}: {exc}") from exc
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped here; keep Popen from waiting again
    if check and code > 1:
        raise ExternalToolError(f"{command[0]} exited with status {code}")
    return Measured(usage.ru_utime, usage.ru_stime, wall, code)
