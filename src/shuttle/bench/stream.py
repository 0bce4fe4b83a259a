"""``shuttle bench stream``: one large object streamed from a node, against raw TCP.

The anchor is the least any TCP transfer of the same bytes between two processes on
this machine costs in Python: a child process reads the same file (from the page
cache) in 1 MiB pieces and ``sendall``s them; the parent ``recv_into``s a reused
buffer. Shuttle's number is :meth:`Client.iter_read` of the object on a node (its
file warm in the page cache too), with pipelined 1 MiB range requests. Runs are
interleaved and the medians compared. With ``tls``, the same object is streamed from a
second node that serves TLS, interleaved with the others: TLS against no TLS.

Each Shuttle run also counts the CPU seconds the client and the node (one started here)
spent per GiB streamed: on a shared machine wall times drift with other work, while
CPU time per byte moves much less, and it says which side a cost is on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import shuttle.compiled as compiled
from shuttle.bench.netrand import make_file
from shuttle.bench.nodes import bench_client
from shuttle.client.client import Client
from shuttle.errors import ConfigError

PIECE_BYTES = 1 << 20
KEY = "bench/stream.dat"
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user and system, every thread) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


@dataclass(frozen=True)
class StreamConfig:
    nbytes: int = 1 << 30
    repeat: int = 3
    node: str | None = None
    window: int = 8
    piece_bytes: int = PIECE_BYTES
    #: Also stream from a node that serves TLS.
    tls: bool = False

    def __post_init__(self) -> None:
        if self.nbytes <= 0 or self.repeat <= 0 or self.window <= 0:
            raise ConfigError("--bytes, --repeat and --window must be positive")


def raw_tcp_receive(path: Path, nbytes: int) -> float:
    """Seconds to receive ``nbytes`` of ``path`` from a sender process over loopback TCP."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        sender = subprocess.Popen(
            [sys.executable, "-m", "shuttle.bench.stream", str(path), str(port), str(nbytes)]
        )
        conn, _ = listener.accept()
    buf = bytearray(PIECE_BYTES)
    got = 0
    with conn:
        start = time.perf_counter()
        while got < nbytes:
            n = conn.recv_into(buf)
            if not n:
                break
            got += n
        elapsed = time.perf_counter() - start
    sender.wait(30)
    if got != nbytes:
        raise AssertionError(f"raw TCP sender delivered {got} of {nbytes} bytes")
    return elapsed


def _send_file(path: str, port: int, nbytes: int) -> None:
    """The raw sender (run as a child process): the file's bytes, 1 MiB at a time."""
    buf = bytearray(PIECE_BYTES)
    view = memoryview(buf)
    with socket.create_connection(("127.0.0.1", port)) as sock, open(path, "rb", buffering=0) as f:
        sent = 0
        while sent < nbytes:
            n = f.readinto(buf)
            if not n:
                f.seek(0)
                continue
            n = min(n, nbytes - sent)
            sock.sendall(view[:n])
            sent += n


def run(config: StreamConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    raw_s: list[float] = []
    shuttle_s: list[float] = []
    tls_s: list[float] = []
    # CPU seconds per GiB of each Shuttle run: (client, node); node None if not ours.
    cpu: dict[str, list[tuple[float, float | None]]] = {"shuttle": [], "shuttle_tls": []}
    node_pid: dict[int, int] = {}
    with contextlib.ExitStack() as stack:

        def started(tls: bool) -> tuple[Client, Path]:
            pids: list[int] = []
            client, scratch = stack.enter_context(
                bench_client(
                    config.node,
                    tls=tls,
                    node_pids=pids,
                    cache_bytes=0,
                    piece_bytes=config.piece_bytes,
                    window=config.window,
                )
            )
            if pids:
                node_pid[id(client)] = pids[0]
            return client, scratch

        client, scratch = started(False)
        tls_client = started(True)[0] if config.tls else None
        path = scratch / "stream.dat"
        progress(f"writing {config.nbytes >> 20} MiB and putting it into the node")
        make_file(path, config.nbytes)
        client.put(KEY, path)
        info = client.stat(KEY)
        if tls_client is not None:
            tls_client.put(KEY, path)

        infos = {id(client): info}
        if tls_client is not None:
            infos[id(tls_client)] = tls_client.stat(KEY)

        def shuttle_once(c: Client, name: str | None = None) -> float:
            pid = node_pid.get(id(c))
            node_cpu = process_cpu_s(pid) if pid is not None else 0.0
            client_cpu = time.process_time()
            start = time.perf_counter()
            n = sum(len(piece) for piece in c.iter_read(KEY, info=infos[id(c)]))
            elapsed = time.perf_counter() - start
            if n != config.nbytes:
                raise AssertionError(f"streamed {n} of {config.nbytes} bytes")
            if name is not None:
                gib = n / (1 << 30)
                client_cpu = (time.process_time() - client_cpu) / gib
                node_s = None if pid is None else (process_cpu_s(pid) - node_cpu) / gib
                cpu[name].append((client_cpu, node_s))
            return elapsed

        progress("warming the page cache (one pass each)")
        raw_tcp_receive(path, config.nbytes)
        shuttle_once(client)
        if tls_client is not None:
            shuttle_once(tls_client)
        for i in range(config.repeat):
            progress(f"run {i + 1}/{config.repeat}")
            raw_s.append(raw_tcp_receive(path, config.nbytes))
            shuttle_s.append(shuttle_once(client, "shuttle"))
            if tls_client is not None:
                tls_s.append(shuttle_once(tls_client, "shuttle_tls"))
        counters = client.counters()
    raw_med, shuttle_med = statistics.median(raw_s), statistics.median(shuttle_s)
    mib = config.nbytes / (1 << 20)
    extra: dict[str, Any] = {}
    if tls_s:
        tls_med = statistics.median(tls_s)
        extra = {
            "shuttle_tls": {
                "runs_s": tls_s,
                "median_s": tls_med,
                "mib_per_s": mib / tls_med,
                "cpu_s_per_gib": _cpu_medians(cpu["shuttle_tls"]),
            },
            "shuttle_tls_over_shuttle_throughput": shuttle_med / tls_med,
            "tls_target": 0.6,
        }
    return {
        "config": asdict(config),
        "compiled": compiled.active().reason,
        "raw_tcp": {"runs_s": raw_s, "median_s": raw_med, "mib_per_s": mib / raw_med},
        "shuttle": {
            "runs_s": shuttle_s,
            "median_s": shuttle_med,
            "mib_per_s": mib / shuttle_med,
            "requests": counters["requests"],
            "cpu_s_per_gib": _cpu_medians(cpu["shuttle"]),
        },
        "shuttle_over_raw_throughput": raw_med / shuttle_med,
        "target": 0.6,
        **extra,
    }


def _cpu_medians(runs: list[tuple[float, float | None]]) -> dict[str, float | None]:
    """Median CPU seconds per GiB of the client and the node (None: a node not ours)."""
    nodes = [n for _, n in runs if n is not None]
    return {
        "client": statistics.median(c for c, _ in runs),
        "node": statistics.median(nodes) if nodes else None,
    }


if __name__ == "__main__":  # the raw sender's entry point
    _send_file(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    os._exit(0)
