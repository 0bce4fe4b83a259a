"""ShapedSocket (the blocking client's shaping) over real 127.0.0.1 sockets, against
a real server process. Lower bounds are firm (nothing arrives early); upper bounds
leave room for a shared 2-core machine."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from shuttle.bench.shaping import REQUEST
from shuttle.net.profiles import BUILTIN_PROFILES, LinkProfile
from shuttle.net.shaped_socket import ShapedSocket
from shuttle.net.shaping import Link

LAN = BUILTIN_PROFILES["lan"]
RTT_10MS = LinkProfile("rtt", None, 0.005)


@pytest.fixture(scope="module")
def server_port() -> Iterator[int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "shuttle.bench.shaping", "server", "--host", "127.0.0.1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    word, port = process.stdout.readline().split()
    assert word == "ready"
    yield int(port)
    process.terminate()
    process.wait(timeout=10)


def _connect(port: int, profile: LinkProfile) -> ShapedSocket:
    return ShapedSocket(socket.create_connection(("127.0.0.1", port)), Link(profile))


def _read_exactly(s: ShapedSocket, n: int) -> bytes:
    parts = []
    while n:
        data = s.recv(n, timeout_s=10)
        assert data, "unexpected end of stream"
        parts.append(data)
        n -= len(data)
    return b"".join(parts)


def test_round_trips_pay_the_latency_but_pipelined_requests_share_it(server_port: int) -> None:
    s = _connect(server_port, RTT_10MS)
    start = time.monotonic()
    for _ in range(10):
        s.sendall(REQUEST.pack(b"P", 0))
        assert _read_exactly(s, 1) == b"p"
    one_by_one_s = time.monotonic() - start
    start = time.monotonic()
    s.sendall([REQUEST.pack(b"P", 0) for _ in range(10)])
    assert _read_exactly(s, 10) == b"p" * 10
    pipelined_s = time.monotonic() - start
    s.close()
    assert 0.100 <= one_by_one_s <= 0.35
    # Sharing one round trip, ten requests cost about one (10 ms); paying one each,
    # they would cost as much as one by one. Relative, so a loaded machine slows both.
    assert 0.010 <= pipelined_s < one_by_one_s / 3


def test_a_download_and_an_upload_under_lan_take_the_closed_form_time(server_port: int) -> None:
    nbytes = 250_000
    expected = 2 * LAN.latency_s + (nbytes - LAN.effective_burst_bytes) * 8 / 10e6  # 0.198 s
    link = Link(LAN)
    s = ShapedSocket(socket.create_connection(("127.0.0.1", server_port)), link)
    start = time.monotonic()
    s.sendall(REQUEST.pack(b"D", nbytes))
    assert len(_read_exactly(s, nbytes)) == nbytes
    down_s = time.monotonic() - start
    start = time.monotonic()
    s.sendall([REQUEST.pack(b"U", nbytes), b"u" * nbytes])
    assert s.pending_send_bytes > 0  # queued, not yet due at the node
    assert _read_exactly(s, 1) == b"k"
    up_s = time.monotonic() - start
    s.close()
    assert expected <= down_s <= expected * 1.5 + 0.05
    assert expected <= up_s <= expected * 1.5 + 0.05
    assert link.down.counters.bytes == nbytes + 1


def test_a_late_reader_gets_bytes_timed_from_their_kernel_arrival(server_port: int) -> None:
    """The answer reaches the socket right after the request reaches the node (100 ms
    one way), so it is due back 100 ms later. Read 300 ms after that, it must count as
    handed to the link back then and come at once, not a further 100 ms after the read.
    Both bounds are firm: the shaper cannot be early, and the mistake costs 100 ms."""
    latency_s = 0.100
    s = _connect(server_port, LinkProfile("slow", None, latency_s))
    start = time.monotonic()
    s.sendall(REQUEST.pack(b"P", 0))
    s.flush()  # the request is written at 100 ms
    assert time.monotonic() - start >= latency_s
    time.sleep(0.3)
    read_at = time.monotonic()
    assert s.recv(1, timeout_s=5) == b"p"
    read_s = time.monotonic() - read_at
    s.close()
    assert read_s < latency_s


def test_end_of_stream_and_timeouts(server_port: int) -> None:
    s = _connect(server_port, RTT_10MS)
    with pytest.raises(TimeoutError):
        s.recv(1, timeout_s=0.05)
    start = time.monotonic()
    s.sendall(REQUEST.pack(b"X", 0))  # an unknown op: the server hangs up
    assert s.recv(1, timeout_s=5) == b""
    assert time.monotonic() - start >= 0.010  # the hang-up crossed the link both ways
    s.close()
    with pytest.raises(OSError, match="closed"):
        s.sendall(b"late")
