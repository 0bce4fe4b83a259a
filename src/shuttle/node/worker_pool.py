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
from shuttle.node.config import NodeConfig
from shuttle.node.worker import READY_LINE
from shuttle.store.core import ChangeHook
from shuttle.store.generations import ChangeGenerations

log = logging.getLogger("shuttle.node")

#: How long a worker may take to start listening (an interpreter's start and imports,
#: ~1 s on an idle machine; generous for a loaded one).
WORKER_START_TIMEOUT_S = 30.0
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

    def stats(self) -> dict[str, Any]:
        return {
            "count": self.config.workers,
            "pids": [os.getpid(), *(p.pid for p in self.procs)],
            "alive": 1 + sum(1 for p in self.procs if p.returncode is None),
            "changes_bracketed": self.generations.changes,
        }
