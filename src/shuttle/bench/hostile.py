"""``shuttle bench hostile``: what hostile or careless clients cost a node.

Against a real node process on loopback (no cluster key, so raw sockets can speak
the protocol), in one run:

* **stalled frames**: connections that each send a request claiming a 16 MiB payload
  and 10 bytes of it, then nothing: the node's resident memory before and after;
* **clients that never read**: connections with a tiny receive buffer that pipeline
  256 reads of a 16 MiB object and never read a byte: the node's memory, and how long
  a small put from another client takes meanwhile (the anchor: the same put on the
  quiet node, in the same run);
* **idle connections**: thousands of connections that handshake and then idle: the
  node's memory, whether a put still works, and how many were refused as ``busy``.

Figures are printed and written as JSON; docs/operations.md explains the limits.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from shuttle.bench.session import scratch_dir
from shuttle.client.connect import connect
from shuttle.errors import NodeBusyError, ShuttleError
from shuttle.wire import NEED_DATA, Connection, Hello, Request, Role

MiB = 1 << 20
START_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class HostileConfig:
    stalled: int = 128
    non_readers: int = 3
    idle: int = 10_000
    #: Extra ``shuttle serve`` flags.
    node_args: tuple[str, ...] = ()


@contextlib.contextmanager
def _node(scratch: Path, args: tuple[str, ...]) -> Iterator[tuple[int, int]]:
    """A node process without a key on a free loopback port: yields (pid, port)."""
    ready = scratch / "node.ready"
    with open(scratch / "node.log", "ab") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "shuttle", "serve", "--data", str(scratch / "data")),
                *("--listen", "127.0.0.1:0", "--ready-file", str(ready), *args),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ShuttleError(f"the node did not start; see {scratch / 'node.log'}")
            time.sleep(0.02)
        yield proc.pid, json.loads(ready.read_text())["port"]
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ShuttleError(f"no resident size for process {pid}")


class _Peer:
    """A hand-driven connection: handshake, then whatever bytes a test wants."""

    def __init__(self, port: int, *, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket()
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.conn = Connection(Role.CLIENT)
        self._event()  # CHALLENGE
        self.sock.sendall(self.conn.send_bytes(Hello(2, 2, "hostile-bench")))
        self._event()  # WELCOME (or busy)

    def _event(self) -> object:
        while (ev := self.conn.next_event()) is NEED_DATA:
            data = self.sock.recv(1 << 16)
            self.conn.receive_data(data)
            if not data:
                return self.conn.next_event()
        return ev


def _time_put(port: int) -> float:
    with connect(node=f"127.0.0.1:{port}") as client:
        start = time.perf_counter()
        client.put("canary", b"c" * 1024)
        return time.perf_counter() - start


def run(config: HostileConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process opens thousands
    scratch = scratch_dir("shuttle-hostile-")
    report: dict[str, Any] = {"config": config.__dict__ | {"node_args": list(config.node_args)}}
    try:
        with _node(scratch, config.node_args) as (pid, port):
            with connect(node=f"127.0.0.1:{port}") as client:
                client.put("big", os.urandom(16 * MiB))
            quiet_put_s = min(_time_put(port) for _ in range(5))
            base = rss_bytes(pid)
            report["node_rss_start_mib"] = base / MiB

            progress(f"{config.stalled} stalled 16 MiB frames")
            stalled = []
            head = msgpack.packb([1, "put", {"key": "stalled"}])
            prefix = b"SH\x03\x00" + len(head).to_bytes(4, "big") + (16 * MiB).to_bytes(4, "big")
            for _ in range(config.stalled):
                peer = _Peer(port)
                peer.sock.sendall(prefix + head + b"x" * 10)
                stalled.append(peer)
            _settle(pid)
            report["stalled_frames_mib"] = (rss_bytes(pid) - base) / MiB

            progress(f"{config.non_readers} clients that never read")
            hogs = []
            for _ in range(config.non_readers):
                peer = _Peer(port, rcvbuf=4096)
                burst = b"".join(
                    b"".join(
                        peer.conn.send(
                            Request(rid, "read", {"key": "big", "offset": 0, "length": 16 * MiB})
                        )
                    )
                    for rid in range(1, 257)
                )
                peer.sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    peer.sock.sendall(burst)
                hogs.append(peer)
            _settle(pid)
            report["stalled_and_non_readers_mib"] = (rss_bytes(pid) - base) / MiB
            busy_put_s = min(_time_put(port) for _ in range(5))
            report["put_quiet_s"] = quiet_put_s
            report["put_under_hostile_s"] = busy_put_s
            report["put_ratio_to_quiet"] = busy_put_s / quiet_put_s
            for peer in stalled + hogs:
                peer.sock.close()

            progress(f"{config.idle} idle connections")
            idle: list[socket.socket] = []
            before_idle = rss_bytes(pid)
            for _ in range(config.idle):
                sock = socket.create_connection(("127.0.0.1", port))
                idle.append(sock)
            _settle(pid)
            try:
                report["put_with_idle_s"] = _time_put(port)
                report["put_with_idle"] = "ok"
            except NodeBusyError as exc:
                report["put_with_idle"] = f"busy: {exc}"
            with connect(node=f"127.0.0.1:{port}") as c:
                [n] = c.nodes
                server = c.node_stats(n)["server"]
            report["idle_connections_mib"] = (rss_bytes(pid) - before_idle) / MiB
            report["connections_max"] = server["connections_max"]
            report["connections_refused"] = server["connections_refused"]
            for sock in idle:
                sock.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        shutil.rmtree(scratch, ignore_errors=True)
    return report


def _settle(pid: int, quiet_s: float = 1.0, timeout_s: float = 30.0) -> None:
    """Wait until the node's resident size stops moving (its buffers are filled)."""
    last, since = rss_bytes(pid), time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = rss_bytes(pid)
        if abs(now - last) > MiB:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > quiet_s:
            return
