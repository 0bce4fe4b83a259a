"""The node's promise table on a fake clock: grants, breaks, acks, terms and sessions
that end, as short stories; and the store's change hook blocking a real writer."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from shuttle.errors import ConfigError, InvalidArgumentError
from shuttle.net.registry import OperationRegistry
from shuttle.node.callback_ops import register_callback_ops
from shuttle.node.callbacks import PromiseTable
from shuttle.node.handlers import register_storage_ops
from shuttle.store import ObjectStore
from shuttle.testing import FakeClock

TERM_S = 10.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(100.0)


@pytest.fixture
def table(clock: FakeClock) -> PromiseTable:
    return PromiseTable(TERM_S, clock=clock)


def test_a_change_breaks_the_promise_and_waits_for_the_ack(table: PromiseTable) -> None:
    s = table.open_session(owner=1)
    grant = table.grant(s, "k")
    assert grant is not None and grant.term_s == TERM_S
    change = table.begin_change(["k"])
    assert len(table.owed(change)) == 1
    queued = table.pending_breaks(s)
    assert queued["breaks"] == [["k", grant.seq]]
    table.ack(s, queued["seq"])
    assert table.owed(change) == []
    table.end_change(change)
    stats = table.stats()
    assert (stats["breaks"], stats["breaks_acked"], stats["promises_outstanding"]) == (1, 1, 0)
    assert table.pending_breaks(s)["breaks"] == []  # acked breaks are not sent again


def test_a_second_change_waits_for_the_first_ones_break(table: PromiseTable) -> None:
    """The promise is gone from the table once broken, but its holder has not acked:
    a second writer must not go ahead of the ack either."""
    s = table.open_session()
    table.grant(s, "k")
    first = table.begin_change(["k"])
    second = table.begin_change(["k"])
    assert len(table.owed(second)) == 1
    assert table.has_promises(["k"])  # so the fast path does not skip the wait
    table.ack(s, table.pending_breaks(s)["seq"])
    assert table.owed(second) == [] and table.owed(first) == []
    table.end_change(second)
    table.end_change(first)
    assert not table.has_promises(["k"])
    assert table.stats()["breaks_acked"] == 1  # counted once, by the change that broke it


def test_no_promise_is_granted_while_a_change_is_pending(table: PromiseTable) -> None:
    s = table.open_session()
    change = table.begin_change(["k"])
    assert table.grant(s, "k") is None
    assert table.grant(s, "other") is not None
    table.end_change(change)
    assert table.grant(s, "k") is not None
    assert table.stats()["promises_refused"] == 1


def test_a_writer_goes_ahead_when_the_term_ends(table: PromiseTable, clock: FakeClock) -> None:
    s = table.open_session()
    table.grant(s, "k")
    clock.jump(TERM_S / 2)
    change = table.begin_change(["k"])
    assert table.owed(change)  # the holder says nothing (stopped, cut off)
    clock.jump(TERM_S / 2 - 0.001)
    assert table.owed(change)
    clock.jump(0.001)  # the term counts from the grant
    assert table.owed(change) == []
    table.end_change(change)
    stats = table.stats()
    assert (stats["breaks_expired"], stats["writer_wait_s_max"]) == (1, pytest.approx(TERM_S / 2))


def test_a_lapsed_promise_costs_a_change_nothing(table: PromiseTable, clock: FakeClock) -> None:
    s = table.open_session()
    table.grant(s, "k")
    clock.jump(TERM_S)
    change = table.begin_change(["k"])
    assert change.owed == []
    table.end_change(change)
    assert table.stats()["promises_expired"] == 1
    assert table.pending_breaks(s)["breaks"] == []


def test_a_session_that_ends_releases_writers_at_once(table: PromiseTable) -> None:
    s = table.open_session(owner=7)
    other = table.open_session(owner=8)
    table.grant(s, "k")
    change = table.begin_change(["k"])
    assert table.sessions_owned_by(7) == 1
    assert table.release_owner(7) == 1  # its connection closed
    assert table.owed(change) == []
    table.end_change(change)
    assert table.stats()["breaks_released"] == 1
    assert table.stats()["sessions_open"] == 1 and table.grant(other, "k") is not None


def test_a_break_names_the_highest_grant_it_covers(table: PromiseTable) -> None:
    s = table.open_session()
    first = table.grant(s, "k")
    again = table.grant(s, "k")  # renewed: one promise, a higher number
    assert first is not None and again is not None and again.seq > first.seq
    assert table.stats()["promises_outstanding"] == 1
    table.end_change(table.begin_change(["k"]))
    assert table.pending_breaks(s)["breaks"] == [["k", again.seq]]
    later = table.grant(s, "k")
    assert later is not None and later.seq > again.seq  # not void on the client


def test_only_the_owning_connection_waits_on_a_session(table: PromiseTable) -> None:
    s = table.open_session(owner=1)
    with pytest.raises(InvalidArgumentError, match="connection that opened it"):
        table.pending_breaks(s, owner=2)


def test_terms_are_bounded() -> None:
    with pytest.raises(ConfigError, match="callback term"):
        PromiseTable(0)


def test_the_long_poll_answers_when_a_break_is_queued(table: PromiseTable) -> None:
    async def story() -> None:
        s = table.open_session(owner=1)
        grant = table.grant(s, "k")
        assert grant is not None
        poll = asyncio.ensure_future(table.wait_breaks(s, 0, 5.0, owner=1))
        await asyncio.sleep(0)
        assert not poll.done()
        writer = asyncio.ensure_future(table.clear(["k"]))
        out = await asyncio.wait_for(poll, 5)
        assert out["breaks"] == [["k", grant.seq]]
        await asyncio.sleep(0)
        assert not writer.done()  # waits for the ack
        nxt = asyncio.ensure_future(table.wait_breaks(s, out["seq"], 5.0, owner=1))
        await asyncio.wait_for(writer, 5)
        table.close_session(s)
        assert (await asyncio.wait_for(nxt, 5))["closed"]

    asyncio.run(story())


def test_the_store_hook_blocks_a_change_until_the_ack(tmp_path: Path) -> None:
    """Every change to the store, whatever its path, waits for the break's ack."""
    store = ObjectStore(tmp_path / "data")
    table = PromiseTable(60.0)
    registry = OperationRegistry()
    register_storage_ops(registry, store)
    register_callback_ops(registry, store, table)
    store.put("k", b"old")
    s = table.open_session()
    assert table.grant(s, "k") is not None
    done = threading.Event()

    def writer() -> None:
        store.put("k", b"new")  # as a mobile object would, straight to the store
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    queued = table.pending_breaks(s)
    while not queued["breaks"]:  # the writer has broken the promise (no other signal)
        queued = table.pending_breaks(s)
    assert not done.wait(0.05)
    assert store.read("k", 0, 10) == b"old"  # not applied before the ack
    table.ack(s, queued["seq"])
    thread.join(5)
    assert done.is_set() and store.read("k", 0, 10) == b"new"
    store.close()


def test_changing_operations_get_a_before_step(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "data")
    table = PromiseTable(60.0)
    registry = OperationRegistry()
    register_storage_ops(registry, store)
    register_callback_ops(registry, store, table)
    changing = ("put", "create", "write", "truncate", "remove", "remove_many", "upload.commit")
    assert all(registry.get(op).before is not None for op in changing)
    assert registry.get("read").before is None
    put = registry.get("put").before
    assert put is not None and put({"key": "k"}) is None  # no promise: no wait, no task
    with pytest.raises(ConfigError, match="already has a before step"):
        registry.add_before("put", lambda args: None)
    with pytest.raises(ConfigError, match="only applies to THREAD"):
        registry.add_before("callback.close", lambda args: None)
    store.close()


def test_a_directory_listing_is_promised_page_by_page(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path / "data")
    table = PromiseTable(60.0)
    registry = OperationRegistry()
    register_storage_ops(registry, store)
    register_callback_ops(registry, store, table)
    for name in ("a", "b", "c", "sub/x"):
        store.put(f"d/{name}", name.encode())
    s = table.open_session()
    promise_list = registry.get("callback.promise_list").handler
    names: list[str] = []
    prefixes: list[str] = []
    seqs: list[int] = []
    args: dict[str, object] = {"prefix": "d/", "session": s, "limit": 2}
    while True:
        page = promise_list(args, b"")
        assert isinstance(page, dict)
        names += page["names"]
        prefixes += page["prefixes"]
        seqs += [row[-1] for row in page["rows"]]  # one-chunk files: the row ends in seq
        assert all(row[0] == 1 for row in page["rows"])  # sizes
        if page["next"] is None:
            break
        args = {**args, "start_after": page["next"]}
    assert (names, prefixes) == (["a", "b", "c"], ["sub/"])
    assert sorted(seqs) == seqs and len(set(seqs)) == 3  # a promise on each file
    assert table.has_promises(["d/a", "d/b", "d/c"]) and not table.has_promises(["d/sub/x"])
    promise = registry.get("callback.promise").handler
    assert promise({"key": "d/sub", "session": s, "dirs": True}, b"") == {"dir": True}
    assert not table.has_promises(["d/sub"])  # the directory's grant was withdrawn
    with pytest.raises(InvalidArgumentError, match="form must be 'rows1'"):
        registry.get("stat_many").handler({"keys": ["d/a"], "form": "rows2"}, b"")
    store.close()
