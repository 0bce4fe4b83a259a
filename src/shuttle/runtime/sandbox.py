"""Shipped mobile objects, each in a worker process the node can stop.

A user's class reaches a node by value (:func:`~shuttle.runtime.shipping.ship_class`,
cloudpickle), so the node runs code it has never seen. That code must not be able to
take the node down: an object that loops, allocates without bound, crashes the
interpreter from a C extension or sleeps forever has to be stopped with a clear error
to its caller while the node keeps serving everyone else. Python cannot stop a
thread, bound one thread's memory or interrupt a loop in C code, so a shipped object
runs in a process of its own (:mod:`shuttle.runtime.sandbox_worker`) that the kernel
limits and the node can kill:

* memory: ``RLIMIT_AS`` in the worker, so an allocation past the limit fails there
  (``MemoryError``, reported, and the worker exits);
* CPU per call: before each call the worker sets ``RLIMIT_CPU``'s soft limit to the
  CPU it has used plus the budget; the kernel's SIGXCPU ends it even inside C code;
* wall time per call: the node waits for the reply with a deadline and SIGKILLs the
  worker past it (the backstop for a blocked object, and for one that ignores SIGXCPU);
* the node's death: ``PR_SET_PDEATHSIG`` kills the worker with it.

One process per object, not a pool: a stopped object then takes nothing with it, its
memory and CPU are its own (the resource monitor reads them from ``/proc``), and an
object's state never has to be moved between workers. The costs, measured on this
machine, are the worker's start (dominated by importing Shuttle) and a socket round
trip per call; see ``docs/runtime.md``.

The node talks to its worker over a socketpair in length-prefixed frames (the table is
in :mod:`~shuttle.runtime.sandbox_frames`). The node never unpickles shipped code:
the class's name, methods and ``migratable`` flag come back from the worker. A call
runs on the caller's thread; when the object calls another object through a
reference, the node runs that call (the *callout*) on the same waiting thread and
sends the result back, so a sandboxed object sees the same call semantics as one in
the node, re-entrant calls included.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    NotPermittedError,
    ObjectLimitError,
    ServerError,
    ShuttleError,
    error_from_code,
)
from shuttle.net.cpu import parse_speed_factor
from shuttle.runtime import jail, values
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.refs import Ref
from shuttle.runtime.sandbox_frames import (
    CALL,
    CALLOUT,
    CALLOUT_ERROR,
    CALLOUT_RESULT,
    CHECKPOINT,
    ERROR,
    JAIL_FAILED,
    LOAD,
    MESSAGE_BYTES_MAX,
    READY,
    RESULT,
    RESULT_BYTES,
    STARTED,
    PeerClosed,
    recv_exact,
    recv_header,
    send_frame,
)
from shuttle.runtime.sandbox_limits import SandboxLimits, cannot_jail, diagnose_exit
from shuttle.runtime.sandbox_worker import load_class
from shuttle.runtime.shipping import ship_class

#: ``ship_class`` (:mod:`.shipping`) and ``load_class`` (:mod:`.sandbox_worker`) are
#: named here too: the application's side ships through this module.
__all__ = [
    "Callout",
    "SandboxLimits",
    "SandboxedObject",
    "load_class",
    "ship_class",
]

#: Seconds a new worker may take to start (the interpreter and Shuttle's imports):
#: about 0.3 s here, so 60 s only runs out on a node that is swapping or stalled.
WORKER_START_WAIT_S = 60.0
#: Seconds to wait for a worker to exit (after its socket closed, or after SIGKILL)
#: before giving up on reaping it now; SIGKILL takes effect in milliseconds unless
#: the process is in uninterruptible I/O.
EXIT_WAIT_S = 5.0
#: What a value from a worker (a result, a callout's arguments, an error) may hold,
#: checked before the node decodes it: the frame's bytes, and items and nesting
#: (:data:`~shuttle.runtime.values.ITEMS_MAX`), so no result costs the node more than
#: some 100 MB of objects however it is built.
WORKER_VALUE_LIMITS = values.DecodeLimits(MESSAGE_BYTES_MAX)
#: The worker's main module.
WORKER_MODULE = "shuttle.runtime.sandbox_worker"
#: How a shipped object's calls through its references reach the rest of the system:
#: ``callout(ref, method, args, kwargs)`` with unbound references in the arguments.
#: It runs on the thread waiting in :meth:`SandboxedObject.invoke`; its result, or its
#: :class:`ShuttleError` (same class), is what the object's call returns or raises.
Callout = Callable[[Ref, str, tuple[Any, ...], dict[str, Any]], Any]

log = logging.getLogger(__name__)

_spawner_lock = threading.Lock()
_spawner: ThreadPoolExecutor | None = None


# --- the node's side -------------------------------------------------------------------


class SandboxedObject:
    """One shipped object running in its own worker process. Make it with
    :meth:`start`; thread-safe, one call at a time (re-entrant from a callout)."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        sock: socket.socket,
        rid: ObjectId,
        limits: SandboxLimits,
        callout: Callout,
        jail_spec: jail.JailSpec | None = None,
    ) -> None:
        self.rid = rid
        self.limits = limits
        #: ``module.qualname`` of the class (known once the worker loaded it).
        self.type_label = "shipped class"
        #: The class's ``migratable`` flag.
        self.migratable = False
        self._methods: list[str] = []
        self._proc = proc
        self._pidfd = os.pidfd_open(proc.pid)
        #: The jail this worker runs in (None: unjailed, --unsafe-code).
        self.jail_spec = jail_spec
        #: The worker's own pid: in a jail, the launcher's grandchild (found at start).
        self._worker_pid = proc.pid
        self._sock = sock
        self._poller = select.poll()
        self._poller.register(sock, select.POLLIN)
        self._callout = callout
        self._call_lock = threading.RLock()
        self._depth = 0  # requests in progress (nested when a callout calls back)
        self._state_lock = threading.Lock()
        self._stopped: str | None = None  # why the worker was stopped
        self._status: int | None = None  # its wait status, once reaped
        self._peak_rss_bytes = 0
        # A child's peak RSS (wait4's ru_maxrss) starts at the peak of the process it
        # was forked from, which survives exec: a node bigger than a worker's memory
        # limit would make every killed worker look over its limit. Only a peak above
        # this one says anything about the worker.
        self._inherited_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    @classmethod
    def start(
        cls,
        code: bytes,
        rid: ObjectId,
        *,
        limits: SandboxLimits,
        callout: Callout,
        params: dict[str, Any] | None = None,
        checkpoint: bytes | None = None,
        cpu_factor: float = 1.0,
    ) -> SandboxedObject:
        """Start a worker and make object ``rid`` of the class in ``code`` there: a new
        one from ``params`` (``__init__(**params)``), or, given ``checkpoint``, a fresh
        instance restored from it. References in ``params`` are bound to the worker.

        ``cpu_factor`` below 1 emulates a slower node (see :mod:`shuttle.net.cpu`).
        Errors: :class:`InvalidArgumentError` if ``code`` is not a shippable class;
        :class:`ObjectFailedError` naming the class and the exception if the
        constructor or ``restore`` raised; :class:`ObjectLimitError` if it went over
        a limit; :class:`ServerError` if no worker could be started. On any error the
        worker is gone."""
        if params is not None and checkpoint is not None:
            raise InvalidArgumentError(
                f"object {rid}: pass params to create it or a checkpoint to restore it, not both"
            )
        factor = parse_speed_factor(cpu_factor, "sandbox cpu_factor")
        payload = values.pack(
            [code, str(rid), params, checkpoint, float(limits.cpu_s_per_call), factor]
        )
        if len(payload) > MESSAGE_BYTES_MAX:
            raise LimitExceededError(
                f"object {rid}: its class and {'checkpoint' if checkpoint else 'params'} "
                f"take {len(payload)} bytes, over the sandbox's limit of {MESSAGE_BYTES_MAX}"
            )
        spec: jail.JailSpec | None = None
        if not limits.unsafe_code:
            missing = jail.unavailable()
            if missing is not None:
                raise NotPermittedError(cannot_jail(missing))
            spec = jail.new_spec(limits.memory_bytes, processes_max=limits.processes_max)
        sock, worker_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            fd = worker_sock.fileno()
            # -P: the node's working directory is not on the worker's path (the shipped
            # class must not find its module there); -u: prints reach the log at once.
            # In a jail: -I (also no user site, no PYTHON* variables), and nothing of
            # the node's environment, terminal, log or working directory.
            argv = [sys.executable, "-P" if spec is None else "-I", "-u", "-m", WORKER_MODULE]
            argv += [str(fd), str(limits.memory_bytes), str(os.getpid())]
            if spec is not None:
                argv += ["--jail", spec.to_json()]
            proc = _spawn(argv, fd, jailed=spec is not None)
        except OSError as exc:
            sock.close()
            raise ServerError(f"could not start a sandbox worker for object {rid}: {exc}") from exc
        finally:
            worker_sock.close()
        try:
            sandbox = cls(proc, sock, rid, limits, callout, spec)
        except OSError as exc:  # pidfd_open: out of file descriptors
            proc.kill()
            proc.wait()
            sock.close()
            if spec is not None:
                jail.release(spec)
            raise ServerError(f"could not watch the sandbox worker of object {rid}: {exc}") from exc
        # Bounds every read and write of a frame already begun, so even a worker that
        # stalls inside a frame cannot hold a node thread past the wall limit.
        seconds, fraction = divmod(limits.wall_s_per_call, 1.0)
        timeout = struct.pack("@ll", int(seconds), max(1, int(fraction * 1e6)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeout)
        try:
            sandbox._await_start()
            _, _, body = sandbox._request(
                LOAD, payload, "__init__" if checkpoint is None else "restore", (READY,)
            )
            label, methods, migratable = values.unpack(body, None, WORKER_VALUE_LIMITS)
            sandbox.type_label = str(label)
            sandbox._methods = [str(m) for m in methods]
            sandbox.migratable = bool(migratable)
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    # --- calls ---------------------------------------------------------------------------

    def invoke(
        self, method: str, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]
    ) -> tuple[Any, float]:
        """Call ``method(*args, **kwargs)`` on the object; returns the result (with
        unbound references) and the CPU seconds the object used for it (its thread,
        callouts excluded, a slower node's burn included).

        Errors: :class:`UnknownOperationError`; :class:`ObjectFailedError` if the
        method raised (the object stays alive with the state the method left);
        :class:`ObjectLimitError` if the object went over a limit or died, and on
        every call after that; :class:`InvalidArgumentError` or
        :class:`LimitExceededError` for arguments that cannot travel. A
        :class:`ShuttleError` the method raised keeps its class."""
        if not isinstance(method, str):
            raise InvalidArgumentError(f"a method name is a string, got {method!r:.80}")
        payload = values.pack([method, list(args), kwargs])
        if len(payload) > MESSAGE_BYTES_MAX:
            raise LimitExceededError(
                f"a call to {self._who}.{method} carries {len(payload)} bytes of arguments, "
                f"over the sandbox's limit of {MESSAGE_BYTES_MAX}; pass smaller pieces"
            )
        kind, cpu_s, body = self._request(CALL, payload, method, (RESULT, RESULT_BYTES))
        if kind == RESULT_BYTES:
            return body, cpu_s
        try:
            return values.unpack(body, None, WORKER_VALUE_LIMITS), cpu_s
        except LimitExceededError as exc:
            raise LimitExceededError(
                f"{self._who}.{method} returned a result that is not decoded: {exc}"
            ) from None

    def checkpoint(self) -> bytes:
        """The object's :meth:`~shuttle.runtime.mobile.MobileObject.checkpoint` bytes.
        Errors as :meth:`invoke`."""
        return self._request(CHECKPOINT, b"", "checkpoint", (RESULT_BYTES,))[2]

    def methods(self) -> list[str]:
        """The names other objects may invoke."""
        return list(self._methods)

    def memory_bytes(self) -> int:
        """The worker's resident memory (``/proc/PID/statm``); 0 once it is gone."""
        if not self.alive:
            return 0
        try:
            with open(f"/proc/{self._worker_pid}/statm", "rb") as statm:
                return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            return 0

    @property
    def pid(self) -> int:
        """The worker's pid (in a jail: its process inside, not the launcher)."""
        return self._worker_pid

    @property
    def alive(self) -> bool:
        """Whether the object can still be called (its worker runs and was not stopped)."""
        with self._state_lock:
            if self._stopped is not None or self._status is not None:
                return False
            return not select.select([self._pidfd], [], [], 0)[0]

    def close(self) -> None:
        """Stop the worker and reap it; idempotent. A call in progress on another
        thread fails with :class:`ObjectLimitError`."""
        self._stop("it was closed")
        if self._call_lock.acquire(blocking=False):
            try:
                if self._depth == 0:
                    self._sock.close()
            finally:
                self._call_lock.release()

    def __enter__(self) -> SandboxedObject:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "alive" if self.alive else f"stopped: {self._stopped}"
        return f"SandboxedObject({self.rid}, {self.type_label}, pid {self.pid}, {state})"

    # --- one request and its reply -------------------------------------------------------

    def _await_start(self) -> None:
        """Wait for the worker's STARTED, so a slow start is not charged to the wall
        limit of the constructor."""
        if not self._poller.poll(WORKER_START_WAIT_S * 1000):
            self._stop("its worker did not start")
            raise ServerError(
                f"the sandbox worker of object {self.rid} did not start within "
                f"{WORKER_START_WAIT_S:g} s; the node is overloaded"
            )
        kind, _, body = self._receive(0, "start")
        if kind == JAIL_FAILED:
            reason = body.decode(errors="replace")
            self._stop(f"its jail could not be built ({reason})")
            raise NotPermittedError(cannot_jail(reason))
        if kind != STARTED:
            raise self._violation("start", f"a frame of kind {kind} before STARTED")
        if self.jail_spec is not None:
            self._worker_pid = jail.worker_pid(self._proc.pid) or self._proc.pid

    @property
    def _who(self) -> str:
        return f"object {self.rid} ({self.type_label})"

    def _request(
        self, kind: int, payload: bytes, what: str, expect: tuple[int, ...]
    ) -> tuple[int, float, bytes]:
        """Send a request, serve the worker's callouts until its reply, and return
        ``(kind, cpu_s, body)`` of a reply in ``expect``; raises the worker's error."""
        with self._call_lock:
            self._depth += 1
            try:
                if self._stopped is not None:
                    raise self._stopped_error()
                self._send(kind, payload, what)
                budget_s = self.limits.wall_s_per_call
                while True:
                    waited_from = time.monotonic()
                    reply, cpu_s, body = self._receive(budget_s, what)
                    if reply != CALLOUT:
                        break
                    budget_s -= time.monotonic() - waited_from
                    self._serve_callout(body, what)
                if reply == ERROR:
                    raise self._error(body, what)
                if reply not in expect:
                    raise self._violation(what, f"a reply of kind {reply}")
                return reply, cpu_s, body
            finally:
                self._depth -= 1
                if self._depth == 0 and self._stopped is not None:
                    self._sock.close()

    def _send(self, kind: int, payload: bytes, what: str) -> None:
        try:
            send_frame(self._sock, kind, payload)
        except (BlockingIOError, TimeoutError):
            raise self._over_wall_limit(what) from None
        except OSError:
            raise self._died(what) from None

    def _receive(self, budget_s: float, what: str) -> tuple[int, float, bytes]:
        if not self._poller.poll(max(0, math.ceil(budget_s * 1000))):
            raise self._over_wall_limit(what)
        try:
            size, kind, cpu_s = recv_header(self._sock)
            return kind, cpu_s, recv_exact(self._sock, size)
        except (BlockingIOError, TimeoutError):
            raise self._over_wall_limit(what) from None
        except LimitExceededError as exc:
            raise self._violation(what, str(exc)) from None
        except (PeerClosed, OSError):
            raise self._died(what) from None

    def _serve_callout(self, body: bytes, what: str) -> None:
        try:
            ref, method, args, kwargs = values.unpack(body, None, WORKER_VALUE_LIMITS)
        except LimitExceededError as exc:
            # The object's own doing: it learns why, and its call goes on.
            reply = values.pack([LimitExceededError.code, f"a call out of {self._who}: {exc}"])
            self._send(CALLOUT_ERROR, reply, what)
            return
        except (InvalidArgumentError, ValueError):
            raise self._violation(what, "an undecodable callout") from None
        if not (
            isinstance(ref, Ref)
            and isinstance(method, str)
            and isinstance(args, list)
            and isinstance(kwargs, dict)
        ):
            raise self._violation(what, "a malformed callout")
        try:
            result = self._callout(ref, method, tuple(args), kwargs)
            reply, kind = values.pack(result), CALLOUT_RESULT
            if len(reply) > MESSAGE_BYTES_MAX:
                raise LimitExceededError(
                    f"{ref.rid}.{method} returned {len(reply)} bytes, over the limit of "
                    f"{MESSAGE_BYTES_MAX} a shipped object can receive in one message"
                )
        except ShuttleError as exc:
            reply, kind = values.pack([exc.code, str(exc)]), CALLOUT_ERROR
        except Exception as exc:  # a bug in the node: the object sees a ServerError
            message = f"the node failed calling {ref.rid}.{method}: {type(exc).__name__}: {exc}"
            reply, kind = values.pack([ServerError.code, message]), CALLOUT_ERROR
        if self._stopped is not None:  # closed while the callout ran
            raise self._stopped_error()
        self._send(kind, reply, what)

    # --- errors and stopping -------------------------------------------------------------

    def _error(self, body: bytes, what: str) -> ShuttleError:
        try:
            code, message, stop_reason = values.unpack(body, None, WORKER_VALUE_LIMITS)
        except (InvalidArgumentError, LimitExceededError, ValueError, TypeError):
            return self._violation(what, "an undecodable error")
        if stop_reason is not None:  # the worker is exiting (it ran out of memory)
            self._stop(str(stop_reason))
        return error_from_code(str(code), str(message))

    def _stopped_error(self) -> ObjectLimitError:
        return ObjectLimitError(
            f"{self._who} was stopped earlier ({self._stopped}); create it again, or "
            "restore it from a checkpoint taken before"
        )

    def _over_wall_limit(self, what: str) -> ObjectLimitError:
        wall_s = self.limits.wall_s_per_call
        reason = f"did not finish a call within {wall_s:g} s"
        if self._stop(reason) != reason:
            return self._stopped_error()
        return ObjectLimitError(
            f"{self._who}.{what} {reason} and was stopped; a call must not wait for long "
            "(a sleep, a lock, input that never comes): split the work, or give the "
            "object a longer wall_s_per_call"
        )

    def _violation(self, what: str, detail: str) -> ServerError:
        self._stop(f"its worker broke the protocol ({detail})")
        return ServerError(
            f"{self._who}.{what}: its worker sent {detail}, which breaks the sandbox "
            "protocol, and was stopped; this is a bug in Shuttle, or the object wrote to "
            "its worker's socket"
        )

    def _died(self, what: str) -> ObjectLimitError:
        with self._state_lock:
            earlier = self._stopped
            if self._status is None:
                self._reap()
            if earlier is None:
                status = self._status if self._status is not None else 0
                own_peak = self._peak_rss_bytes
                if own_peak <= self._inherited_rss_bytes:
                    own_peak = 0  # unknown: no larger than what the worker inherited
                reason, advice = diagnose_exit(status, own_peak, self.limits)
                self._stopped = reason
        if earlier is not None:
            return ObjectLimitError(f"{self._who}.{what} was stopped during the call ({earlier})")
        return ObjectLimitError(f"{self._who}.{what} {reason} and was stopped; {advice}")

    def _stop(self, reason: str) -> str:
        """Kill and reap the worker (if still there); returns why it was stopped
        (the first reason given wins)."""
        with self._state_lock:
            if self._stopped is None:
                self._stopped = reason
            if self._status is None:
                with contextlib.suppress(ProcessLookupError):  # it already exited
                    signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
                self._reap()
            return self._stopped

    def _reap(self) -> None:
        """Wait for the worker to exit (killing it after :data:`EXIT_WAIT_S`) and
        record its status. Caller holds ``_state_lock``."""
        for kill in (True, False):
            if select.select([self._pidfd], [], [], EXIT_WAIT_S)[0]:
                break
            if kill:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        pid, status, usage = os.wait4(self._proc.pid, os.WNOHANG)
        if pid == 0:  # stuck in uninterruptible I/O: Popen reaps it later
            self._status = signal.SIGKILL  # the wait status of "killed by SIGKILL"
            os.close(self._pidfd)
            return
        self._status = status
        self._peak_rss_bytes = usage.ru_maxrss * 1024
        self._proc.returncode = os.waitstatus_to_exitcode(status)
        os.close(self._pidfd)
        if self.jail_spec is not None:
            left = jail.release(self.jail_spec)
            if left:
                log.warning("the cgroups %s of ended object %s are not empty yet", left, self.rid)


def _spawn(argv: list[str], fd: int, *, jailed: bool) -> subprocess.Popen[bytes]:
    """Start a worker process from one long-lived thread.

    The kernel sends ``PR_SET_PDEATHSIG`` when the *thread* that forked the worker
    exits, not the process: a worker forked from a pool thread would die when the
    pool retires that thread. The spawner thread lives as long as the node.

    A jailed worker starts in a session of its own (a signal to its process group
    cannot reach the node's), in ``/``, with none of the node's environment, and with
    its output thrown away: what it prints is not the node's log to fill."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sandbox-spawner")
        spawner = _spawner
    if jailed:
        return spawner.submit(
            subprocess.Popen,
            argv,
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=jail.environment(),
            cwd="/",
            start_new_session=True,
        ).result()
    return spawner.submit(
        subprocess.Popen,
        argv,
        pass_fds=(fd,),
        stdin=subprocess.DEVNULL,
        stdout=2,  # a shipped object's prints go to the node's log, never its stdout
    ).result()
