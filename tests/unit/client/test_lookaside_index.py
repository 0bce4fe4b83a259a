"""A lookaside store's index: every chunk of every file found where it is, with the
node's chunking; changed files re-indexed, removed ones forgotten, unreadable ones
skipped; the registry of a user's stores."""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle import cdc
from shuttle.client.lookaside import LookasideIndex, LookasideStore, StoreSet
from shuttle.client.lookaside import index as index_module
from shuttle.errors import InvalidArgumentError


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def make_index(tmp: Path, files: dict[str, bytes]) -> LookasideIndex:
    root = tmp / "root"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    root.mkdir(exist_ok=True)
    return LookasideIndex(tmp / "db" / "index.sqlite", root)


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 600_000), min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
)
def test_every_chunk_of_every_file_is_found_where_its_bytes_are(
    sizes: list[int], seed: int
) -> None:
    files = {f"d{i % 2}/f{i}": blob(seed + i, n) for i, n in enumerate(sizes)}
    with tempfile.TemporaryDirectory() as tmp:
        index = make_index(Path(tmp), files)
        try:
            report = index.refresh()
            assert report.files_indexed == len(files)
            assert report.bytes_indexed == sum(sizes)
            for data in files.values():
                refs = cdc.chunk_buffer(data)
                assert sum(r.length for r in refs) == len(data)
                found = index.lookup([r.hash for r in refs])
                assert set(found) == {r.hash for r in refs}
                for ref in refs:
                    loc = found[ref.hash]
                    held = files[loc.path][loc.offset : loc.offset + loc.length]
                    assert cdc.chunk_hash(held) == ref.hash and loc.length == ref.length
        finally:
            index.close()


def test_refresh_reindexes_changed_files_and_forgets_removed_ones(tmp_path: Path) -> None:
    old, new = blob(1, 300_000), blob(2, 300_000)
    index = make_index(tmp_path, {"a": old, "b": blob(3, 1000), "c": blob(4, 5000)})
    assert index.refresh().files_indexed == 3
    again = index.refresh()
    assert (again.files_indexed, again.files_unchanged) == (0, 3)
    (index.root / "a").write_bytes(new)
    (index.root / "c").unlink()
    report = index.refresh()
    assert (report.files_indexed, report.files_unchanged, report.files_removed) == (1, 1, 1)
    assert index.lookup([r.hash for r in cdc.chunk_buffer(old)]) == {}
    assert len(index.lookup([r.hash for r in cdc.chunk_buffer(new)])) > 0
    assert index.lookup([cdc.chunk_hash(blob(4, 5000))]) == {}
    assert index.summary().files == 2


def test_a_dropped_file_is_not_found_until_indexed_again(tmp_path: Path) -> None:
    data = blob(5, 200_000)
    index = make_index(tmp_path, {"x": data})
    index.refresh()
    hashes = [r.hash for r in cdc.chunk_buffer(data)]
    index.drop_file("x")
    assert index.lookup(hashes) == {}
    assert index.refresh().files_indexed == 1  # same size and mtime, but dropped
    assert set(index.lookup(hashes)) == set(hashes)


def test_unreadable_files_are_skipped_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = make_index(tmp_path, {"ok": blob(6, 1000), "secret": blob(7, 1000)})
    real_open = os.open

    def refusing(path: str | os.PathLike[str], flags: int, *args: int) -> int:
        if str(path).endswith("secret"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)
    report = index.refresh()
    assert report.files_indexed == 1
    assert report.skipped == [("secret", "Permission denied")]
    os.symlink(tmp_path / "elsewhere", index.root / "link")  # not followed, not an error
    assert index.refresh().skipped == [("secret", "Permission denied")]


def test_an_index_of_other_chunking_is_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = make_index(tmp_path, {"a": blob(8, 1000)})
    index.refresh()
    index.close()
    monkeypatch.setattr(index_module, "CHUNKING", "some-other-chunking")
    again = LookasideIndex(index.db_path, index.root)
    assert again.summary().files == 0 and again.refresh().files_indexed == 1


def test_the_store_set_adds_lists_and_removes(tmp_path: Path) -> None:
    stores = StoreSet(tmp_path / "home")
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "f").write_bytes(blob(9, 100_000))
    store = stores.add(one)
    assert store.refresh().files_indexed == 1
    store.close()
    stores.add(two).close()
    stores.add(one).close()  # twice: harmless
    assert [e.root for e in stores.entries()] == [one, two]
    two.rmdir()
    assert [s.root for s in stores.stores()] == [one]  # a store that is not there is left out
    stores.remove(two)
    assert [e.root for e in stores.entries()] == [one]
    assert stores.store(stores.entries()[0]).summary().files == 1
    with pytest.raises(InvalidArgumentError, match="not a lookaside store"):
        stores.remove(two)


def test_a_store_must_be_an_existing_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        StoreSet(tmp_path).add(tmp_path / "absent")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(InvalidArgumentError, match="not a directory"):
        LookasideStore.open(tmp_path / "file")


def test_dropping_does_not_wait_behind_an_index_run(tmp_path: Path) -> None:
    """A read that finds a stale entry while another process writes the index gives
    up on dropping it (it is caught again next time) instead of stalling."""
    index = make_index(tmp_path, {"x": blob(10, 1000)})
    index.refresh()
    other = sqlite3.connect(index.db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # `shuttle lookaside index` mid-transaction
    try:
        started = time.monotonic()
        assert index.drop_file("x") is False
        assert time.monotonic() - started < 1.0
        assert len(index.lookup([cdc.chunk_hash(blob(10, 1000))])) == 1  # reads still work
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert index.drop_file("x") is True


def test_a_store_whose_index_cannot_be_opened_is_left_out(tmp_path: Path) -> None:
    stores = StoreSet(tmp_path / "home")
    (tmp_path / "one").mkdir()
    store = stores.add(tmp_path / "one")
    store.close()
    store.index.db_path.write_bytes(b"not a database" * 100)
    assert stores.stores() == []  # a client still starts, without it
