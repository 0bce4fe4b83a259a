"""Ctrl-C in the middle of a transfer: the client stops at once and leaves the node
nothing to wait for (a real node process; the interrupt is placed inside a frame)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

import shuttle
from tests.integration.nodeproc import NodeProcess

#: The client's request timeout in these tests. Before the fix, the tidy-up request
#: went out on the cut connection and waited all of it; after, nothing waits.
REQUEST_TIMEOUT_S = 30.0


class _CutSocket(socket.socket):
    """A socket whose next large send stops halfway with KeyboardInterrupt, as Ctrl-C
    does when it lands while ``sendall`` is pushing a piece of an upload."""

    armed = False

    def sendall(self, data: Any, *args: Any) -> None:
        if _CutSocket.armed and len(data) >= 64 << 10:
            _CutSocket.armed = False
            view = memoryview(data).cast("B")
            super().sendall(view[: len(view) // 2])
            raise KeyboardInterrupt
        super().sendall(data, *args)


@pytest.fixture
def cut(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_CutSocket]]:
    real = socket.create_connection

    def create_connection(*args: Any, **kwargs: Any) -> socket.socket:
        sock = real(*args, **kwargs)
        return _CutSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())

    monkeypatch.setattr(socket, "create_connection", create_connection)
    yield _CutSocket
    _CutSocket.armed = False


def _uploads_open(client: shuttle.Client) -> int:
    return int(client.node_stats(client.nodes[0])["store"]["uploads_open"])


def _interrupted_after(fn: Any) -> float:
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        fn()
    return time.monotonic() - started


def test_ctrl_c_inside_an_upload_frame_stops_at_once_and_ends_the_session(
    node: NodeProcess, cut: type[_CutSocket]
) -> None:
    client = shuttle.connect(node=node.address, request_timeout_s=REQUEST_TIMEOUT_S)
    try:
        client.put("kept", b"old")
        cut.armed = True
        took = _interrupted_after(lambda: client.put("kept", b"x" * (8 << 20)))
        # Generous on a loaded machine: the interrupt itself takes milliseconds.
        assert took < REQUEST_TIMEOUT_S / 3, f"the interrupt took {took:.1f} s"
        assert client.get("kept") == b"old"  # the same thread's next call works at once
        deadline = time.monotonic() + 10
        while _uploads_open(client) and time.monotonic() < deadline:
            time.sleep(0.05)  # the node ends the session when it sees the connection close
        assert _uploads_open(client) == 0
    finally:
        client.close()


def test_ctrl_c_inside_a_write_of_an_open_file_stops_at_once(
    node: NodeProcess, cut: type[_CutSocket]
) -> None:
    client = shuttle.connect(node=node.address, request_timeout_s=REQUEST_TIMEOUT_S)
    try:
        client.put("file", b"old")

        def write() -> None:
            with client.open("file", "wb") as f:
                cut.armed = True
                f.write(b"y" * (4 << 20))

        took = _interrupted_after(write)
        assert took < REQUEST_TIMEOUT_S / 3, f"the interrupt took {took:.1f} s"
        assert client.get("file") == b"old"
    finally:
        client.close()
