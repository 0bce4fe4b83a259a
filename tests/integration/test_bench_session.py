"""A benchmark stopped mid-run leaves nothing behind: no node process, no scratch
directory; off a terminal it prints its progress as lines."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shuttle.bench.session import _children

#: How long a small benchmark may take to reach its first measured run.
START_TIMEOUT_S = 90.0


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {
        **os.environ,
        "TMPDIR": str(scratch),  # where the benchmark's scratch directories go
        "SHUTTLE_BENCH_HISTORY": str(tmp_path / "history.json"),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "shuttle", "bench", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        # A suite started in the background of a shell inherits SIGINT ignored, and a
        # Python started so never raises KeyboardInterrupt: give the benchmark the
        # Ctrl-C a user's terminal gives it.
        preexec_fn=_sigint_default,
    )
    return proc, scratch


def _lines_until(proc: subprocess.Popen[bytes], wanted: str) -> list[str]:
    """stderr's lines up to the first that contains ``wanted`` (the pipe is no terminal)."""
    assert proc.stderr is not None
    lines: list[str] = []
    buffer = b""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stderr], [], [], 1.0)
        if not ready:
            assert proc.poll() is None, f"the benchmark ended early: {lines}"
            continue
        chunk = os.read(proc.stderr.fileno(), 4096)
        assert chunk, f"the benchmark ended early: {lines}"
        buffer += chunk
        *done, buffer = buffer.split(b"\n")
        lines += [line.decode() for line in done]
        if any(wanted in line for line in lines):
            return lines
    raise AssertionError(f"no {wanted!r} within {START_TIMEOUT_S} s: {lines}")


def _gone(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (a zombie counts as gone)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


@pytest.mark.parametrize(
    ("args", "signum"),
    [
        (
            [
                "abacus", "filter", "--size", str(4 << 20), "--runs", "1", "--cases", "1",
                "--no-monitor-overhead", "--cpu-s-per-mb", "0.2",
            ],
            signal.SIGTERM,
        ),
        (
            [
                "abacus", "raid", "--links", "lan", "--runs", "1", "--file-bytes", str(4 << 20),
            ],
            signal.SIGINT,
        ),
    ],
    ids=["filter-sigterm", "raid-sigint"],
)  # fmt: skip
def test_a_benchmark_stopped_mid_run_leaves_nothing_behind(
    tmp_path: Path, args: list[str], signum: int
) -> None:
    proc, scratch = _start(args, tmp_path)
    try:
        lines = _lines_until(proc, "run 1/1")  # nodes up, data loaded, measuring
        assert "no run with these settings recorded" in lines[0]
        started = _children(proc.pid)
        assert started, "the benchmark runs no node processes"
        assert any(scratch.iterdir()), "the benchmark made no scratch directory"
        proc.send_signal(signum)
        assert proc.wait(timeout=60) == 128 + signum
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    tail = proc.stderr.read().decode()
    assert _gone(started) == [], f"left running: {_gone(started)}\n{tail}"
    assert list(scratch.iterdir()) == [], tail
    assert "cleaned up" in tail
