"""Moving a blocking connection's bytes: the socket, TLS, and an emulated link.

Concepts: the byte stream under :class:`~shuttle.net.blocking.BlockingConnection`.
It opens the socket to a node (blocking mode with kernel timeouts: one system call
per receive), runs TLS over it as bytes in, bytes out
(:class:`~shuttle.net.tls.TlsChannel`: ciphertext still moves with ``os.write`` and
``os.read`` on the descriptor, so kernel timeouts and the idle probe work as on a
plain socket), lets an emulated link
(:class:`~shuttle.net.shaped_socket.ShapedSocket`) hold what it sends and receives,
feeds what arrives to the connection's codec (a large payload straight into its
buffer), counts the bytes, and turns every failure into a typed error
(:class:`UnreachableError`, :class:`RequestTimeoutError`, :class:`TlsError`) after
closing. The protocol over it (handshake, calls, pipelining, the read lane) is
:mod:`shuttle.net.blocking`, which subclasses :class:`BlockingStream`: one object, so
the compiled fast lane reads the descriptor and its reader and writer as fields.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from os import read as os_read
from os import write as os_write
from pathlib import Path
from typing import Final

from shuttle.errors import RequestTimeoutError, TlsError, UnreachableError
from shuttle.net.shaped_socket import ShapedSocket
from shuttle.net.shaping import Link
from shuttle.net.tls import ClientTls, TlsChannel, client_failure
from shuttle.wire import Connection
from shuttle.wire.events import Payload

#: Seconds to wait for a TCP connection and handshake before calling a node unreachable.
CONNECT_TIMEOUT_S = 5.0
#: Seconds a request may take before the call fails (a 16 MiB frame over a 1 Mb/s
#: emulated link takes ~134 s, so shaped clusters should raise it).
REQUEST_TIMEOUT_S = 60.0
#: Bytes asked of the kernel per recv between large payloads (those are received in
#: place, as much as the kernel has): a small response and the start of a large one.
RECV_BYTES: Final = 64 << 10
#: Bytes taken per receive from an emulated link's queue (it hands over what the
#: link has released, already in memory).
SHAPED_RECV_BYTES = 1 << 20
#: Payloads below this are joined with their frame header into one send.
SMALL_PAYLOAD_BYTES: Final = 64 << 10
#: Ciphertext bytes asked of the kernel per read on a TLS connection: a 1 MiB piece
#: arrives as 64 records of 16 KiB, taken in a few reads.
TLS_RECV_BYTES = 256 << 10
#: Bytes a TLS 1.3 record adds to its plaintext: a 5-byte header, the content type
#: and the 16-byte AEAD tag (22), with room to spare; one record carries 16 KiB.
TLS_RECORD_OVERHEAD_BYTES = 64


@dataclass
class ConnectionCounters:
    """What this connection has done (the client's observable API)."""

    requests: int = 0
    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    connects: int = 0
    errors: int = 0
    #: Reads whose reply came back by the read lane (``wire/readlane.py``).
    read_lane: int = 0
    #: ``by_op`` less the reads counted in ``_reads``.
    _ops: dict[str, int] = field(default_factory=dict, repr=False)
    #: Reads sent (``BlockingConnection.read``) not yet added to ``_ops``: an int field,
    #: where a dict item costs the compiled read path a look-up, a new int object and a
    #: store every read.
    _reads: int = field(default=0, repr=False)

    @property
    def by_op(self) -> dict[str, int]:
        """Requests sent, by operation (the dict itself: callers may count in it)."""
        if self._reads:
            self._ops["read"] = self._ops.get("read", 0) + self._reads
            self._reads = 0
        return self._ops

    def count_read(self) -> None:
        """One more ``read`` sent (in ``by_op`` when it is next asked for)."""
        self._reads += 1


class BlockingStream:
    """The bytes of one connection to the node at ``host:port``: plain, or TLS with
    ``tls`` (the cluster's CA), through emulated ``link`` if one is given. Opened by
    :meth:`_open_socket`, ended by :meth:`close` (the next open starts afresh).
    Thread-compatible, not thread-safe: use one per thread."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        link: Link | None = None,
        tls: ClientTls | None = None,
    ) -> None:
        self.host = host
        self.port = port
        #: TLS settings (the cluster's CA), or None for a plain connection.
        self.tls = tls
        self.connect_timeout_s = connect_timeout_s
        self.request_timeout_s = request_timeout_s
        self.link = link
        self.counters = ConnectionCounters()
        self._sock: socket.socket | None = None
        #: The open socket's descriptor (-1: none), for the read lane's os.read/os.write.
        self._fd = -1
        self._shaped: ShapedSocket | None = None
        #: The codec the received bytes feed (the connection's; None when closed).
        self._conn: Connection | None = None
        #: The open connection's TLS state (None: plain, or not connected), and the
        #: buffer its ciphertext is received into (made on first use).
        self._tls: TlsChannel | None = None
        self._tls_buffer: bytearray | None = None
        #: How the open connection writes and reads its descriptor: ``os.write`` and
        #: ``os.read`` on a plain one, through the TLS channel on a TLS one.
        self._write_fd: Callable[[int, bytes], int] = os_write
        self._read_fd: Callable[[int, int], bytes] = os_read

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _open_socket(self) -> socket.socket:
        """A new TCP connection to the node, in blocking mode with kernel timeouts
        (the receive timeout the connect timeout until the handshake is done).
        Raises :class:`UnreachableError` if the node does not accept it."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout_s)
        except TimeoutError as exc:
            raise UnreachableError(
                f"node {self.address} did not accept a connection within "
                f"{self.connect_timeout_s:g} s; is it running and reachable?"
            ) from exc
        except OSError as exc:
            raise UnreachableError(
                f"cannot reach node {self.address} ({exc.strerror or exc}); is it running? "
                "(`shuttle cluster status` shows a cluster's nodes)"
            ) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking mode with kernel timeouts: one syscall per recv, where a Python-level
        # socket timeout costs a failed recv, a poll and a second recv.
        sock.settimeout(None)
        set_kernel_timeout(sock, socket.SO_SNDTIMEO, self.request_timeout_s)
        set_kernel_timeout(sock, socket.SO_RCVTIMEO, self.connect_timeout_s)
        self._sock = sock
        self._fd = sock.fileno()
        return sock

    def _tls_handshake(self, tls: ClientTls) -> bytes:
        """The TLS handshake over the new socket (within the connect timeout); returns
        the channel's binding for the key proofs. Raises :class:`TlsError` (and closes)
        when it fails, :class:`UnreachableError` when the node goes away."""
        try:
            channel = TlsChannel(tls.context(), server_side=False, server_hostname=self.host)
        except ValueError as exc:  # e.g. an empty host name
            raise TlsError(f"cannot start TLS to {self.address}: {exc}") from None
        fd = self._fd
        deadline = time.monotonic() + self.connect_timeout_s
        try:
            while not channel.handshake():
                self._write_all(fd, channel.output())
                try:
                    data = os_read(fd, TLS_RECV_BYTES)
                except BlockingIOError:  # SO_RCVTIMEO expired
                    if time.monotonic() < deadline:
                        continue
                    raise UnreachableError(
                        f"node {self.address} did not complete the TLS handshake within "
                        f"{self.connect_timeout_s:g} s; does it serve TLS? (a node without "
                        "TLS waits for a plain client)"
                    ) from None
                if not data:
                    if channel.first_bytes:
                        raise client_failure(
                            ssl.SSLError("closed"), self.address, tls.ca_file, channel
                        )
                    raise UnreachableError(
                        f"node {self.address} closed the connection during the TLS handshake; "
                        "is it a Shuttle node with TLS, and is it over its connection limit?"
                    )
                channel.feed(data)
            self._write_all(fd, channel.output())  # the client's Finished
        except ssl.SSLError as exc:
            raise client_failure(exc, self.address, tls.ca_file, channel) from None
        except OSError as exc:
            raise UnreachableError(
                f"lost the connection to node {self.address} during the TLS handshake "
                f"({exc.strerror or exc})"
            ) from exc
        self._tls = channel
        self._write_fd, self._read_fd = self._tls_write, self._tls_read
        return channel.binding()

    def _ca_file(self) -> Path | None:
        return self.tls.ca_file if self.tls is not None else None

    @staticmethod
    def _write_all(fd: int, data: bytes) -> None:
        """All of ``data`` to ``fd`` (a blocking socket writes it whole unless a signal
        cuts it short)."""
        sent = os_write(fd, data)
        while sent < len(data):
            sent += os_write(fd, data[sent:])

    def _tls_write(self, fd: int, data: bytes) -> int:
        """``os.write`` for a TLS connection: all of ``data``, encrypted; returns its
        plaintext length (a partial write would break the record stream)."""
        tls = self._tls
        assert tls is not None
        self._write_all(fd, tls.encrypt(data))
        return len(data)

    def _tls_read(self, fd: int, limit: int) -> bytes:
        """``os.read`` for a TLS connection: at least one plaintext byte (at most
        ``limit``), reading ciphertext as needed; b"" at the end of the stream. A
        record that fails its authentication raises :class:`TlsError` (closed)."""
        tls = self._tls
        assert tls is not None
        try:
            data = tls.read(limit)  # what an earlier read left (rare): b"" at once if none
            # Ask the kernel for the records ``limit`` bytes take, not for TLS_RECV_BYTES:
            # the bytes object is made at its size, not made large and shrunk.
            want = min(TLS_RECV_BYTES, limit + (limit >> 9) + TLS_RECORD_OVERHEAD_BYTES)
            while not data and not tls.peer_closed:
                raw = os_read(fd, want)
                if not raw:
                    return b""
                data = tls.decrypt(raw, limit)
            return data
        except ssl.SSLError as exc:
            failure = client_failure(exc, self.address, self._ca_file(), tls)
            self.close()
            raise failure from None

    def close(self) -> None:
        """Close the socket; the next call reconnects."""
        sock, shaped, tls = self._sock, self._shaped, self._tls
        self._sock, self._shaped, self._conn, self._tls = None, None, None, None
        self._write_fd, self._read_fd = os_write, os_read
        fd, self._fd = self._fd, -1
        with contextlib.suppress(OSError):
            if tls is not None and fd >= 0 and shaped is None:
                goodbye = tls.close()  # close_notify: the node reads a clean end
                if goodbye:
                    os_write(fd, goodbye)
        with contextlib.suppress(OSError):
            if shaped is not None:
                shaped.close()
            elif sock is not None:
                sock.close()

    # --- bytes ---------------------------------------------------------------------

    def _sendall(self, buffers: list[Payload]) -> None:
        sock = self._sock
        assert sock is not None
        tls = self._tls
        try:
            if tls is not None:
                sent = sum(map(len, buffers))
                records = [tls.encrypt(b) for b in buffers]
                if self._shaped is not None:
                    self._shaped.sendall(records)
                else:
                    for record in records:
                        sock.sendall(record)
            elif self._shaped is not None:
                self._shaped.sendall(buffers)  # queued; leaves when the link says
                sent = sum(map(len, buffers))
            elif len(buffers) == 1:
                data = buffers[0]
                sock.sendall(data)
                sent = len(data)
            elif len(buffers[-1]) < SMALL_PAYLOAD_BYTES:
                data = b"".join(buffers)  # one syscall beats saving a small copy
                sock.sendall(data)
                sent = len(data)
            else:
                for buffer in buffers:
                    sock.sendall(buffer)
                sent = sum(map(len, buffers))
        except OSError as exc:
            self._send_failed(exc)
            raise
        self.counters.bytes_sent += sent

    def _send_failed(self, exc: OSError) -> None:
        """Close after a failed send and raise the typed error (never returns)."""
        self.close()
        if isinstance(exc, TimeoutError | BlockingIOError):  # SO_SNDTIMEO expired
            raise RequestTimeoutError(
                f"node {self.address} did not accept data for {self.request_timeout_s:g} s"
            ) from exc
        raise UnreachableError(
            f"lost the connection to node {self.address} while sending ({exc.strerror or exc})"
        ) from exc

    def _receive(self, conn: Connection, deadline: float, timeout_s: float) -> None:
        """One receive into the codec (blocks until some bytes, the end, or the deadline)."""
        sock = self._sock
        assert sock is not None
        if self._tls is not None:
            self._receive_tls(conn, deadline, timeout_s)
            return
        if self._shaped is not None:
            self._recv_shaped(conn, deadline)
            return
        direct = conn.receive_buffer()  # a large payload: receive it in place
        while True:
            try:
                if direct is not None:
                    n = sock.recv_into(direct)
                else:
                    # A fresh bytes object, which the codec keeps without copying; at
                    # most RECV_BYTES, so the heap serves it (no mmap, see net.memory).
                    data = sock.recv(RECV_BYTES)
                    n = len(data)
                break
            except OSError as exc:
                self._recv_failed(exc, deadline, timeout_s)
        if not n:
            if conn.eof_received:
                self.close()
                raise UnreachableError(f"node {self.address} closed the connection")
            conn.receive_data(b"")  # end of stream: the codec says how it ended
            return
        self.counters.bytes_received += n
        if direct is not None:
            conn.received_into(n)
        else:
            conn.receive_data(data)

    def _receive_tls(self, conn: Connection, deadline: float, timeout_s: float) -> None:
        """:meth:`_receive` on a TLS connection: plaintext the channel already holds,
        else ciphertext from the socket (or the emulated link) until some decrypts. A
        large payload is decrypted straight into its buffer."""
        tls = self._tls
        assert tls is not None
        while True:
            direct = conn.receive_buffer()
            try:
                if direct is not None:
                    n = tls.read_into(direct)
                    if n:
                        self.counters.bytes_received += n
                        conn.received_into(n)
                        return
                else:
                    data = tls.read(RECV_BYTES)
                    if data:
                        self.counters.bytes_received += len(data)
                        conn.receive_data(data)
                        return
            except ssl.SSLError as exc:
                failure = client_failure(exc, self.address, self._ca_file(), tls)
                self.close()
                raise failure from None
            if tls.peer_closed:
                conn.receive_data(b"")  # close_notify: the codec says how it ended
                return
            raw: bytes | memoryview
            if self._shaped is not None:
                raw = self._recv_shaped_raw(deadline)
            else:
                # Ciphertext goes into one buffer kept for the connection (TLS copies it
                # on into its own): no fresh bytes object per read of a stream.
                sock = self._sock
                assert sock is not None
                if self._tls_buffer is None:
                    self._tls_buffer = bytearray(TLS_RECV_BYTES)
                try:
                    n = sock.recv_into(self._tls_buffer)
                except OSError as exc:
                    self._recv_failed(exc, deadline, timeout_s)
                    continue
                raw = memoryview(self._tls_buffer)[:n]
            if not raw:
                if conn.eof_received:
                    self.close()
                    raise UnreachableError(f"node {self.address} closed the connection")
                conn.receive_data(b"")
                return
            tls.feed(raw)

    def _recv_failed(self, exc: OSError, deadline: float, timeout_s: float) -> None:
        """A receive raised ``exc``: return if it may be retried (the kernel's receive
        timeout expired before ``deadline``), else close and raise the typed error."""
        if isinstance(exc, BlockingIOError):  # SO_RCVTIMEO expired
            if time.monotonic() < deadline:
                return
            self.close()
            raise RequestTimeoutError(
                f"node {self.address} did not answer within {timeout_s:g} s; "
                "it may be overloaded, or raise the request timeout"
            ) from None
        self.close()
        raise UnreachableError(
            f"lost the connection to node {self.address} ({exc.strerror or exc})"
        ) from exc

    def _recv_shaped(self, conn: Connection, deadline: float) -> None:
        data = self._recv_shaped_raw(deadline)
        self.counters.bytes_received += len(data)
        conn.receive_data(data)  # b"" (end of stream) included: the codec says how it ended

    def _recv_shaped_raw(self, deadline: float) -> bytes:
        """Bytes the emulated link released (b"": the end of the stream)."""
        assert self._shaped is not None
        try:
            data = self._shaped.recv(
                SHAPED_RECV_BYTES, timeout_s=max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            self.close()
            raise RequestTimeoutError(
                f"node {self.address} did not answer in time over the emulated link; "
                "a slow profile may need a longer request timeout"
            ) from None
        except OSError as exc:
            self.close()
            raise UnreachableError(
                f"lost the connection to node {self.address} ({exc.strerror or exc})"
            ) from exc
        return data


def set_kernel_timeout(sock: socket.socket, option: int, seconds: float) -> None:
    """Set ``option`` (SO_SNDTIMEO or SO_RCVTIMEO) of ``sock`` to ``seconds``."""
    whole = int(seconds)
    sock.setsockopt(
        socket.SOL_SOCKET, option, struct.pack("ll", whole, int((seconds - whole) * 1e6))
    )
