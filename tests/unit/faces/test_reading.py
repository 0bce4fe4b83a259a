"""A face never hands a program bytes or attributes from a stale speculative open."""

from __future__ import annotations

import pytest

from shuttle.client import Client
from shuttle.client.files import RemoteReader
from shuttle.errors import NotFoundError, StaleDataError, VersionMismatchError
from shuttle.faces import reading
from shuttle.faces.reading import confirmed_info, open_reader, read_confirmed
from shuttle.testing import MemoryNode


def test_a_stale_speculative_open_is_replaced_before_its_bytes_are_returned(
    node: MemoryNode, client: Client
) -> None:
    with MemoryNode.client([node], validation="speculative") as face:
        client.put("k", b"old")
        reader = open_reader(face, "k", "speculative")
        assert read_confirmed(reader, 0, 10, "speculative", first=True)[1] == b"old"  # now cached
        reader.close()
        client.put("k", b"newer")  # another client: the face's copy is stale
        reader = open_reader(face, "k", "speculative")
        assert reader.info.size == 3  # opened on the cached copy, check still out
        fresh_reader, data = read_confirmed(reader, 0, 10, "speculative", first=True)
        assert data == b"newer"
        assert fresh_reader is not reader and fresh_reader.info.size == 5
        fresh_reader.close()


def test_attributes_are_confirmed(node: MemoryNode, client: Client) -> None:
    with MemoryNode.client([node], validation="speculative") as face:
        client.put("k", b"old")
        read_confirmed(open_reader(face, "k", None), 0, 3, None, first=True)[0].close()
        client.put("k", b"newer")
        assert confirmed_info(face.validation_mode(), face, "k").size == 5


def test_a_writer_racing_every_reopen_is_an_error_not_bytes_of_another_version(
    node: MemoryNode, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each open finds the copy stale and a put lands right after each reopen: the
    face gives up with ESTALE (``VersionMismatchError``) instead of handing out bytes
    of a version the reader it keeps for the next reads is not pinned to."""
    client.put("k", b"v0")
    checks = 0
    real_checkpoint, real_open = RemoteReader.checkpoint, reading.open_reader

    def stale_checkpoint(reader: RemoteReader) -> None:
        nonlocal checks
        checks += 1
        if checks <= reading.STALE_RETRIES_MAX:
            raise StaleDataError("the test's writer changed it")
        real_checkpoint(reader)

    def open_then_change(face: Client, key: str, validation: str | None) -> RemoteReader:
        reader = real_open(face, key, validation)
        client.put(key, f"v{checks + 1}".encode())  # another client, just after the open
        return reader

    with MemoryNode.client([node]) as face:
        first = real_open(face, "k", None)
        monkeypatch.setattr(RemoteReader, "checkpoint", stale_checkpoint)
        monkeypatch.setattr(reading, "open_reader", open_then_change)
        with pytest.raises(VersionMismatchError):
            read_confirmed(first, 0, 10, None, first=True)


def test_a_file_removed_before_a_reopen_stays_not_found(
    node: MemoryNode, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object changes (the first read is stale, the reader closed) and is removed
    before the reopen: that read and the next of the same handle say "not found"
    (ENOENT), never "closed file" (EIO)."""
    client.put("k", b"v1")
    real_open = reading.open_reader

    def removed_first(c: Client, key: str, validation: str | None) -> RemoteReader:
        client.remove_many([key])
        return real_open(c, key, validation)

    with MemoryNode.client([node]) as face:
        reader = open_reader(face, "k", None)
        client.put("k", b"v2")  # the reader's version is gone: its read is stale
        monkeypatch.setattr(reading, "open_reader", removed_first)
        for _ in range(2):
            with pytest.raises(NotFoundError):
                read_confirmed(reader, 0, 2, None, first=True)
        assert reader.closed
