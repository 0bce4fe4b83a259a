"""The lookaside miss path against an in-memory node: chunks from local stores,
verified; the rest from the node in one batch; changed store files never returned;
a store that vanishes mid-read falls back to the node; the skip rule."""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shuttle import cdc
from shuttle.client import Client
from shuttle.client.lookaside import Location, LookasideReader, LookasideStore
from shuttle.client.lookaside.reader import PROBE_EVERY, STORE_SAMPLES_MIN
from shuttle.errors import VersionMismatchError
from shuttle.testing import MemoryNode

V1 = random.Random(1).randbytes(1_500_000)
#: The next "release": an insertion, a small edit and a deletion; most chunks survive.
V2 = V1[:300_000] + b"new code" * 700 + V1[300_000:800_000] + b"X" * 10 + V1[800_010:1_200_000]


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    (root / "release").mkdir(parents=True)
    (root / "release" / "data.bin").write_bytes(V1)
    return root


@pytest.fixture
def store(store_dir: Path, tmp_path: Path) -> Iterator[LookasideStore]:
    s = LookasideStore.open(store_dir, tmp_path / "index.sqlite")
    s.refresh()
    yield s
    s.close()


@pytest.fixture
def client(node: MemoryNode, store: LookasideStore) -> Iterator[Client]:
    with MemoryNode.client(
        [node], lookaside=[store], piece_bytes=1 << 20, cache_block_bytes=64 << 10
    ) as c:
        assert c.lookaside is not None
        c.lookaside.clock = lambda: 0.0  # no rates measured: the stores are always used
        yield c


def lookaside(client: Client) -> dict[str, int]:
    return client.counters()["lookaside"]  # type: ignore[no-any-return]


def count_reads(store: LookasideStore, monkeypatch: pytest.MonkeyPatch) -> list[Location]:
    reads: list[Location] = []
    real = store.read

    def counting(loc: Location) -> bytes | None:
        reads.append(loc)
        return real(loc)

    monkeypatch.setattr(store, "read", counting)
    return reads


def test_an_identical_copy_supplies_every_chunk(client: Client, node: MemoryNode) -> None:
    info = client.put("v1", V1)
    assert client.get("v1") == V1
    n = lookaside(client)
    assert node.served["read"] == 0
    assert (n["chunks_from_stores"], n["bytes_from_stores"]) == (info.chunks_total, len(V1))
    assert (n["chunks_from_node"], n["bytes_from_node"], n["node_batches"]) == (0, 0, 0)


def test_an_older_release_gives_its_unchanged_chunks_the_node_the_rest_in_one_batch(
    client: Client, node: MemoryNode
) -> None:
    info = client.put("v2", V2)
    old = {r.hash for r in cdc.chunk_buffer(V1)}
    shared = [c for c in info.chunks if c.hash in old]
    fresh = [c for c in info.chunks if c.hash not in old]
    assert shared and fresh
    assert client.get("v2") == V2
    n = lookaside(client)
    assert n["chunks_from_stores"] == len(shared) and n["chunks_from_node"] == len(fresh)
    assert n["bytes_from_stores"] == sum(c.length for c in shared)
    assert n["bytes_from_node"] == sum(c.length for c in fresh)
    assert n["node_batches"] == 1 and n["verify_failures"] == 0


def test_reads_through_the_cache_take_each_chunk_from_its_store_once(
    client: Client, store: LookasideStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = client.put("v1", V1)
    reads = count_reads(store, monkeypatch)
    with client.open("v1") as f:
        got = b"".join(iter(lambda: f.read(4096), b""))
    assert got == V1
    # 23 cache blocks of 64 KiB, chunks of 16-256 KiB across them: each read and
    # verified once, however many blocks it spans.
    assert sorted(loc.offset for loc in reads) == [c.offset for c in info.chunks]
    assert lookaside(client)["bytes_from_node"] == 0


def test_a_store_file_changed_after_indexing_is_never_returned(
    client: Client, store_dir: Path, store: LookasideStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Size and mtime changed: the entries are dropped unread, the node serves."""
    client.put("v1", V1)
    (store_dir / "release" / "data.bin").write_bytes(V2)
    assert client.get("v1") == V1
    n = lookaside(client)
    assert n["chunks_from_stores"] == 0 and n["bytes_from_node"] == len(V1)
    assert n["store_misses"] >= 1
    reads = count_reads(store, monkeypatch)
    assert client.get("v1") == V1
    assert reads == []  # dropped: not even looked at again
    store.refresh()  # re-indexed as V2: its shared chunks serve again, verified
    assert client.get("v1") == V1
    assert lookaside(client)["chunks_from_stores"] > 0


def test_a_change_that_keeps_size_and_mtime_is_caught_by_the_hash(
    client: Client, store_dir: Path, store: LookasideStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    client.put("v1", V1)
    path = store_dir / "release" / "data.bin"
    st = path.stat()
    with open(path, "r+b") as f:  # one byte, in place: same size
        f.seek(700_000)
        f.write(bytes([V1[700_000] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime
    assert client.get("v1") == V1
    n = lookaside(client)
    assert n["verify_failures"] == 1
    # Chunks checked before the bad one came from the store; the file was then dropped.
    assert n["chunks_from_stores"] < len(cdc.chunk_buffer(V1))
    reads = count_reads(store, monkeypatch)
    assert client.get("v1") == V1 and reads == []


def test_a_store_that_disappears_mid_read_falls_back_to_the_node(
    client: Client, store_dir: Path, store: LookasideStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = client.put("v1", V1)
    real = store.read

    def then_unplugged(loc: Location) -> bytes | None:
        data = real(loc)
        shutil.rmtree(store_dir, ignore_errors=True)  # gone after the first chunk (unplugged)
        return data

    monkeypatch.setattr(store, "read", then_unplugged)
    assert client.get("v1") == V1
    n = lookaside(client)
    assert n["chunks_from_stores"] == 1 and n["chunks_from_node"] == info.chunks_total - 1
    assert n["store_misses"] == info.chunks_total - 1 and n["verify_failures"] == 0


def test_a_store_that_disappears_between_cache_blocks_falls_back_too(
    client: Client, store_dir: Path
) -> None:
    client.put("v1", V1)
    with client.open("v1") as f:
        head = f.read(100_000)
        shutil.rmtree(store_dir)
        rest = f.read()
    assert head + rest == V1
    n = lookaside(client)
    assert n["chunks_from_stores"] >= 1 and n["bytes_from_node"] > 0


def test_the_stores_are_skipped_while_the_link_is_measured_faster(
    client: Client, node: MemoryNode
) -> None:
    info = client.put("v1", V1)
    reader = client.lookaside
    assert isinstance(reader, LookasideReader)
    for _ in range(STORE_SAMPLES_MIN):
        reader.store_rate.add(1_000_000, 1.0)  # 1 MB/s
    reader.link_rate.add(1_000_000_000, 1.0)  # 1 GB/s
    for _ in range(PROBE_EVERY - 1):
        assert reader.fetch(info, 0, 100_000) == V1[:100_000]
    n = lookaside(client)
    assert n["reads_skipped"] == PROBE_EVERY - 1 and n["chunks_from_stores"] == 0
    assert node.served["read"] == PROBE_EVERY - 1
    assert reader.fetch(info, 0, 100_000) == V1[:100_000]  # a probe re-measures the store
    n = lookaside(client)
    assert n["probes"] == 1 and n["chunks_from_stores"] >= 1
    reader.store_rate.add(10**12, 1.0)  # now the store is the faster one
    reader.fetch(info, 0, 100_000)
    assert lookaside(client)["reads_skipped"] == PROBE_EVERY - 1


def test_the_stores_are_not_skipped_on_the_evidence_of_a_few_misses(
    client: Client, node: MemoryNode
) -> None:
    info = client.put("v1", V1)
    reader = client.lookaside
    assert isinstance(reader, LookasideReader)
    reader.link_rate.add(12_500, 1.0)  # 100 Kbit/s
    for _ in range(STORE_SAMPLES_MIN - 1):
        reader.store_rate.add(0, 0.001)  # misses: files changed since the store's release
    assert reader.store_rate.bytes_per_s == 0.0
    assert reader.fetch(info, 0, 100_000) == V1[:100_000]  # still consults the stores
    n = lookaside(client)
    assert n["reads_skipped"] == 0 and n["chunks_from_stores"] >= 1


def test_time_saved_is_estimated_from_the_measured_link(client: Client) -> None:
    info = client.put("v1", V1)
    reader = client.lookaside
    assert reader is not None
    ticks = iter(range(1000))
    reader.clock = lambda: next(ticks) * 0.001  # every look at the clock: 1 ms later
    reader.link_rate.add(1_000_000, 1.0)  # 1 MB/s: V1 would take 1.5 s
    reader.store_rate.add(10**9, 1.0)
    assert reader.fetch(info, 0, len(V1)) == V1
    assert lookaside(client)["time_saved_s"] == pytest.approx(1.5 - 0.001)


def test_an_incomplete_chunk_list_is_paged_pinned_to_the_version(
    client: Client, node: MemoryNode
) -> None:
    info = client.put("v1", V1)
    short = dataclasses.replace(info, chunks=info.chunks[:2])
    reader = client.lookaside
    assert reader is not None
    assert reader.fetch(short, 0, len(V1)) == V1
    assert node.served["chunks"] == 1 and node.served["read"] == 0
    changed = client.put("v2", V2)
    client.put("v2", V1)
    with pytest.raises(VersionMismatchError):
        reader.fetch(dataclasses.replace(changed, chunks=()), 0, len(V2))


def test_a_read_pinned_to_a_changed_version_fails_rather_than_mixing(
    client: Client, node: MemoryNode
) -> None:
    info = client.put("v2", V2)
    client.put("v2", V2[::-1])
    reader = client.lookaside
    assert reader is not None
    with pytest.raises(VersionMismatchError):
        reader.fetch(info, 0, len(V2))  # its new chunks must come from the node


def test_a_client_without_stores_has_no_lookaside(node: MemoryNode) -> None:
    with MemoryNode.client([node], lookaside=[]) as c:
        assert c.lookaside is None and "lookaside" not in c.counters()


def test_a_stale_file_whose_index_cannot_be_written_is_a_miss_not_a_failed_read(
    client: Client, store_dir: Path, store: LookasideStore
) -> None:
    """Dropping a changed file's entries fails (a read-only or full index): the read
    still comes whole from the node."""
    client.put("v1", V1)
    db = sqlite3.connect(store.index.db_path, isolation_level=None)
    db.execute(
        "CREATE TRIGGER no_drop BEFORE DELETE ON chunks "
        "BEGIN SELECT RAISE(ABORT, 'the index cannot be written'); END"
    )
    db.close()
    (store_dir / "release" / "data.bin").write_bytes(V2)  # size and mtime changed
    assert client.get("v1") == V1
    assert lookaside(client)["bytes_from_node"] == len(V1)


def test_a_forked_child_does_not_use_the_parents_lookaside(client: Client) -> None:
    """A fork speculation's child reads from the node: the parent's lookaside lock
    (held by another thread at the fork, here) and SQLite connections are not its own."""
    client.put("v1", V1)
    assert client.lookaside is not None
    with client.lookaside._lock:  # another thread of the parent, mid-lookup
        client.after_fork_in_child()  # what a forked branch runs first
        got: list[bytes] = []
        reader = threading.Thread(target=lambda: got.append(client.get("v1")), daemon=True)
        reader.start()
        reader.join(5)
        assert got == [V1]  # (inside: once the lock is free a stuck read would finish)


def test_an_older_source_file_supplies_all_but_the_lines_that_changed(
    node: MemoryNode, tmp_path: Path
) -> None:
    """sqlalchemy 2.0.0 changed the copyright year at the top of every file: with one
    chunk per small file, an older release supplied nothing. Small files now get small
    chunks, so everything after the changed line comes from the store."""
    rng = random.Random(5)
    body = "".join(
        f"def f{i}(x):\n    return x * {rng.randint(1, 10**9)} + {i}\n\n" for i in range(500)
    )
    old = "# Copyright (C) 2005-2022 the SQLAlchemy authors\n" + body
    new = "# Copyright (C) 2005-2023 the SQLAlchemy authors\n" + body
    assert 16_000 < len(new) < 32 << 10  # a typical module, in the smallest size class
    root = tmp_path / "older"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "orm.py").write_text(old)
    older = LookasideStore.open(root, tmp_path / "older.sqlite")
    older.refresh()
    try:
        with MemoryNode.client([node], lookaside=[older]) as c:
            assert c.lookaside is not None
            c.lookaside.clock = lambda: 0.0
            c.put("lib/orm.py", new.encode())
            assert c.get("lib/orm.py") == new.encode()
            n = lookaside(c)
    finally:
        older.close()
    assert n["bytes_from_stores"] >= 0.9 * len(new), n
    assert n["bytes_from_node"] <= 2 * cdc.chunking_for(len(new)).max_bytes
