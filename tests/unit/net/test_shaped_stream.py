"""ShapedStream over an in-memory pipe, with a fake clock: exact delivery instants."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.net.profiles import BUILTIN_PROFILES, LinkProfile
from shuttle.net.shaping import Link, ShapedStream
from shuttle.testing import FakeClock, memory_stream_pair
from tests.unit.net._aio import async_test

LAN = BUILTIN_PROFILES["lan"]
WAN = BUILTIN_PROFILES["wan"]
BURST = 4096


class Far:
    """The node's end of the pipe: logs (time, total bytes received) as bytes come."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, clock: FakeClock
    ):
        self.reader, self.writer, self.clock = reader, writer, clock
        self.data = bytearray()
        self.log: list[tuple[float, int]] = []
        self.eof_at: float | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while chunk := await self.reader.read(1 << 20):
            self.data += chunk
            self.log.append((self.clock.now(), len(self.data)))
        self.eof_at = self.clock.now()

    def time_of_byte(self, offset: int) -> float:
        """When the byte at ``offset`` (1-based count) had arrived."""
        return next(t for t, total in self.log if total >= offset)


async def _setup(profile: LinkProfile) -> tuple[FakeClock, Link, ShapedStream, Far]:
    clock = FakeClock()
    (cr, cw), (sr, sw) = await memory_stream_pair()
    link = Link(profile, clock)
    return clock, link, link.wrap(cr, cw), Far(sr, sw, clock)


@async_test
async def test_a_request_reaches_the_node_at_the_closed_form_instant() -> None:
    clock, link, stream, far = await _setup(LAN)
    n = 100_000
    stream.write(b"x" * n)
    due = (n - BURST) * 8 / 10e6 + 0.5e-3
    await clock.advance_to(due - 1e-4)
    assert len(far.data) < n  # the tail is still on the wire
    assert far.data  # but the head has arrived (delivery is progressive)
    await clock.advance_to(due + 1e-9)  # (summing per-piece times rounds in the last bit)
    assert len(far.data) == n
    assert far.time_of_byte(n) == pytest.approx(due)
    assert far.time_of_byte(1) == pytest.approx(0.5e-3)  # the burst: latency only
    stream.close()
    await clock.advance(1.0)
    await stream.wait_closed()
    assert far.eof_at == pytest.approx(due + 0.5e-3)  # closed at `due`, one latency away
    assert link.up.counters.bytes == n


@async_test
async def test_a_response_reaches_the_application_at_the_closed_form_instant() -> None:
    clock, link, stream, far = await _setup(WAN)
    n = 50_000
    payload = bytes(range(256)) * (n // 256) + b"!" * (n % 256)
    far.writer.write(payload)
    done_at: list[float] = []

    async def reader() -> bytes:
        header = await stream.readexactly(4)
        done_at.append(clock.now())
        rest = await stream.readexactly(n - 4)
        done_at.append(clock.now())
        return header + rest

    task = asyncio.create_task(reader())
    await clock.advance(5.0)
    data = await task
    assert data == payload
    assert done_at[0] == pytest.approx(20e-3)  # the header is inside the burst
    assert done_at[1] == pytest.approx((n - BURST) * 8 / 1e6 + 20e-3)
    assert link.down.counters.bytes == n
    stream.close()
    await clock.advance(1.0)
    await stream.wait_closed()


@async_test
async def test_latency_pipelines_requests_in_flight() -> None:
    """Ten 100-byte requests sent at once and echoed back: one round trip, not ten."""
    clock, _, stream, far = await _setup(WAN)
    for i in range(10):
        stream.write(bytes([i]) * 100)

    async def echo() -> None:
        for _ in range(10):
            far.writer.write(await far.reader.readexactly(100))

    far.task.cancel()  # this test reads the far end itself
    echo_task = asyncio.create_task(echo())
    got: list[tuple[float, bytes]] = []

    async def client() -> None:
        for _ in range(10):
            got.append((clock.now(), await stream.readexactly(100)))
            got[-1] = (clock.now(), got[-1][1])

    task = asyncio.create_task(client())
    await clock.advance(1.0)
    await task
    await echo_task
    assert [b for _, b in got] == [bytes([i]) * 100 for i in range(10)]
    # 1000 bytes fit the burst both ways: two one-way latencies in all.
    assert got[-1][0] == pytest.approx(40e-3)
    stream.close()
    await clock.advance(1.0)
    await stream.wait_closed()


@async_test
async def test_streams_on_one_link_share_its_bandwidth() -> None:
    clock = FakeClock()
    link = Link(LAN, clock)
    (c1, w1), (s1, sw1) = await memory_stream_pair()
    (c2, w2), (s2, sw2) = await memory_stream_pair()
    a, b = link.wrap(c1, w1), link.wrap(c2, w2)
    far_a, far_b = Far(s1, sw1, clock), Far(s2, sw2, clock)
    a.write(b"a" * 50_000)
    b.write(b"b" * 50_000)
    await clock.advance(1.0)
    assert far_a.time_of_byte(50_000) == pytest.approx((50_000 - BURST) * 8 / 10e6 + 0.5e-3)
    assert far_b.time_of_byte(50_000) == pytest.approx((100_000 - BURST) * 8 / 10e6 + 0.5e-3)
    for s in (a, b):
        s.close()
    await clock.advance(1.0)
    for s in (a, b):
        await s.wait_closed()


@async_test
async def test_end_of_stream_arrives_after_the_data() -> None:
    clock, _, stream, far = await _setup(WAN)
    far.writer.write(b"hello")
    far.writer.close()
    await clock.advance(0.0199)
    assert not stream.at_eof()
    await clock.advance(0.0001)
    assert await stream.read(100) == b"hello"
    assert await stream.read(100) == b""
    assert stream.at_eof()
    stream.close()
    await clock.advance(1.0)
    await stream.wait_closed()


@async_test
async def test_readexactly_past_the_end_gives_the_partial_bytes() -> None:
    clock, _, stream, far = await _setup(LAN)
    far.writer.write(b"abc")
    far.writer.close()
    task = asyncio.create_task(stream.readexactly(10))
    await clock.advance(1.0)
    with pytest.raises(asyncio.IncompleteReadError) as info:
        await task
    assert info.value.partial == b"abc"
    stream.close()
    await clock.advance(1.0)
    await stream.wait_closed()


@async_test
async def test_a_reset_connection_surfaces_after_the_bytes_before_it() -> None:
    clock, _, stream, far = await _setup(LAN)
    far.writer.write(b"abc")
    far.writer.transport.abort()
    task = asyncio.create_task(stream.readexactly(3))
    await clock.advance(1.0)
    assert await task == b"abc"
    with pytest.raises(ConnectionResetError):
        await stream.read(1)
    stream.abort()
    await stream.wait_closed()


@async_test
async def test_writes_after_close_are_refused() -> None:
    clock, _, stream, _ = await _setup(LAN)
    stream.close()
    with pytest.raises(ConnectionResetError, match="closed"):
        stream.write(b"late")
    await clock.advance(1.0)
    await stream.wait_closed()


@async_test
async def test_drain_waits_for_the_send_buffer() -> None:
    clock, _, stream, far = await _setup(LAN)
    stream.write(b"z" * (3 << 20))  # 3 MiB: about 2.5 s at 10 Mbit/s
    drained = asyncio.create_task(stream.drain())
    await clock.advance(1.0)
    assert not drained.done()
    # Down to 1 MiB pending once 2 MiB have arrived.
    await clock.advance_to(((2 << 20) - BURST) * 8 / 10e6 + 0.5e-3 + 0.002)
    assert drained.done()
    await drained
    stream.close()
    await clock.advance(5.0)
    await stream.wait_closed()
    assert len(far.data) == 3 << 20


@async_test
async def test_loopback_passes_straight_through() -> None:
    clock, _, stream, far = await _setup(BUILTIN_PROFILES["loopback"])
    stream.write(b"now")
    await stream.drain()
    await clock.settle()
    assert far.data == b"now"
    assert clock.sleepers == 0
    stream.close()
    await stream.wait_closed()


@settings(max_examples=30, deadline=None)
@given(
    profile=st.sampled_from([LAN, WAN, BUILTIN_PROFILES["san"], LinkProfile("l", None, 0.003)]),
    writes=st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=0.05, allow_nan=False),
            st.integers(min_value=1, max_value=40_000),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_every_write_arrives_whole_in_order_at_its_shaper_instant(
    profile: LinkProfile, writes: list[tuple[float, int]]
) -> None:
    async def main() -> None:
        clock, _, stream, far = await _setup(profile)
        reference = Link(profile, FakeClock())
        ref_clock = reference.clock
        assert isinstance(ref_clock, FakeClock)
        expected = bytearray()
        due: list[tuple[int, float]] = []
        for i, (gap_s, n) in enumerate(writes):
            await clock.advance(gap_s)
            ref_clock.jump_to(clock.now())
            payload = bytes([i % 251]) * n
            stream.write(payload)
            expected += payload
            due.append((len(expected), reference.up.transmit(n)))
        await clock.advance(10.0)
        assert far.data == expected
        for offset, t in due:
            assert far.time_of_byte(offset) == pytest.approx(t, abs=1e-9)
        stream.close()
        await clock.advance(1.0)
        await stream.wait_closed()

    asyncio.run(main())
