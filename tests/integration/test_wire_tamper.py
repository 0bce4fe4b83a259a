"""A party on the path changes one byte, against real nodes: it always ends in an error,
never in wrong bytes stored or returned.

Over TLS any changed byte, in either direction and anywhere in the stream (handshake,
HELLO, a request's header, a put's payload, a read's reply), fails a record's
authentication: the connection ends with an error. Without TLS the end-to-end hashes
still catch a changed payload: a put whose bytes changed is refused by the node before
anything is stored, and a read whose bytes changed is refused by the client before
anything is returned (before these checks, both succeeded with the wrong bytes).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import shuttle
from shuttle.errors import IntegrityError, NotFoundError, ShuttleError
from shuttle.net import auth
from tests.integration.nodeproc import NodeProcess
from tests.integration.wire_helpers import Flip, FlipProxy, Pki, keyed_tls_node

#: Object data with a marker the proxy finds in a plain stream (many copies, so one
#: lies whole inside any chunk the proxy receives).
MARK = b"<<shuttle-tamper-marker>>"
OLD = b"old contents " * 100
NEW = MARK * 3000  # 75 KB: several chunks' worth of content-defined chunking
#: A read reply big enough to be checked chunk by chunk.
STORED = MARK * 12000  # 300 KB


@pytest.fixture(autouse=True)
def no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (auth.KEY_FILE_ENV, "SHUTTLE_CLUSTER", "SHUTTLE_TLS", "SHUTTLE_CA_FILE"):
        monkeypatch.delenv(name, raising=False)


# --- without TLS: the end-to-end hashes ----------------------------------------------


@pytest.fixture(scope="module")
def plain_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node for the module: no test here may change what it stores."""
    node = NodeProcess(tmp_path_factory.mktemp("plain") / "node").start()
    with shuttle.connect(node=node.address) as c:
        c.put("victim", OLD)
        c.put("stored", STORED)
    yield node
    node.terminate()


def _content(node: NodeProcess, key: str) -> bytes | None:
    with shuttle.connect(node=node.address) as c:
        try:
            return c.get(key)
        except NotFoundError:
            return None


def test_plain_a_changed_put_payload_is_refused_by_the_node(plain_node: NodeProcess) -> None:
    with FlipProxy(plain_node.port, Flip("up", marker=MARK)) as proxy:
        with shuttle.connect(node=proxy.address) as c, pytest.raises(IntegrityError) as err:
            c.put("victim", NEW)
        assert proxy.flips == 1
    assert "Nothing was stored" in str(err.value)
    assert _content(plain_node, "victim") == OLD  # the old object, untouched


def test_plain_a_changed_upload_piece_is_refused_by_the_node(plain_node: NodeProcess) -> None:
    big = MARK * 260_000  # 6.5 MB: an upload session of several pieces
    with FlipProxy(plain_node.port, Flip("up", marker=MARK)) as proxy:
        with shuttle.connect(node=proxy.address) as c, pytest.raises(IntegrityError):
            c.put("victim", big)
        assert proxy.flips == 1
    assert _content(plain_node, "victim") == OLD


def test_plain_a_changed_read_reply_is_refused_by_the_client(plain_node: NodeProcess) -> None:
    with FlipProxy(plain_node.port, Flip("down", marker=MARK)) as proxy:
        with shuttle.connect(node=proxy.address) as c, pytest.raises(IntegrityError) as err:
            c.get("stored")
        assert proxy.flips == 1
    assert "do not match the object's hash" in str(err.value)
    assert _content(plain_node, "stored") == STORED


def test_plain_a_changed_key_in_a_put_is_reported(plain_node: NodeProcess) -> None:
    """A header is not covered by a hash: without TLS the node stores under the key it
    read. The client still finds out (the answer names another key) and says so."""
    key = "victim-" + MARK.decode()
    with FlipProxy(plain_node.port, Flip("up", marker=MARK, marker_index=2)) as proxy:
        with shuttle.connect(node=proxy.address) as c, pytest.raises(IntegrityError) as err:
            c.put(key, b"tiny")
        assert proxy.flips == 1
    assert "where this client sent" in str(err.value)
    assert _content(plain_node, key) is None


# --- with TLS: any byte, either direction ------------------------------------------


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProcess, Pki, Path]]:
    node, pki, key_file = keyed_tls_node(tmp_path_factory.mktemp("tls"))
    with shuttle.connect(node=node.address, key_file=key_file, tls=True, ca_file=pki.ca.cert) as c:
        c.put("victim", OLD)
        c.put("stored", STORED)
    yield node, pki, key_file
    node.terminate()


def _tls_client(address: str, pki: Pki, key_file: Path) -> shuttle.Client:
    return shuttle.connect(node=address, key_file=key_file, tls=True, ca_file=pki.ca.cert)


@pytest.fixture(scope="module")
def stream_lengths(tls_node: tuple[NodeProcess, Pki, Path]) -> dict[str, int]:
    """Bytes each way of a clean connect and put (up) and connect and get (down)."""
    node, pki, key_file = tls_node
    with FlipProxy(node.port) as proxy, _tls_client(proxy.address, pki, key_file) as c:
        c.put("victim", OLD)
        up = proxy.forwarded["up"]
    with FlipProxy(node.port) as proxy, _tls_client(proxy.address, pki, key_file) as c:
        assert c.get("stored") == STORED
        down = proxy.forwarded["down"]
    return {"up": up, "down": down}


@pytest.mark.parametrize("where", [0.002, 0.02, 0.1, 0.5, 0.98], ids=lambda f: f"at{f:g}")
@pytest.mark.parametrize("direction", ["up", "down"])
def test_tls_any_changed_byte_ends_in_an_error_never_in_wrong_bytes(
    tls_node: tuple[NodeProcess, Pki, Path],
    stream_lengths: dict[str, int],
    direction: str,
    where: float,
) -> None:
    """Positions spread over the whole exchange: the handshake's first records, the
    HELLO and WELCOME, the request headers, the put's payload and the read's reply."""
    node, pki, key_file = tls_node
    offset = int(stream_lengths[direction] * where)
    with FlipProxy(node.port, Flip(direction, offset=offset)) as proxy:
        with _tls_client(proxy.address, pki, key_file) as c, pytest.raises(ShuttleError):
            if direction == "up":
                c.put("victim", NEW)
            else:
                got = c.get("stored")
                assert got == STORED, "a changed reply must never be returned"
                pytest.fail("the changed byte went unnoticed")
        assert proxy.flips >= 1
    assert _content_tls(node, pki, key_file, "victim") == OLD
    assert _content_tls(node, pki, key_file, "stored") == STORED


def _content_tls(node: NodeProcess, pki: Pki, key_file: Path, key: str) -> bytes:
    with _tls_client(node.address, pki, key_file) as c:
        return c.get(key)
