"""Where a warm 4 KiB read's round trip goes: Shuttle against the floor of Python itself.

    .venv/bin/python benchmarks/roundtrip_floor.py --json benchmarks/results/roundtrip-floor.json

Four exchanges of a 4 KiB reply to a small request, all pinned to one CPU (as
``shuttle bench netrand`` pins), each timed per request (p50) with the CPU time each
side used per request (user and system, from ``/proc/PID/stat``):

* **floor**: a minimal uvloop server (a ``Protocol`` that answers every 32-byte
  request with 12 + 4096 bytes) and a client that does ``sendall`` + ``recv``: the
  least a Python client and a Python event-loop server can cost on this machine.
* **raw → node**: the same raw client loop against a real ``shuttle serve``: one
  Shuttle read request, encoded once by the real client and replayed, so the client
  side costs what the floor's does and the difference is the node's.
* **client → node**: ``Client.read`` against the same node (``shuttle bench
  netrand``'s warm read).
* **redis**: ``redis-server`` with the netrand's raw RESP client.

The per-request CPU columns say which side a gap is on; the floor says how far
Python's own costs (interpreter, event loop, kernel round trip) are from Redis's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shuttle.bench.nodes import bench_client
from shuttle.bench.placement import default_cpu, pin_process
from shuttle.bench.redis_anchor import RedisServer, RespClient
from shuttle.bench.session import BenchSession
from shuttle.client.client import Client
from shuttle.cluster.clusterfile import ClusterFile

PAGE = 4096
FLOOR_REQUEST = 32
FLOOR_REPLY = b"%012d" % PAGE + os.urandom(PAGE)


def _floor_server(port_file: str) -> None:
    """The floor's server: run in its own process (``--serve-floor``)."""
    import uvloop

    class Answer(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport  # uvloop's TCPTransport (not asyncio's class)
            self.pending = 0

        def data_received(self, data: bytes) -> None:
            self.pending += len(data)
            while self.pending >= FLOOR_REQUEST:
                self.pending -= FLOOR_REQUEST
                self.transport.write(FLOOR_REPLY)

    loop = uvloop.new_event_loop()
    server: Any = loop.run_until_complete(loop.create_server(Answer, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    Path(port_file).write_text(str(port))
    loop.run_forever()


def _cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid``, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _timed(
    exchange: Callable[[], object], requests: int, server_pid: int, warmup: int = 500
) -> dict[str, Any]:
    for _ in range(warmup):
        exchange()
    lat: list[int] = []
    clock = time.perf_counter_ns
    s0, c0, w0 = _cpu_s(server_pid), os.times(), time.perf_counter()
    for _ in range(requests):
        t = clock()
        exchange()
        lat.append(clock() - t)
    s1, c1, w1 = _cpu_s(server_pid), os.times(), time.perf_counter()
    lat.sort()
    per = 1e6 / requests
    return {
        "p50_us": lat[len(lat) // 2] / 1e3,
        "p90_us": lat[int(len(lat) * 0.9)] / 1e3,
        "wall_us_per_request": (w1 - w0) * per,
        "client_user_us": (c1.user - c0.user) * per,
        "client_sys_us": (c1.system - c0.system) * per,
        "server_user_us": (s1[0] - s0[0]) * per,
        "server_sys_us": (s1[1] - s0[1]) * per,
    }


def _raw_exchange(sock: socket.socket, request: bytes, reply_bytes: int) -> Callable[[], None]:
    sendall, recv = sock.sendall, sock.recv

    def exchange() -> None:
        sendall(request)
        got = 0
        while got < reply_bytes:
            piece = recv(65536)
            if not piece:
                raise ConnectionError("the server closed the connection")
            got += len(piece)

    return exchange


def measure_floor(requests: int, cpu: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        proc = subprocess.Popen([sys.executable, __file__, "--serve-floor", str(port_file)])
        try:
            pin_process(proc.pid, cpu)
            deadline = time.monotonic() + 10
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the floor server did not start")
                time.sleep(0.02)
            with socket.create_connection(("127.0.0.1", int(port_file.read_text()))) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                exchange = _raw_exchange(sock, b"r" * FLOOR_REQUEST, len(FLOOR_REPLY))
                return _timed(exchange, requests, proc.pid)
        finally:
            proc.kill()
            proc.wait()


def _replayable_read(client: Client) -> tuple[socket.socket, bytes, int]:
    """The client's socket to its node, one encoded read request of a warm page, and
    the length of its reply (the node answers a request id again once answered)."""
    node = client.nodes[0]
    blocking: Any = client.connection(node)  # a BlockingConnection
    conn, sock = blocking._conn, blocking._sock  # a measurement peeks at the socket
    assert conn is not None and sock is not None
    rid = conn.next_request_id()
    args = {"key": "floor/page", "offset": PAGE, "length": PAGE}
    request = b"".join(conn.send_request(rid, "read", args, b"", join_below=1 << 16))
    sock.sendall(request)
    sock.settimeout(5.0)
    reply = b""
    while len(reply) < PAGE:
        reply += sock.recv(65536)
    sock.settimeout(0.2)
    try:
        while piece := sock.recv(65536):
            reply += piece
    except TimeoutError:
        pass
    sock.settimeout(None)
    return sock, request, len(reply)


def measure_node(requests: int, cpu: int) -> dict[str, Any]:
    with bench_client(None, cache_bytes=0) as (client, scratch):
        client.put("floor/page", os.urandom(64 * PAGE))
        client.read("floor/page", PAGE, PAGE)  # into the node's block cache
        entry = ClusterFile.load(scratch / "cluster" / "cluster.toml").nodes[0]
        assert entry.pid
        pin_process(entry.pid, cpu)
        out = {
            "client_to_node": _timed(
                lambda: client.read("floor/page", PAGE, PAGE), requests, entry.pid
            )
        }
        sock, request, reply_bytes = _replayable_read(client)
        out["raw_to_node"] = _timed(_raw_exchange(sock, request, reply_bytes), requests, entry.pid)
        return out


def measure_redis(requests: int, cpu: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        try:
            pin_process(redis.proc.pid, cpu)
            resp = RespClient(redis.port)
            resp.set_many([(b"p:1", os.urandom(PAGE))])
            return _timed(lambda: resp.get(b"p:1"), requests, redis.proc.pid)
        finally:
            redis.stop()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--serve-floor":
        _floor_server(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000, help="requests per exchange")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all four (medians)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args()
    cpu = default_cpu()
    os.sched_setaffinity(0, {cpu})
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
        row = {
            "floor": measure_floor(args.requests, cpu),
            "redis": measure_redis(args.requests, cpu),
        }
        row.update(measure_node(args.requests, cpu))
        rounds.append(row)
    names = ("floor", "raw_to_node", "client_to_node", "redis")
    keys = list(rounds[0]["floor"])
    summary = {
        name: {k: statistics.median(rnd[name][k] for rnd in rounds) for k in keys} for name in names
    }
    heads = ("p50", "p90", "wall/req", "client usr", "client sys", "server usr", "server sys")
    print(f"{'µs':<16}" + "".join(f"{h:>11}" for h in heads))
    for name in names:
        print(f"{name:<16}" + "".join(f"{summary[name][k]:>11.1f}" for k in keys))
    redis_p50 = summary["redis"]["p50_us"]
    ratios = {name: summary[name]["p50_us"] / redis_p50 for name in names}
    print("p50 / redis: " + ", ".join(f"{n} {r:.2f}" for n, r in ratios.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        report = {
            "experiment": "roundtrip-floor",
            "pinned_cpu": cpu,
            "requests": args.requests,
            "rounds": rounds,
            "median": summary,
            "p50_over_redis": ratios,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report written to {args.json}")


if __name__ == "__main__":
    if "--serve-floor" in sys.argv:
        main()  # the floor's server, a child of the run below
    else:
        # Stops what the run started on any exit (SIGTERM too); says how long it took.
        with BenchSession(f"benchmarks/{Path(__file__).name}", {"argv": sys.argv[1:]}):
            main()
