"""What every ``shuttle bench`` command runs inside: it stops what it started on any
exit, shows progress on and off a terminal, and says roughly how long it will take.

* **Any exit.** SIGTERM and SIGHUP raise :class:`BenchStopped` in the main thread (by
  default Python dies at once, skipping every ``finally``), so each benchmark's own
  teardown runs, as it does for an exception or Ctrl-C. Then, whatever happened, the
  session stops every child process the benchmark started that is still running
  (node processes are started in sessions of their own so a terminal's Ctrl-C does
  not reach them, so nothing else would) and removes every scratch directory made
  with :func:`scratch_dir`. Its own cleanup defers further signals, so a second
  Ctrl-C cannot cut it short (it once stopped one node of five).
* **Progress.** :meth:`BenchSession.status` is a spinner on a terminal and a line per
  step elsewhere (a log, CI, a pipe), with the time so far and the time left.
* **How long.** Each finished run records its duration and when each step began
  (``bench-history.json`` in ``~/.cache/shuttle``, or ``$SHUTTLE_BENCH_HISTORY``).
  The next run with the same settings starts by saying how long that took, and each
  step's line says how long the rest took then. A command with no such run yet says
  so, and gives the typical duration of its defaults where one was measured.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO, TypeVar, cast

#: Where runs are recorded (a file), instead of ~/.cache/shuttle/bench-history.json.
HISTORY_ENV = "SHUTTLE_BENCH_HISTORY"
#: Runs kept in the history (the newest): enough for every command and a few settings.
HISTORY_RUNS_MAX = 200
#: How long a leftover child gets to stop after SIGTERM before SIGKILL (a node
#: checkpoints its store as it stops; that takes well under a second).
CHILD_STOP_TIMEOUT_S = 10.0
#: Off a terminal, a step's line is printed at most this often (a step that changes
#: its message many times a second would otherwise flood a log).
LINE_INTERVAL_S = 1.0
#: Signals that stop a benchmark cleanly (SIGINT already raises KeyboardInterrupt).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class BenchStopped(BaseException):
    """A signal asked the benchmark to stop. Not an ``Exception``, so no benchmark's
    ``except Exception`` swallows it on the way to the teardown."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


_active: BenchSession | None = None
_F = TypeVar("_F", bound=Callable[..., Any])


def run_clients(
    clients: list[Callable[[], None]], barrier: threading.Barrier | None = None
) -> None:
    """Run each client in a thread of its own and wait for them all (each records its
    own result and error). A benchmark stopped meanwhile (Ctrl-C, SIGTERM) does not wait
    for its clients: they are daemon threads, and the barrier they start at is broken,
    so the process can exit while its nodes are taken down under them."""
    threads = [threading.Thread(target=client, daemon=True) for client in clients]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException:
        if barrier is not None:
            barrier.abort()
        raise


def scratch_dir(prefix: str, dir: Path | None = None) -> Path:
    """``tempfile.mkdtemp``, removed by the running session when it ends however it
    ends (a benchmark removes it itself when it finishes normally)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=dir))
    if _active is not None:
        _active.scratch.append(path)
    return path


def benchmark(command: str, typical_s: float | None = None) -> Callable[[_F], _F]:
    """Run a ``shuttle bench`` command (``command``: its name, ``bench abacus filter``)
    inside a :class:`BenchSession` keyed by the parameters it was called with
    (``typical_s``: how long its defaults take, where that was measured)."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            with BenchSession(command, dict(kwargs), typical_s):
                return fn(*args, **kwargs)

        return cast(_F, run)

    return wrap


@contextlib.contextmanager
def status(label: str, console: Any) -> Iterator[Callable[[str], None]]:
    """The progress callback of the running session (:meth:`BenchSession.status`), or a
    plain spinner outside one."""
    if _active is not None:
        with _active.status(label, console) as update:
            yield update
        return
    with console.status(label) as spinner:
        yield lambda message: spinner.update(f"{label}: {message}")


def lines(label: str, console: Any) -> Callable[[str], None]:
    """A progress callback that prints each step as a line (on a terminal too: for
    benchmarks whose spinner's refresh thread would disturb what they measure), with
    the time so far and the time left when the session knows them."""

    def show(message: str) -> None:
        if _active is None:
            console.print(f"{label}: {message}", highlight=False, soft_wrap=True)
            return
        now = _active.record(message)
        times = f"{_duration(now)}{_active.time_left(message, now)}"
        console.print(
            f"{label}: [{times}] {message}", highlight=False, markup=False, soft_wrap=True
        )

    return show


def history_path() -> Path:
    if os.environ.get(HISTORY_ENV):
        return Path(os.environ[HISTORY_ENV])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "shuttle" / "bench-history.json"


def _load_history(path: Path) -> list[dict[str, Any]]:
    try:
        runs = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [r for r in runs if isinstance(r, dict)] if isinstance(runs, list) else []


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 90:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass
class BenchSession:
    """One benchmark command's run (see the module docstring). ``typical_s``: how long
    the command's defaults took where that was measured (None: not measured)."""

    command: str
    settings: dict[str, Any] = field(default_factory=dict)
    typical_s: float | None = None
    out: TextIO = field(default_factory=lambda: sys.stderr)
    scratch: list[Path] = field(default_factory=list)
    #: (seconds since the start, message) of every step so far.
    steps: list[tuple[float, str]] = field(default_factory=list)
    _started: float = 0.0
    _children_before: set[int] = field(default_factory=set)
    _previous: dict[str, Any] | None = None
    _handlers: dict[int, Any] = field(default_factory=dict)
    _last_line: float = -1e9

    # --- lifecycle -----------------------------------------------------------------------

    def __enter__(self) -> BenchSession:
        global _active
        _active = self
        self._started = time.monotonic()
        self._children_before = set(_children(os.getpid()))
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._handlers[signum] = signal.signal(signum, _raise_stopped)
        self._previous = self._same_settings_run()
        self._say(f"{self.command}: {self._expectation()}")
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        global _active
        with _deferred_signals() as deferred:
            stopped, removed = self._clean_up()
            for signum, handler in self._handlers.items():
                signal.signal(signum, handler)
            self._handlers.clear()
            _active = None
        elapsed = time.monotonic() - self._started
        left = (
            f"; stopped {stopped} process(es) and removed {removed} scratch dir(s) it left"
            if stopped or removed
            else ""
        )
        if exc is None:
            self._record(elapsed)
            self._say(f"{self.command}: done in {_duration(elapsed)}{left}")
            if deferred:
                raise SystemExit(128 + deferred[0])
            return
        why = (
            str(exc)
            if isinstance(exc, BenchStopped)
            else ("interrupted" if isinstance(exc, KeyboardInterrupt) else "failed")
        )
        self._say(f"{self.command}: {why} after {_duration(elapsed)}; cleaned up{left}")
        if isinstance(exc, BenchStopped):
            raise SystemExit(128 + exc.signum) from None
        if isinstance(exc, KeyboardInterrupt):
            raise SystemExit(130) from None
        if deferred:
            raise SystemExit(128 + deferred[0]) from exc

    def _clean_up(self) -> tuple[int, int]:
        """Stop the children the benchmark started that still run; remove its scratch."""
        mine = [pid for pid in _children(os.getpid()) if pid not in self._children_before]
        stopped = _stop_processes(mine)
        removed = 0
        for path in reversed(self.scratch):
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        return stopped, removed

    # --- progress ------------------------------------------------------------------------

    def record(self, message: str) -> float:
        """A step began: record it; returns the seconds since the start."""
        now = time.monotonic() - self._started
        self.steps.append((now, message))
        return now

    def step(self, message: str) -> None:
        """A step began: record it; off a terminal, print it with the times."""
        now = self.record(message)
        if self.out.isatty() or now - self._last_line < LINE_INTERVAL_S:
            return
        self._last_line = now
        self._say(f"  [{_duration(now)}{self.time_left(message, now)}] {message}")

    @contextlib.contextmanager
    def status(self, label: str, console: Any | None = None) -> Iterator[Callable[[str], None]]:
        """A progress callback for the benchmark: ``update(message)`` shows the step on
        a terminal's spinner (``console``, a Rich console) and records it (a line off a
        terminal)."""
        if console is not None and self.out.isatty() and console.is_terminal:
            with console.status(label) as spinner:

                def update(message: str) -> None:
                    self.step(message)
                    now = time.monotonic() - self._started
                    left = self.time_left(message, now)
                    spinner.update(f"{label}: {message}" + (f" ({left[2:]})" if left else ""))

                yield update
            return
        yield self.step

    def time_left(self, message: str, now: float) -> str:
        """``, about 3 min left`` from the same step of the previous run with these
        settings (scaled by how this run compares so far), else nothing."""
        prev = self._previous
        if prev is None:
            return ""
        for then, text in prev.get("steps", []):
            if text == message:
                total = float(prev["elapsed_s"])
                pace = now / then if then > 1 else 1.0
                return f", about {_duration(max(0.0, (total - then) * pace))} left"
        return ""

    def _expectation(self) -> str:
        if self._previous is not None:
            took = float(self._previous["elapsed_s"])
            return (
                f"expect about {_duration(took)} (the last run with these settings on this "
                f"machine took that, {self._previous.get('date', 'earlier')})"
            )
        other = self._other_settings_run()
        if other is not None:
            return (
                f"no run with these settings recorded on this machine; one with other "
                f"settings took {_duration(float(other['elapsed_s']))} ({other.get('date')})"
            )
        if self.typical_s is not None:
            return (
                f"no run with these settings recorded on this machine; its defaults take "
                f"about {_duration(self.typical_s)} on a 2-core machine"
            )
        return "no run with these settings recorded on this machine yet: no estimate"

    def _say(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(line, file=self.out, flush=True)

    # --- history -------------------------------------------------------------------------

    def _key(self) -> str:
        return json.dumps([self.command, self.settings], sort_keys=True, default=str)

    def _same_settings_run(self) -> dict[str, Any] | None:
        key = self._key()
        runs = [r for r in _load_history(history_path()) if r.get("key") == key]
        return runs[-1] if runs else None

    def _other_settings_run(self) -> dict[str, Any] | None:
        runs = [
            r
            for r in _load_history(history_path())
            if str(r.get("key", "")).startswith(json.dumps([self.command])[:-1])
        ]
        return runs[-1] if runs else None

    def _record(self, elapsed: float) -> None:
        path = history_path()
        runs = _load_history(path)
        runs.append(
            {
                "key": self._key(),
                "date": time.strftime("%Y-%m-%d %H:%M"),
                "elapsed_s": round(elapsed, 1),
                "steps": [[round(t, 1), m] for t, m in self.steps],
            }
        )
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(runs[-HISTORY_RUNS_MAX:]) + "\n")
            tmp.replace(path)


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    raise BenchStopped(signum)


@contextlib.contextmanager
def _deferred_signals() -> Iterator[list[int]]:
    """Record SIGINT, SIGTERM and SIGHUP instead of acting on them (yields the list):
    the cleanup they would interrupt is what they ask for."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield got
        return
    wanted = (signal.SIGINT, *STOP_SIGNALS)
    old = {s: signal.signal(s, lambda signum, _frame: got.append(signum)) for s in wanted}
    try:
        yield got
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (from /proc; empty where there is none)."""
    out = []
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _stop_processes(pids: list[int]) -> int:
    """SIGTERM each, then SIGKILL what is left after :data:`CHILD_STOP_TIMEOUT_S`;
    reap them. Returns how many were running."""
    running = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            running.append(pid)
    deadline = time.monotonic() + CHILD_STOP_TIMEOUT_S
    for pid in running:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break  # reaped by whoever started it (a Popen's wait)
            if done:
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return len(running)
