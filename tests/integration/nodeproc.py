"""A real storage-node process for tests: started on 127.0.0.1, killed or restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 20.0


class NodeProcess:
    """``python -m shuttle serve`` on a data directory, on a kernel-chosen port that is
    kept across restarts (so clients can reconnect to the same address)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = 0,
        extra: list[str] | None = None,
        env: dict[str, str] | None = None,
        side_dir: Path | None = None,
        prefix: list[str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """``side_dir``: where the log and the ready file go (default: beside the data
        directory; a test on a small file system keeps them off it)."""
        self.data_dir = data_dir
        self.side_dir = side_dir or data_dir.parent
        #: A command the node runs under (``prlimit --nofile=256``, say).
        self.prefix = prefix or []
        self.port = port
        #: Where it listens (a namespaced node listens on its namespace's address).
        self.host = host
        self.extra = extra or []
        #: Variables added to the node's environment (a test crash point, say); change
        #: it between restarts to start the node differently.
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.side_dir / f"{data_dir.name}.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> NodeProcess:
        ready = self.side_dir / f"{self.data_dir.name}.ready"
        ready.unlink(missing_ok=True)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.prefix,
                    sys.executable,
                    "-m",
                    "shuttle",
                    "serve",
                    "--data",
                    str(self.data_dir),
                    "--listen",
                    f"{self.host}:{self.port}",
                    "--node-id",
                    self.data_dir.name,
                    "--ready-file",
                    str(ready),
                    *self.extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node did not start; log:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.01)
        self.port = json.loads(ready.read_text())["port"]
        return self

    def kill(self) -> None:
        """SIGKILL: no chance to clean up (what a crash looks like)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> int | None:
        """SIGTERM and wait: the clean shutdown path. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def restart(self) -> NodeProcess:
        self.kill()
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def shuttle_cli(
    *args: str, env: dict[str, str] | None = None, input: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[bytes]:
    """Run the ``shuttle`` command as a user would, in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "shuttle", *args],
        capture_output=True,
        input=input,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
