"""The worker process that runs one shipped mobile object.

:class:`shuttle.runtime.sandbox.SandboxedObject` starts it as
``python -P -u -m shuttle.runtime.sandbox_worker FD MEMORY_BYTES PARENT_PID``. Before it
loads any shipped code the worker limits itself: its address space to
``MEMORY_BYTES`` (``RLIMIT_AS``: an allocation past it fails with ``MemoryError``),
no core files, SIGINT ignored (Ctrl-C on the node's terminal is the node's to handle)
and ``PR_SET_PDEATHSIG`` so that the kernel SIGKILLs it when the node dies. Then it
serves requests on the stream socket ``FD`` one at a time until the node closes it.
Before each request that runs the object's code it sets ``RLIMIT_CPU``'s soft limit
to the CPU it has used plus the per-call budget: past it the kernel sends SIGXCPU,
whose default action ends the process even in the middle of a loop in C code.

The frames it speaks with the node, and the table of their kinds, are in
:mod:`shuttle.runtime.sandbox_frames`; the class it loads was shipped by
:func:`shuttle.runtime.shipping.ship_class`, and only a worker loads one
(:func:`load_class`): unpickling runs the code.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import resource
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

import cloudpickle

from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    LocalProtocolError,
    ObjectFailedError,
    ObjectLimitError,
    ShuttleError,
    UnknownOperationError,
    error_from_code,
)
from shuttle.net.cpu import burn_cpu
from shuttle.runtime import values
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject, bound_method, type_label
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

#: CPU seconds between the kernel's SIGXCPU (soft limit) and its SIGKILL (hard limit),
#: for an object that catches or ignores SIGXCPU. Applied only where the worker may
#: raise its hard limit again for the next call (``CAP_SYS_RESOURCE``).
CPU_HARD_GRACE_S = 1
#: The hard CPU limit of a worker that could never raise it again once lowered (no
#: ``CAP_SYS_RESOURCE``): 2^31 s, 68 years, i.e. none. Then the soft limit's SIGXCPU
#: stops the object and the node's wall-time limit is the backstop.
CPU_HARD_UNPRIVILEGED_S = 1 << 31
#: Characters of an exception's text kept in an error message (a repr of a big
#: argument must not become a megabyte error).
ERROR_TEXT_CHARS_MAX = 500
#: Exit statuses of the worker itself.
EXIT_NODE_GONE = 0
EXIT_USAGE = 2
EXIT_MEMORY = 3
EXIT_PROTOCOL = 4
EXIT_ORPHANED = 5
#: ``prctl`` option: the signal the kernel sends us when our parent thread exits.
PR_SET_PDEATHSIG = 1


# --- the shipped class -----------------------------------------------------------------


def load_class(code: bytes) -> type[MobileObject]:
    """The class :func:`shuttle.runtime.sandbox.ship_class` shipped.

    Unpickling runs the shipped code, so only a sandbox worker calls this on code it
    did not make itself. :class:`InvalidArgumentError` if the bytes do not load (a
    helper module the node lacks, say), are not a :class:`MobileObject` subclass, or
    are an anchored one."""
    try:
        cls = cloudpickle.loads(code)
    except Exception as exc:
        raise InvalidArgumentError(
            f"cannot load the shipped class: {type(exc).__name__}: {_clip(exc)}; a class's "
            "helpers must be shipped with it (cloudpickle.register_pickle_by_value on "
            "their module) or installed on every node"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, MobileObject)):
        raise InvalidArgumentError(
            f"shipped code must be a MobileObject subclass, got {_clip(repr(cls), 80)}"
        )
    if cls.anchored:
        raise InvalidArgumentError(
            f"{type_label(cls)} is anchored (a storage object or a console) and cannot be shipped"
        )
    return cls


# --- the worker ------------------------------------------------------------------------


class Worker:
    """Serves one shipped object over ``sock``. It is also the object's
    :class:`~shuttle.runtime.refs.Invoker`: its references call through it."""

    def __init__(self, sock: socket.socket, memory_bytes: int, hard_cpu_limit: bool) -> None:
        self._sock = sock
        self._memory_bytes = memory_bytes
        self._hard_cpu_limit = hard_cpu_limit
        self._obj: MobileObject | None = None
        self._who = "a shipped object"
        self._cpu_s_per_call = 0.0
        self._burn_ratio = 0.0
        self._thread = threading.get_ident()
        #: Requests being served; more than one when a callout calls the object back.
        self._depth = 0
        #: Thread CPU the current call spent in callouts (not the object's own work).
        self._callout_cpu_s = 0.0
        #: What the innermost request runs, for the out-of-memory message.
        self._what = "load"

    def started(self) -> None:
        """Tell the node the worker is up (its start is not charged to the first call)."""
        self._send(STARTED)

    def serve(self) -> NoReturn:
        """Serve requests until the node closes the socket, then exit."""
        while True:
            kind, body = self._receive()
            self._handle(kind, body)

    # --- the Invoker protocol: the object's references call through here --------------

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Send the call to the node (a CALLOUT) and wait for its result, serving any
        call the node makes into this object meanwhile. The callee's error is raised
        with its own class."""
        if threading.get_ident() != self._thread or self._depth == 0:
            raise LocalProtocolError(
                f"{self._who}: a shipped object's references can be called only from its "
                "methods, on the thread that runs them (not from threads it starts, and "
                "not between calls)"
            )
        payload = values.pack([ref, method, list(args), kwargs])
        if len(payload) > MESSAGE_BYTES_MAX:
            raise LimitExceededError(
                f"{self._who}: the call {ref.rid}.{method} carries {len(payload)} bytes of "
                f"arguments, over the sandbox's limit of {MESSAGE_BYTES_MAX}; pass less per call"
            )
        start_s = time.thread_time()
        try:
            self._send(CALLOUT, payload)
            while True:
                kind, body = self._receive()
                if kind == CALLOUT_RESULT:
                    return values.unpack(body, self)
                if kind == CALLOUT_ERROR:
                    code, message = self._decode(body, 2)
                    raise error_from_code(str(code), str(message))
                self._handle(kind, body)  # the callee called this object back
        finally:
            self._callout_cpu_s += time.thread_time() - start_s

    # --- requests ------------------------------------------------------------------------

    def _handle(self, kind: int, body: bytes) -> None:
        out_of_memory = False
        self._depth += 1
        what = self._what
        try:
            if kind == CALL:
                self._call(body)
            elif kind == CHECKPOINT:
                self._checkpoint()
            elif kind == LOAD and self._obj is None and self._depth == 1:
                self._load(body)
            else:
                self._protocol_violation(f"unexpected frame kind {kind}")
        except MemoryError:
            # Report outside the except block: its traceback holds the frames (and
            # whatever they allocated) alive.
            out_of_memory = True
        finally:
            self._depth -= 1
        if out_of_memory:
            self._out_of_memory()
        self._what = what

    def _load(self, body: bytes) -> None:
        code, rid_text, params, checkpoint, cpu_s_per_call, cpu_factor = self._decode(body, 6)
        rid = ObjectId.parse(rid_text)
        self._cpu_s_per_call = float(cpu_s_per_call)
        self._burn_ratio = max(0.0, 1.0 / float(cpu_factor) - 1.0)
        self._who = f"object {rid} (shipped class)"
        creating = checkpoint is None
        self._what = "__init__" if creating else "restore"
        self._arm_cpu_limit()  # unpickling the class runs shipped code already
        try:
            cls = load_class(code)
        except InvalidArgumentError as exc:
            self._send_error(exc.code, f"{self._who} could not be created: {exc}")
            return
        label = type_label(cls)
        self._who = f"object {rid} ({label})"
        try:
            obj = cls.__new__(cls)
            obj.attach(rid, self)
            if creating:
                obj.__init__(**(params or {}))  # type: ignore[misc]
            else:
                obj.restore(checkpoint)
        except MemoryError:
            raise
        except BaseException as exc:
            done = "created" if creating else "restored from its checkpoint"
            self._send_error(
                ObjectFailedError.code,
                f"{self._who} could not be {done}: {self._what} raised {_describe(exc)}",
            )
            return
        self._obj = obj
        self._send(READY, values.pack([label, cls.methods(), bool(cls.migratable)]))

    def _call(self, body: bytes) -> None:
        method, args, kwargs = self._decode(body, 3)
        obj = self._object()
        self._what = str(method)
        try:
            fn = bound_method(obj, str(method))
        except UnknownOperationError as exc:
            self._send_error(exc.code, str(exc))
            return
        self._arm_cpu_limit()
        outer_callout_cpu_s = self._callout_cpu_s
        self._callout_cpu_s = 0.0
        error: BaseException | None = None
        start_s = time.thread_time()
        try:
            try:
                result = fn(*args, **kwargs)
            except MemoryError:
                raise
            except BaseException as exc:
                error = exc
            cpu_s = time.thread_time() - start_s - self._callout_cpu_s
            if self._burn_ratio:  # a slower node: as CpuSpeed.section, also when it raised
                cpu_s += burn_cpu(cpu_s * self._burn_ratio)
        finally:
            self._callout_cpu_s = outer_callout_cpu_s
        if error is not None:
            self._send_failure(method, error)
        else:
            self._send_result(method, cpu_s, result)

    def _checkpoint(self) -> None:
        obj = self._object()
        self._what = "checkpoint"
        self._arm_cpu_limit()
        try:
            data = obj.checkpoint()
        except MemoryError:
            raise
        except BaseException as exc:
            self._send_failure("checkpoint", exc)
            return
        if not isinstance(data, bytes | bytearray):
            self._send_error(
                ObjectFailedError.code,
                f"{self._who}.checkpoint returned {type(data).__name__}, not bytes",
            )
            return
        self._send_result("checkpoint", 0.0, data)

    # --- replies -------------------------------------------------------------------------

    def _send_result(self, method: str, cpu_s: float, result: Any) -> None:
        kind = type(result)
        if kind is bytes or kind is bytearray:
            reply, body = RESULT_BYTES, result
        elif kind is memoryview and result.c_contiguous:
            reply, body = RESULT_BYTES, result.cast("B")
        else:
            try:
                reply, body = RESULT, values.pack(result)
            except InvalidArgumentError as exc:
                self._send_error(
                    ObjectFailedError.code,
                    f"{self._who}.{method} returned a value that cannot leave the object: {exc}",
                )
                return
        if len(body) > MESSAGE_BYTES_MAX:
            self._send_error(
                ObjectFailedError.code,
                f"{self._who}.{method} returned {len(body)} bytes, over the sandbox's limit of "
                f"{MESSAGE_BYTES_MAX} per message; return it in pieces (an offset and a length)",
            )
            return
        self._send(reply, body, cpu_s=cpu_s)

    def _send_failure(self, what: str, exc: BaseException) -> None:
        if isinstance(exc, ShuttleError):  # keeps its class, as a built-in object's would
            self._send_error(exc.code, f"{self._who}.{what}: {_clip(exc)}")
            return
        self._send_error(
            ObjectFailedError.code,
            f"{self._who}.{what} raised {_describe(exc)}; the object is still alive, with "
            "the state the method left",
        )

    def _send_error(self, code: str, message: str, stop_reason: str | None = None) -> None:
        self._send(ERROR, values.pack([code, message, stop_reason]))

    def _out_of_memory(self) -> NoReturn:
        reason = f"went over its memory limit of {format_bytes(self._memory_bytes)}"
        self._send_error(
            ObjectLimitError.code,
            f"{self._who}.{self._what} {reason} and was stopped; hold less (process the "
            "data in pieces) or give the object a larger memory limit",
            reason,
        )
        os._exit(EXIT_MEMORY)

    # --- plumbing ------------------------------------------------------------------------

    def _object(self) -> MobileObject:
        if self._obj is None:
            self._protocol_violation("a request before the object was loaded")
        return self._obj

    def _arm_cpu_limit(self) -> None:
        """The kernel stops this process once it used ``cpu_s_per_call`` more CPU
        seconds (all threads), rounded up to the kernel's whole seconds."""
        soft = math.ceil(time.process_time() + self._cpu_s_per_call)
        hard = soft + CPU_HARD_GRACE_S if self._hard_cpu_limit else CPU_HARD_UNPRIVILEGED_S
        resource.setrlimit(resource.RLIMIT_CPU, (soft, max(soft, hard)))

    def _decode(self, body: bytes, fields: int) -> list[Any]:
        try:
            decoded = values.unpack(body, self)
        except (InvalidArgumentError, ValueError) as exc:
            self._protocol_violation(str(exc))
        if not isinstance(decoded, list) or len(decoded) != fields:
            self._protocol_violation(f"expected {fields} fields, got {_clip(repr(decoded), 80)}")
        return decoded

    def _send(self, kind: int, *parts: bytes | bytearray | memoryview, cpu_s: float = 0.0) -> None:
        try:
            send_frame(self._sock, kind, *parts, cpu_s=cpu_s)
        except OSError:  # the node closed the socket or died: nobody to answer
            os._exit(EXIT_NODE_GONE)

    def _receive(self) -> tuple[int, bytes]:
        try:
            size, kind, _ = recv_header(self._sock)
            return kind, recv_exact(self._sock, size)
        except LimitExceededError as exc:
            self._protocol_violation(str(exc))
        except (PeerClosed, OSError):
            os._exit(EXIT_NODE_GONE)

    def _protocol_violation(self, detail: str) -> NoReturn:
        print(f"sandbox worker of {self._who}: protocol violation: {detail}", file=sys.stderr)
        os._exit(EXIT_PROTOCOL)


def format_bytes(size: int) -> str:
    """``536870912`` → ``512 MiB`` (whole MiB shown as such)."""
    if size % (1 << 20) == 0:
        return f"{size >> 20} MiB"
    return f"{size} bytes"


def _clip(text: object, chars: int = ERROR_TEXT_CHARS_MAX) -> str:
    text = str(text)
    return text if len(text) <= chars else text[: chars - 3] + "..."


def _describe(exc: BaseException) -> str:
    """``ValueError: bad block (at mymod.py:12 in scan: raise ValueError(...))``."""
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        line = f": {_clip(last.line, 120)}" if last.line else ""
        where = f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name}{line})"
    return f"{type(exc).__name__}: {_clip(exc)}{where}"


# --- process setup ---------------------------------------------------------------------


def limit_self(memory_bytes: int) -> bool:
    """Apply the limits that last the worker's life; returns whether the worker may
    raise its hard CPU limit again after lowering it (so can use a per-call one)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a 512 MiB core per stopped object
    _, as_hard = resource.getrlimit(resource.RLIMIT_AS)
    if as_hard != resource.RLIM_INFINITY:
        memory_bytes = min(memory_bytes, as_hard)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # Probe: lower the hard CPU limit to "none" in finite form, then try to raise it.
    _, cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)
    if cpu_hard != resource.RLIM_INFINITY and cpu_hard <= CPU_HARD_UNPRIVILEGED_S:
        return False
    probe = CPU_HARD_UNPRIVILEGED_S
    resource.setrlimit(resource.RLIMIT_CPU, (probe, probe))
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (probe, probe + 1))
    except (ValueError, OSError):
        return False
    return True


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent thread exits; exit now
    if the parent is already gone (it died before we asked)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), *[ctypes.c_ulong(0)] * 3):
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")
    if os.getppid() != parent_pid:
        os._exit(EXIT_ORPHANED)


def main(argv: list[str] | None = None) -> NoReturn:
    """``FD MEMORY_BYTES PARENT_PID [--jail SPEC]``: jail this process (given a spec:
    :mod:`shuttle.runtime.jail_enter`), limit it, then serve the object."""
    args = sys.argv[1:] if argv is None else argv
    jail_spec = None
    if len(args) == 5 and args[3] == "--jail":
        from shuttle.runtime.jail_enter import JailSpec

        jail_spec = JailSpec.from_json(args[4])
        args = args[:3]
    try:
        fd, memory_bytes, parent_pid = (int(arg) for arg in args)
    except ValueError:
        print(
            "usage: python -m shuttle.runtime.sandbox_worker FD MEMORY_BYTES PARENT_PID [--jail J]"
        )
        sys.exit(EXIT_USAGE)
    die_with_parent(parent_pid)
    sock = socket.socket(fileno=fd)
    if jail_spec is not None:
        _enter_jail(jail_spec, sock)
    hard_cpu_limit = limit_self(memory_bytes)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # An ignored or blocked SIGXCPU is inherited across exec; the CPU limit needs it.
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGXCPU})
    worker = Worker(sock, memory_bytes, hard_cpu_limit)
    worker.started()
    worker.serve()


def _enter_jail(spec: Any, sock: socket.socket) -> None:
    """Build the jail and continue inside it; a jail that cannot be built is reported
    to the node as a JAIL_FAILED frame naming the step, and this process exits."""
    from shuttle.runtime.jail_enter import EXIT_JAIL_FAILED, JailError, enter

    def fail(reason: str) -> None:
        with contextlib.suppress(OSError):
            send_frame(sock, JAIL_FAILED, reason.encode()[: ERROR_TEXT_CHARS_MAX * 8])

    try:
        enter(spec, sock.fileno(), fail)
    except (JailError, OSError) as exc:
        fail(str(exc))
        os._exit(EXIT_JAIL_FAILED)


if __name__ == "__main__":
    main()
