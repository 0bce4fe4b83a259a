"""The optimistic branch of a speculative read, as a thread or as a forked child.

A branch runs ``work(data, checkpoint)`` on the cached copy while the caller (the
pessimistic branch, :mod:`shuttle.client.speculation`) asks the node whether that copy
is current. The caller then either :meth:`~Branch.confirm`\\ s the branch (the copy was
current: the branch may pass its checkpoints and its result is the answer) or
:meth:`~Branch.kill`\\ s it (the copy was stale: whatever the branch did before its
next checkpoint is thrown away). A branch never passes a checkpoint, and never
returns, before it is confirmed; ``checkpoint()`` blocks until then.

* :class:`ThreadBranch` runs ``work`` in a new thread of this process. Cheap (a
  thread start and a join: ~0.1 ms), but the branch shares the process's memory, so
  what ``work`` mutates before its checkpoint must be put back by the program's own
  ``restore`` (the paper's save/restore). A stale branch is stopped at once with an
  asynchronous exception (``PyThreadState_SetAsyncExc``), delivered at its next
  Python bytecode: pure Python work stops within microseconds; a call into C (a
  ``sleep``, a numpy kernel) finishes first.
* :class:`ForkBranch` runs ``work`` in a ``fork()``\\ ed child. Transparent: the
  child's memory is a copy, so nothing it mutates reaches the caller and no
  save/restore is needed; its result comes back pickled (cloudpickle) through a pipe.
  A stale child is killed with ``SIGKILL``. The child is the optimistic branch and
  the parent the pessimistic one, the reverse of the paper's C implementation, because
  inside a library the process that survives must be the caller's own (its pid is
  what the shell, a supervisor or pytest wait on): the parent *is* the checkpoint.

Fork safety. ``fork()`` copies only the calling thread; a lock that another thread
held at that instant stays held in the child forever. So the child touches nothing
another thread could hold: it reads its data from a ``bytes`` object made before the
fork, waits on a pipe, writes to a pipe and leaves with ``os._exit`` (no atexit
handlers, no finalizers, no stdio flush). The rules for ``work`` in a forked branch
are in ``docs/consistency.md``: take no lock another thread may hold and write to no
stream another thread writes to (``sys.stdout``, ``sys.stderr``, a log file: their
buffers have locks of their own); send output back through the result. ``logging``
re-creates its own locks at fork, but not those of the streams its handlers write to.
The kernel kills the child if the thread that forked it dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import pickle
import signal
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import cloudpickle

from shuttle.errors import SpeculationError

T = TypeVar("T")
#: What a speculated function looks like: the object's bytes and the checkpoint.
Work = Callable[[bytes, Callable[[], None]], T]

#: How long a killed thread branch may take to take its asynchronous exception once it
#: is back in Python code (it fires within a few bytecodes; this only bounds a bug).
KILL_DELIVERY_S_MAX = 1.0
#: Bytes read from a child's result pipe per call (a pipe holds 64 KiB on Linux).
RESULT_READ_BYTES = 1 << 16
#: Exit status of a forked branch that learns through its pipe that it was stale.
EXIT_STALE = 3
#: Exit status of a forked branch that could not send its result.
EXIT_UNSENT = 4
#: ``prctl`` option: the signal a child gets when the thread that forked it dies.
PR_SET_PDEATHSIG = 1


class Rollback(BaseException):
    """Raised inside a stale branch to unwind it (a ``BaseException``, like
    ``GeneratorExit``, so that ``except Exception`` in ``work`` does not swallow it)."""


class _Killed(Rollback):
    """The asynchronous form of :class:`Rollback`, sent into a running thread branch."""


class Branch(ABC, Generic[T]):
    """One optimistic run of ``work`` on the cached copy."""

    #: Seconds ``work`` ran, not counting its waits at checkpoints; and seconds it
    #: waited there. Set by :meth:`result`. The caller's elapsed time less both is
    #: what the branch cost the program: T_f (starting it, a late start because the
    #: caller held the interpreter, handing the result back).
    work_s: float = 0.0
    wait_s: float = 0.0

    @abstractmethod
    def confirm(self) -> None:
        """The copy was current: let the branch pass its checkpoints."""

    @abstractmethod
    def kill(self) -> None:
        """The copy was stale: stop the branch; it never passes a checkpoint."""

    @abstractmethod
    def result(self) -> T:
        """After :meth:`confirm`: wait for ``work``'s value (or raise its exception)."""

    @abstractmethod
    def wait_stopped(self) -> None:
        """After :meth:`kill`: wait until the branch no longer runs (before a
        ``restore``, so that it cannot mutate what was just put back)."""


_STARTING, _RUNNING, _KILLING, _DONE = "starting", "running", "killing", "done"


class ThreadBranch(Branch[T]):
    """``work`` in a thread of this process (see the module docstring)."""

    def __init__(self, work: Work[T], data: bytes) -> None:
        self._work = work
        self._data = data
        self._decided = threading.Event()
        self._stale = False
        self._lock = threading.Lock()
        self._state = _STARTING
        self._stopped = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="shuttle-speculation", daemon=True)
        self._thread.start()

    def _checkpoint(self) -> None:
        if not self._decided.is_set():
            t0 = time.perf_counter()
            self._decided.wait()
            self.wait_s += time.perf_counter() - t0
        if self._stale:
            raise Rollback

    def _main(self) -> None:
        # Everything runs inside one try that takes a late _Killed, however late it
        # fires: none may escape into the thread's bootstrap code. Until the state is
        # "running" no kill is sent (one during the start is seen as ``_stale``).
        consumed = ran = False
        started_s = time.perf_counter()
        while True:
            try:
                if not ran:
                    ran = True
                    with self._lock:
                        self._state = _RUNNING
                    try:
                        if self._stale:
                            raise Rollback
                        value = self._work(self._data, self._checkpoint)
                        self._checkpoint()  # the return is a checkpoint too
                        self._value = value
                    except _Killed as exc:
                        consumed = True
                        self._error = exc
                    except BaseException as exc:  # the caller decides what it means
                        self._error = exc
                    self.work_s = time.perf_counter() - started_s - self.wait_s
                self._settle(consumed)
                self._stopped.set()
                return
            except _Killed as exc:
                consumed = True
                self._error = self._error or exc

    def _settle(self, consumed: bool) -> None:
        """Leave no asynchronous exception pending: one sent while the branch ran is
        taken here (spinning in Python code until it fires) before the thread ends."""
        while True:
            try:
                with self._lock:
                    killed = self._state is _KILLING
                    self._state = _DONE
                if killed and not consumed:
                    deadline_s = time.monotonic() + KILL_DELIVERY_S_MAX
                    while time.monotonic() < deadline_s:
                        pass
                return
            except _Killed:
                consumed = True

    def confirm(self) -> None:
        self._decided.set()

    def kill(self) -> None:
        self._stale = True
        self._decided.set()  # a branch waiting at its checkpoint unwinds at once
        with self._lock:
            if self._state is not _RUNNING:
                return
            self._state = _KILLING
            ident = self._thread.ident
            assert ident is not None, "the branch thread was started"
            sent = ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(ident), ctypes.py_object(_Killed)
            )
            assert sent == 1, f"asynchronous exception reached {sent} threads, not one"

    def result(self) -> T:
        self._stopped.wait()
        if self._error is not None:
            raise self._error
        value: T = self._value
        return value

    def wait_stopped(self) -> None:
        self._stopped.wait()


class ForkBranch(Branch[T]):
    """``work`` in a forked child process (see the module docstring).

    ``in_child`` runs in the child before ``work`` (the client drops the parent's
    connections there, so that ``work`` never writes into the parent's sockets).
    """

    def __init__(self, work: Work[T], data: bytes, in_child: Callable[[], None]) -> None:
        _reap_exited()
        go_r, self._go_w = os.pipe()
        self._res_r, res_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (runs in the child; its effects are tested)
            _child(work, data, in_child, go_r, res_w, (self._go_w, self._res_r))
        self.pid = pid
        os.close(go_r)
        os.close(res_w)
        self._reaped = False

    def confirm(self) -> None:
        with contextlib.suppress(BrokenPipeError):  # the child finished without a checkpoint
            os.write(self._go_w, b"g")
        os.close(self._go_w)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        os.close(self._go_w)
        os.close(self._res_r)
        with _UNREAPED_LOCK:  # reaped later: the parent need not wait for the teardown
            _UNREAPED.append(self.pid)
        self._reaped = True

    def wait_stopped(self) -> None:
        """A killed child runs no more of ``work`` and never touches our memory: its
        teardown is not waited for (it is reaped at a later fork)."""

    def _reap(self) -> int:
        if self._reaped:
            return 0
        _, status = os.waitpid(self.pid, 0)
        self._reaped = True
        return os.waitstatus_to_exitcode(status)

    def result(self) -> T:
        chunks: list[bytes] = []
        try:
            while piece := os.read(self._res_r, RESULT_READ_BYTES):
                chunks.append(piece)
        finally:
            os.close(self._res_r)
        if chunks:
            # The child closed the pipe before exiting: reap it later, off the critical
            # path (tearing a process down takes a millisecond or two).
            with _UNREAPED_LOCK:
                _UNREAPED.append(self.pid)
            self._reaped = True
            status = 0
        else:
            status = self._reap()
        if not chunks:
            raise SpeculationError(
                f"the forked branch ended (exit status {status}) without sending its result; "
                "work must return (not exit the process) and its result must be picklable, "
                "or use mechanism='thread'"
            )
        self.work_s, self.wait_s, ok, value = pickle.loads(b"".join(chunks))
        if not ok:
            raise value
        result: T = value
        return result


def _child(
    work: Work[Any],
    data: bytes,
    in_child: Callable[[], None],
    go_r: int,
    res_w: int,
    parent_ends: tuple[int, int],
) -> None:  # pragma: no cover (runs in the forked child)
    """The forked branch: run ``work``, wait for the verdict, send the result, exit."""
    code = EXIT_UNSENT
    try:
        _die_with_parent()
        for fd in parent_ends:
            os.close(fd)
        gc.disable()  # a collection would touch (and so copy) every page of the heap
        in_child()
        passed = False
        wait_s = 0.0

        def checkpoint() -> None:
            nonlocal passed, wait_s
            if not passed:
                t0 = time.perf_counter()
                if os.read(go_r, 1) != b"g":
                    os._exit(EXIT_STALE)  # the parent closed the pipe: stale
                wait_s += time.perf_counter() - t0
                passed = True

        started_s = time.perf_counter()
        try:
            value = work(data, checkpoint)
            checkpoint()
            ok = True
        except BaseException as exc:
            value, ok = exc, False
        payload = _dumps(time.perf_counter() - started_s - wait_s, wait_s, ok, value)
        view = memoryview(payload)
        while view:
            view = view[os.write(res_w, view) :]
        os.close(res_w)  # the parent has its result now, before this process is torn down
        code = 0
    finally:
        os._exit(code)


def _die_with_parent() -> None:  # pragma: no cover (runs in the forked child)
    """Linux: have the kernel kill this child if the thread that forked it dies (a
    caller killed by a timeout must not leave a branch blocked at its checkpoint)."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the branch is still killed or released by its parent
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(EXIT_STALE)


def _dumps(
    work_s: float, wait_s: float, ok: bool, value: Any
) -> bytes:  # pragma: no cover (runs in the forked child)
    try:
        return bytes(cloudpickle.dumps((work_s, wait_s, ok, value)))
    except Exception as exc:  # an unpicklable result or exception
        error = SpeculationError(
            f"the forked branch's {'result' if ok else 'exception'} could not be pickled "
            f"({exc}): return something picklable, or use mechanism='thread'"
        )
        return bytes(cloudpickle.dumps((work_s, wait_s, False, error)))


#: Children that sent their result and were left to exit on their own: reaped
#: without waiting at the next fork (or by :func:`reap_all`).
_UNREAPED: list[int] = []


_UNREAPED_LOCK = threading.Lock()


def _reap_exited() -> None:
    """Reap the children that have exited by now, without waiting for the others."""
    with _UNREAPED_LOCK:
        for pid in list(_UNREAPED):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # reaped elsewhere (a SIGCHLD handler, a waitpid(-1))
            if done:
                _UNREAPED.remove(pid)


def reap_all() -> None:
    """Wait for every child left to exit on its own (at the engine's close)."""
    with _UNREAPED_LOCK:
        while _UNREAPED:
            pid = _UNREAPED.pop()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
