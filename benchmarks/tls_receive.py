"""What receiving a TLS stream costs the receiver, by the way Python's :mod:`ssl` is
driven: the question behind "TLS streams at 0.4 of plain" (benchmarks/README.md, "The
wire"). A sender process writes N bytes over TLS 1.3 (``SSLSocket.sendall`` of 1 MiB
pieces); this process receives them into a reused 1 MiB buffer, by turns:

* ``plain``: no TLS, ``socket.recv_into`` (the anchor);
* ``memorybio``: as Shuttle's client does (``net/blocking.py``): ciphertext
  ``recv_into`` a 256 KiB buffer, fed to an :class:`ssl.MemoryBIO`, plaintext taken
  with :meth:`TlsChannel.read_into`;
* ``sslsocket``: :class:`ssl.SSLSocket` ``recv_into`` (OpenSSL reads the socket itself;
  without read-ahead it asks the kernel for each record's header, then its body);
* ``sslsocket_readahead``: the same with OpenSSL's read-ahead on and a 256 KiB read
  buffer, set through ``ctypes`` on the context's ``SSL_CTX`` (Python's :mod:`ssl` has
  no call for it). **An experiment only**: it relies on CPython's private object layout,
  and Shuttle never does it.

    .venv/bin/python benchmarks/tls_receive.py --json benchmarks/results/tls-receive.json

Prints, per mode, the receiver's CPU seconds per GiB and MiB/s (medians over interleaved
rounds, with their spread), and writes them as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from shuttle.net.tls import TlsChannel

PIECE = 1 << 20
RECV = 256 << 10
MODES = ("plain", "memorybio", "sslsocket", "sslsocket_readahead")
#: OpenSSL's SSL_CTRL_SET_READ_AHEAD (ssl.h).
_SSL_CTRL_SET_READ_AHEAD = 41


def _certs(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "c.pem", folder / "k.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"),
            *("-nodes", "-days", "1", "-subj", "/CN=bench", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def _send(port: int, nbytes: int, tls: int, cert: str, key: str) -> None:
    """The sender (a child process): ``nbytes`` in 1 MiB pieces, over TLS if ``tls``."""
    data = memoryview(bytes(range(256)) * (PIECE // 256))
    with socket.create_connection(("127.0.0.1", port)) as raw:
        sock: Any = raw
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_3
            ctx.load_cert_chain(cert, key)
            sock = ctx.wrap_socket(raw, server_side=True)
        sent = 0
        while sent < nbytes:
            n = min(PIECE, nbytes - sent)
            sock.sendall(data[:n])
            sent += n


def _client_context(read_ahead: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # a benchmark of bytes, not of trust
    if read_ahead:
        libssl = ctypes.CDLL("libssl.so.3")
        libssl.SSL_CTX_ctrl.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_long,
            ctypes.c_void_p,
        ]
        libssl.SSL_CTX_set_default_read_buffer_len.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        # CPython's PySSLContext: PyObject_HEAD, then SSL_CTX *ctx (private layout).
        ssl_ctx = ctypes.c_void_p.from_address(id(ctx) + 2 * ctypes.sizeof(ctypes.c_void_p))
        libssl.SSL_CTX_ctrl(ssl_ctx.value, _SSL_CTRL_SET_READ_AHEAD, 1, None)
        libssl.SSL_CTX_set_default_read_buffer_len(ssl_ctx.value, RECV)
    return ctx


def receive(mode: str, nbytes: int, cert: Path, key: Path) -> tuple[float, float]:
    """(wall seconds, receiver CPU seconds) to receive ``nbytes`` in ``mode``."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        tls = int(mode != "plain")
        sender = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--send",
                str(port),
                str(nbytes),
                str(tls),
                str(cert),
                str(key),
            ]
        )
        raw, _ = listener.accept()
    buf = bytearray(PIECE)
    view = memoryview(buf)
    got = 0
    with raw:
        if mode == "memorybio":
            chan = TlsChannel(_client_context(False), server_side=False, server_hostname="x")
            cipher = bytearray(RECV)
            while not chan.handshake():
                raw.sendall(chan.output())
                n = raw.recv_into(cipher)
                chan.feed(memoryview(cipher)[:n])
            raw.sendall(chan.output())
            cpu0, t0 = time.process_time(), time.perf_counter()
            while got < nbytes:
                n = chan.read_into(view)
                if n:
                    got += n
                    continue
                n = raw.recv_into(cipher)
                if not n:
                    break
                chan.feed(memoryview(cipher)[:n])
        elif mode == "plain":
            cpu0, t0 = time.process_time(), time.perf_counter()
            while got < nbytes:
                n = raw.recv_into(buf)
                if not n:
                    break
                got += n
        else:
            ctx = _client_context(mode == "sslsocket_readahead")
            with ctx.wrap_socket(raw, server_hostname="x") as sock:
                cpu0, t0 = time.process_time(), time.perf_counter()
                while got < nbytes:
                    n = sock.recv_into(view)
                    if not n:
                        break
                    got += n
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            sender.wait(30)
            if got != nbytes:
                raise AssertionError(f"{mode}: received {got} of {nbytes}")
            return wall, cpu
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    sender.wait(30)
    if got != nbytes:
        raise AssertionError(f"{mode}: received {got} of {nbytes}")
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", type=int, default=512 << 20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    cert, key = _certs(Path(tempfile.mkdtemp(prefix="shuttle-tls-recv-")))
    gib = args.bytes / (1 << 30)
    runs: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for mode in MODES:
        receive(mode, 64 << 20, cert, key)  # warm up
    for r in range(args.rounds):
        for mode in MODES[r % 4 :] + MODES[: r % 4]:
            runs[mode].append(receive(mode, args.bytes, cert, key))
        print(
            f"round {r + 1}: "
            + "  ".join(f"{m} {runs[m][-1][1] / gib:.2f}" for m in MODES)
            + " CPU s/GiB",
            flush=True,
        )
    out: dict[str, Any] = {"bytes": args.bytes, "rounds": args.rounds}
    print(f"\n{'mode':<20} {'CPU s/GiB':>10} {'(range)':>13} {'MiB/s':>7}")
    for mode in MODES:
        cpu = [c / gib for _, c in runs[mode]]
        wall = statistics.median(w for w, _ in runs[mode])
        out[mode] = {
            "cpu_s_per_gib": statistics.median(cpu),
            "cpu_range": [min(cpu), max(cpu)],
            "mib_per_s": args.bytes / (1 << 20) / wall,
            "runs": runs[mode],
        }
        print(
            f"{mode:<20} {statistics.median(cpu):>10.2f} {min(cpu):>6.2f}-{max(cpu):<6.2f} "
            f"{out[mode]['mib_per_s']:>7.0f}"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--send":
        _send(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    else:
        main()
