"""The contract of :class:`shuttle.store.interface.Store`, checked on every store."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    InvalidKeyError,
    LimitExceededError,
    NotFoundError,
    VersionMismatchError,
)
from shuttle.store import chunk_buffer, object_hash
from shuttle.store.interface import Store
from shuttle.store.objects import WRITE_BYTES_MAX


def _check_attrs(store: Store, key: str, content: bytes) -> None:
    attrs = store.stat(key)
    assert attrs.size == len(content)
    assert attrs.hash == object_hash(content)
    assert list(attrs.chunks) == chunk_buffer(content)
    assert store.read(key) == content


def test_put_then_read_and_stat(store: Store) -> None:
    attrs = store.put("logs/2026/a.txt", b"hello world")
    assert (attrs.key, attrs.size, attrs.hash) == (
        "logs/2026/a.txt",
        11,
        object_hash(b"hello world"),
    )
    assert store.read("logs/2026/a.txt", 6, 5) == b"world"
    assert store.read("logs/2026/a.txt", 6) == b"world"
    assert store.read("logs/2026/a.txt", 11, 5) == b""
    assert store.read("logs/2026/a.txt", 100) == b""
    assert store.read("logs/2026/a.txt", 0, 0) == b""
    assert store.stat("logs/2026/a.txt") == attrs
    with pytest.raises(NotFoundError):
        store.read("missing", 0, 10)
    with pytest.raises(NotFoundError):
        store.stat("missing")


def test_reads_bypassing_the_cache_agree(store: Store) -> None:
    data = os.urandom(300_000)
    store.put("k", data)
    assert store.read("k", 1000, 5000, use_cache=False) == data[1000:6000]
    assert store.read("k", 1000, 5000) == data[1000:6000]
    assert store.read("k", 299_990, 100, use_cache=False) == data[299_990:]


def test_keys_are_validated(store: Store) -> None:
    for bad in ["", "/abs", "a/../b", "dir/", ".shuttle/x", "a\nb"]:
        with pytest.raises(InvalidKeyError):
            store.put(bad, b"x")


def test_versions_increase_on_every_change_and_are_never_reused(store: Store) -> None:
    seen = [store.put("k", b"1").version]
    seen.append(store.write("k", 1, b"2").version)
    seen.append(store.truncate("k", 1).version)
    seen.append(store.put("k", b"3").version)
    store.remove("k")
    seen.append(store.put("k", b"4").version)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert store.stat("k").version == seen[-1]


def test_mtime_moves_forward(store: Store) -> None:
    a = store.put("k", b"1")
    b = store.write("k", 0, b"2")
    assert b.mtime_ns >= a.mtime_ns > 0


def test_an_mtime_given_is_recorded_and_set_mtime_keeps_the_contents(store: Store) -> None:
    """What utime, touch -d and rsync -t need: a put or commit with a given time, and a
    time set on an object as a change of its own (a new version, the same bytes)."""
    put = store.put("k", b"contents", mtime_ns=1_500_000_000_123_456_789)
    assert store.stat("k").mtime_ns == put.mtime_ns == 1_500_000_000_123_456_789
    touched = store.set_mtime("k", 981_173_106 * 10**9)
    assert touched.version > put.version
    assert (touched.mtime_ns, touched.size, touched.hash, touched.chunks) == (
        981_173_106 * 10**9,
        put.size,
        put.hash,
        put.chunks,
    )
    assert store.stat("k") == touched and store.read("k") == b"contents"
    with pytest.raises(VersionMismatchError):
        store.set_mtime("k", 1, expected_version=put.version)
    with pytest.raises(NotFoundError):
        store.set_mtime("missing", 1)
    with pytest.raises(InvalidArgumentError):
        store.set_mtime("k", -1)
    upload = store.begin_upload("big")
    store.upload_write(upload, 0, b"z" * 100_000)
    assert store.commit_upload(upload, mtime_ns=10**18).mtime_ns == 10**18
    assert store.stat("big").mtime_ns == 10**18


def test_range_write_extends_with_zeros_and_keeps_attrs_exact(store: Store) -> None:
    store.put("k", b"abc")
    r = store.write("k", 6, b"xyz")
    assert (r.size, store.read("k")) == (9, b"abc\0\0\0xyz")
    _check_attrs(store, "k", b"abc\0\0\0xyz")


def test_write_to_missing_object_needs_create(store: Store) -> None:
    with pytest.raises(NotFoundError, match="create=True"):
        store.write("new", 0, b"x")
    store.write("dir/new", 2, b"x", create=True)
    _check_attrs(store, "dir/new", b"\0\0x")


def test_empty_write_past_the_end_does_not_extend(store: Store) -> None:
    store.put("k", b"ab")
    assert store.write("k", 10, b"").size == 2
    _check_attrs(store, "k", b"ab")


def test_large_object_range_writes_keep_chunks_exact(store: Store) -> None:
    content = bytearray(os.urandom(3 * 1024 * 1024))
    store.put("big", bytes(content))
    for offset, data in [(1_000_000, b"x" * 5000), (0, b"head"), (len(content) - 2, b"tail!")]:
        store.write("big", offset, data)
        content[offset : offset + len(data)] = data
    _check_attrs(store, "big", bytes(content))


def test_truncate_cuts_and_extends(store: Store) -> None:
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


def test_create_exclusive_and_not(store: Store) -> None:
    a = store.create("c")
    assert (a.size, a.hash) == (0, object_hash(b""))
    with pytest.raises(AlreadyExistsError, match="already exists"):
        store.create("c")
    store.write("c", 0, b"data")
    assert store.create("c", exclusive=False).size == 4  # left as it was


def test_remove_and_remove_many(store: Store) -> None:
    store.put("a/b/c", b"1")
    store.put("a/d", b"2")
    store.remove("a/b/c")
    with pytest.raises(NotFoundError):
        store.stat("a/b/c")
    with pytest.raises(NotFoundError):
        store.remove("a/b/c")
    assert store.remove_many(["a/d", "a/d", "zz"]) == [True, False, False]
    assert store.list().keys == []


def test_conditional_operations(store: Store) -> None:
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
    with pytest.raises(VersionMismatchError):
        store.read("k", 0, 1, expected_version=v1)
    with pytest.raises(VersionMismatchError):
        store.stat("k", expected_version=v1)
    assert store.read("k", expected_version=v2) == b"2"
    with pytest.raises(VersionMismatchError, match="does not exist"):
        store.put("other", b"x", expected_version=5)
    assert store.read("k") == b"2"


def test_stat_many(store: Store) -> None:
    store.put("a", b"1")
    store.put("b", b"22")
    out = store.stat_many(["a", "missing", "b"])
    assert [None if x is None else x.size for x in out] == [1, None, 2]


def test_put_from_an_iterable_of_pieces(store: Store) -> None:
    pieces = [os.urandom(300_000) for _ in range(10)]
    attrs = store.put("streamed", iter(pieces))
    _check_attrs(store, "streamed", b"".join(pieces))
    assert attrs.hash == object_hash(b"".join(pieces))


def test_streaming_reads_of_a_large_object(store: Store) -> None:
    data = os.urandom(20 << 20)  # several aio pieces on RADOS
    store.put("big", data)
    assert store.read("big") == data
    assert store.read("big", 5 << 20, 9 << 20) == data[5 << 20 : 14 << 20]


def test_upload_session_is_invisible_until_commit(store: Store) -> None:
    store.put("obj", b"old")
    up = store.begin_upload("obj")
    assert store.uploads.get(up).key == "obj"
    part = os.urandom(1 << 20)
    store.upload_write(up, len(part), part)  # out of order
    store.upload_write(up, 0, part)
    assert store.read("obj") == b"old"
    assert store.commit_upload(up).size == 2 << 20
    _check_attrs(store, "obj", part + part)
    with pytest.raises(NotFoundError, match="no open upload"):
        store.upload_write(up, 0, b"x")


def test_upload_abort_release_and_version_check_at_commit(store: Store) -> None:
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
    store.begin_upload("x", owner=7)
    assert store.uploads_owned_by(7) == 1
    assert store.release_uploads(7) == 1
    store.begin_upload("y")
    assert store.expire_uploads(idle_s=3600) == 0
    assert store.expire_uploads(idle_s=0) == 1
    assert store.stats()["uploads_open"] == 0


def test_limits_and_bad_arguments(store: Store) -> None:
    store.put("k", b"x")
    with pytest.raises(LimitExceededError, match="upload session"):
        store.write("k", 0, bytes(WRITE_BYTES_MAX + 1))
    with pytest.raises(InvalidArgumentError):
        store.write("k", -1, b"x")
    with pytest.raises(InvalidArgumentError):
        store.read("k", -1)


def test_listing_with_prefix_delimiter_and_pages(store: Store) -> None:
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
    for limit in (1, 2, 3):
        got, after = [], None
        while True:
            page = store.list(limit=limit, start_after=after)
            got += page.keys
            after = page.next_start_after
            if after is None:
                break
        assert got == sorted(keys)
    got, after = [], None
    while True:  # pages of a delimited listing resume after a prefix too
        page = store.list(delimiter="/", limit=1, start_after=after)
        got += page.keys + page.prefixes
        after = page.next_start_after
        if after is None:
            break
    assert got == ["a-b", "a.txt", "a/", "a0", "b.txt", "logs/"]
    with pytest.raises(InvalidArgumentError):
        store.list(delimiter=",")


def test_cache_follows_changes(store: Store) -> None:
    store.put("k", b"a" * 10_000)
    assert store.read("k", 0, 100) == b"a" * 100
    assert store.read("k", 0, 100) == b"a" * 100
    assert store.stats()["cache"]["hits"] > 0
    store.write("k", 50, b"b")
    assert store.read("k", 0, 100) == b"a" * 50 + b"b" + b"a" * 49
    store.put("k", b"c" * 10)
    assert store.read("k", 0, 100) == b"c" * 10
    dropped = store.drop_caches([])
    assert dropped["block_cache_bytes_dropped"] > 0
    assert store.read("k", 0, 100) == b"c" * 10


def test_concurrent_writers_and_readers(store: Store) -> None:
    """Threads hammer a few keys; every read sees a whole write (never a mix)."""
    keys = ["t/a", "t/b"]
    for k in keys:
        store.put(k, b"0" * 4096)
    errors: list[str] = []

    def writer(n: int) -> None:
        for i in range(15):
            fill = str((n + i) % 10).encode() * 4096
            if i % 3 == 0:
                store.put(keys[i % 2], fill)
            else:
                store.write(keys[i % 2], 0, fill)

    def reader() -> None:
        for i in range(60):
            data = store.read(keys[i % 2], 0, 4096)
            if len(set(data)) != 1:
                errors.append(f"torn read: {sorted(set(data))}")

    def caught(body: Callable[..., None], *args: int) -> None:
        try:
            body(*args)
        except Exception as exc:  # a thread's exception is only a warning to pytest
            errors.append(f"{body.__name__}: {exc!r}")

    threads = [threading.Thread(target=caught, args=(writer, n)) for n in range(3)]
    threads += [threading.Thread(target=caught, args=(reader,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for k in keys:
        _check_attrs(store, k, store.read(k))
