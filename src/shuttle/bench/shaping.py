"""Benchmark: the emulated link shaper against kernel ``tc ... tbf`` shaping.

The same transfers, between a real TCP server process and a real client process,
for the same :class:`~shuttle.net.profiles.LinkProfile`:

* **emulated**: both processes on 127.0.0.1; the client wraps its connection in a
  :class:`~shuttle.net.shaping.ShapedStream` (``transport="async"``) or a
  :class:`~shuttle.net.shaped_socket.ShapedSocket` (``"sync"``) with the full profile.
* **kernel**: the server in a node namespace, the client in the hub namespace of a
  :class:`~shuttle.net.netns.NetnsLab`, the link shaped by ``tbf`` in both
  directions; this kernel cannot delay packets (no netem, no fq), so the client
  adds the profile's latency with a latency-only shaper, and the comparison checks
  the bandwidth half.

As the floor of every figure, the same transfers also run unshaped on 127.0.0.1
(the ``unshaped`` section: Python, the event loop and the loopback device).

Transfers: ``pings`` round trips of a 9-byte request and 1-byte answer, a download
of ``nbytes`` (request up, payload down) and an upload of ``nbytes`` (payload up,
1-byte answer down). Each mode is run ``repeat`` times; medians are reported with
the closed form ``2 * latency + max(0, nbytes - burst) * 8 / bandwidth``.

The kernel counts what goes on the wire: every 1448-byte TCP segment (with
timestamps) carries 66 bytes of TCP/IP/Ethernet headers, so at the same rate the
kernel moves about 4.4% less payload; :data:`WIRE_BYTES_PER_PAYLOAD_BYTE` states
the expectation the ratio should be near.

The peers are this module's ``server`` and ``client`` entry points
(``python -m shuttle.bench.shaping server|client --help``); they speak a tiny
protocol of their own, as this measures links, not storage nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from shuttle.errors import ExternalToolError
from shuttle.net.netns import NetnsLab, netns_unavailable_reason
from shuttle.net.profiles import BUILTIN_PROFILES, LinkProfile, parse_link_profile
from shuttle.net.shaped_socket import ShapedSocket
from shuttle.net.shaping import Link

#: Request: one op byte and a 64-bit length. 'D': send me n bytes; 'U': I send you
#: n bytes, answer one byte; 'P': answer one byte.
REQUEST = struct.Struct("!cQ")
#: Payload is written from one preallocated buffer in slices of this size.
SERVER_CHUNK_BYTES = 1024 * 1024
#: Default transfer size, in seconds of the profile's bandwidth: long enough that
#: the burst and the latency are small beside the serialisation time, short enough
#: that three repeats of both modes take under a minute.
TRANSFER_S_DEFAULT = 1.5
TRANSFER_BYTES_MIN = 64 * 1024
TRANSFER_BYTES_MAX = 64 * 1024 * 1024
#: Wire bytes per payload byte in a bulk TCP transfer over veth: (1448 payload +
#: 32 TCP + 20 IP + 14 Ethernet) / 1448; kernel tbf counts all of them.
WIRE_BYTES_PER_PAYLOAD_BYTE = (1448 + 32 + 20 + 14) / 1448
#: How long to wait for a peer process to start listening or to finish.
PEER_READY_TIMEOUT_S = 10.0
PEER_RUN_TIMEOUT_S = 600.0
#: Client transports: asyncio streams through ShapedStream, or a blocking socket
#: through ShapedSocket (the synchronous client's).
TRANSPORTS = ("async", "sync")


def default_bytes(profile: LinkProfile) -> int:
    """The transfer size that takes :data:`TRANSFER_S_DEFAULT` at the profile's rate."""
    rate = profile.bandwidth_bytes_per_s
    if rate is None:
        return TRANSFER_BYTES_MAX
    return int(min(TRANSFER_BYTES_MAX, max(TRANSFER_BYTES_MIN, rate * TRANSFER_S_DEFAULT)))


def closed_form(profile: LinkProfile, nbytes: int, wire_factor: float = 1.0) -> dict[str, float]:
    """Expected times on an idle link: the request and the answer each cross it once
    (two latencies), and the payload is serialised at the bandwidth beyond the burst.
    ``wire_factor`` scales the payload to the bytes the shaper counts."""
    rtt_s = 2 * profile.latency_s
    rate = profile.bandwidth_bytes_per_s
    wire_bytes = nbytes * wire_factor
    serialise_s = (
        0.0 if rate is None else max(0.0, wire_bytes - profile.effective_burst_bytes) / rate
    )
    return {"ping_rtt_s": rtt_s, "download_s": rtt_s + serialise_s, "upload_s": rtt_s + serialise_s}


# -- the peers ---------------------------------------------------------------------------


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    payload = memoryview(b"\xa5" * SERVER_CHUNK_BYTES)
    try:
        while True:
            try:
                op, n = REQUEST.unpack(await reader.readexactly(REQUEST.size))
            except asyncio.IncompleteReadError:
                return
            if op == b"D":
                left = n
                while left:
                    part = min(left, SERVER_CHUNK_BYTES)
                    writer.write(payload[:part])
                    left -= part
                    await writer.drain()
            elif op == b"U":
                left = n
                while left:
                    data = await reader.read(min(left, SERVER_CHUNK_BYTES))
                    if not data:
                        return
                    left -= len(data)
                writer.write(b"k")
            elif op == b"P":
                writer.write(b"p")
            else:
                return
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def serve(host: str, port: int) -> None:
    """Serve the benchmark protocol until SIGTERM; prints ``ready PORT`` when listening.

    On SIGTERM, open connections are closed first, so their handlers end normally
    (cancelling them instead makes Python 3.11's ``start_server`` log an error)."""
    open_writers: set[asyncio.StreamWriter] = set()
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        open_writers.add(writer)
        handlers.add(task)
        try:
            await _serve_connection(reader, writer)
        finally:
            open_writers.discard(writer)
            handlers.discard(task)

    server = await asyncio.start_server(handle, host, port)
    bound = server.sockets[0].getsockname()[1]
    print(f"ready {bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()
        server.close()
        for writer in list(open_writers):
            writer.transport.abort()
        if handlers:
            await asyncio.wait(list(handlers), timeout=PEER_READY_TIMEOUT_S)


@dataclass
class ClientResult:
    """What one client run measured (seconds; throughput in payload bytes per second)."""

    ping_rtt_s: list[float]
    download_s: float
    upload_s: float
    nbytes: int

    @property
    def download_bytes_per_s(self) -> float:
        return self.nbytes / self.download_s

    @property
    def upload_bytes_per_s(self) -> float:
        return self.nbytes / self.upload_s


async def run_client(
    host: str, port: int, profile: LinkProfile, nbytes: int, pings: int
) -> ClientResult:
    """Connect through a :class:`Link` with ``profile`` and time the three transfers."""
    reader, writer = await asyncio.open_connection(host, port)
    stream = Link(profile).wrap(reader, writer)
    rtts = []
    for _ in range(pings):
        start = time.monotonic()
        stream.write(REQUEST.pack(b"P", 0))
        await stream.readexactly(1)
        rtts.append(time.monotonic() - start)
    start = time.monotonic()
    stream.write(REQUEST.pack(b"D", nbytes))
    left = nbytes
    while left:
        data = await stream.read(min(left, 1 << 20))
        if not data:
            raise ConnectionError(f"server closed with {left} bytes of the download missing")
        left -= len(data)
    download_s = time.monotonic() - start
    block = b"\x5a" * min(nbytes, SERVER_CHUNK_BYTES)
    start = time.monotonic()
    stream.write(REQUEST.pack(b"U", nbytes))
    left = nbytes
    while left:
        part = min(left, len(block))
        stream.write(block[:part])
        left -= part
        await stream.drain()
    await stream.readexactly(1)
    upload_s = time.monotonic() - start
    stream.close()
    await stream.wait_closed()
    return ClientResult(rtts, download_s, upload_s, nbytes)


def run_client_sync(
    host: str, port: int, profile: LinkProfile, nbytes: int, pings: int
) -> ClientResult:
    """The same transfers from blocking code, through a :class:`ShapedSocket`."""
    sock = ShapedSocket(socket.create_connection((host, port)), Link(profile))

    def read_exactly(n: int) -> int:
        left = n
        while left:
            data = sock.recv(min(left, 1 << 20), timeout_s=PEER_RUN_TIMEOUT_S)
            if not data:
                raise ConnectionError(f"server closed with {left} bytes missing")
            left -= len(data)
        return n

    rtts = []
    for _ in range(pings):
        start = time.monotonic()
        sock.sendall(REQUEST.pack(b"P", 0))
        read_exactly(1)
        rtts.append(time.monotonic() - start)
    start = time.monotonic()
    sock.sendall(REQUEST.pack(b"D", nbytes))
    read_exactly(nbytes)
    download_s = time.monotonic() - start
    block = b"\x5a" * min(nbytes, SERVER_CHUNK_BYTES)
    start = time.monotonic()
    sock.sendall(REQUEST.pack(b"U", nbytes))
    left = nbytes
    while left:
        part = min(left, len(block))
        sock.sendall(block[:part])
        left -= part
        sock.drain()
    read_exactly(1)
    upload_s = time.monotonic() - start
    sock.close()
    return ClientResult(rtts, download_s, upload_s, nbytes)


# -- running the modes ---------------------------------------------------------------------


def _peer(*args: str) -> list[str]:
    return [sys.executable, "-m", "shuttle.bench.shaping", *args]


@contextlib.contextmanager
def _server(popen: Callable[..., subprocess.Popen[str]], host: str) -> Iterator[int]:
    process = popen(_peer("server", "--host", host, "--port", "0"))
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        if len(line) != 2 or line[0] != "ready":
            raise ExternalToolError(f"the benchmark server did not start (said {line!r})")
        yield int(line[1])
    finally:
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout=PEER_READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _client_result(done: subprocess.CompletedProcess[str]) -> ClientResult:
    if done.returncode != 0:
        raise ExternalToolError(f"the benchmark client failed: {done.stderr.strip()[-2000:]}")
    raw = json.loads(done.stdout)
    return ClientResult(raw["ping_rtt_s"], raw["download_s"], raw["upload_s"], raw["nbytes"])


def run_emulated(
    profile: LinkProfile, nbytes: int, pings: int, transport: str = "async"
) -> ClientResult:
    """One run of the emulated mode: both peers on 127.0.0.1, the client shapes."""

    def popen(argv: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)

    with _server(popen, "127.0.0.1") as port:
        argv = _peer("client", "--host", "127.0.0.1", "--port", str(port))
        argv += ["--profile", profile.spec(), "--bytes", str(nbytes), "--pings", str(pings)]
        argv += ["--transport", transport]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=PEER_RUN_TIMEOUT_S, check=False
        )
    return _client_result(done)


def run_kernel(lab: NetnsLab, nbytes: int, pings: int, transport: str = "async") -> ClientResult:
    """One run of the kernel mode in an open lab: tbf shapes, the client adds latency."""
    node = lab.nodes[0]

    def popen(argv: list[str]) -> subprocess.Popen[str]:
        return lab.popen(node.namespace, argv, stdout=subprocess.PIPE, text=True)

    with _server(popen, "0.0.0.0") as port:
        argv = _peer("client", "--host", node.address, "--port", str(port))
        argv += ["--profile", lab.client_profile(0).spec(), "--transport", transport]
        argv += ["--bytes", str(nbytes), "--pings", str(pings)]
        done = lab.run(lab.client_namespace, argv, timeout_s=PEER_RUN_TIMEOUT_S)
    return _client_result(done)


def _qdisc_counters(stats: str) -> dict[str, int]:
    """``Sent B bytes P pkt (dropped D, overlimits O ...)`` from ``tc -s qdisc show``."""
    found = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", stats)
    if found is None:
        return {}
    keys = ("sent_bytes", "sent_packets", "dropped", "overlimits")
    return dict(zip(keys, map(int, found.groups()), strict=True))


def _summary(runs: list[ClientResult]) -> dict[str, Any]:
    download_s = statistics.median(r.download_s for r in runs)
    upload_s = statistics.median(r.upload_s for r in runs)
    nbytes = runs[0].nbytes
    return {
        "ping_rtt_s": statistics.median(t for r in runs for t in r.ping_rtt_s),
        "download_s": download_s,
        "upload_s": upload_s,
        "download_bytes_per_s": nbytes / download_s,
        "upload_bytes_per_s": nbytes / upload_s,
        "runs": [asdict(r) for r in runs],
    }


def run_benchmark(
    profile: LinkProfile,
    nbytes: int,
    *,
    repeat: int = 3,
    pings: int = 20,
    kernel: bool = True,
    transport: str = "async",
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Both modes, ``repeat`` runs each, interleaved (so drift on a shared machine hits
    both alike); returns the JSON-ready report."""
    reason = None if kernel else "not requested (--no-kernel)"
    if reason is None:
        reason = netns_unavailable_reason()
    emulated: list[ClientResult] = []
    kernel_runs: list[ClientResult] = []
    unshaped: list[ClientResult] = []
    lab = NetnsLab(1, profile) if reason is None else None
    qdiscs: dict[str, dict[str, int]] = {}
    with lab if lab is not None else contextlib.nullcontext():
        for i in range(repeat):
            progress(f"unshaped run {i + 1}/{repeat}")
            unshaped.append(run_emulated(BUILTIN_PROFILES["loopback"], nbytes, pings, transport))
            progress(f"emulated run {i + 1}/{repeat}")
            emulated.append(run_emulated(profile, nbytes, pings, transport))
            if lab is not None:
                progress(f"kernel run {i + 1}/{repeat}")
                kernel_runs.append(run_kernel(lab, nbytes, pings, transport))
        if lab is not None:
            node = lab.nodes[0]
            qdiscs = {
                "client_to_node": _qdisc_counters(lab.qdisc_stats(lab.hub, node.hub_device)),
                "node_to_client": _qdisc_counters(lab.qdisc_stats(node.namespace, node.device)),
            }
    report: dict[str, Any] = {
        "benchmark": "shaping",
        "config": {
            "profile": {"name": profile.name, "spec": profile.spec(), **profile.to_toml()},
            "burst_bytes": profile.effective_burst_bytes,
            "bytes": nbytes,
            "repeat": repeat,
            "pings": pings,
            "transport": transport,
            "machine": {
                "cpus": os.cpu_count(),
                "kernel": platform.release(),
                "python": platform.python_version(),
            },
        },
        "closed_form": closed_form(profile, nbytes),
        "closed_form_wire": closed_form(profile, nbytes, WIRE_BYTES_PER_PAYLOAD_BYTE),
        "wire_bytes_per_payload_byte": WIRE_BYTES_PER_PAYLOAD_BYTE,
        "unshaped": _summary(unshaped),
        "emulated": _summary(emulated),
    }
    if kernel_runs:
        k = _summary(kernel_runs)
        k["latency"] = "added by the emulated shaper at the client (no netem or fq here)"
        k["tbf"] = qdiscs
        report["kernel"] = k
        e = report["emulated"]
        report["emulated_over_kernel"] = {
            key: e[key] / k[key] for key in ("download_s", "upload_s", "ping_rtt_s") if k[key]
        }
    else:
        report["kernel"] = {"skipped": reason}
    return report


# -- the peers' command line (internal: the benchmark starts them) ----------------------


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m shuttle.bench.shaping",
        description="Peers of 'shuttle bench shaping' (started by the benchmark itself).",
    )
    sub = parser.add_subparsers(dest="role", required=True)
    server = sub.add_parser("server", help="serve the benchmark protocol until SIGTERM")
    server.add_argument("--host", default="127.0.0.1")
    server.add_argument("--port", type=int, default=0)
    client = sub.add_parser("client", help="time pings, a download and an upload; print JSON")
    client.add_argument("--host", required=True)
    client.add_argument("--port", type=int, required=True)
    client.add_argument("--profile", default="loopback", help="name or spec, e.g. bw=none,lat=1ms")
    client.add_argument("--bytes", type=int, required=True)
    client.add_argument("--pings", type=int, default=20)
    client.add_argument("--transport", choices=TRANSPORTS, default="async")
    args = parser.parse_args(argv)
    if args.role == "server":
        asyncio.run(serve(args.host, args.port))
        return
    profile = parse_link_profile(args.profile)
    if args.transport == "sync":
        result = run_client_sync(args.host, args.port, profile, args.bytes, args.pings)
    else:
        result = asyncio.run(run_client(args.host, args.port, profile, args.bytes, args.pings))
    print(json.dumps(asdict(result)))


if __name__ == "__main__":
    _main()
