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
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from shuttle.errors import ConfigError
from shuttle.net.principals import PrincipalBook, PrincipalTable
from shuttle.net.registry import Mode, OperationRegistry, arg
from shuttle.node.config import NodeConfig
from shuttle.node.worker import READY_LINE
from shuttle.store.core import ChangeHook
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
                        "killed, so that no process serves with the old table",
                        index,
                        table.epoch,
                        WORKER_INSTALL_TIMEOUT_S,
                    )
                    pool.kill(index)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._acked.wait(), remaining)

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


class WorkerPool:
    """The N-1 worker processes of a primary: started once it listens, stopped before
    it closes its store."""

    def __init__(
        self,
        config: NodeConfig,
        node_id: str,
        private: tuple[str, int],
        generations: ChangeGenerations,
        lock_fd: int,
    ) -> None:
        self.config = config
        self.node_id = node_id
        self.private = private
        self.generations = generations
        self.lock_fd = lock_fd
        self.procs: list[asyncio.subprocess.Process] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> None:
        """Start the workers and wait until each listens; on any failure stop those
        started and raise :class:`ConfigError` saying which and why."""
        wire = json.dumps(self.config.to_wire())
        fds = (self.generations.fd, self.lock_fd)
        try:
            for index in range(1, self.config.workers):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "shuttle.node.worker",
                    "--index",
                    str(index),
                    "--node-id",
                    self.node_id,
                    "--primary",
                    f"{self.private[0]}:{self.private[1]}",
                    "--generations-fd",
                    str(self.generations.fd),
                    "--parent",
                    str(os.getpid()),
                    "--config",
                    wire,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    pass_fds=fds,
                )
                self.procs.append(proc)
            for index, proc in enumerate(self.procs, start=1):
                await self._ready(index, proc)
        except BaseException:
            await self.stop()
            raise
        for index, proc in enumerate(self.procs, start=1):
            self._watchers.append(asyncio.get_running_loop().create_task(self._watch(index, proc)))
        log.info(
            "%d worker process(es) share the port: %s",
            len(self.procs),
            ", ".join(str(p.pid) for p in self.procs),
        )

    async def _ready(self, index: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), WORKER_START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line.decode(errors="replace").strip() != READY_LINE:
            raise ConfigError(
                f"worker {index} (pid {proc.pid}) did not start listening within "
                f"{WORKER_START_TIMEOUT_S:g} s; its error is in the node's log above. "
                "Start the node with --workers 1 to run without workers"
            )

    async def _watch(self, index: int, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if not self._stopping:
            # Its connections are gone (clients reconnect, to the others); the node
            # serves on with one process fewer.
            log.error(
                "worker %d (pid %d) exited with status %s; the node serves on without it",
                index,
                proc.pid,
                code,
            )

    async def stop(self) -> None:
        """SIGTERM every worker, wait for them to finish their requests, kill stragglers."""
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), WORKER_STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("worker pid %d did not stop in time: killed", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()

    def live(self) -> list[int]:
        """Indices of the workers still running."""
        return [i for i, p in enumerate(self.procs, start=1) if p.returncode is None]

    def kill(self, index: int) -> None:
        """SIGKILL worker ``index``."""
        with contextlib.suppress(ProcessLookupError):
            self.procs[index - 1].kill()

    def stats(self) -> dict[str, Any]:
        return {
            "count": self.config.workers,
            "pids": [os.getpid(), *(p.pid for p in self.procs)],
            "alive": 1 + sum(1 for p in self.procs if p.returncode is None),
            "changes_bracketed": self.generations.changes,
        }
