"""Data round trips through a real node process over 127.0.0.1."""

from __future__ import annotations

import hashlib
import os

import blake3
import pytest

import shuttle
from shuttle.errors import AlreadyExistsError, NotFoundError, VersionMismatchError
from tests.integration.nodeproc import NodeProcess


def test_put_get_empty_and_small_objects(client: shuttle.Client) -> None:
    empty = client.put("empty", b"")
    assert empty.size == 0 and client.get("empty") == b""
    assert empty.hash == blake3.blake3(b"").digest()
    info = client.put("dir/small.txt", b"hello shuttle\n")
    assert client.get("dir/small.txt") == b"hello shuttle\n"
    assert info.hash == blake3.blake3(b"hello shuttle\n").digest()
    assert client.stat("dir/small.txt").version == info.version


def test_large_object_streams_both_ways_intact(client: shuttle.Client) -> None:
    size = 256 << 20
    # Incompressible, reproducible content without holding two copies in Python.
    block = os.urandom(1 << 20)
    pieces = (block[i % 7 :] + block[: i % 7] for i in range(size >> 20))
    want = hashlib.sha256()
    sent = 0

    def source():  # type: ignore[no-untyped-def]
        nonlocal sent
        for piece in pieces:
            want.update(piece)
            sent += len(piece)
            yield piece

    info = client.put("big/blob.bin", source())
    assert info.size == size == sent
    assert len(info.chunks) > 1000  # ~64 KiB content-defined chunks
    got = hashlib.sha256()
    n = 0
    for piece in client.iter_read("big/blob.bin"):
        got.update(piece)
        n += len(piece)
    assert n == size and got.digest() == want.digest()
    # A range in the middle, across a piece boundary.
    mid = client.read("big/blob.bin", (3 << 20) - 10, 20)
    expect = (block[2:] + block[:2])[-10:] + (block[3:] + block[:3])[:10]
    assert mid == expect


def test_range_write_truncate_and_versions(client: shuttle.Client) -> None:
    v1 = client.put("r", b"0123456789").version
    w = client.write("r", 4, b"ab")
    assert w.version > v1 and w.size == 10
    assert client.get("r") == b"0123ab6789"
    w2 = client.write("r", 12, b"Z")  # past the end: the gap reads as zeros
    assert client.get("r") == b"0123ab6789\0\0Z" and w2.version > w.version
    client.truncate("r", 3)
    assert client.get("r") == b"012"
    with pytest.raises(VersionMismatchError):
        client.write("r", 0, b"x", expected_version=v1)
    assert client.get("r") == b"012"  # the refused write changed nothing


def test_create_remove_and_not_found(client: shuttle.Client) -> None:
    client.create("c")
    with pytest.raises(AlreadyExistsError):
        client.create("c")
    client.remove("c")
    with pytest.raises(NotFoundError, match="no object"):
        client.stat("c")
    with pytest.raises(NotFoundError):
        client.get("c")
    assert client.remove_many(["c", "nope"]) == [False, False]


def test_listing_by_prefix_gives_directories(client: shuttle.Client) -> None:
    for key in ("logs/2026/a.txt", "logs/2026/b.txt", "logs/2025/c.txt", "logs/top", "other"):
        client.put(key, key.encode())
    assert list(client.list("logs/")) == [
        "logs/2025/c.txt",
        "logs/2026/a.txt",
        "logs/2026/b.txt",
        "logs/top",
    ]
    prefixes, keys = client.listdir("logs/")
    assert prefixes == ["logs/2025/", "logs/2026/"] and keys == ["logs/top"]


def test_listing_pages_through_many_keys(client: shuttle.Client) -> None:
    keys = [f"many/{i:05d}" for i in range(2500)]
    for key in keys:
        client.put(key, b"x")
    assert list(client.list("many/")) == keys


def test_objects_are_real_files_an_operator_can_read(
    node: NodeProcess, client: shuttle.Client
) -> None:
    client.put("logs/2026/a.txt", b"visible")
    assert (node.data_dir / "logs" / "2026" / "a.txt").read_bytes() == b"visible"


def test_client_cache_is_validated_on_open(node: NodeProcess) -> None:
    reader = shuttle.connect(node=node.address)
    writer = shuttle.connect(node=node.address)
    writer.put("cached", b"A" * 200_000)
    with reader.open("cached") as f:
        assert f.read() == b"A" * 200_000
    misses = reader.cache.stats()["misses"]
    with reader.open("cached") as f:  # same version: served from the cache
        assert f.read() == b"A" * 200_000
        assert f.cache_was_valid  # type: ignore[attr-defined]
    assert reader.cache.stats()["misses"] == misses
    writer.write("cached", 0, b"B")
    with reader.open("cached") as f:  # changed on the node: the open notices
        assert not f.cache_was_valid  # type: ignore[attr-defined]
        assert f.read(3) == b"BAA"
    assert reader.cache.stats()["validations_invalidated"] == 1
    reader.close()
    writer.close()


def test_file_writer_commits_on_close_and_aborts_on_error(client: shuttle.Client) -> None:
    with client.open("w", "wb") as f:
        f.write(b"x" * 3_000_000)
        f.write(b"y")
    assert client.stat("w").size == 3_000_001
    with pytest.raises(RuntimeError), client.open("w", "wb") as f:
        f.write(b"partial")
        raise RuntimeError("writer failed")
    assert client.stat("w").size == 3_000_001  # the failed writer replaced nothing


def test_data_survives_a_clean_restart(node: NodeProcess) -> None:
    c = shuttle.connect(node=node.address)
    c.put("keep/me", b"durable")
    assert node.terminate() == 0
    node.start()
    assert c.get("keep/me") == b"durable"  # the client reconnects by itself
    c.close()
