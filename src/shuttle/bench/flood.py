"""``shuttle bench flood``: connections that never authenticate, against a key holder.

A node (with a cluster key; with ``tls``, serving TLS) gets a flood of connections
that connect and then send nothing: no HELLO (plain) or no TLS ClientHello (TLS). The
measure is what the issue asked of it: how long a key holder takes to connect and
put 1 KiB while the flood is open, against the same on the quiet node, interleaved
round by round (target: at most 100 ms more). The node is started with a small
connection cap (as in the report that found the problem: ``--connections-max 64``),
so without limits before authentication the flood would take every connection.
"""

from __future__ import annotations

import json
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shuttle.client.connect import connect
from shuttle.errors import ConfigError, ShuttleError
from shuttle.net import auth, certs

#: How long the node may take to start.
START_TIMEOUT_S = 30.0
#: The issue's target: the flood may delay a key holder's put by at most this.
DELAY_TARGET_S = 0.100


@dataclass(frozen=True)
class FloodConfig:
    connections: int = 1000
    rounds: int = 5
    #: Connects and puts timed per round, quiet and flooded.
    puts: int = 5
    connections_max: int = 64
    tls: bool = False

    def __post_init__(self) -> None:
        if self.connections < 1 or self.rounds < 1 or self.puts < 1:
            raise ConfigError("--connections, --rounds and --puts must be positive")


def _start(scratch: Path, config: FloodConfig) -> tuple[subprocess.Popen[bytes], int, Any]:
    key_file = scratch / "cluster.key"
    auth.write_key_file(key_file)
    args = ["--key-file", str(key_file), "--connections-max", str(config.connections_max)]
    client_tls: dict[str, Any] = {"tls": False}
    if config.tls:
        ca = certs.make_ca(scratch / "tls")
        pair = certs.make_node_cert(ca, scratch / "tls", "node", "127.0.0.1")
        args += ["--tls", "--tls-cert", str(pair.cert), "--tls-key", str(pair.key)]
        args += ["--ca-file", str(ca.cert)]
        client_tls = {"tls": True, "ca_file": ca.cert}
    ready = scratch / "ready"
    with open(scratch / "node.log", "ab") as log:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "shuttle", "serve", "--data", str(scratch / "data")),
                *("--listen", "127.0.0.1:0", "--node-id", "node", "--ready-file", str(ready)),
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise ShuttleError(f"the node did not start; see {scratch / 'node.log'}")
        time.sleep(0.02)
    port = int(json.loads(ready.read_text())["port"])
    return proc, port, {"key_file": key_file, **client_tls}


def run(config: FloodConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process opens the flood
    scratch = Path(tempfile.mkdtemp(prefix="shuttle-flood-"))
    quiet: list[float] = []
    flooded: list[float] = []
    refused = 0
    try:
        proc, port, options = _start(scratch, config)
        address = f"127.0.0.1:{port}"

        def connect_and_put() -> float:
            start = time.perf_counter()
            with connect(node=address, **options) as client:
                client.put("canary", b"c" * 1024)
            return time.perf_counter() - start

        try:
            connect_and_put()  # warm: imports, the first handshake
            for rnd in range(config.rounds):
                progress(f"round {rnd + 1}/{config.rounds}: quiet")
                quiet += [connect_and_put() for _ in range(config.puts)]
                progress(f"round {rnd + 1}/{config.rounds}: {config.connections} connections")
                flood = [
                    socket.create_connection(("127.0.0.1", port)) for _ in range(config.connections)
                ]
                try:
                    for _ in range(config.puts):
                        try:
                            flooded.append(connect_and_put())
                        except ShuttleError:
                            refused += 1
                finally:
                    for s in flood:
                        s.close()
            with connect(node=address, **options) as client:
                server = client.node_stats(client.nodes[0])["server"]
        finally:
            proc.terminate()
            proc.wait(15)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        shutil.rmtree(scratch, ignore_errors=True)
    q50, f50 = statistics.median(quiet), statistics.median(flooded) if flooded else float("inf")
    return {
        "config": asdict(config),
        "quiet_s": {"p50": q50, "max": max(quiet), "runs": quiet},
        "flooded_s": {
            "p50": f50,
            "max": max(flooded) if flooded else None,
            "runs": flooded,
        },
        "refused": refused,
        "delay_p50_s": f50 - q50,
        "delay_max_s": (max(flooded) - q50) if flooded else None,
        "target_delay_s": DELAY_TARGET_S,
        "node": {
            name: server.get(name)
            for name in (
                "connections_max",
                "unauthenticated_max",
                "unauthenticated_evicted",
                "handshake_timeouts",
                "connections_refused",
                "tls",
            )
        },
    }
