"""Speculation against a real node process over a shaped link: a stale copy re-runs
on fresh data and a current one keeps the branch's result, in both mechanisms; and
a forked branch that uses the client after its checkpoint never disturbs the
parent's connection (a shared socket would garble the parent's next answer)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

import shuttle
from tests.integration.nodeproc import NodeProcess

KEY = "spec/real"


@pytest.fixture
def reader(node: NodeProcess) -> Iterator[shuttle.Client]:
    with shuttle.connect(node=node.address, link="lan", request_timeout_s=30) as client:
        yield client


@pytest.mark.parametrize("mechanism", ["thread", "fork"])
def test_stale_and_current_copies_over_a_real_link(
    reader: shuttle.Client, client: shuttle.Client, mechanism: str
) -> None:
    client.put(KEY, b"one" * 3000)

    def where(data: bytes, checkpoint: Callable[[], None]) -> tuple[bytes, int]:
        return data[:3], os.getpid()

    assert reader.speculate(KEY, where, mechanism="none")[0] == b"one"
    data, pid = reader.speculate(KEY, where, mechanism=mechanism)  # current: kept
    assert data == b"one" and (pid != os.getpid()) == (mechanism == "fork")
    client.put(KEY, b"two" * 3000)  # another client: the reader's copy is stale now
    data, pid = reader.speculate(KEY, where, mechanism=mechanism)
    assert data == b"two" and pid == os.getpid()  # re-run here, on the fresh bytes
    stats = reader.counters()["validation"]["speculative"]
    assert stats["confirmed"] == 1 and stats["stale"] == 1


def test_a_forked_branch_using_the_client_leaves_the_parents_socket_alone(
    reader: shuttle.Client,
) -> None:
    reader.put(KEY, b"abc" * 4000)
    reader.speculate(KEY, lambda data, _: None, mechanism="none")

    def work(data: bytes, checkpoint: Callable[[], None]) -> int:
        checkpoint()
        for i in range(20):  # requests of its own, on its own connection
            reader.put(f"spec/child-{i}", data[: i + 1])
        return reader.stat(KEY).version

    for _ in range(3):
        version = reader.speculate(KEY, work, mechanism="fork")
        assert reader.stat(KEY).version == version  # the parent's socket still in step
    assert reader.get("spec/child-19") == (b"abc" * 7)[:20]
