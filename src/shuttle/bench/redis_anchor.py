"""A Redis server on loopback, and a raw RESP client: the anchor for a fast remote fetch.

Debian's ``redis-server`` (installed by ``scripts/setup.sh``) is started on a free
port with persistence off, so it serves purely from memory; the client speaks RESP
over a plain socket, with the same per-request harness the Shuttle client is timed
with, so the comparison is between servers, not client libraries.

With ``tls`` the same server also listens for TLS 1.3 (Redis's ``--tls-port``, with a
certificate from a CA made for the run), and :class:`RespClient` can speak it through
Python's :mod:`ssl`, as Shuttle's client does: the anchor for Shuttle over TLS.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from shuttle.errors import ExternalToolError, RemoteProtocolError
from shuttle.net import certs

#: Where Debian puts the server; PATH is searched first.
REDIS_SERVER = "redis-server"
START_TIMEOUT_S = 10.0
#: SETs sent per pipelined batch when loading pages.
LOAD_BATCH = 512


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """``redis-server`` on 127.0.0.1 with no persistence; stopped on exit. With
    ``tls``, also a TLS 1.3 port (:attr:`tls_port`) whose CA is :attr:`ca_file`."""

    def __init__(self, workdir: Path, *, tls: bool = False) -> None:
        binary = shutil.which(REDIS_SERVER) or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise ExternalToolError(
                "redis-server is not installed; run scripts/setup.sh (or apt-get install "
                "redis-server), or pass --no-redis"
            )
        self.port = _free_port()
        self.tls_port: int | None = None
        self.ca_file: Path | None = None
        tls_args: list[str] = []
        if tls:
            ca = certs.make_ca(workdir / "redis-tls", "redis anchor")
            pair = certs.make_node_cert(ca, workdir / "redis-tls", "redis", "127.0.0.1")
            self.tls_port, self.ca_file = _free_port(), ca.cert
            tls_args = [
                "--tls-port",
                str(self.tls_port),
                "--tls-cert-file",
                str(pair.cert),
                "--tls-key-file",
                str(pair.key),
                "--tls-ca-cert-file",
                str(ca.cert),
                "--tls-auth-clients",
                "no",
                "--tls-protocols",
                "TLSv1.3",
            ]
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
                *tls_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # In a session of its own, as every node the benchmarks start is
            # (cluster/local.py): with the kernel's autogroups (Debian's default) each
            # session is one scheduling group, so a Redis left in the benchmark's
            # session shared its group with the client processes while the node had
            # one to itself, and on a loaded machine the two servers got different
            # shares of the CPU (benchmarks/README.md, "Tail latency under many
            # clients").
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise ExternalToolError("redis-server did not start") from None
                time.sleep(0.02)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


class RespClient:
    """A minimal blocking RESP client: SET (pipelined) and GET of bulk strings; with
    ``ca_file``, over TLS 1.3 (the server's certificate checked against it)."""

    def __init__(self, port: int, *, ca_file: Path | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if ca_file is not None:
            context = ssl.create_default_context(cafile=str(ca_file))
            context.minimum_version = ssl.TLSVersion.TLSv1_3
            sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
        self.sock = sock
        self._buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise RemoteProtocolError("redis closed the connection")
        self._buf += data

    def _line(self) -> bytes:
        while (end := self._buf.find(b"\r\n")) < 0:
            self._fill()
        line = bytes(self._buf[:end])
        del self._buf[: end + 2]
        return line

    def _reply(self) -> bytes | None:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self._buf) < n + 2:
                self._fill()
            value = bytes(self._buf[:n])
            del self._buf[: n + 2]
            return value
        raise RemoteProtocolError(f"unexpected redis reply {line[:80]!r}")

    def set_many(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        batch: list[bytes] = []
        for key, value in items:
            batch.append(_command(b"SET", key, value))
            if len(batch) == LOAD_BATCH:
                self._send_batch(batch)
                batch = []
        if batch:
            self._send_batch(batch)

    def _send_batch(self, batch: list[bytes]) -> None:
        self.sock.sendall(b"".join(batch))
        for _ in batch:
            self._reply()

    def get(self, key: bytes) -> bytes | None:
        self.sock.sendall(_command(b"GET", key))
        return self._reply()
