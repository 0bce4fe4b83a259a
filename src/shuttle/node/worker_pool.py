"""The primary's side of ``--workers N``: the shared change generations, the store's
change hook that keeps them, and the worker processes (docs/architecture.md,
"Workers"; the worker itself is :mod:`shuttle.node.worker`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from shuttle.errors import ConfigError
from shuttle.net.principals import PrincipalBook, PrincipalTable
from shuttle.net.registry import Mode, OperationRegistry, arg
from shuttle.node.config import NodeConfig
from shuttle.node.worker import READY_LINE
from shuttle.node.worker_restarts import RestartBackoff, exit_reason
from shuttle.store.config import ChangeHook
from shuttle.store.generations import ChangeGenerations

log = logging.getLogger("shuttle.node")

#: How long a worker may take to start listening (an interpreter's start and imports,
#: ~1 s on an idle machine; generous for a loaded one).
WORKER_START_TIMEOUT_S = 30.0
#: How long a principal table change waits for every worker to install it. A worker
#: that has not by then is killed (its clients reconnect to the others): a removed
#: principal must not keep acting through it.
WORKER_INSTALL_TIMEOUT_S = 10.0
#: Longest a worker's ``worker.principals`` long poll is held (well under the idle
#: timeout, which would close the worker's connection).
PRINCIPALS_WAIT_S_MAX = 20.0
#: How long a stopping worker may take to let its requests finish (the primary's own
#: grace, ``shuttle.net.server.SHUTDOWN_GRACE_S``, plus a margin) before it is killed.
WORKER_STOP_TIMEOUT_S = 15.0


class GenerationHook:
    """The store's change hook on a node with workers: the callback promises first
    (their breaks may wait for clients), then the key's slot made odd around the
    change itself (:mod:`shuttle.store.generations`)."""

    def __init__(self, inner: ChangeHook | None, generations: ChangeGenerations) -> None:
        self.inner = inner
        self.generations = generations

    @contextlib.contextmanager
    def changing(self, key: str) -> Iterator[None]:
        outer: AbstractContextManager[object] = (
            self.inner.changing(key) if self.inner is not None else contextlib.nullcontext()
        )
        with outer, self.generations.changing(key):
            yield


class PrincipalRelay:
    """The node's principal table, handed to its workers (``worker.principals``, a long
    poll each worker holds) and a change held until every worker installed it.

    So when ``principals.put`` answers (``shuttle cluster user remove`` returns), no
    process of the node still accepts the removed principal's HELLO, and each has
    closed its connections, as one process does (docs/security.md)."""

    def __init__(self, book: PrincipalBook) -> None:
        self.book = book
        #: Worker index → the digest of the table it installed last.
        self.installed: dict[int, str] = {}
        self.pool: WorkerPool | None = None
        self._changed = asyncio.Event()
        self._acked = asyncio.Event()
        book.listeners.append(self._table_changed)

    def _table_changed(self, table: PrincipalTable) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, index: int, digest: str, timeout_s: float) -> dict[str, Any]:
        """Worker ``index`` installed ``digest``: the table as soon as it differs (at
        once if it does already), or the same one after ``timeout_s``."""
        self.installed[index] = digest
        self._acked.set()
        self._acked = asyncio.Event()
        if self.book.table.digest() == digest:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(timeout_s, PRINCIPALS_WAIT_S_MAX))
        table = self.book.table
        return {"table": table.to_wire(), "digest": table.digest()}

    async def settle(self, table: PrincipalTable) -> None:
        """Return once every live worker installed ``table``; kill those that did not
        within :data:`WORKER_INSTALL_TIMEOUT_S`."""
        pool = self.pool
        if pool is None:
            return
        digest = table.digest()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WORKER_INSTALL_TIMEOUT_S
        while True:
            late = [i for i in pool.live() if self.installed.get(i) != digest]
            remaining = deadline - loop.time()
            if not late:
                return
            if remaining <= 0:
                for index in late:
                    log.error(
                        "worker %d did not install principal table epoch %d within %g s: "
                        "killed, so that no process serves with the old table (it is "
                        "started again, and takes the new table before it listens)",
                        index,
                        table.epoch,
                        WORKER_INSTALL_TIMEOUT_S,
                    )
                    pool.kill(index)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), remaining)

    def forget(self, index: int) -> None:
        """Worker ``index`` died: what it installed is gone with it (the next process
        in its place asks for the table before it listens), and a change waiting for
        it looks again at who is left."""
        self.installed.pop(index, None)
        self._acked.set()
        self._acked = asyncio.Event()

    def register(self, registry: OperationRegistry) -> None:
        """Add ``worker.principals`` (a cluster operation: workers hold the cluster key)."""

        async def principals(args: dict[str, Any], payload: bytes) -> Any:
            """A worker's long poll for the node's principal table (see PrincipalRelay)."""
            return await self.wait(
                arg(args, "index", int),
                arg(args, "digest", str),
                float(arg(args, "timeout_s", float, PRINCIPALS_WAIT_S_MAX)),
            )

        registry.add("worker.principals", principals, Mode.ASYNC)


@dataclass
class _Worker:
    """One worker's place in the pool: the process now in it, and its history."""

    index: int
    proc: asyncio.subprocess.Process | None = None
    #: ``starting`` (spawned, not listening yet), ``serving``, ``waiting`` (dead,
    #: restarted after a delay), ``stopped`` (the node is stopping).
    state: str = "starting"
    #: When the process now in the slot was spawned (the loop's clock).
    spawned_at: float = 0.0
    #: Times it was started again and listened.
    restarts: int = 0
    #: Starts in a row that did not get to listen.
    failed_starts: int = 0
    backoff: RestartBackoff = field(default_factory=RestartBackoff)


def proc_pid(worker: _Worker) -> int:
    """The pid of the process now in ``worker``'s place (0: none yet)."""
    return worker.proc.pid if worker.proc is not None else 0


class WorkerPool:
    """The N-1 worker processes of a primary: started once it listens, each started
    again when it dies on its own (after a delay, :mod:`shuttle.node.worker_restarts`),
    stopped before the primary closes its store.

    Counters (the primary's ``node.stats`` → ``workers``): ``deaths`` (workers that
    exited on their own), ``restarts`` (started again and listening),
    ``start_failures`` (a restart that did not get to listen)."""

    def __init__(
        self,
        config: NodeConfig,
        node_id: str,
        private: tuple[str, int],
        generations: ChangeGenerations,
        lock_fd: int,
        *,
        on_death: Callable[[int], object] = lambda index: None,
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.private = private
        self.generations = generations
        self.lock_fd = lock_fd
        #: Called with a worker's index when it died (the principal relay forgets what
        #: it had installed).
        self.on_death = on_death
        self.workers = [_Worker(i) for i in range(1, config.workers)]
        self._keepers: list[asyncio.Task[None]] = []
        self._stopping = False
        self.deaths = 0
        self.restarts = 0
        self.start_failures = 0
        #: The last death, for the stats: ``worker 1 (pid 123) killed by SIGKILL``.
        self.last_death = ""

    async def start(self) -> None:
        """Start the workers and wait until each listens; on any failure stop those
        started and raise :class:`ConfigError` saying which and why. (At the node's
        start a worker that cannot start stops the node: the operator is there to see
        why. Once the node serves, a worker that dies is started again instead.)"""
        try:
            for worker in self.workers:
                await self._spawn(worker)
            for worker in self.workers:
                await self._ready(worker)
        except BaseException:
            await self.stop()
            raise
        loop = asyncio.get_running_loop()
        self._keepers = [loop.create_task(self._keep(w)) for w in self.workers]
        log.info(
            "%d worker process(es) share the port: %s",
            len(self.workers),
            ", ".join(str(w.proc.pid) for w in self.workers if w.proc is not None),
        )

    async def _spawn(self, worker: _Worker) -> None:
        worker.state = "starting"
        worker.spawned_at = asyncio.get_running_loop().time()
        worker.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "shuttle.node.worker",
            "--index",
            str(worker.index),
            "--node-id",
            self.node_id,
            "--primary",
            f"{self.private[0]}:{self.private[1]}",
            "--generations-fd",
            str(self.generations.fd),
            "--parent",
            str(os.getpid()),
            "--config",
            json.dumps(self.config.to_wire()),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            pass_fds=(self.generations.fd, self.lock_fd),
        )

    async def _ready(self, worker: _Worker) -> None:
        """Wait for the worker's ready line; ConfigError if it does not come."""
        proc = worker.proc
        assert proc is not None and proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), WORKER_START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line.decode(errors="replace").strip() != READY_LINE:
            raise ConfigError(
                f"worker {worker.index} (pid {proc.pid}) did not start listening within "
                f"{WORKER_START_TIMEOUT_S:g} s; its error is in the node's log above. "
                "Start the node with --workers 1 to run without workers"
            )
        worker.state = "serving"

    async def _keep(self, worker: _Worker) -> None:
        """Start ``worker`` again whenever it dies, until the node stops."""
        loop = asyncio.get_running_loop()
        while True:
            proc = worker.proc
            assert proc is not None
            code = await proc.wait()
            if self._stopping:
                return
            # Its clients' connections closed with it (they reconnect, to the other
            # processes), and the primary closed their upstream connections, and with
            # them what they owned here (callback sessions, uploads).
            lived_s = loop.time() - worker.spawned_at
            delay_s = worker.backoff.after_death(lived_s)
            self.on_death(worker.index)
            if worker.state == "serving":
                self.deaths += 1
                self.last_death = f"worker {worker.index} (pid {proc.pid}) {exit_reason(code)}"
                log.error(
                    "%s after %.1f s; the node serves on without it and starts it again in %g s",
                    self.last_death,
                    lived_s,
                    delay_s,
                )
            else:
                self.start_failures += 1
                worker.failed_starts += 1
                log.error(
                    "worker %d (pid %d) %s before it listened (its error is above); "
                    "starting it again in %g s (%d failed start(s) in a row)",
                    worker.index,
                    proc.pid,
                    exit_reason(code),
                    delay_s,
                    worker.failed_starts,
                )
            worker.state = "waiting"
            await asyncio.sleep(delay_s)
            try:
                await self._spawn(worker)
                await self._ready(worker)
            except (ConfigError, OSError) as exc:
                if isinstance(exc, OSError):  # no process at all (EAGAIN, ENOMEM, EMFILE)
                    log.error("worker %d could not be started: %s", worker.index, exc)
                if worker.proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        worker.proc.kill()  # silent for too long: never half started
                continue  # its (or the old one's) exit is the next turn's death
            worker.restarts += 1
            worker.failed_starts = 0
            self.restarts += 1
            log.info("worker %d started again: pid %d", worker.index, proc_pid(worker))

    async def stop(self) -> None:
        """SIGTERM every worker, wait for them to finish their requests, kill stragglers."""
        self._stopping = True
        for task in self._keepers:
            task.cancel()
        # Let each keeper finish where it was (a spawn it made is then in its slot).
        await asyncio.gather(*self._keepers, return_exceptions=True)
        procs = [w.proc for w in self.workers if w.proc is not None]
        for worker in self.workers:
            worker.state = "stopped"
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), WORKER_STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("worker pid %d did not stop in time: killed", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    def live(self) -> list[int]:
        """Indices of the workers whose process runs (serving, or starting: a starting
        worker asks for the principal table before it listens)."""
        return [
            w.index
            for w in self.workers
            if w.proc is not None and w.proc.returncode is None and w.state != "waiting"
        ]

    def kill(self, index: int) -> None:
        """SIGKILL worker ``index`` (the pool starts it again)."""
        proc = self.workers[index - 1].proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    def stats(self) -> dict[str, Any]:
        return {
            "count": self.config.workers,
            "pids": [
                os.getpid(),
                *(w.proc.pid for w in self.workers if w.proc is not None and w.state != "waiting"),
            ],
            "alive": 1 + sum(1 for w in self.workers if w.state == "serving"),
            "deaths": self.deaths,
            "restarts": self.restarts,
            "start_failures": self.start_failures,
            "last_death": self.last_death,
            "processes": [
                {
                    "index": w.index,
                    "pid": w.proc.pid if w.proc is not None else 0,
                    "state": w.state,
                    "restarts": w.restarts,
                    "restart_delay_s": w.backoff.delay_s,
                }
                for w in self.workers
            ],
            "changes_bracketed": self.generations.changes,
        }
