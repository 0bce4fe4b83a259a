"""``client.speculate``: work runs on the cached copy while the check is out, waits at
its checkpoint for the verdict, keeps its result when the copy was current and re-runs
on fresh data when it was stale, in both mechanisms (a thread, a forked child)."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable, Iterator

import pytest

from shuttle.client import Client
from shuttle.errors import InvalidArgumentError, SpeculationError
from shuttle.testing import MemoryNode
from tests.unit.client.speculation_helpers import KEY, gated_client

OLD = b"old " * 2000  # 8 KB: eight 1 KiB blocks of the client cache
NEW = b"new " * 2500

Hooks = dict[str, Callable[[], None]]
MECHANISMS = ["thread", "fork"]


@pytest.fixture
def hooks() -> Hooks:
    return {}


@pytest.fixture
def reader(node: MemoryNode, hooks: Hooks) -> Iterator[Client]:
    """A client that holds a whole cached copy of ``KEY`` (the old bytes)."""
    with gated_client(node, hooks) as client:
        client.put(KEY, OLD)
        assert client.speculate(KEY, lambda data, _: data) == OLD  # no copy yet: read
        yield client


@pytest.fixture
def writer(node: MemoryNode) -> Iterator[Client]:
    """Another client: its writes make the reader's copy stale behind its back."""
    with MemoryNode.client([node]) as client:
        yield client


def _stats(client: Client) -> dict[str, object]:
    stats: dict[str, object] = client.counters()["validation"]["speculative"]
    return stats


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_current_copy_keeps_the_optimistic_result(reader: Client, mechanism: str) -> None:
    caller = (os.getpid(), threading.get_ident())

    def work(data: bytes, checkpoint: Callable[[], None]) -> tuple[bytes, tuple[int, int]]:
        return data, (os.getpid(), threading.get_ident())

    data, where = reader.speculate(KEY, work, mechanism=mechanism)
    assert data == OLD
    assert where != caller  # the result is the branch's, not a re-run by the caller
    stats = _stats(reader)
    assert stats["confirmed"] == 1 and stats["stale"] == 0
    assert stats["speculated"] == {"thread": 0, "fork": 0, mechanism: 1}


def test_a_stale_copy_reruns_on_fresh_data_with_thread_restore(
    reader: Client, writer: Client, hooks: Hooks
) -> None:
    writer.put(KEY, NEW)
    state: list[bytes] = []
    ran_on_old = threading.Event()
    # The check answers only once the branch has run on the old copy and mutated state.
    hooks["stat"] = lambda: None if ran_on_old.wait(5) else pytest.fail("branch never ran")

    def work(data: bytes, checkpoint: Callable[[], None]) -> bytes:
        state.append(data[:3])
        if data == OLD:
            ran_on_old.set()
        checkpoint()
        return data

    restored: list[list[bytes]] = []

    def restore(saved: list[bytes]) -> None:
        restored.append(list(state))
        state[:] = saved

    result = reader.speculate(
        KEY, work, mechanism="thread", save=lambda: list(state), restore=restore
    )
    assert result == NEW
    assert restored == [[b"old"]]  # the optimistic branch's mutation was put back
    assert state == [b"new"]
    stats = _stats(reader)
    assert stats["stale"] == 1 and stats["confirmed"] == 0


def test_a_stale_copy_reruns_on_fresh_data_with_fork(
    reader: Client, writer: Client, hooks: Hooks
) -> None:
    writer.put(KEY, NEW)
    state: list[bytes] = []
    ran_r, ran_w = os.pipe()
    # The check answers only once the child has run on the old copy.
    hooks["stat"] = lambda: None if os.read(ran_r, 1) == b"r" else pytest.fail("no branch")

    def work(data: bytes, checkpoint: Callable[[], None]) -> bytes:
        state.append(data[:3])  # in the child: never seen by the parent
        if data == OLD:
            os.write(ran_w, b"r")
        checkpoint()
        return data

    try:
        assert reader.speculate(KEY, work, mechanism="fork") == NEW
    finally:
        os.close(ran_r)
        os.close(ran_w)
    assert state == [b"new"]  # only the parent's re-run on the fresh copy
    assert _stats(reader)["stale"] == 1


def test_checkpoint_blocks_until_the_check_confirms_in_a_thread(
    reader: Client, hooks: Hooks
) -> None:
    at_checkpoint = threading.Event()
    passed = threading.Event()
    passed_before_answer: list[bool] = []

    def answer_late() -> None:
        # Runs in the caller, which is the pessimistic branch: the check is answered
        # only after the branch sits at its checkpoint and has had time to pass it.
        assert at_checkpoint.wait(5)
        passed_before_answer.append(passed.wait(0.2))

    hooks["stat"] = answer_late

    def work(data: bytes, checkpoint: Callable[[], None]) -> int:
        at_checkpoint.set()
        checkpoint()
        passed.set()
        return len(data)

    assert reader.speculate(KEY, work, mechanism="thread") == len(OLD)
    assert passed_before_answer == [False]
    assert passed.is_set()


def test_checkpoint_blocks_until_the_check_confirms_in_a_fork(reader: Client, hooks: Hooks) -> None:
    log_r, log_w = os.pipe()
    passed_before_answer: list[bytes] = []

    def answer_late() -> None:
        assert os.read(log_r, 1) == b"r"  # the child is at its checkpoint
        ready, _, _ = select.select([log_r], [], [], 0.2)
        passed_before_answer.append(os.read(log_r, 1) if ready else b"")

    hooks["stat"] = answer_late

    def work(data: bytes, checkpoint: Callable[[], None]) -> int:
        os.write(log_w, b"r")
        checkpoint()
        os.write(log_w, b"p")
        return len(data)

    try:
        assert reader.speculate(KEY, work, mechanism="fork") == len(OLD)
        assert passed_before_answer == [b""]
        assert os.read(log_r, 1) == b"p"  # and it passed once confirmed
    finally:
        os.close(log_r)
        os.close(log_w)


@pytest.mark.timeout(10)  # a branch that is never stopped spins forever
def test_a_stale_thread_branch_is_stopped_before_its_checkpoint(
    reader: Client, writer: Client, hooks: Hooks
) -> None:
    """The kill reaches a branch still computing (no waiting for its checkpoint), as
    the paper's pessimistic branch stops the optimistic one."""
    writer.put(KEY, NEW)
    spinning = threading.Event()
    stopped = threading.Event()
    hooks["stat"] = lambda: None if spinning.wait(5) else pytest.fail("branch never ran")

    def work(data: bytes, checkpoint: Callable[[], None]) -> bytes:
        if data == OLD:
            try:
                spinning.set()
                while True:  # long local processing on the stale copy
                    pass
            finally:
                stopped.set()
        checkpoint()
        return data

    assert reader.speculate(KEY, work, mechanism="thread", save=list, restore=list) == NEW
    assert stopped.is_set()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_an_exception_on_a_current_copy_is_raised(reader: Client, mechanism: str) -> None:
    def work(data: bytes, checkpoint: Callable[[], None]) -> None:
        raise KeyError(data[:3])

    with pytest.raises(KeyError, match="old"):
        reader.speculate(KEY, work, mechanism=mechanism)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_an_exception_on_a_stale_copy_is_discarded(
    reader: Client, writer: Client, mechanism: str
) -> None:
    writer.put(KEY, NEW)

    def work(data: bytes, checkpoint: Callable[[], None]) -> bytes:
        if data == OLD:
            raise KeyError("stale data looked corrupt")
        return data

    assert reader.speculate(KEY, work, mechanism=mechanism) == NEW


def test_a_forked_branch_that_exits_without_a_result_is_an_error(reader: Client) -> None:
    def work(data: bytes, checkpoint: Callable[[], None]) -> None:
        os._exit(7)

    with pytest.raises(SpeculationError, match="exit status 7"):
        reader.speculate(KEY, work, mechanism="fork")


def test_an_unpicklable_fork_result_is_an_error(reader: Client) -> None:
    def work(data: bytes, checkpoint: Callable[[], None]) -> object:
        return threading.Lock()

    with pytest.raises(SpeculationError, match="could not be pickled"):
        reader.speculate(KEY, work, mechanism="fork")


def test_the_forked_branch_may_use_the_client_after_its_checkpoint(reader: Client) -> None:
    """The child gets its own connections (never the parent's) once it is confirmed."""

    def work(data: bytes, checkpoint: Callable[[], None]) -> int:
        checkpoint()
        reader.put("spec/from-child", data[:10])
        return reader.stat(KEY).version

    version = reader.speculate(KEY, work, mechanism="fork")
    assert version == reader.stat(KEY).version
    assert reader.get("spec/from-child") == OLD[:10]


def test_no_cached_copy_is_a_normal_read(node: MemoryNode, writer: Client) -> None:
    writer.put(KEY, NEW)
    with MemoryNode.client([node]) as client:
        assert client.speculate(KEY, lambda data, _: data, mechanism="fork") == NEW
        stats = _stats(client)
        assert stats["no_copy"] == 1 and stats["speculated"] == {"thread": 0, "fork": 0}


def test_a_bad_mechanism_is_refused(reader: Client) -> None:
    with pytest.raises(InvalidArgumentError, match="mechanism must be one of"):
        reader.speculate(KEY, lambda data, _: data, mechanism="process")


def test_none_is_a_normal_read_that_checks_first(
    reader: Client, writer: Client, node: MemoryNode
) -> None:
    writer.put(KEY, NEW)
    assert reader.speculate(KEY, lambda data, _: data, mechanism="none") == NEW
    stats = _stats(reader)
    assert stats["normal"] == 1 and stats["speculated"] == {"thread": 0, "fork": 0}


def test_a_forked_branch_never_uses_the_parents_connections_or_locks(reader: Client) -> None:
    """A lock another thread held at the fork stays held in the child, and a socket
    is shared with the parent: the child's client has fresh ones."""
    node = reader.nodes[0]
    parents = (reader.connection(node), reader._lock, reader.cache)

    def work(data: bytes, checkpoint: Callable[[], None]) -> list[bool]:
        checkpoint()
        childs = (reader.connection(node), reader._lock, reader.cache)
        return [a is b for a, b in zip(childs, parents, strict=True)]

    assert reader.speculate(KEY, work, mechanism="fork") == [False, False, False]


@pytest.mark.timeout(20)
def test_kills_racing_the_branchs_own_end_leave_nothing_behind(
    reader: Client, writer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stale copies of quick work: each kill lands at any point of the branch (in work,
    at its end, in its bookkeeping, or too late to send); none escapes the branch
    thread and every re-run gets the fresh bytes."""
    escaped: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_value))
    spins = [0]

    def work(data: bytes, checkpoint: Callable[[], None]) -> bytes:
        for _ in range(spins[0]):  # a little Python work, of varying length
            pass
        return data[:4]

    for i in range(300):
        body = b"%04d" % i * 100
        writer.put(KEY, body)
        spins[0] = i * 10  # from none to about the time the check takes
        assert reader.speculate(KEY, work, mechanism="thread", save=list, restore=list) == body[:4]
    assert escaped == []
    assert _stats(reader)["stale"] == 300
