"""The Ceph daemons of a :class:`~shuttle.cluster.ceph.LocalCeph` as processes: is a
recorded pid still our daemon (pids get reused), has it finished exiting, waiting for
it, and what its log says when it failed. Every check reads ``/proc``, so it works
for daemons another process started (``shuttle cluster down``).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_runs(pid: int | None, conf: Path) -> bool:
    """Whether ``pid`` is alive and is a Ceph daemon of the conf ``conf`` (pids get
    reused; zombies count as gone)."""
    if not pid:
        return False
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return status.rsplit(")", 1)[1].split()[0] != "Z" and str(conf).encode() in cmdline


def exited(pid: int, conf: Path) -> bool:
    """Whether daemon ``pid`` (of conf ``conf``) has finished exiting: gone, a zombie,
    or the pid reused by another program. A process still tearing itself down after a
    SIGKILL already shows an empty command line but is not gone yet."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    if status.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
        return True
    return bool(cmdline) and str(conf).encode() not in cmdline.split(b"\0")


def wait_gone(pid: int, proc: subprocess.Popen[bytes] | None, timeout_s: float, conf: Path) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return True
        if exited(pid, conf):
            return True
        time.sleep(0.02)
    return False


def wait_exit(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
    try:
        return proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


def log_errors(log: Path, lines: int = 4) -> str:
    """The last error lines (Ceph's level -1) of a daemon's log, shortened."""
    try:
        text = log.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    found = [line.strip()[:240] for line in text if " -1 " in line]
    return "\n".join(found[-lines:]) or "(none)"


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
