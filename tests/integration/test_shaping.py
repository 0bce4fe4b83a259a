"""Emulated shaping over real 127.0.0.1 sockets, against a real server process.

Timing on a shared 2-core machine drifts, so the bounds are generous: the lower
bounds are firm (the shaper never delivers early), the upper ones leave room."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from shuttle.bench.shaping import REQUEST
from shuttle.net.profiles import BUILTIN_PROFILES, LinkProfile
from shuttle.net.shaping import Link, ShapedStream, open_shaped_connection

LAN = BUILTIN_PROFILES["lan"]


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


async def _download(stream: ShapedStream, nbytes: int) -> float:
    start = time.monotonic()
    stream.write(REQUEST.pack(b"D", nbytes))
    assert len(await stream.readexactly(nbytes)) == nbytes
    return time.monotonic() - start


def test_a_download_under_lan_takes_the_closed_form_time(server_port: int) -> None:
    nbytes = 250_000
    expected = 2 * LAN.latency_s + (nbytes - LAN.effective_burst_bytes) * 8 / 10e6  # 0.198 s

    async def main() -> tuple[float, float, Link]:
        link = Link(LAN)
        stream = await open_shaped_connection("127.0.0.1", server_port, link)
        down_s = await _download(stream, nbytes)
        start = time.monotonic()
        stream.write(REQUEST.pack(b"U", nbytes))
        stream.write(b"u" * nbytes)
        await stream.drain()
        assert await stream.readexactly(1) == b"k"
        up_s = time.monotonic() - start
        stream.close()
        await stream.wait_closed()
        return down_s, up_s, link

    down_s, up_s, link = asyncio.run(main())
    assert expected <= down_s <= expected * 1.5 + 0.05
    assert expected <= up_s <= expected * 1.5 + 0.05
    assert link.down.counters.bytes == nbytes + 1
    assert link.up.counters.bytes == nbytes + 2 * REQUEST.size


def test_round_trips_pay_the_latency_but_pipelined_requests_share_it(server_port: int) -> None:
    profile = LinkProfile("rtt", None, 0.005)  # 10 ms round trip, unlimited bandwidth

    async def main() -> tuple[float, float]:
        stream = await open_shaped_connection("127.0.0.1", server_port, Link(profile))
        start = time.monotonic()
        for _ in range(10):
            stream.write(REQUEST.pack(b"P", 0))
            await stream.readexactly(1)
        one_by_one_s = time.monotonic() - start
        start = time.monotonic()
        for _ in range(10):
            stream.write(REQUEST.pack(b"P", 0))
        assert await stream.readexactly(10) == b"p" * 10
        pipelined_s = time.monotonic() - start
        stream.close()
        await stream.wait_closed()
        return one_by_one_s, pipelined_s

    one_by_one_s, pipelined_s = asyncio.run(main())
    assert 0.100 <= one_by_one_s <= 0.35
    # Sharing one round trip, ten requests cost about one (10 ms); paying one each,
    # they would cost as much as one by one. Relative, so a loaded machine slows both.
    assert 0.010 <= pipelined_s < one_by_one_s / 3


def test_connections_over_one_link_share_its_bandwidth(server_port: int) -> None:
    nbytes = 125_000

    async def main() -> float:
        link = Link(LAN)
        streams = [await open_shaped_connection("127.0.0.1", server_port, link) for _ in range(2)]
        start = time.monotonic()
        await asyncio.gather(*(_download(s, nbytes) for s in streams))
        both_s = time.monotonic() - start
        for s in streams:
            s.close()
            await s.wait_closed()
        return both_s

    both_s = asyncio.run(main())
    expected = 2 * LAN.latency_s + (2 * nbytes - LAN.effective_burst_bytes) * 8 / 10e6
    assert expected <= both_s <= expected * 1.5 + 0.05
