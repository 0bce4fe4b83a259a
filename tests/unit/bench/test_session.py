"""The benchmark session: progress lines off a terminal, the estimate from the last
run with the same settings, and cleanup of what a benchmark left on any exit."""

from __future__ import annotations

import _thread
import io
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from shuttle.bench.session import BenchSession, run_clients, scratch_dir


@pytest.fixture(autouse=True)
def history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "history.json"
    monkeypatch.setenv("SHUTTLE_BENCH_HISTORY", str(path))
    return path


def test_a_second_run_with_the_same_settings_says_how_long_and_what_is_left() -> None:
    first = io.StringIO()
    with BenchSession("bench demo", {"runs": 2}, out=first) as s:
        s.step("run 1/2")
        s.steps[-1] = (0.0, "run 1/2")
        s.steps.append((30.0, "run 2/2"))
    assert "no run with these settings recorded on this machine yet" in first.getvalue()
    assert "bench demo: done in" in first.getvalue()
    second = io.StringIO()
    with BenchSession("bench demo", {"runs": 2}, out=second) as s:
        assert "expect about" in second.getvalue().splitlines()[0]
        assert s.time_left("run 1/2", 0.0).startswith(", about ")
        assert s.time_left("a step it never had", 0.0) == ""
    other = io.StringIO()
    with BenchSession("bench demo", {"runs": 3}, out=other, typical_s=600):
        pass
    assert "one with other settings took" in other.getvalue()
    fresh = io.StringIO()
    with BenchSession("bench other", {}, out=fresh, typical_s=600):
        pass
    assert "its defaults take about 10 min 00 s" in fresh.getvalue()


def test_off_a_terminal_each_step_is_a_line() -> None:
    out = io.StringIO()
    with BenchSession("bench demo", {}, out=out) as s:
        s.step("loading 16 MiB")
    lines = out.getvalue().splitlines()
    assert lines[1].endswith("] loading 16 MiB") and lines[1].startswith("  [0 s")


def test_an_exception_stops_the_children_and_removes_the_scratch() -> None:
    out = io.StringIO()
    child: subprocess.Popen[bytes] | None = None
    with pytest.raises(RuntimeError), BenchSession("bench demo", {}, out=out):
        scratch = scratch_dir("shuttle-test-")
        (scratch / "data").write_bytes(b"x" * 1000)
        child = subprocess.Popen(["sleep", "60"])
        raise RuntimeError("the benchmark failed")
    assert child is not None
    assert child.poll() is not None  # stopped (and reaped) by the session
    assert not scratch.exists()
    assert "failed after" in out.getvalue() and "stopped 1 process(es)" in out.getvalue()


def test_a_scratch_dir_outside_a_session_is_a_plain_temporary_directory(tmp_path: Path) -> None:
    path = scratch_dir("shuttle-test-", tmp_path)
    assert path.is_dir() and path.parent == tmp_path


def test_an_interrupted_benchmark_does_not_wait_for_its_clients() -> None:
    """Ctrl-C while one client waits at the start barrier for one that will never come:
    the interrupt reaches the caller, the barrier is broken, and the waiting client is
    a daemon thread (so the process could exit even if it were still blocked)."""
    barrier = threading.Barrier(3)  # the third party never arrives
    seen: list[BaseException] = []
    daemons: list[bool] = []
    first_started = threading.Event()

    def waiting() -> None:
        daemons.append(threading.current_thread().daemon)
        first_started.set()
        try:
            barrier.wait()
        except threading.BrokenBarrierError as exc:
            seen.append(exc)

    def interrupting() -> None:
        first_started.wait()
        daemons.append(threading.current_thread().daemon)
        _thread.interrupt_main()  # as Ctrl-C does, while the caller waits in join
        try:
            barrier.wait()
        except threading.BrokenBarrierError as exc:
            seen.append(exc)

    # interrupt_main does nothing where SIGINT is ignored (a suite started in the
    # background of a shell): give this process the handler a terminal's Ctrl-C meets.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_clients([waiting, interrupting], barrier)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert barrier.broken
    assert daemons == [True, True]
