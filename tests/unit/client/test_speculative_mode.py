"""The ``speculative`` validation mode for a plain ``open``: it returns at once on the
cached copy while the check is out; ``checkpoint()`` and ``close()`` wait for the
check and raise ``StaleDataError`` if the copy was stale."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from shuttle.client import Client
from shuttle.client.files import RemoteReader
from shuttle.errors import StaleDataError, VersionMismatchError
from shuttle.testing import MemoryNode
from tests.unit.client.speculation_helpers import KEY, gated_client

OLD = b"old " * 2000
NEW = b"new " * 2500


@pytest.fixture
def hooks() -> dict[str, Callable[[], None]]:
    return {}


@pytest.fixture
def reader(node: MemoryNode, hooks: dict[str, Callable[[], None]]) -> Iterator[Client]:
    with gated_client(node, hooks) as client:
        client.put(KEY, OLD)
        with client.open(KEY, validation="speculative") as f:  # no copy: checks first
            assert f.read() == OLD
        yield client


def _open(client: Client) -> RemoteReader:
    f = client.open(KEY, validation="speculative")
    assert isinstance(f, RemoteReader)
    return f


def test_open_returns_on_the_cached_copy_before_the_check_is_answered(
    reader: Client, hooks: dict[str, Callable[[], None]]
) -> None:
    asked = threading.Event()
    answer = threading.Event()

    def held() -> None:
        asked.set()
        assert answer.wait(5)

    hooks["stat"] = held
    f = _open(reader)
    assert f.read() == OLD  # served from the cache while the check is still held
    assert asked.wait(5) and not answer.is_set()
    answer.set()
    f.checkpoint()  # the copy was current: passes
    f.close()
    stats = reader.counters()["validation"]["speculative"]
    assert stats["opens_checked"] == 1 and stats["opens_stale"] == 0


def test_a_stale_copy_fails_at_the_checkpoint_and_at_close(
    reader: Client, node: MemoryNode
) -> None:
    with MemoryNode.client([node]) as writer:
        writer.put(KEY, NEW)
    f = _open(reader)
    assert f.read(4) == b"old "  # what the cached copy says: not to be acted on
    with pytest.raises(StaleDataError, match="open the object again") as raised:
        f.checkpoint()
    assert isinstance(raised.value, VersionMismatchError)
    f.close()  # already reported: closing does not raise twice
    stats = reader.counters()["validation"]["speculative"]
    assert stats["opens_checked"] == 1 and stats["opens_stale"] == 1
    with reader.open(KEY, validation="speculative") as g:  # known stale: checks first
        assert g.read() == NEW
    with reader.open(KEY, validation="speculative") as h:  # a current copy again
        assert h.read() == NEW
    stats = reader.counters()["validation"]["speculative"]
    assert stats["opens_checked"] == 2 and stats["opens_stale"] == 1


def test_close_raises_for_a_program_that_never_called_checkpoint(
    reader: Client, node: MemoryNode
) -> None:
    with MemoryNode.client([node]) as writer:
        writer.put(KEY, NEW)
    with pytest.raises(StaleDataError), reader.open(KEY, validation="speculative") as f:
        assert f.read() == OLD  # one consistent (stale) version until the checkpoint


def test_an_unclosed_stale_file_is_collected_quietly(reader: Client, node: MemoryNode) -> None:
    with MemoryNode.client([node]) as writer:
        writer.put(KEY, NEW)
    f = _open(reader)
    f.read()
    del f  # no exception from the finalizer (pytest turns unraisable ones into errors)
