"""Durable objects on an in-memory network (tests/unit/runtime/netsim.py): their
records on the home's disk, writes before answers, leases, re-activation by the home
after their host is cut off, a stale copy told to stop, a home read back from disk."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shuttle.runtime import migration, mobile, values
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.durable_records import Record, RecordFiles
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject
from tests.unit.runtime.netsim import Net

LEASE_S = 0.3
CONFIG = RuntimeConfig(durable_lease_s=LEASE_S)


class Journal(MobileObject):
    type_name = "test-journal"
    durable = True
    readonly = frozenset({"items"})

    def __init__(self) -> None:
        self.entries: list[int] = []

    def append(self, x: int) -> int:
        self.entries.append(x)
        return len(self.entries)

    def items(self) -> list[int]:
        return list(self.entries)


@pytest.fixture(autouse=True)
def journal_type() -> Iterator[None]:
    mobile.BUILTIN_TYPES["test-journal"] = Journal
    yield
    del mobile.BUILTIN_TYPES["test-journal"]


def scenario(tmp: Path, body: Callable[[Net, ThreadPoolExecutor], Awaitable[None]]) -> None:
    async def main() -> None:
        with ThreadPoolExecutor(8) as pool:
            net = Net(pool)
            try:
                await body(net, pool)
            finally:
                for bm in net.runtimes.values():
                    for task in list(bm.tasks):
                        task.cancel()

    asyncio.run(main())


async def on(pool: ThreadPoolExecutor, fn: Callable[[], object]) -> object:
    return await asyncio.get_running_loop().run_in_executor(pool, fn)


def record(tmp: Path, node: str, rid: ObjectId) -> Record:
    (found,) = [r for r in RecordFiles(tmp / node).load_all() if r.rid == str(rid)]
    return found


async def make_journal(net: Net, host: str, home: str) -> ObjectId:
    """A durable journal made on ``host`` (on a thread, as the run-time makes them)."""
    bm = net.runtimes[host]
    rid = bm.new_id(home)
    await on(
        net.pool,
        lambda: bm.host_new(
            rid, net.runtimes[home].address, Journal, "test-journal", None, {}, "auto", durable=True
        ),
    )
    return rid


def test_records_keep_the_newer_whole_slot(tmp_path: Path) -> None:
    files = RecordFiles(tmp_path)
    base = Record("n1/d1", "t", "t", None, "auto", "", "c", "n1", 1, "", b"one")
    files.write(base)
    files.write(Record(**{**base.__dict__, "seq": 1, "checkpoint": b"two"}))
    assert [r.checkpoint for r in files.load_all()] == [b"two"]
    (tmp_path / "d1.1").write_bytes((tmp_path / "d1.1").read_bytes()[:-3])  # torn
    assert [r.checkpoint for r in files.load_all()] == [b"one"]


def test_a_changing_call_is_on_the_home_s_disk_before_it_is_answered(tmp_path: Path) -> None:
    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        client = net.add("c1", config=CONFIG)
        rid = await make_journal(net, "c1", "n1")
        assert values.unpack(record(tmp_path, "n1", rid).checkpoint) == {"entries": []}
        for x in range(3):
            assert await on(pool, lambda x=x: client.ref(rid).append(x)) == x + 1
            assert values.unpack(record(tmp_path, "n1", rid).checkpoint) == {
                "entries": list(range(x + 1))
            }
        writes = len([m for m in net.log if m[2] == "object.persist"])
        assert await on(pool, client.ref(rid).items) == [0, 1, 2]
        assert len([m for m in net.log if m[2] == "object.persist"]) == writes  # readonly

    scenario(tmp_path, body)


def test_the_home_brings_back_an_object_whose_host_is_cut_off(tmp_path: Path) -> None:
    """Its host n2 is cut off: callers wait while the lease runs out, then the home
    n1 makes it again from its last checkpoint, same id, every acknowledged append
    there. When n2 is back, its copy (a stale epoch) stops at its first renewal."""

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        home = net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        n2 = net.add("n2", durable_dir=tmp_path / "n2", config=CONFIG)
        client = net.add("c1", config=CONFIG)
        home.durability.start()
        n2.durability.start()
        rid = await make_journal(net, "n2", "n1")
        ref = client.ref(rid)
        for x in range(5):
            await on(pool, lambda x=x: ref.append(x))
        net.down.add("n2")
        started = time.monotonic()
        assert await on(pool, lambda: ref.append(5)) == 6  # waits, then at n1
        waited = time.monotonic() - started
        assert waited >= LEASE_S  # never before n2's lease ran out
        copy = home.table.hosted(rid)
        assert copy is not None and copy.epoch == 2
        assert await on(pool, ref.items) == [0, 1, 2, 3, 4, 5]
        stale = n2.table.hosted(rid)
        assert stale is not None and not stale.serving(time.monotonic())  # lease over
        net.down.clear()
        for _ in range(200):
            if n2.table.hosted(rid) is None:
                break
            await asyncio.sleep(0.02)
        assert n2.table.hosted(rid) is None  # told to stop by its home

    scenario(tmp_path, body)


def test_a_stale_copy_s_write_is_refused_and_its_call_goes_to_the_current_one(
    tmp_path: Path,
) -> None:
    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        home = net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        n2 = net.add("n2", durable_dir=tmp_path / "n2", config=CONFIG)
        net.add("c1", config=CONFIG)
        rid = await make_journal(net, "n2", "n1")
        await on(pool, lambda: n2.ref(rid).append(1))
        # The home brings it back on itself (as if n2's lease had run out).
        await home.durability._reactivate(rid, "n2", 1)
        stale = n2.table.hosted(rid)
        assert stale is not None
        stale.lease_until = time.monotonic() + 60  # as if its clock ran slow
        assert await on(pool, lambda: n2.ref(rid).append(2)) == 2  # went to n1
        assert n2.table.hosted(rid) is None
        assert await on(pool, home.ref(rid).items) == [1, 2]

    scenario(tmp_path, body)


def test_a_home_read_back_from_disk_brings_back_what_ran_on_it(tmp_path: Path) -> None:
    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        client = net.add("c1", config=CONFIG)
        rid = await make_journal(net, "n1", "n1")
        await on(pool, lambda: client.ref(rid).append(7))
        # n1 restarts: a new run-time on the same directory, nothing in memory.
        del net.runtimes["n1"]
        again = net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        again.durability.start()
        entry = again.table.home_entry(rid)
        assert entry is not None and entry.epoch == 1 and entry.durable
        assert await on(pool, lambda: client.ref(rid).append(8)) == 2
        copy = again.table.hosted(rid)
        assert copy is not None and copy.epoch == 2

    scenario(tmp_path, body)


def test_a_restarted_home_brings_an_object_back_acting_for_its_creator(tmp_path: Path) -> None:
    """The record keeps the principal that made the object: brought back from disk, it
    acts for the same one (its calls are checked against that principal's caps), never
    with the node's own rights nor as nobody's."""

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        n1 = net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        client = net.add("c1", config=CONFIG)
        rid = n1.new_id("n1")
        await on(
            pool,
            lambda: n1.host_new(
                rid,
                n1.address,
                Journal,
                "test-journal",
                None,
                {},
                "auto",
                durable=True,
                principal="alice",
            ),
        )
        assert record(tmp_path, "n1", rid).principal == "alice"
        del net.runtimes["n1"]  # n1 restarts on the same directory
        again = net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        again.durability.start()
        entry = again.table.home_entry(rid)
        assert entry is not None and entry.principal == "alice"
        assert await on(pool, lambda: client.ref(rid).append(1)) == 1
        copy = again.table.hosted(rid)
        assert copy is not None and copy.epoch == 2 and copy.principal == "alice"

    scenario(tmp_path, body)


def test_a_record_from_before_principals_reads_back_as_unrestricted(tmp_path: Path) -> None:
    import msgpack

    files = RecordFiles(tmp_path)
    base = Record("n1/d1", "t", "t", None, "auto", "", "c", "n1", 1, "", b"one")
    fields = {k: v for k, v in base.__dict__.items() if k != "principal"}
    body = msgpack.packb(fields, use_bin_type=True)
    header = __import__("struct").pack("<II", len(body), __import__("zlib").crc32(body))
    (tmp_path / "d1.0").write_bytes(header + body)
    (found,) = files.load_all()
    assert found.principal is None and found.checkpoint == b"one"


def test_a_durable_object_moves_with_its_lease_and_its_home_s_record(tmp_path: Path) -> None:
    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        net.add("n2", durable_dir=tmp_path / "n2", config=CONFIG)
        client = net.add("c1", config=CONFIG)
        rid = await make_journal(net, "c1", "n1")
        await on(pool, lambda: client.ref(rid).append(1))
        event = await migration.migrate_out(client, rid, "n2")
        assert event.ok and event.epoch == 2
        assert record(tmp_path, "n1", rid).location == "n2"
        assert record(tmp_path, "n1", rid).epoch == 2
        assert await on(pool, lambda: client.ref(rid).append(2)) == 2
        copy = net.runtimes["n2"].table.hosted(rid)
        assert copy is not None and copy.serving(time.monotonic())

    scenario(tmp_path, body)


def test_a_durable_object_needs_a_node_for_its_home(tmp_path: Path) -> None:
    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        net.add("c1", config=CONFIG)
        with pytest.raises(Exception, match="home must be a storage node"):
            await make_journal(net, "c1", "c1")

    scenario(tmp_path, body)


def test_a_write_whose_answer_was_lost_then_found_stale_is_in_doubt_not_repeated(
    tmp_path: Path,
) -> None:
    """n2's write of append(2) reaches the home but its answer is lost; n2 is then
    cut off from the home long enough that the home brings the object back from that
    very record. n2's next try hears "stale": append(2) is in the record, so running
    it again on the current copy would append it twice. The caller is told it is in
    doubt instead."""
    from shuttle.errors import ObjectInDoubtError

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        home = net.add("n1", durable_dir=tmp_path / "n1", config=CONFIG)
        net.add("n2", durable_dir=tmp_path / "n2", config=CONFIG)
        client = net.add("c1", config=CONFIG)
        home.durability.start()
        rid = await make_journal(net, "n2", "n1")
        await on(pool, lambda: client.ref(rid).append(1))
        cut = {"on": False}

        def rule(source: str, target: str, op: str) -> str:
            if source == "n2" and target == "n1":
                if op == "object.persist" and not cut["on"]:
                    cut["on"] = True
                    return "lose_reply"
                if cut["on"] and home.table.hosted(rid) is None:
                    return "drop"  # cut off until the home has brought it back
            return "ok"

        net.rule = rule
        with pytest.raises(ObjectInDoubtError, match="may or may not have taken effect"):
            await on(pool, lambda: client.ref(rid).append(2))
        net.rule = lambda *_: "ok"
        assert await on(pool, lambda: client.ref(rid).items()) == [1, 2]

    scenario(tmp_path, body)
