"""The harness of the RAID 5 tests: ``columns`` real storage objects over real object
stores in one process (:class:`Cluster`), a deterministic scheduler that lets the
writers' storage calls through one at a time in an order the test picks
(:class:`Scheduler`, each writer's calls through a :class:`Gated` invoker), a writer
that dies at a chosen call (:class:`Crash`), and an invoker that logs the calls a
write makes (:class:`Counting`). Used by ``test_raid_model.py`` (the hypothesis
state machine) and ``test_raid_object.py`` (the directed cases).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shuttle.errors import NotFoundError
from shuttle.objects.fs.raid import Raid5Object
from shuttle.objects.fs.raid_layout import column_key
from shuttle.objects.storage import StorageObject
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import bound_method
from shuttle.runtime.refs import Ref
from shuttle.store import ObjectStore

UNIT = 512
KEY = "files/f"
#: A stuck scheduler is a bug in the test or the code: fail instead of hanging.
STEP_TIMEOUT_S = 10.0
#: Calls two writes may make between them: past it they are livelocked (a bug).
CALLS_MAX = 2000


def _tmp_root() -> str:
    shm = Path("/dev/shm")
    return tempfile.mkdtemp(prefix="raid-", dir=shm if shm.is_dir() else None)


class Cluster:
    """``columns`` storage objects, each over an object store of its own."""

    def __init__(self, columns: int) -> None:
        self.root = _tmp_root()
        self.stores = [ObjectStore(Path(self.root) / f"n{c}") for c in range(columns)]
        self.objects = {
            ObjectId.storage(f"n{c}"): StorageObject(s) for c, s in enumerate(self.stores)
        }

    def call(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return bound_method(self.objects[ref.rid], method)(*args, **kwargs)

    def refs(self, invoker: Any) -> list[Ref]:
        return [Ref(rid, "127.0.0.1:1", invoker) for rid in self.objects]

    def column(self, c: int, key: str = KEY) -> bytes:
        try:
            return self.stores[c].read(column_key(key, c))
        except NotFoundError:
            return b""

    def unit(self, c: int, stripe: int, key: str = KEY) -> bytes:
        data = self.column(c, key)[stripe * UNIT : (stripe + 1) * UNIT]
        return data + bytes(UNIT - len(data))

    def close(self) -> None:
        for s in self.stores:
            s.close()
        shutil.rmtree(self.root, ignore_errors=True)


class Crash(BaseException):
    """The writer's process died here (not an error the RAID code may catch)."""


class Scheduler:
    """Lets the writers' storage calls run one at a time, in the order ``choose``
    picks. Outside :meth:`run` calls pass straight through."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active = False
        self.parked: set[str] = set()
        self.granted: str | None = None
        self.calls: dict[str, int] = {}
        self.steps = 0
        self.crash_at: dict[str, int] = {}
        self.stopping = False

    def before_call(self, name: str) -> None:
        if not self.active:
            return
        with self.cond:
            self.parked.add(name)
            self.cond.notify_all()
            if not self.cond.wait_for(
                lambda: self.granted == name or self.stopping, STEP_TIMEOUT_S
            ):
                raise AssertionError(f"writer {name} was never let through")
            if self.stopping:  # the run failed: end this thread now, quietly
                self.parked.discard(name)
                raise Crash()
            self.granted = None
            self.parked.discard(name)
            n = self.calls.get(name, 0)
            self.calls[name] = n + 1
            self.cond.notify_all()
            if self.crash_at.get(name) == n:
                raise Crash()

    def run(
        self, jobs: dict[str, Callable[[], Any]], choose: Callable[[list[str]], str]
    ) -> dict[str, Any]:
        """Run ``jobs`` on threads, one storage call at a time; each job's result, or
        the exception it ended with."""
        results: dict[str, Any] = {}
        finished: set[str] = set()

        def body(name: str, job: Callable[[], Any]) -> None:
            try:
                results[name] = job()
            except BaseException as exc:
                results[name] = exc
            with self.cond:
                finished.add(name)
                self.cond.notify_all()

        self.active, self.calls, self.steps = True, {}, 0
        threads = [threading.Thread(target=body, args=item, daemon=True) for item in jobs.items()]
        for t in threads:
            t.start()
        try:
            while True:
                with self.cond:
                    ready = self.cond.wait_for(
                        lambda: all(n in self.parked or n in finished for n in jobs),
                        STEP_TIMEOUT_S,
                    )
                    assert ready, "a writer neither called nor finished"
                    waiting = sorted(self.parked)
                    if not waiting:
                        break
                    self.steps += 1
                    assert self.steps <= CALLS_MAX, f"livelock: {CALLS_MAX} calls, no end"
                    self.granted = choose(waiting)
                    self.cond.notify_all()
                    assert self.cond.wait_for(lambda: self.granted is None, STEP_TIMEOUT_S)
        finally:
            with self.cond:
                self.stopping = True
                self.cond.notify_all()
            for t in threads:
                t.join(STEP_TIMEOUT_S)
            self.active, self.stopping, self.crash_at = False, False, {}
        return results


class Gated:
    """One writer's invoker: every call waits for the scheduler, then runs."""

    def __init__(self, name: str, cluster: Cluster, scheduler: Scheduler) -> None:
        self.name, self.cluster, self.scheduler = name, cluster, scheduler

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.scheduler.before_call(self.name)
        return self.cluster.call(ref, method, args, kwargs)


def new_writer(cluster: Cluster, invoker: Gated) -> Raid5Object:
    raid = Raid5Object(cluster.refs(invoker), KEY, UNIT, stale_intent_s=600.0)
    raid._sleep = lambda _s: None  # back-off costs steps, not time
    return raid


class Counting:
    """A plain invoker that logs each call's method and its ``return_old`` flag."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.log: list[str] = []

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method == "swap":
            self.log.append("swap" if (args[3] if len(args) > 3 else True) else "write")
        else:
            self.log.append(method)
        return self.cluster.call(ref, method, args, kwargs)
