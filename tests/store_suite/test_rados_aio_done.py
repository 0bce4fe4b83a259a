"""How librados hands a finished asynchronous read back to the event loop
(:class:`shuttle.store.rados_aio.AioClient`): the C completions (``_aiodone.c``: a
callback that never takes the GIL, a FIFO list and an eventfd the loop drains) against
the reference, a Python callback through ``ctypes``, on the same reads of a real Ceph.

What a broken completion would do and what catches it here: a lost wake-up (reads
finished while the loop was busy, never answered: every wait is bounded); reads
answered out of the order librados finished them, or with another read's bytes; an
error code from librados not reaching the caller; a read answered twice or never,
also when ``drain()`` cannot allocate (every allocation it makes failed in turn)."""

from __future__ import annotations

import asyncio
import errno
import math
import os
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import TYPE_CHECKING

import pytest

from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import connect
from shuttle.errors import ConfigError
from shuttle.store.rados_aio import COMPLETIONS, AioClient, native_completions
from shuttle.store.rados_conn import CephOptions

if TYPE_CHECKING:
    from shuttle.store._aiodone import Completions

#: Each object's bytes: 64 pages, page ``i`` filled with the byte ``i`` (xor a salt), so
#: a read answered with another read's bytes shows it.
PAGE = 4096
PAGES = 64
#: Bounded waits, generous for a loaded 2-core machine: an answer that never comes
#: (a lost wake-up) fails the test instead of hanging it.
ANSWER_S = 60.0


def _object(salt: int) -> bytes:
    return b"".join(bytes([(i ^ salt) & 0xFF]) * PAGE for i in range(PAGES))


@pytest.fixture(scope="module")
def namespace(ceph: LocalCeph) -> Iterator[tuple[str, bytes, int]]:
    """A fresh namespace holding object ``o`` (version returned) of :func:`_object`."""
    info = ceph.info()
    ns = f"d{secrets.token_hex(6)}"
    cluster = connect(info.conf_path, info.keyring_path, op_timeout_s=20)
    io = cluster.open_ioctx(info.pool)
    io.set_namespace(ns)
    data = _object(0x5A)
    io.write_full("o", data)
    version = io.get_last_version()
    try:
        yield ns, data, version
    finally:
        io.remove_object("o")
        io.close()
        cluster.shutdown()


@pytest.fixture(params=COMPLETIONS)
def client(
    request: pytest.FixtureRequest, ceph: LocalCeph, namespace: tuple[str, bytes, int]
) -> Iterator[AioClient]:
    completion = str(request.param)
    if completion == "c" and native_completions() is None:
        pytest.skip("the C completions need the compiled modules (scripts/setup.sh)")
    info = ceph.info()
    opts = CephOptions(info.conf_path, info.keyring_path, op_timeout_s=20)
    c = AioClient(info.pool, namespace[0], opts, completion=completion)
    assert c.completion == completion
    try:
        yield c
    finally:
        c.close()


Answer = tuple[int, int, bytes, int]  # rv, version, data, the callback's monotonic ns


def _start(
    c: AioClient, key: str, offset: int, length: int, log: list[int], tag: int
) -> asyncio.Future[Answer]:
    """Start a read; its future gets (rv, version, data, callback_ns); ``log`` gets
    ``tag`` in the order the reads are answered."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Answer] = loop.create_future()

    def done(rv: int, version: int, data: bytes) -> None:
        log.append(tag)
        assert not fut.done(), f"read {tag} answered twice"
        fut.set_result((rv, version, data, c.callback_ns))

    assert c.read(key, offset, length, done, loop), "the read was not started"
    return fut


def test_both_ways_answer_the_same_reads_with_the_same_bytes_and_version(
    client: AioClient, namespace: tuple[str, bytes, int]
) -> None:
    _ns, data, version = namespace
    cases = [(0, PAGE), (PAGE * 3 + 100, 5000), (PAGE * (PAGES - 1), PAGE * 2), (17, 1)]

    async def go() -> list[Answer]:
        log: list[int] = []
        out = []
        for i, (off, n) in enumerate(cases):
            out.append(await asyncio.wait_for(_start(client, "o", off, n, log, i), ANSWER_S))
        return out

    errors = client.errors
    for (off, n), (rv, v, got, _cb) in zip(cases, asyncio.run(go()), strict=True):
        assert got == data[off : off + n]  # the last one is short: the object's end
        assert rv == len(got) and v == version
    assert client.errors == errors
    assert client.in_flight() == 0


def test_many_reads_in_flight_each_get_their_own_bytes(
    client: AioClient, namespace: tuple[str, bytes, int]
) -> None:
    """64 reads at once, several rounds: every one answered once, with its own page
    (a completion matched to the wrong read, or lost, fails here)."""
    _ns, data, _v = namespace

    async def go() -> None:
        for _round in range(5):
            log: list[int] = []
            order = list(range(PAGES))
            futs = [_start(client, "o", i * PAGE, PAGE, log, i) for i in order]
            answers = await asyncio.wait_for(asyncio.gather(*futs), ANSWER_S)
            for i, (rv, _version, got, _cb) in enumerate(answers):
                assert rv == PAGE and got == data[i * PAGE : (i + 1) * PAGE], f"page {i}"
            assert sorted(log) == order

    asyncio.run(go())
    assert client.in_flight() == 0


def test_reads_finished_while_the_loop_is_busy_wake_it_and_come_in_finishing_order(
    client: AioClient, namespace: tuple[str, bytes, int]
) -> None:
    """The loop's thread blocks until librados has called back for all 32 reads (no
    loop turn in between), then returns to the loop: it must be woken for them (one
    batch on the C path) and answer them in the order librados finished them."""
    _ns, data, _v = namespace

    async def go() -> None:
        for _round in range(3):
            log: list[int] = []
            futs = [_start(client, "o", i * PAGE, PAGE, log, i) for i in range(32)]
            assert client.wait_idle(ANSWER_S), "librados did not call back"
            assert log == []  # nothing answered before the loop turns
            answers = await asyncio.wait_for(asyncio.gather(*futs), ANSWER_S)
            finished = [answers[tag][3] for tag in log]
            assert finished == sorted(finished), "answered out of librados's order"
            assert all(a[2] == data[i * PAGE : (i + 1) * PAGE] for i, a in enumerate(answers))

    asyncio.run(go())


def test_waiting_without_a_bound_waits_for_librados(
    client: AioClient, namespace: tuple[str, bytes, int]
) -> None:
    """``wait_idle(math.inf)``, or a timeout longer than a deadline can hold, waits
    until librados has called back for every read. Before, the C path turned the
    timeout into a ``time_t`` (undefined beyond its range; on x86-64 a deadline in
    1970) and said "not idle" at once with the reads still in librados, and the
    ctypes path raised OverflowError; a negative or NaN timeout is refused alike."""
    _ns, data, _v = namespace

    async def go() -> list[Answer]:
        for timeout_s in (math.inf, 1e300):
            log: list[int] = []
            futs = [_start(client, "o", i * PAGE, PAGE, log, i) for i in range(8)]
            assert client.wait_idle(timeout_s), f"wait_idle({timeout_s}) did not wait"
            assert log == []  # librados called back; the loop has not turned yet
            answers = await asyncio.wait_for(asyncio.gather(*futs), ANSWER_S)
        return answers

    for i, (rv, _version, got, _cb) in enumerate(asyncio.run(go())):
        assert rv == PAGE and got == data[i * PAGE : (i + 1) * PAGE]
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError, match="timeout_s must be >= 0"):
            client.wait_idle(bad)


def test_an_error_from_librados_reaches_the_caller(
    client: AioClient, namespace: tuple[str, bytes, int]
) -> None:
    async def go() -> tuple[Answer, Answer]:
        log: list[int] = []
        missing = _start(client, "no-such-object", 0, PAGE, log, 0)
        good = _start(client, "o", PAGE, PAGE, log, 1)  # the batch goes on after it
        return await asyncio.wait_for(asyncio.gather(missing, good), ANSWER_S)

    errors = client.errors
    (rv, _version, got, _cb), (rv2, _v2, got2, _cb2) = asyncio.run(go())
    assert rv == -errno.ENOENT and got == b""
    assert rv2 == PAGE and got2 == namespace[1][PAGE : 2 * PAGE]
    assert client.errors == errors + 1
    assert client.in_flight() == 0


def test_a_done_that_raises_is_reported_and_the_batch_goes_on(
    client: AioClient, namespace: tuple[str, bytes, int]
) -> None:
    reported: list[BaseException] = []

    async def go() -> Answer:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _l, ctx: reported.append(ctx["exception"]))

        def boom(rv: int, version: int, data: bytes) -> None:
            raise RuntimeError("a bug in done")

        assert client.read("o", 0, PAGE, boom, loop)
        fut = _start(client, "o", PAGE, PAGE, [], 1)
        return await asyncio.wait_for(fut, ANSWER_S)

    rv, _v, got, _cb = asyncio.run(go())
    assert rv == PAGE and got == namespace[1][PAGE : 2 * PAGE]
    assert [str(e) for e in reported] == ["a bug in done"]


def test_a_closed_client_starts_nothing(client: AioClient) -> None:
    client.close()

    async def go() -> bool:
        return client.read("o", 0, 10, lambda rv, v, d: None, asyncio.get_running_loop())

    assert not asyncio.run(go())
    client.close()  # idempotent


def test_an_unknown_completion_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"unknown completion 'fast'.*use one of c, ctypes"):
        AioClient("pool", "", CephOptions(), completion="fast")


def test_the_c_completions_refuse_a_null_function() -> None:
    native = native_completions()
    if native is None:
        pytest.skip("the C completions need the compiled modules (scripts/setup.sh)")
    with pytest.raises(ValueError, match="the address of aio_read is 0"):
        native(1, 0, 1, 1, 1)


def test_asking_for_the_c_completions_without_the_compiled_modules_says_what_to_do() -> None:
    """``SHUTTLE_PURE=1`` (or no build): the ctypes path is the default, and asking for
    the C one is refused with the reason and the way out."""
    code = (
        "from shuttle.store.rados_aio import AioClient, native_completions\n"
        "from shuttle.store.rados_conn import CephOptions\n"
        "from shuttle.errors import ConfigError\n"
        "assert native_completions() is None\n"
        "try:\n"
        "    AioClient('pool', '', CephOptions(), completion='c')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    env = {**os.environ, "SHUTTLE_PURE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "need Shuttle's compiled modules" in out
    assert "SHUTTLE_PURE is set" in out
    assert "run scripts/setup.sh, or use completion='ctypes'" in out


def _testcapi() -> ModuleType:
    """CPython's own test module, whose ``set_nomemory(start, stop)`` fails the
    allocations after the ``start``-th up to the ``stop``-th (0: all) through every
    allocator, until ``remove_mem_hooks()``."""
    try:
        import _testcapi
    except ImportError:
        pytest.skip("this Python has no _testcapi (its test modules were not installed)")
    if not hasattr(_testcapi, "set_nomemory"):
        pytest.skip("this Python's _testcapi cannot fail allocations (set_nomemory)")
    return _testcapi


#: (offset, length) of the reads of one batch: whole pages, and one short read at the
#: object's end (its buffer is shrunk to the bytes read: an allocation that can fail).
OOM_READS = [(0, PAGE), (PAGE * 5, PAGE), ((PAGES - 1) * PAGE, PAGE * 2), (PAGE * 9, 700)]
#: More allocations than a drain of OOM_READS makes (a list, then four per read): the
#: sweep below reaches one that makes none fail.
OOM_ALLOCATIONS_MAX = 40

Drained = tuple[int, int, int, bytes, int]  # the tag, rv, version, data, done_ns


def _drain_failing(ring: Completions, capi: ModuleType, start: int, stop: int) -> list[Drained]:
    """``ring.drain()`` with the allocations after the ``start``-th up to the ``stop``-th
    failing (0: all of them); [] if it raised MemoryError. The failures hit every
    thread's allocations: no other thread may run meanwhile (pytest-xdist's own would
    die of them), so the GIL is not handed over in between: drain() never lets go of
    it, and the switch interval is longer than the test (a thread already waiting for
    the GIL with the old one is let run first)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(ANSWER_S)
    time.sleep(0)
    capi.set_nomemory(start, stop)
    try:
        got = ring.drain()
    except MemoryError:
        got = []
    finally:
        capi.remove_mem_hooks()
        sys.setswitchinterval(interval)
    return got


def test_a_drain_that_cannot_allocate_loses_no_read(
    client: AioClient, namespace: tuple[str, bytes, int]
) -> None:
    """Each allocation ``drain()`` makes fails in turn (that one alone, then it and all
    after it): every read of the batch still comes back exactly once, in the order
    librados finished them, each with its own bytes (or, a short read whose buffer
    could not be shrunk, with -ENOMEM: an error its caller reports, not a read that
    never ends), and whenever a read is left in the ring the eventfd is readable, so
    the loop comes back for it. Before, such a drain dropped its whole batch: a RADOS
    miss among them held its key's lock for good and its client waited."""
    if client.completion != "c":
        pytest.skip("the C completions' drain(); the ctypes path has none")
    capi = _testcapi()
    _ns, data, version = namespace
    ring = client._ring  # the C completions under test
    assert ring is not None
    failed = partial = enomem = 0
    for start in range(OOM_ALLOCATIONS_MAX):
        for stop in (start + 1, 0):  # that allocation alone; it and every one after
            for tag, (off, n) in enumerate(OOM_READS):
                assert ring.read(client._io_address, b"o", off, n, tag) == 0
            assert ring.wait_idle(ANSWER_S), "librados did not call back"
            got = _drain_failing(ring, capi, start, stop)
            if len(got) < len(OOM_READS):
                failed += 1
                partial += bool(got)
                readable, _, _ = select.select([ring.fileno()], [], [], 0)
                assert readable, f"reads left in the ring without a wake-up ({start}, {stop})"
            for _ in range(len(OOM_READS)):  # the loop's next turns
                if len(got) == len(OOM_READS):
                    break
                got += ring.drain()
            assert sorted(tag for tag, *_ in got) == list(range(len(OOM_READS))), (start, stop)
            stamps = [done_ns for *_, done_ns in got]
            assert stamps == sorted(stamps), "answered out of librados's order"
            for tag, rv, v, got_data, _done_ns in got:
                off, n = OOM_READS[tag]
                want = data[off : off + n]
                if rv == -errno.ENOMEM:  # only a short read's shrink may fail
                    assert len(want) < n and got_data == b"", (start, stop, tag)
                    enomem += 1
                    continue
                assert (rv, v, got_data) == (len(want), version, want), (start, stop, tag)
            assert ring.in_flight() == 0
    assert failed > 0 and partial > 0 and enomem > 0  # every way out was taken
    assert ring.drain() == []
