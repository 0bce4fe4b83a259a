"""Many objects' attributes on the wire against a real node: the rows form says what
the map list says in a fraction of the bytes, a directory comes with its files'
promises in one request, and a directory lookup is one small answer."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import shuttle
from shuttle.client.validation.base import DirectoryKeyError
from shuttle.errors import InvalidArgumentError, NotFoundError
from shuttle.faces.tree import KeyTree, marker_key
from shuttle.net.attr_rows import ROWS_FORM, decode_rows
from tests.integration.nodeproc import NodeProcess

KEYS = ["m/big", "m/empty", "m/missing", "m/small"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    proc = NodeProcess(tmp_path_factory.mktemp("forms") / "node").start()
    with shuttle.connect(node=proc.address) as c:
        c.put("m/big", os.urandom(300_000))  # several content-defined chunks
        c.put("m/empty", b"")
        c.put("m/small", b"print('hello')\n")
        for name in ("a.py", "b.py"):
            c.put(f"d/{name}", name.encode() * 100)
        c.put("d/sub/c.py", b"c")
        c.put(marker_key("d/empty"), b"")
    yield proc
    proc.terminate()


@pytest.fixture
def client(node: NodeProcess) -> Iterator[shuttle.Client]:
    c = shuttle.connect(node=node.address, validation="callback")
    yield c
    c.close()


def _received(client: shuttle.Client) -> int:
    return int(client.counters()["bytes_received"])


def test_stat_many_rows_say_what_the_maps_say_in_fewer_bytes(client: shuttle.Client) -> None:
    n = client.nodes[0]
    before = _received(client)
    maps = client.call(n, "stat_many", {"keys": KEYS}).result
    map_bytes = _received(client) - before
    rows = client.call(n, "stat_many", {"keys": KEYS, "form": ROWS_FORM}).result
    row_bytes = _received(client) - before - map_bytes
    assert isinstance(maps, list) and rows["form"] == ROWS_FORM
    assert decode_rows(rows, KEYS) == maps
    assert maps[2] is None and len(maps[0]["chunks"]) > 1
    # m/big's 70-odd chunk hashes (32 B each, in both forms) are most of either now
    # that small objects get small chunks; the rows still save the rest.
    assert row_bytes < map_bytes * 0.8
    infos = client.stat_many(KEYS)  # the client asks for rows
    assert [i and i.size for i in infos] == [300_000, 0, None, 15]
    assert infos[0] == client.stat("m/big")


def test_promise_many_rows_carry_the_same_attributes_and_promises(
    client: shuttle.Client,
) -> None:
    n = client.nodes[0]
    session = client.call(n, "callback.open").result["session"]
    args = {"keys": KEYS, "session": session}
    maps = client.call(n, "callback.promise_many", args).result
    answer = client.call(n, "callback.promise_many", {**args, "form": ROWS_FORM}).result
    rows = decode_rows(answer, KEYS)
    for old, new in zip(maps, rows, strict=True):
        if old is None:
            assert new is None
            continue
        assert new is not None and new["promise"]["seq"] > old["promise"]["seq"]
        assert {**old, "promise": None} == {**new, "promise": None}
    with pytest.raises(InvalidArgumentError, match="form must be 'rows1' or absent"):
        client.call(n, "callback.promise_many", {**args, "form": "columns"})


def test_a_directory_and_its_promises_take_one_request(
    client: shuttle.Client, node: NodeProcess
) -> None:
    tree = KeyTree(client, "callback")
    tree.listdir("m")  # opens the session
    before = client.counters()["requests"]
    listing = tree.listdir("d")
    assert client.counters()["requests"] == before + 1
    assert listing.dirs == ["empty", "sub"]  # the marker's directory too, not the marker
    assert {n: i.size for n, i in listing.files.items()} == {"a.py": 400, "b.py": 400}
    for name in ("a.py", "b.py"):
        with client.open(f"d/{name}") as f:  # promised by the listing: no stat
            assert f.read() == name.encode() * 100
    assert client.counters()["requests"] == before + 3  # one read each
    assert tree.listdir("d/empty").files == {}  # its marker only: still a directory
    with pytest.raises(NotFoundError, match="nothing is stored under it"):
        tree.listdir("nowhere")
    with shuttle.connect(node=node.address) as writer:
        served = writer.node_stats(writer.nodes[0])["server"]["by_op"]
        assert served.get("callback.promise_list", 0) >= 3
        writer.put("d/a.py", b"new")  # breaks the listing's promise
    with client.open("d/a.py") as f:
        assert f.read() == b"new"
    tree.close()


def test_a_directory_lookup_is_one_short_answer(client: shuttle.Client) -> None:
    mode = client.validation_mode()
    with client.open("m/small") as f:  # opens the session
        f.read()
    before, received = client.counters()["requests"], _received(client)
    with pytest.raises(DirectoryKeyError):
        mode.open("d/sub")
    assert client.counters()["requests"] == before + 1
    assert _received(client) - received < 40  # {"dir": true}, not an error message
    with pytest.raises(NotFoundError) as missing:
        mode.open("d/none")
    assert not isinstance(missing.value, DirectoryKeyError)


def test_a_client_without_lookaside_stores_gets_chunks_counted_not_listed(
    node: NodeProcess,
) -> None:
    """Only lookaside looks chunks up: other clients' attributes leave the lists out
    (most of a small file's attributes now), and a client that wants one asks for it."""
    plain = shuttle.connect(node=node.address, validation="callback")
    try:
        assert not plain.chunk_lists
        before = _received(plain)
        info = plain.stat("m/big")
        lean = _received(plain) - before
        assert info.chunks == () and info.chunks_total > 50 and not info.chunks_complete
        full = plain.chunks("m/big")  # listed when asked
        assert len(full) == info.chunks_total and sum(c.length for c in full) == 300_000
        before = _received(plain)
        plain.call(plain.nodes[0], "stat", {"key": "m/big"})
        assert lean * 4 < _received(plain) - before
        # The callback mode's listing and promises leave them out too.
        (listed,) = plain.validation_mode().stat_many(["m/big"])
        assert listed is not None and listed.chunks == () and listed.chunks_total > 50
    finally:
        plain.close()
