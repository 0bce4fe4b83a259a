"""File stacks (file over cache over the node's isolation object) against real nodes:
reads give what was written in every placement and across migrations, callbacks keep
two clients' caches coherent, and a migrated cache arrives warm."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle.errors import InvalidArgumentError
from shuttle.runtime.client import Runtime
from shuttle.runtime.refs import Ref
from tests.integration.test_runtime import Nodes

KEY = "vol/files/table"
BLOCK = 1024


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Nodes]:
    n = Nodes(tmp_path)
    yield n
    for p in n.procs:
        p.terminate()


def stack(rt: Runtime, at: str | None = None) -> tuple[Ref, Ref]:
    """A file over a cache over the isolation object of the key's node."""
    node = rt.node_for(KEY)
    where = node if at == "node" else None
    cache = rt.create(
        "cache",
        at=where,
        placement="static",
        isolation=rt.service(node, "isolation"),
        key=KEY,
        block_bytes=BLOCK,
    )
    file = rt.create("file", at=where, placement="static", backing=cache, key=KEY)
    return file, cache


def write_and_read_back(
    file: Ref, rng: random.Random, model: bytearray, off: int, data: bytes, read_bytes: int
) -> None:
    """``data`` written at ``off`` through ``file`` and into ``model``; then a read of
    ``read_bytes`` at a random offset gives what the model holds."""
    assert file.write(off, data) == len(data)
    if len(model) < off:
        model += bytes(off - len(model))
    model[off : off + len(data)] = data
    start = rng.randrange(0, len(model))
    assert file.read(start, read_bytes) == bytes(model[start : start + read_bytes])


@pytest.mark.parametrize("at", ["client", "node"])
def test_reads_give_what_was_written_at_any_offset(nodes: Nodes, at: str) -> None:
    rng = random.Random(7)
    model = bytearray()
    with nodes.runtime() as rt:
        file, _ = stack(rt, at)
        for _ in range(60):
            off = rng.randrange(0, 6 * BLOCK)
            data = rng.randbytes(rng.randrange(1, 3 * BLOCK))
            write_and_read_back(file, rng, model, off, data, 2 * BLOCK)
        assert file.size() == len(model)
        assert file.read(0, len(model)) == bytes(model)


def test_a_write_by_one_client_reaches_the_other_s_cache_through_its_callback(
    nodes: Nodes,
) -> None:
    with nodes.runtime() as a, nodes.runtime() as b:
        fa, ca = stack(a)
        fb, _ = stack(b)
        fa.write(0, b"x" * (2 * BLOCK))
        assert fb.read(0, 16) == b"x" * 16  # b caches block 0 under a promise
        fa.write(4, b"NEW!")  # breaks b's promise before it returns
        assert fb.read(0, 16) == b"xxxxNEW!xxxxxxxx"
        stats = fb.stats()["below"]
        assert stats["invalidations"] == 1 and stats["installation_reads"] == 2
        hits = ca.stats()["hits"]
        assert fa.read(0, 8) == b"xxxxNEW!"
        assert ca.stats()["hits"] == hits + 1  # a's own copy stayed valid: its write is the news


def test_a_migrated_cache_keeps_its_promises_and_starts_cold(nodes: Nodes) -> None:
    data = bytes(range(256)) * 16
    with nodes.runtime() as a, nodes.runtime() as b:
        fa, ca = stack(a)
        fb, _ = stack(b)
        fa.write(0, data)
        assert fa.read(0, 4 * BLOCK) == data[: 4 * BLOCK]
        node = a.node_for(KEY)
        a.migrate(ca, node)
        assert a.where(ca) == node
        before = ca.stats()
        assert before["cached_blocks"] == 0  # the blocks stay behind; the node has them
        assert fa.read(0, 4 * BLOCK) == data[: 4 * BLOCK]
        assert ca.stats()["installation_reads"] == before["installation_reads"] + 4
        fb.write(BLOCK, b"B" * BLOCK)  # the promise is the object's, wherever it runs
        assert fa.read(BLOCK, BLOCK) == b"B" * BLOCK
        a.migrate(ca, "client")
        assert fa.read(BLOCK, 8) == b"B" * 8


def test_bad_arguments_get_clear_errors(nodes: Nodes) -> None:
    with nodes.runtime() as rt:
        file, _ = stack(rt)
        with pytest.raises(InvalidArgumentError, match="offset must be an integer ≥ 0"):
            file.read(-1, 10)
        with pytest.raises(InvalidArgumentError, match="power of two"):
            rt.create("cache", isolation=rt.service("n1", "isolation"), key="k", block_bytes=1000)
        with pytest.raises(InvalidArgumentError, match="no anchored node object"):
            rt.service("n1", "nothing")


@pytest.mark.parametrize("at", ["client", "node"])
def test_a_cache_that_ends_gives_back_its_callback_promises(nodes: Nodes, at: str) -> None:
    # Left behind, each would make the next writer of its blocks call back an object
    # that is gone (three tries before the isolation object drops it).
    with nodes.runtime() as rt:
        isolation = rt.service(rt.node_for(KEY), "isolation")
        file, cache = stack(rt, at)
        file.write(0, b"x" * (2 * BLOCK))
        assert file.read(0, 2 * BLOCK) == b"x" * (2 * BLOCK)
        assert isolation.stats()["callbacks_held"] == 2
        rt.destroy(file)
        rt.destroy(cache)
        assert isolation.stats()["callbacks_held"] == 0
