"""The asyncio client against a real node, and its parity with the sync client.

The parity tests run the same scenario, line for line, against :class:`Client` and
:class:`AsyncClient` (driven from a loop thread so the scenario code is identical):
conditional writes, the cache after validation, retry when the node's connection
drops with a request in flight, and the limits with identical messages. One node
process serves the whole module.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from shuttle.client.aio import AsyncClient
from shuttle.client.calls import REQUEST_PAYLOAD_BYTES_MAX, SINGLE_PUT_BYTES_MAX
from shuttle.client.client import Client
from shuttle.client.model import NodeAddress
from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    StaleDataError,
    UnknownOperationError,
    UnreachableError,
    VersionMismatchError,
)
from shuttle.net.profiles import parse_link_profile
from tests.integration.nodeproc import NodeProcess

WAIT_S = 30.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One real storage node for the module (tests that restart it keep its port)."""
    proc = NodeProcess(tmp_path_factory.mktemp("aio") / "node").start()
    yield proc
    assert proc.terminate() in (0, None, -9), proc.log.read_text()[-3000:]


def _address(port: int) -> list[NodeAddress]:
    return [NodeAddress("n", "127.0.0.1", port)]


# --- the asyncio client on its own ------------------------------------------------------


def test_async_round_trips_and_concurrency(node: NodeProcess) -> None:
    async def main() -> None:
        async with AsyncClient(_address(node.port)) as client:
            await asyncio.gather(*(client.put(f"a/{i}", f"v{i}".encode()) for i in range(50)))
            got = await asyncio.gather(*(client.get(f"a/{i}") for i in range(50)))
            assert got == [f"v{i}".encode() for i in range(50)]
            assert await client.list("a/") == sorted(f"a/{i}" for i in range(50))
            conn = client.connection(client.nodes[0])
            assert conn.requests >= 150  # all over one connection
            assert conn.counters.connects == 1
            big = os.urandom(5 << 20)
            info = await client.put("big", big)  # an upload session, pieces in flight
            assert info.size == len(big) and await client.get("big") == big
            assert await client.read("big", 1_000_000, 10) == big[1_000_000:1_000_010]
            w = await client.write("big", 0, b"XY")
            assert w.version > info.version
            await client.remove("a/0")
            with pytest.raises(NotFoundError):
                await client.stat("a/0")
            with pytest.raises(UnknownOperationError):
                await client.call(client.nodes[0], "nope")

    asyncio.run(main())


def test_async_client_over_an_emulated_link(node: NodeProcess) -> None:
    async def main() -> float:
        lan = parse_link_profile("lan")  # 10 Mb/s, 0.5 ms
        async with AsyncClient([NodeAddress("n", "127.0.0.1", node.port, lan)]) as client:
            await client.put("x", b"q" * 125_000)  # 1 Mbit
            loop = asyncio.get_running_loop()
            start = loop.time()
            assert await client.get("x") == b"q" * 125_000
            return loop.time() - start

    elapsed = asyncio.run(main())
    # 1 Mbit at 10 Mb/s, less the token bucket's burst, plus the one-way latency.
    assert elapsed >= parse_link_profile("lan").transfer_time_s(125_000)


def test_async_client_survives_a_node_restart(node: NodeProcess) -> None:
    """The restart happens while the loop is blocked, so the client still holds the old
    connection when it calls: the read fails on it and is retried on a fresh one."""

    async def main() -> None:
        async with AsyncClient(_address(node.port)) as client:
            await client.put("k", b"v")
            node.terminate()
            node.start()
            assert await client.get("k") == b"v"
            assert client.connection(client.nodes[0]).counters.connects == 2

    asyncio.run(main())


def test_validation_modes_the_async_client_lacks_are_refused_clearly(node: NodeProcess) -> None:
    with pytest.raises(InvalidArgumentError, match="'callback' is not available on AsyncClient"):
        AsyncClient(_address(node.port), validation="callback")
    with pytest.raises(InvalidArgumentError, match="no validation mode 'nope'; choose one of"):
        AsyncClient(_address(node.port), validation="nope")


# --- one scenario, both clients -------------------------------------------------------


class _Blocking:
    """An :class:`AsyncClient` behind blocking methods, run on a loop thread, so a
    scenario's code is the same for both clients."""

    def __init__(self, make: Callable[[], AsyncClient]) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def build() -> AsyncClient:
            return make()

        self.client = self.run(build())

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if inspect.iscoroutinefunction(attr):
            return lambda *a, **k: self.run(attr(*a, **k))
        return attr

    def open_and_read(self, key: str, validation: str | None) -> tuple[bytes, bool]:
        async def go() -> tuple[bytes, bool]:
            async with await self.client.open(key, validation=validation) as f:
                return await f.read(), f.cache_was_valid

        result: tuple[bytes, bool] = self.run(go())
        return result

    def close(self) -> None:
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)
        self.loop.close()


def _open_and_read(api: Any, key: str, validation: str | None = None) -> tuple[bytes, bool]:
    """Open ``key``, read it all, close (which confirms a speculative open)."""
    if isinstance(api, _Blocking):
        return api.open_and_read(key, validation)
    with api.open(key, validation=validation) as f:
        return f.read(), f.cache_was_valid


def _make(kind: str, port: int, **kwargs: Any) -> Any:
    if kind == "sync":
        return Client(_address(port), **kwargs)
    return _Blocking(lambda: AsyncClient(_address(port), **kwargs))


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def api(kind: str, node: NodeProcess) -> Iterator[Any]:
    client = _make(kind, node.port)
    yield client
    client.close()


def test_conditional_writes_refuse_a_stale_version(api: Any, kind: str) -> None:
    key = f"cond/{kind}"
    v1 = api.put(key, b"one").version
    v2 = api.write(key, 3, b"+", expected_version=v1).version
    assert v2 > v1
    for attempt in (
        lambda: api.write(key, 0, b"X", expected_version=v1),
        lambda: api.truncate(key, 0, expected_version=v1),
        lambda: api.put(key, b"new", expected_version=v1),
        lambda: api.put(key, os.urandom(SINGLE_PUT_BYTES_MAX + 1), expected_version=v1),
        lambda: api.remove(key, expected_version=v1),
    ):
        with pytest.raises(VersionMismatchError):
            attempt()
    assert api.get(key) == b"one+" and api.stat(key).version == v2
    assert api.put(key, b"two", expected_version=v2).version > v2
    v3 = api.stat(key).version
    assert api.truncate(key, 1, expected_version=v3).size == 1
    api.remove(key, expected_version=api.stat(key).version)
    assert not api.exists(key)


def test_cache_is_used_after_a_validated_open(api: Any, kind: str, node: NodeProcess) -> None:
    key = f"cache/{kind}"
    data = os.urandom(300_000)  # five 64 KiB blocks
    api.put(key, data)
    assert _open_and_read(api, key) == (data, False)
    before = api.counters()
    assert _open_and_read(api, key) == (data, True)
    after = api.counters()
    assert after["requests"] - before["requests"] == 1  # the check's stat, no reads
    assert after["cache_hits"] - before["cache_hits"] == 5
    assert after["cache"]["validations_valid"] == before["cache"]["validations_valid"] + 1
    with Client(_address(node.port)) as other:  # another writer changes the object
        other.write(key, 0, b"NEW")
    assert _open_and_read(api, key) == (b"NEW" + data[3:], False)


def test_speculative_open_uses_the_copy_and_close_says_if_it_was_stale(
    api: Any, kind: str, node: NodeProcess
) -> None:
    key = f"spec/{kind}"
    api.put(key, b"old")
    assert _open_and_read(api, key, "speculative") == (b"old", False)  # no copy: checks first
    before = api.counters()["requests"]
    assert _open_and_read(api, key, "speculative") == (b"old", True)  # the copy, confirmed
    assert api.counters()["requests"] == before + 1  # the check only
    with Client(_address(node.port)) as other:
        other.put(key, b"new")
    with pytest.raises(StaleDataError, match="opened on the cached copy at version"):
        _open_and_read(api, key, "speculative")  # read the old copy; closing says stale
    assert _open_and_read(api, key, "speculative") == (b"new", False)  # checks first again


class _Proxy:
    """A TCP relay between the clients and the node that can hold the node's answers
    and then cut every connection: a request in flight when its connection drops."""

    def __init__(self, port: int) -> None:
        self.upstream = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.holding = False
        self.held = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            with self._lock:
                self._socks += [down, up]
            threading.Thread(target=self._pump, args=(down, up, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(1 << 16):
                if answers and self.holding:
                    self.held.set()  # swallowed: the client never sees this answer
                    continue
                dst.sendall(data)
        except OSError:
            pass

    def hold(self) -> None:
        self.held.clear()
        self.holding = True

    def cut(self) -> None:
        """Drop every connection (no GOODBYE reaches the client), stop holding."""
        with self._lock:
            socks, self._socks = self._socks, []
            self.holding = False
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def _in_flight_then_cut(proxy: _Proxy, call: Callable[[], Any]) -> Any:
    """Run ``call`` while the proxy holds the node's answer, cut the connection once the
    node has answered (so the request ran), and return ``call``'s outcome. ``call`` runs
    on this thread: the sync client's connections are per thread."""
    proxy.hold()

    def cutter() -> None:
        if proxy.held.wait(WAIT_S):
            proxy.cut()

    thread = threading.Thread(target=cutter)
    thread.start()
    try:
        return call()
    finally:
        thread.join()
        assert proxy.held.is_set(), "the node never answered through the proxy"


def test_dropped_connections_retry_only_idempotent_calls(kind: str, node: NodeProcess) -> None:
    proxy = _Proxy(node.port)
    api = _make(kind, proxy.port)
    try:
        key = f"retry/{kind}"
        api.put(key, b"abc")
        # A read in flight when the connection drops: sent again on a fresh one.
        assert _in_flight_then_cut(proxy, lambda: api.get(key)) == b"abc"
        assert api.counters()["connects"] == 2
        # A write in flight: it ran on the node, and is not sent again.
        version = api.stat(key).version
        with pytest.raises(UnreachableError, match="whether it took effect"):
            _in_flight_then_cut(proxy, lambda: api.write(key, 3, b"d"))
        assert api.get(key) == b"abcd" and api.stat(key).version == version + 1
        # So is a conditional put (a second one would fail on the new version).
        with pytest.raises(UnreachableError):
            _in_flight_then_cut(proxy, lambda: api.put(key, b"x", expected_version=version + 1))
        assert api.get(key) == b"x"
    finally:
        api.close()
        proxy.close()


def _error(call: Callable[[], Any]) -> tuple[type[BaseException], str]:
    try:
        call()
    except Exception as exc:
        return type(exc), str(exc)
    raise AssertionError("no error")


def test_limits_are_the_same_with_identical_messages(node: NodeProcess, tmp_path: Path) -> None:
    sync, aio = _make("sync", node.port), _make("async", node.port)
    try:
        too_big = b"z" * (REQUEST_PAYLOAD_BYTES_MAX + 1)
        errors = []
        for api in (sync, aio):
            before = api.counters()["requests"]
            errors.append(_error(lambda api=api: api.write("lim", 0, too_big)))
            assert api.counters()["requests"] == before  # refused before sending
            # Up to the single-put limit one request; beyond it an upload session
            # (begin, five 1 MiB pieces, commit).
            api.put("lim/small", b"s" * SINGLE_PUT_BYTES_MAX)
            assert api.counters()["requests"] == before + 1
            api.put("lim/big", b"b" * (SINGLE_PUT_BYTES_MAX + 1))
            assert api.counters()["requests"] == before + 8
        assert errors[0] == errors[1]
        assert errors[0][0] is LimitExceededError and "one request may carry" in errors[0][1]
    finally:
        sync.close()
        aio.close()
    tuning = [_error(lambda c=c: c(_address(node.port), window=0)) for c in (Client, AsyncClient)]
    assert (
        tuning[0] == tuning[1] == (InvalidArgumentError, "piece_bytes and window must be positive")
    )
    path = tmp_path / "src"
    path.write_bytes(b"p" * 1000)
    aio = _make("async", node.port)
    try:
        assert aio.put("lim/path", path).size == 1000  # sources as Client takes them
        assert aio.get("lim/path") == b"p" * 1000
    finally:
        aio.close()
