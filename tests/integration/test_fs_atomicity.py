"""Multi-block directory updates are all or nothing across a crash: a node killed in
the middle of one comes back with the whole update, a torn log record comes back as
nothing, and the directory stays usable either way. The log's decoder is checked on
every prefix of a valid log."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import shuttle
from shuttle.client.model import NodeAddress
from shuttle.errors import ShuttleError
from shuttle.objects.fs import FS_STATE_DIR
from shuttle.objects.fs.atomicity import (
    CRASH_EXIT_STATUS,
    CRASH_POINT_ENV,
    decode_records,
    encode_record,
)
from shuttle.objects.fs.dirblocks import Header, encode_header, plan_insert, view_of
from shuttle.objects.fs.directory import open_directory
from shuttle.runtime.client import Runtime
from tests.integration.nodeproc import NodeProcess

ROOT_KEY = "vol/.dirs/root"

# --- the log's decoder ----------------------------------------------------------------

writes = st.lists(
    st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 2**40), st.binary(max_size=64)),
    min_size=1,
    max_size=4,
)


@given(st.lists(writes, max_size=5), st.data())
def test_any_prefix_of_a_log_decodes_to_the_whole_records_in_it(
    records: list[list[tuple[str, int, bytes]]], data: st.DataObject
) -> None:
    encoded = [encode_record(seq, ws) for seq, ws in enumerate(records, 1)]
    log = b"".join(encoded)
    cut = data.draw(st.integers(0, len(log)), label="cut")
    whole, end = 0, 0
    while whole < len(encoded) and end + len(encoded[whole]) <= cut:
        end += len(encoded[whole])
        whole += 1
    got, got_end = decode_records(log[:cut])
    assert got_end == end
    assert got == [
        {"seq": seq, "writes": [list(w) for w in ws]} for seq, ws in enumerate(records[:whole], 1)
    ]


@given(st.lists(writes, min_size=1, max_size=4), st.data())
def test_a_damaged_record_ends_the_log_where_it_begins(
    records: list[list[tuple[str, int, bytes]]], data: st.DataObject
) -> None:
    encoded = [encode_record(seq, ws) for seq, ws in enumerate(records, 1)]
    bad = data.draw(st.integers(0, len(encoded) - 1), label="damaged record")
    start = sum(len(e) for e in encoded[:bad])
    # A changed byte in the checksum or the body (CRC-32 catches every one).
    at = start + data.draw(st.integers(4, len(encoded[bad]) - 1), label="byte")
    log = bytearray(b"".join(encoded))
    log[at] ^= data.draw(st.integers(1, 255), label="xor")
    got, end = decode_records(bytes(log))
    assert end == start
    assert [r["seq"] for r in got] == list(range(1, bad + 1))


# --- a node that crashes in the middle of an update -----------------------------------


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    proc = NodeProcess(tmp_path / "n1")
    yield proc
    proc.terminate()


def runtime(node: NodeProcess) -> Runtime:
    return Runtime([NodeAddress("n1", "127.0.0.1", node.port)])


def log_path(node: NodeProcess) -> Path:
    return node.data_dir / FS_STATE_DIR / "atomicity.log"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", ["after-log", "after-first-write"])
def test_a_node_killed_in_a_multi_block_update_comes_back_with_all_of_it(
    node: NodeProcess, point: str
) -> None:
    node.env = {CRASH_POINT_ENV: point}
    node.start()
    with runtime(node) as rt:
        d = open_directory(rt, "vol", placement="static")
        # The first mkdir on one node writes three blocks in one commit: the root's
        # first entry block, the root's header (its count) and the child's header.
        with pytest.raises(ShuttleError):
            d.mkdir("/a")
        assert node.proc is not None and node.proc.wait(10) == CRASH_EXIT_STATUS
        node.env = {}
        node.start()  # recovery applies the logged update again, in full
        assert log_path(node).stat().st_size == 0
        assert "applied again in full" in node.log.read_text()
        # The same object (its cached root was dropped when its node went away)...
        assert [n for n, _ in d.listdir("/")] == ["a"]
        assert d.listdir("/a") == []  # the child's header is there: a whole directory
        d.create("/a/f", {"type": "file"})
        assert [n for n, _ in d.listdir("/a")] == ["f"]
        # ...and a new one, from the blocks.
        fresh = open_directory(rt, "vol", placement="static")
        assert [n for n, _ in fresh.listdir("/")] == ["a"]
        assert [n for n, _ in fresh.listdir("/a")] == ["f"]


def mkdir_writes(state: dict[int, bytes], name: str) -> list[Any]:
    """A mkdir of ``/name`` over the root whose blocks are ``state``, as one update:
    the root's entry block (and count) and the new directory's header."""
    entry = {"type": "dir", "id": name}
    plan = plan_insert(view_of(ROOT_KEY, state), name, entry, "/" + name)
    for key, offset, raw in plan:
        assert key == ROOT_KEY
        state[offset] = raw
    return [*plan, (f"vol/.dirs/{name}", 0, encode_header(Header(name, "root", 0)))]


@pytest.mark.timeout(60)
def test_a_torn_log_record_applies_nothing_and_the_whole_one_before_it_everything(
    node: NodeProcess,
) -> None:
    node.start()
    node.terminate()
    state: dict[int, bytes] = {}
    whole = encode_record(1, mkdir_writes(state, "real"))  # 3 blocks over 2 objects
    torn = encode_record(2, mkdir_writes(state, "ghost"))  # 2 blocks over 2 objects
    for cut in (len(torn) // 2, len(torn) - 1):  # mid-body, and one byte short
        log_path(node).write_bytes(whole + torn[:cut])
        node.start()
        assert log_path(node).stat().st_size == 0
        with runtime(node) as rt:
            d = open_directory(rt, "vol", placement="static")
            assert d.listdir("/") == [["real", {"type": "dir", "id": "real"}]]
            assert d.listdir("/real") == []
            assert d.lookup("/ghost") is None
            d.create(f"/after-{cut}", {"type": "file"})
            assert [n for n, _ in d.listdir("/")] == [f"after-{cut}", "real"]
            d.remove(f"/after-{cut}")
        with shuttle.connect(node=node.address) as client:  # not even the ghost's header
            assert client.exists("vol/.dirs/real")
            assert not client.exists("vol/.dirs/ghost")
        node.terminate()
    assert "torn bytes at its end" in node.log.read_text()
