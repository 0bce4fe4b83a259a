"""File objects over remote objects: a seekable reader over one version, and a writer
whose object appears, whole, when it closes (and never if it fails)."""

from __future__ import annotations

import io
import os

import pytest

from shuttle.client import Client
from shuttle.client.files import RemoteWriter
from shuttle.errors import InvalidArgumentError, NotFoundError
from shuttle.testing import MemoryNode

DATA = os.urandom(10_000)  # ten 1 KiB cache blocks; 4 KiB pieces when streaming


def test_read_seek_tell_and_readinto(client: Client) -> None:
    client.put("k", DATA)
    with client.open("k") as f:
        assert f.readable() and f.seekable() and not f.writable()
        assert f.read(100) == DATA[:100] and f.tell() == 100
        assert f.seek(-50, os.SEEK_END) == len(DATA) - 50
        assert f.read() == DATA[-50:] and f.read() == b""  # at the end: empty, no error
        f.seek(1000)
        assert f.seek(24, os.SEEK_CUR) == 1024
        buf = bytearray(3000)
        assert f.readinto(buf) == 3000 and bytes(buf) == DATA[1024:4024]
        with pytest.raises(InvalidArgumentError, match="before the start"):
            f.seek(-1)
    with pytest.raises(ValueError):
        f.read(1)  # closed (io's own error, as for any closed file)


def test_buffered_wrappers_work_over_the_raw_file(client: Client) -> None:
    client.put("lines", b"one\ntwo\nthree\n")
    with io.TextIOWrapper(io.BufferedReader(client.open("lines"))) as text:
        assert text.readlines() == ["one\n", "two\n", "three\n"]


def test_without_a_cache_reads_stream_from_the_node(node: MemoryNode) -> None:
    with MemoryNode.client([node], cache_bytes=0, piece_bytes=4096) as client:
        client.put("k", DATA)
        with client.open("k") as f:
            assert f.read() == DATA
        assert node.served["read"] == 3  # 10,000 bytes in 4 KiB pieces
        assert client.counters()["cache_misses"] == 0


def test_a_missing_object_fails_at_open(client: Client) -> None:
    with pytest.raises(NotFoundError):
        client.open("absent")


def test_a_writer_sends_pieces_and_the_object_appears_at_close(
    client: Client, node: MemoryNode
) -> None:
    with client.open("k", "wb") as f:
        assert f.writable() and not f.readable()
        for start in range(0, len(DATA), 3000):
            f.write(DATA[start : start + 3000])
        assert node.served["upload.write"] == 2  # two whole 4 KiB pieces so far
        with pytest.raises(NotFoundError):
            client.stat("k")  # nothing visible before the commit
    assert node.served["upload.write"] == 3 and node.served["upload.commit"] == 1
    assert client.get("k") == DATA
    assert isinstance(f, RemoteWriter) and f.info is not None and f.info.size == len(DATA)


def test_a_failed_writer_leaves_the_old_object(client: Client, node: MemoryNode) -> None:
    client.put("k", b"old")
    with pytest.raises(RuntimeError), client.open("k", "wb") as f:
        f.write(DATA)
        raise RuntimeError("the writer fails half way")
    assert node.served["upload.abort"] == 1 and node.served["upload.commit"] == 0
    assert client.get("k") == b"old"
    with pytest.raises(ValueError):
        f.write(b"more")  # closed


def test_a_writer_replacing_an_object_invalidates_the_readers_cache(client: Client) -> None:
    client.put("k", b"A" * 2000)
    with client.open("k") as f:
        f.read()
    with client.open("k", "wb") as w:
        w.write(b"B" * 2000)
    with client.open("k") as f:
        assert f.read() == b"B" * 2000


def test_modes_other_than_rb_and_wb_are_refused(client: Client) -> None:
    with pytest.raises(InvalidArgumentError, match="'rb' or 'wb'"):
        client.open("k", "a")
