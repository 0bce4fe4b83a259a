"""The object store's operations, one behaviour per test."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    StorageIOError,
    VersionMismatchError,
)
from shuttle.store import ObjectStore, StoreConfig, chunk_buffer, object_hash
from shuttle.store.objects import WRITE_BYTES_MAX


def _check_attrs(store: ObjectStore, key: str, content: bytes) -> None:
    attrs = store.stat(key)
    assert attrs.size == len(content)
    assert attrs.hash == object_hash(content)
    assert list(attrs.chunks) == chunk_buffer(content)
    assert store.read(key) == content


def test_put_then_read_and_stat(store: ObjectStore, root: Path) -> None:
    attrs = store.put("logs/2026/a.txt", b"hello world")
    assert (attrs.key, attrs.size, attrs.hash) == (
        "logs/2026/a.txt",
        11,
        object_hash(b"hello world"),
    )
    assert (root / "logs" / "2026" / "a.txt").read_bytes() == b"hello world"  # a real file
    assert store.read("logs/2026/a.txt", 6, 5) == b"world"
    assert store.read("logs/2026/a.txt", 6) == b"world"
    assert store.read("logs/2026/a.txt", 11, 5) == b""
    assert store.read("logs/2026/a.txt", 100) == b""
    assert store.stat("logs/2026/a.txt") == attrs


def test_versions_increase_on_every_change_and_are_never_reused(store: ObjectStore) -> None:
    seen = [store.put("k", b"1").version]
    seen.append(store.write("k", 1, b"2").version)
    seen.append(store.truncate("k", 1).version)
    seen.append(store.put("k", b"3").version)
    store.remove("k")
    seen.append(store.put("k", b"4").version)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert store.stat("k").version == seen[-1]


def test_mtime_moves_forward(store: ObjectStore) -> None:
    a = store.put("k", b"1")
    b = store.write("k", 0, b"2")
    assert b.mtime_ns >= a.mtime_ns > 0


def test_range_write_extends_with_zeros_and_keeps_attrs_exact(store: ObjectStore) -> None:
    store.put("k", b"abc")
    r = store.write("k", 6, b"xyz")
    assert (r.size, store.read("k")) == (9, b"abc\0\0\0xyz")
    _check_attrs(store, "k", b"abc\0\0\0xyz")


def test_write_to_missing_object_needs_create(store: ObjectStore) -> None:
    with pytest.raises(NotFoundError, match="create=True"):
        store.write("new", 0, b"x")
    store.write("dir/new", 2, b"x", create=True)
    _check_attrs(store, "dir/new", b"\0\0x")


def test_empty_write_past_the_end_does_not_extend(store: ObjectStore) -> None:
    store.put("k", b"ab")
    r = store.write("k", 10, b"")
    assert r.size == 2
    _check_attrs(store, "k", b"ab")


def test_large_object_range_writes_keep_chunks_exact(store: ObjectStore) -> None:
    content = bytearray(os.urandom(3 * 1024 * 1024))
    store.put("big", bytes(content))
    for offset, data in [(1_000_000, b"x" * 5000), (0, b"head"), (len(content) - 2, b"tail!")]:
        store.write("big", offset, data)
        end = offset + len(data)
        content[offset:end] = data
    _check_attrs(store, "big", bytes(content))
    stats = store.stats()
    assert stats["chunks_reused"] > 0
    assert stats["bytes_rechunked"] < len(content)  # not rehashed from scratch each time


def test_truncate_cuts_and_extends(store: ObjectStore) -> None:
    store.put("k", b"0123456789")
    assert store.truncate("k", 4).size == 4
    _check_attrs(store, "k", b"0123")
    store.truncate("k", 6)
    _check_attrs(store, "k", b"0123\0\0")
    store.truncate("k", 0)
    _check_attrs(store, "k", b"")
    with pytest.raises(InvalidArgumentError):
        store.truncate("k", -1)
    with pytest.raises(NotFoundError):
        store.truncate("missing", 1)


def test_create_exclusive_and_not(store: ObjectStore) -> None:
    a = store.create("c")
    assert (a.size, a.hash) == (0, object_hash(b""))
    with pytest.raises(AlreadyExistsError, match="already exists"):
        store.create("c")
    store.write("c", 0, b"data")
    assert store.create("c", exclusive=False).size == 4  # left as it was


def test_remove_and_remove_many(store: ObjectStore, root: Path) -> None:
    store.put("a/b/c", b"1")
    store.put("a/d", b"2")
    store.remove("a/b/c")
    with pytest.raises(NotFoundError):
        store.stat("a/b/c")
    with pytest.raises(NotFoundError):
        store.remove("a/b/c")
    assert store.remove_many(["a/d", "a/d", "zz"]) == [True, False, False]
    store.checkpoint()
    assert os.listdir(root) == [".shuttle"]  # empty directories are pruned


def test_conditional_operations(store: ObjectStore) -> None:
    v1 = store.put("k", b"1", expected_version=0).version
    with pytest.raises(VersionMismatchError, match="expected not to exist"):
        store.put("k", b"x", expected_version=0)
    with pytest.raises(VersionMismatchError, match=f"is at version {v1}"):
        store.write("k", 0, b"x", expected_version=v1 + 1000)
    v2 = store.write("k", 0, b"2", expected_version=v1).version
    with pytest.raises(VersionMismatchError):
        store.truncate("k", 0, expected_version=v1)
    with pytest.raises(VersionMismatchError):
        store.remove("k", expected_version=v1)
    with pytest.raises(VersionMismatchError):
        store.read("k", expected_version=v1)
    assert store.read("k", expected_version=v2) == b"2"
    with pytest.raises(VersionMismatchError, match="does not exist"):
        store.put("other", b"x", expected_version=5)
    assert store.read("k") == b"2"


def test_stat_many(store: ObjectStore) -> None:
    store.put("a", b"1")
    store.put("b", b"22")
    out = store.stat_many(["a", "missing", "b"])
    assert [None if x is None else x.size for x in out] == [1, None, 2]


def test_put_from_an_iterable_of_pieces(store: ObjectStore) -> None:
    pieces = [os.urandom(300_000) for _ in range(10)]  # 3 MB: spills to a staging file
    attrs = store.put("streamed", iter(pieces))
    _check_attrs(store, "streamed", b"".join(pieces))
    assert attrs.hash == object_hash(b"".join(pieces))
    store.put("small", iter([b"a", b"b"]))
    assert store.read("small") == b"ab"


def test_upload_session_is_invisible_until_commit(store: ObjectStore) -> None:
    store.put("obj", b"old")
    up = store.begin_upload("obj")
    part = os.urandom(1 << 20)
    store.upload_write(up, len(part), part)  # out of order
    store.upload_write(up, 0, part)
    assert store.read("obj") == b"old"
    attrs = store.commit_upload(up)
    assert attrs.size == 2 << 20
    _check_attrs(store, "obj", part + part)
    with pytest.raises(NotFoundError, match="no open upload"):
        store.upload_write(up, 0, b"x")
    assert os.listdir(store.layout.uploads_dir) == []


def test_upload_abort_and_version_check_at_commit(store: ObjectStore) -> None:
    up = store.begin_upload("obj")
    store.upload_write(up, 0, b"data")
    store.abort_upload(up)
    with pytest.raises(NotFoundError):
        store.commit_upload(up)
    up = store.begin_upload("obj", expected_version=0)
    store.upload_write(up, 0, b"mine")
    store.put("obj", b"theirs")
    with pytest.raises(VersionMismatchError):
        store.commit_upload(up)
    assert store.read("obj") == b"theirs"
    assert os.listdir(store.layout.uploads_dir) == []


def test_idle_uploads_expire(store: ObjectStore) -> None:
    store.begin_upload("a")
    assert store.expire_uploads(idle_s=3600) == 0
    assert store.expire_uploads(idle_s=0) == 1
    assert store.stats()["uploads_open"] == 0


def test_limits_and_bad_arguments(store: ObjectStore) -> None:
    store.put("k", b"x")
    with pytest.raises(LimitExceededError, match="upload session"):
        store.write("k", 0, bytes(WRITE_BYTES_MAX + 1))
    with pytest.raises(InvalidArgumentError):
        store.write("k", -1, b"x")
    with pytest.raises(InvalidArgumentError):
        store.read("k", -1)


def test_listing_with_prefix_delimiter_and_pages(store: ObjectStore) -> None:
    keys = ["a-b", "a.txt", "a/x", "a/y/z", "a0", "b.txt", "logs/2026/a", "logs/2026/b", "logs/x"]
    for k in keys:
        store.put(k, b".")
    assert store.list().keys == sorted(keys)
    top = store.list(delimiter="/")
    assert (top.keys, top.prefixes) == (["a-b", "a.txt", "a0", "b.txt"], ["a/", "logs/"])
    assert store.list("logs/", delimiter="/").prefixes == ["logs/2026/"]
    assert store.list("logs/2026/").keys == ["logs/2026/a", "logs/2026/b"]
    assert store.list("logs/20").keys == ["logs/2026/a", "logs/2026/b"]
    assert store.list("nope/").keys == []
    got, after = [], None
    while True:
        page = store.list(limit=3, start_after=after)
        got += page.keys
        after = page.next_start_after
        if after is None:
            break
    assert got == sorted(keys)
    with pytest.raises(InvalidArgumentError):
        store.list(delimiter=",")


def test_listing_skips_internal_dir_and_foreign_entries(store: ObjectStore, root: Path) -> None:
    store.put("k", b"1")
    os.mkdir(root / "empty")
    (root / "bad\nname").write_bytes(b"x")
    os.symlink("/etc/passwd", root / "link")
    listing = store.list(delimiter="/")
    assert (listing.keys, listing.prefixes) == (["k"], [])


def test_files_copied_in_by_an_operator_are_adopted(store: ObjectStore, root: Path) -> None:
    (root / "dropped").mkdir()
    (root / "dropped" / "f.bin").write_bytes(b"from outside")
    assert store.list().keys == ["dropped/f.bin"]
    attrs = store.stat("dropped/f.bin")
    assert attrs.version > 0
    _check_attrs(store, "dropped/f.bin", b"from outside")
    assert store.stats()["adopted_objects"] == 1


def test_cache_serves_repeated_reads_and_follows_writes(store: ObjectStore) -> None:
    store.put("k", bytes(range(256)) * 64)  # 16 KiB, 4 blocks of 4 KiB
    store.read("k", 0, 4096)
    store.read("k", 0, 4096)
    c = store.stats()["cache"]
    assert (c["hits"], c["misses"]) == (1, 1)
    store.write("k", 10, b"NEW")
    assert store.read("k", 0, 16) == bytes(range(10)) + b"NEW" + bytes(range(13, 16))
    store.truncate("k", 5)
    assert store.read("k", 0, 4096) == bytes(range(5))
    store.put("k", b"replaced")
    assert store.read("k") == b"replaced"
    store.cache.clear()
    assert store.stats()["cache"]["blocks_cached"] == 0


def test_large_reads_bypass_the_cache(root: Path) -> None:
    cfg = StoreConfig(cache_capacity_bytes=1 << 20, cache_read_bytes_max=4096)
    with ObjectStore(root, cfg) as store:
        store.put("k", bytes(100_000))
        store.read("k")
        assert store.stats()["cache"]["misses"] == 0
        store.read("k", 0, 100)
        assert store.stats()["cache"]["misses"] == 1


def test_counters(store: ObjectStore) -> None:
    store.put("k", b"12345")
    store.read("k")
    with pytest.raises(NotFoundError):
        store.read("missing")
    s = store.stats()
    assert s["ops"]["put"] == 1 and s["ops"]["read"] == 2
    assert s["errors"] == {"not_found": 1}
    assert (s["bytes_written"], s["bytes_read"]) == (5, 5)
    assert s["journal"]["records"] == 1


def test_second_opener_is_refused(store: ObjectStore, root: Path) -> None:
    with pytest.raises(StorageIOError, match="already open"):
        ObjectStore(root)


def test_closed_store_refuses_changes(root: Path) -> None:
    s = ObjectStore(root)
    s.close()
    s.close()
    with pytest.raises(StorageIOError, match="closed"):
        s.put("k", b"x")


def test_concurrent_writers_and_readers(store: ObjectStore) -> None:
    """Threads hammer a few keys; every read sees a whole write (never a mix)."""
    keys = ["t/a", "t/b"]
    for k in keys:
        store.put(k, b"0" * 4096)
    errors: list[str] = []

    def writer(n: int) -> None:
        for i in range(40):
            fill = str((n + i) % 10).encode() * 4096
            if i % 3 == 0:
                store.put(keys[i % 2], fill)
            else:
                store.write(keys[i % 2], 0, fill)

    def reader() -> None:
        for i in range(200):
            data = store.read(keys[i % 2])
            if len(set(data)) != 1:
                errors.append(f"torn read: {sorted(set(data))}")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in keys:
        _check_attrs(store, k, store.read(k))
    s = store.stats()["journal"]
    assert s["records"] == 2 + 120


def test_stat_is_cached_tells_when_stat_needs_no_disk(store: ObjectStore) -> None:
    assert not store.stat_is_cached("k")
    store.put("k", os.urandom(100_000))
    assert store.stat_is_cached("k")
    store.write("k", 10, b"x")
    assert not store.stat_is_cached("k")  # the whole-object hash is pending
    store.stat("k")
    assert store.stat_is_cached("k")
    assert not store.stat_is_cached("../bad")
