"""What the wire's tests share: a cluster CA with node certificates, nodes started with
TLS, a TCP proxy that changes one byte of what passes through it, and a party in the
middle that relays a TLS connection."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

from shuttle.net import auth, certs
from tests.integration.nodeproc import NodeProcess


@dataclass
class Pki:
    """A CA and the files a node on 127.0.0.1 needs to serve TLS."""

    root: Path
    ca: certs.CertPair
    node: certs.CertPair

    @classmethod
    def make(cls, root: Path, node_id: str = "node", host: str = "127.0.0.1") -> Pki:
        ca = certs.make_ca(root / "ca")
        return cls(root, ca, certs.make_node_cert(ca, root / "nodes", node_id, host))

    def serve_args(self) -> list[str]:
        return [
            "--tls",
            "--tls-cert",
            str(self.node.cert),
            "--tls-key",
            str(self.node.key),
            "--ca-file",
            str(self.ca.cert),
        ]


def keyed_tls_node(
    tmp_path: Path, *extra: str, name: str = "node"
) -> tuple[NodeProcess, Pki, Path]:
    """A node with a cluster key and TLS (its certificate from a fresh CA)."""
    pki = Pki.make(tmp_path / "pki", name)
    key_file = tmp_path / "cluster.key"
    if not key_file.exists():
        auth.write_key_file(key_file)
    node = NodeProcess(
        tmp_path / name, extra=["--key-file", str(key_file), *pki.serve_args(), *extra]
    ).start()
    return node, pki, key_file


@dataclass
class Flip:
    """Which byte to change: in the stream ``direction`` (``"up"``: client to node,
    ``"down"``: node to client), either the byte at ``offset`` of each connection's
    stream, or, with ``marker``, a byte inside the first whole copy of ``marker`` seen
    in one received chunk (plain connections: the content is visible)."""

    direction: str
    offset: int | None = None
    marker: bytes | None = None
    #: Which byte of the marker is changed.
    marker_index: int = 3


@dataclass
class FlipProxy:
    """A TCP proxy in front of ``127.0.0.1:port`` that forwards everything unchanged
    except one byte per connection, chosen by ``flip`` (None: a clean proxy)."""

    port: int
    flip: Flip | None = None
    #: Bytes forwarded per direction over all connections, and flips made.
    forwarded: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    flips: int = 0

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._closing = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.port))
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, "up"), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, "down"), daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        seen = 0
        done = False
        flip = self.flip if self.flip is not None and self.flip.direction == direction else None
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if flip is not None and not done:
                    chunk = bytearray(data)
                    at = -1
                    if flip.offset is not None and seen <= flip.offset < seen + len(chunk):
                        at = flip.offset - seen
                    elif flip.marker is not None:
                        found = chunk.find(flip.marker)
                        at = found + flip.marker_index if found >= 0 else -1
                    if at >= 0:
                        chunk[at] ^= 0x01
                        data = bytes(chunk)
                        done = True
                        with self._lock:
                            self.flips += 1
                seen += len(data)
                with self._lock:
                    self.forwarded[direction] += len(data)
                dst.sendall(data)
        except OSError:
            # Shut down, not close: the other pump may be inside recv on one of these,
            # and a closed descriptor's number can be handed to a new connection.
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closing = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> FlipProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Relay:
    """A party in the middle with a certificate from the cluster's CA (a node of the
    cluster gone bad): it ends the client's TLS and opens its own to the real node,
    and passes the plaintext through, HELLO and all."""

    def __init__(self, pki: Pki, evil: certs.CertPair, node_port: int) -> None:
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(str(evil.cert), str(evil.key))
        self.client_ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
        self.node_port = node_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.finished = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        raw, _ = self.listener.accept()
        client = self.server_ctx.wrap_socket(raw, server_side=True)
        upstream = self.client_ctx.wrap_socket(
            socket.create_connection(("127.0.0.1", self.node_port)), server_hostname="127.0.0.1"
        )

        def pump(src: ssl.SSLSocket, dst: ssl.SSLSocket) -> None:
            try:
                while data := src.recv(1 << 16):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                # Wake the other pump without giving up the descriptors: a socket
                # closed here while the other thread is still reading it frees its
                # number, the test's next connection can get that number, and the
                # other thread's OpenSSL then reads and writes that connection's
                # handshake (the intermittent WRONG_VERSION_NUMBER this test had).
                for s in (src, dst):
                    with contextlib.suppress(OSError):
                        socket.socket.shutdown(s, socket.SHUT_RDWR)

        other = threading.Thread(target=pump, args=(client, upstream), daemon=True)
        other.start()
        pump(upstream, client)
        other.join()
        for s in (client, upstream, self.listener):
            s.close()
        self.finished.set()
