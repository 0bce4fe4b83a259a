"""Shipped objects in worker processes: calls, callouts, checkpoints, and every way an
object is stopped (memory, CPU, wall time, its node dying) without taking the caller
with it. Real worker processes; the object classes below are shipped by value, as a
user's would be (a worker cannot import this test module: it runs with ``-P``)."""

from __future__ import annotations

import ctypes
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

from shuttle.errors import (
    ConfigError,
    InvalidArgumentError,
    NotFoundError,
    ObjectFailedError,
    ObjectLimitError,
    UnknownOperationError,
)
from shuttle.net.cpu import burn_cpu
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.refs import Ref
from shuttle.runtime.sandbox import (
    Callout,
    SandboxedObject,
    SandboxLimits,
    diagnose_exit,
    load_class,
    ship_class,
)

RID = ObjectId("n1", "7")
PEER = Ref(ObjectId("n2", "9"), "127.0.0.1:7402")
#: Seconds to wait for a process to go away before the test fails (never slept).
EXIT_WAIT_S = 20.0


class Counter(MobileObject):
    """The test object: a counter with a method for every way a call can go."""

    def __init__(self, start: int = 0, peer: Ref | None = None) -> None:
        self.n = start
        self.peer = peer

    def add(self, k: int) -> int:
        self.n += k
        return self.n

    def get(self) -> int:
        return self.n

    def fail(self) -> None:
        self.n = -1  # the state a raising method leaves is kept
        raise ValueError("bad block")

    def burn(self, cpu_s: float) -> str:
        burn_cpu(cpu_s)
        return "burned"

    def blob(self, size: int) -> bytes:
        return b"x" * size

    def view(self, size: int) -> memoryview:
        return memoryview(bytearray(b"y" * size))

    def unsendable(self) -> object:
        return object()

    def allocate(self, size: int) -> int:
        return len(bytearray(size))

    def spin(self) -> None:
        while True:
            pass

    def hang(self) -> None:
        threading.Event().wait()

    def hang_after_saying_so(self, fifo: str) -> None:
        with open(fifo, "wb") as said:
            said.write(b"!")
        threading.Event().wait()

    def ask(self, key: str) -> Any:
        assert self.peer is not None
        return self.peer.lookup(key)

    def ask_or_missing(self, key: str) -> Any:
        assert self.peer is not None
        try:
            return self.peer.lookup(key)
        except NotFoundError as exc:
            return f"caught {type(exc).__name__}: {exc}"


class Exploding(MobileObject):
    def __init__(self) -> None:
        raise RuntimeError("no disk")


class Anchored(MobileObject):
    anchored = True


def _no_callout(ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    raise AssertionError(f"unexpected callout {ref.rid}.{method}")


def _start(
    callout: Callout = _no_callout,
    limits: SandboxLimits | None = None,
    **kwargs: Any,
) -> SandboxedObject:
    return SandboxedObject.start(
        ship_class(Counter), RID, limits=limits or SandboxLimits(), callout=callout, **kwargs
    )


def _assert_gone(pid: int) -> None:
    """The worker was reaped (no process, no zombie)."""
    assert not os.path.exists(f"/proc/{pid}"), f"worker {pid} is still there"


def _worker_children() -> list[int]:
    """Sandbox workers that are children of this process."""
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = stat.read().rsplit(")", 1)[1].split()[1]
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                is_worker = b"sandbox_worker" in cmdline.read()
        except (OSError, IndexError):
            continue
        if ppid == me and is_worker:
            found.append(int(entry))
    return found


# --- shipping --------------------------------------------------------------------------


def test_only_mobile_object_classes_can_be_shipped() -> None:
    with pytest.raises(InvalidArgumentError, match="MobileObject"):
        ship_class(int)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="anchored"):
        ship_class(Anchored)
    with pytest.raises(InvalidArgumentError, match="MobileObject subclass"):
        load_class(pickle.dumps(int))
    with pytest.raises(InvalidArgumentError, match="cannot load"):
        load_class(b"not a pickle")


def test_a_shipped_class_loads_where_its_module_does_not_exist(tmp_path: Any) -> None:
    script = (
        "import sys\n"
        "try:\n"
        "    import tests.unit.runtime.test_sandbox\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    sys.exit('the test module is importable here')\n"
        "from shuttle.runtime.sandbox import load_class\n"
        "cls = load_class(sys.stdin.buffer.read())\n"
        "print(cls.__qualname__, cls(start=2).add(3))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-P", "-c", script],
        input=ship_class(Counter),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.split() == [b"Counter", b"5"]
    # Shipping left cloudpickle's by-value registry as it was.
    assert __name__ not in cloudpickle.list_registry_pickle_by_value()


def test_limits_name_the_bad_field() -> None:
    with pytest.raises(ConfigError, match="memory_bytes"):
        SandboxLimits(memory_bytes=1 << 20)
    with pytest.raises(ConfigError, match="cpu_s_per_call"):
        SandboxLimits(cpu_s_per_call=0)
    with pytest.raises(ConfigError, match="wall_s_per_call"):
        SandboxLimits(wall_s_per_call=float("nan"))


# --- calls -----------------------------------------------------------------------------


def test_a_created_object_answers_calls_and_reports_its_cpu() -> None:
    with _start(params={"start": 3}) as sandbox:
        assert sandbox.alive and sandbox.type_label == f"{__name__}.Counter"
        assert sandbox.migratable
        assert {"add", "get", "fail"} <= set(sandbox.methods())
        assert "checkpoint" not in sandbox.methods()
        assert sandbox.memory_bytes() > 1 << 20
        assert sandbox.invoke("add", (4,), {})[0] == 7
        assert sandbox.invoke("add", [], {"k": 1})[0] == 8
        assert sandbox.invoke("blob", [65536], {})[0] == b"x" * 65536
        assert sandbox.invoke("view", [5], {})[0] == b"yyyyy"
        result, cpu_s = sandbox.invoke("burn", [0.3], {})
        assert result == "burned"
        assert cpu_s >= 0.8 * 0.3


def test_a_slower_node_reports_the_burned_cpu_too() -> None:
    with _start(cpu_factor=0.5) as sandbox:
        _, cpu_s = sandbox.invoke("burn", [0.2], {})
        assert cpu_s >= 0.8 * 2 * 0.2


def test_a_raising_method_fails_the_call_but_not_the_object() -> None:
    with _start(params={"start": 5}) as sandbox:
        with pytest.raises(ObjectFailedError) as failed:
            sandbox.invoke("fail", [], {})
        assert not isinstance(failed.value, ObjectLimitError)
        message = str(failed.value)
        assert f"object n1/7 ({__name__}.Counter).fail raised ValueError: bad block" in message
        assert "test_sandbox.py:" in message  # the last traceback line
        with pytest.raises(UnknownOperationError, match="no method 'nope'"):
            sandbox.invoke("nope", [], {})
        with pytest.raises(UnknownOperationError):
            sandbox.invoke("checkpoint", [], {})
        with pytest.raises(ObjectFailedError, match="cannot leave the object"):
            sandbox.invoke("unsendable", [], {})
        assert sandbox.alive
        assert sandbox.invoke("get", [], {})[0] == -1  # the state fail() left


def test_a_failing_constructor_leaves_no_worker() -> None:
    code = ship_class(Exploding)
    with pytest.raises(ObjectFailedError) as failed:
        SandboxedObject.start(code, RID, limits=SandboxLimits(), callout=_no_callout)
    message = str(failed.value)
    assert "Exploding" in message and "RuntimeError: no disk" in message
    assert "could not be created" in message
    assert _worker_children() == []


def test_close_leaves_no_process_behind() -> None:
    sandbox = _start()
    pid = sandbox.pid
    sandbox.close()
    sandbox.close()
    _assert_gone(pid)
    assert not sandbox.alive and sandbox.memory_bytes() == 0
    with pytest.raises(ObjectLimitError, match="stopped earlier"):
        sandbox.invoke("get", [], {})


# --- callouts --------------------------------------------------------------------------


def test_a_callout_runs_on_the_calling_thread_and_its_result_comes_back() -> None:
    seen: list[tuple[int, Ref, str, tuple[Any, ...], dict[str, Any]]] = []
    other = Ref(ObjectId("n3", "1"), "127.0.0.1:7403")

    def callout(ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        seen.append((threading.get_ident(), ref, method, args, kwargs))
        return {"value": 41, "next": other}

    with _start(callout, params={"peer": PEER}) as sandbox:
        result, _ = sandbox.invoke("ask", ["k"], {})
    assert result == {"value": 41, "next": other}
    assert not result["next"].bound  # the caller binds references it receives
    (thread, ref, method, args, kwargs) = seen[0]
    assert thread == threading.get_ident()
    assert (ref, method, args, kwargs) == (PEER, "lookup", ("k",), {})
    assert ref.home_address == PEER.home_address and not ref.bound


def test_a_callout_error_arrives_in_the_object_with_its_class() -> None:
    def callout(ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        raise NotFoundError(f"no key {args[0]!r} on n2")

    with _start(callout, params={"peer": PEER}) as sandbox:
        caught, _ = sandbox.invoke("ask_or_missing", ["k"], {})
        assert caught == "caught NotFoundError: no key 'k' on n2"
        with pytest.raises(NotFoundError, match="no key 'k' on n2"):
            sandbox.invoke("ask", ["k"], {})  # uncaught, it keeps its class
        assert sandbox.alive


def test_a_callout_may_call_the_same_object_back() -> None:
    sandboxes: list[SandboxedObject] = []

    def callout(ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return sandboxes[0].invoke("add", [10], {})[0]

    with _start(callout, params={"start": 1, "peer": PEER}) as sandbox:
        sandboxes.append(sandbox)
        assert sandbox.invoke("ask", ["k"], {})[0] == 11
        assert sandbox.invoke("get", [], {})[0] == 11


# --- checkpoints -----------------------------------------------------------------------


def test_a_checkpoint_restores_the_same_state_in_a_fresh_worker() -> None:
    with _start(params={"start": 2, "peer": PEER}) as first:
        first.invoke("add", [40], {})
        checkpoint = first.checkpoint()
    assert isinstance(checkpoint, bytes)

    def callout(ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return f"{ref.rid}.{method}"

    with _start(callout, checkpoint=checkpoint) as second:
        assert second.invoke("get", [], {})[0] == 42
        assert second.invoke("ask", ["k"], {})[0] == "n2/9.lookup"  # its reference works


# --- limits ----------------------------------------------------------------------------


def test_an_object_over_its_memory_limit_is_stopped() -> None:
    limits = SandboxLimits(memory_bytes=256 << 20)
    sandbox = _start(limits=limits)
    try:
        with pytest.raises(ObjectLimitError, match="memory limit of 256 MiB") as stopped:
            sandbox.invoke("allocate", [1 << 30], {})
        assert "allocate" in str(stopped.value)
        assert not sandbox.alive
        _assert_gone(sandbox.pid)
        with pytest.raises(ObjectLimitError, match=r"stopped earlier .*memory limit"):
            sandbox.invoke("get", [], {})
    finally:
        sandbox.close()


def test_an_endless_loop_is_stopped_at_the_cpu_limit() -> None:
    sandbox = _start(limits=SandboxLimits(cpu_s_per_call=1))
    try:
        with pytest.raises(ObjectLimitError, match="more than its CPU limit of 1 s in one call"):
            sandbox.invoke("spin", [], {})
        _assert_gone(sandbox.pid)
        with pytest.raises(ObjectLimitError, match=r"stopped earlier .*CPU limit"):
            sandbox.invoke("get", [], {})
        with pytest.raises(ObjectLimitError, match="stopped earlier"):
            sandbox.checkpoint()
    finally:
        sandbox.close()


def test_a_call_that_never_returns_is_stopped_at_the_wall_limit() -> None:
    sandbox = _start(limits=SandboxLimits(wall_s_per_call=1))
    try:
        with pytest.raises(ObjectLimitError, match="did not finish a call within 1 s"):
            sandbox.invoke("hang", [], {})
        _assert_gone(sandbox.pid)
        with pytest.raises(ObjectLimitError, match="stopped earlier"):
            sandbox.invoke("get", [], {})
    finally:
        sandbox.close()


def test_a_worker_killed_from_outside_is_reported_as_such() -> None:
    sandbox = _start()
    try:
        os.kill(sandbox.pid, signal.SIGKILL)
        with pytest.raises(ObjectLimitError, match="was killed by SIGKILL from outside"):
            sandbox.invoke("get", [], {})
        assert not sandbox.alive
        _assert_gone(sandbox.pid)
    finally:
        sandbox.close()


def test_a_worker_of_a_big_process_killed_from_outside_is_not_called_over_memory() -> None:
    # The worker's ru_maxrss starts at its parent's peak (it survives fork and exec):
    # a parent near the worker's limit must not turn every kill into "over memory".
    limit = SandboxLimits().memory_bytes
    ballast = b"\x01" * limit  # written, so resident: this process's peak passes the limit
    sandbox = _start()
    try:
        os.kill(sandbox.pid, signal.SIGKILL)
        with pytest.raises(ObjectLimitError, match="was killed by SIGKILL from outside"):
            sandbox.invoke("get", [], {})
    finally:
        sandbox.close()
        del ballast


def test_exit_statuses_are_explained() -> None:
    limits = SandboxLimits(memory_bytes=256 << 20)
    near = 250 << 20
    assert "memory limit of 256 MiB" in diagnose_exit(signal.SIGKILL, near, limits)[0]
    assert "CPU limit" in diagnose_exit(signal.SIGXCPU, 0, limits)[0]
    assert "SIGKILL" in diagnose_exit(signal.SIGKILL, 10 << 20, limits)[0]
    assert "SIGSEGV" in diagnose_exit(signal.SIGSEGV, 10 << 20, limits)[0]
    assert "exit status 3" in diagnose_exit(3 << 8, 0, limits)[0]


# --- the node dying --------------------------------------------------------------------


@pytest.fixture
def subreaper() -> Iterator[None]:
    """Orphans of our children become ours, so the test can reap them."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    assert libc.prctl(pr_set_child_subreaper, ctypes.c_ulong(1), *[ctypes.c_ulong(0)] * 3) == 0
    try:
        yield
    finally:
        libc.prctl(pr_set_child_subreaper, ctypes.c_ulong(0), *[ctypes.c_ulong(0)] * 3)


def test_a_busy_worker_dies_with_its_node(subreaper: None, tmp_path: Any) -> None:
    # Busy in a call, the worker is not reading its socket: only the kernel's
    # parent-death signal can end it.
    fifo = str(tmp_path / "in-the-call")
    os.mkfifo(fifo)
    said = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    script = (
        "import sys\n"
        "from shuttle.runtime.ids import ObjectId\n"
        "from shuttle.runtime.sandbox import SandboxedObject, SandboxLimits\n"
        "code = sys.stdin.buffer.read()\n"
        "sandbox = SandboxedObject.start(\n"
        "    code, ObjectId('n1', '1'), limits=SandboxLimits(unsafe_code=True), callout=print)\n"
        "print(sandbox.pid, flush=True)\n"
        f"sandbox.invoke('hang_after_saying_so', [{fifo!r}], {{}})\n"
    )
    node = subprocess.Popen(
        [sys.executable, "-P", "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        assert node.stdin is not None and node.stdout is not None
        node.stdin.write(ship_class(Counter))
        node.stdin.close()
        line = node.stdout.readline()
        assert line, "the node process did not start its sandbox"
        worker = int(line)
        pidfd = os.pidfd_open(worker)
        assert select.select([said], [], [], EXIT_WAIT_S)[0], "the call did not start"
        assert os.read(said, 1) == b"!"
    finally:
        os.close(said)
        node.kill()
        node.wait(timeout=EXIT_WAIT_S)
    try:
        assert select.select([pidfd], [], [], EXIT_WAIT_S)[0], "the worker outlived its node"
    finally:
        os.close(pidfd)
    _, status = os.waitpid(worker, 0)  # an orphan of our child: ours to reap
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
