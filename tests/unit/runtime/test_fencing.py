"""The fenced migration end to end: real binding managers and handlers on an
in-memory network that loses what each test says (tests/unit/runtime/netsim.py).

The bug these replace the test of: a lost ``object.activate`` answer followed by an
unreachable target made the source roll back and serve while the target served
too. Now the source stays closed until the target or the home says what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shuttle.errors import MigrationError, ShuttleError
from shuttle.runtime import migration, migration_home, migration_target, mobile
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import MobileObject
from tests.unit.runtime.netsim import Net


class Counter(MobileObject):
    type_name = "test-counter"

    def __init__(self) -> None:
        self.n = 0

    def add(self) -> int:
        self.n += 1
        return self.n


@pytest.fixture(autouse=True)
def counter_type() -> Iterator[None]:
    mobile.BUILTIN_TYPES["test-counter"] = Counter  # a built-in for these tests
    yield
    del mobile.BUILTIN_TYPES["test-counter"]


def scenario(body: Callable[[Net, ThreadPoolExecutor], Awaitable[None]]) -> None:
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


async def call(pool: ThreadPoolExecutor, bm: BindingManager, rid: ObjectId) -> int:
    result: int = await asyncio.get_running_loop().run_in_executor(pool, bm.ref(rid).add)
    return result


def serving(net: Net, rid: ObjectId) -> list[str]:
    now = time.monotonic()
    return [
        name
        for name, bm in net.runtimes.items()
        if (h := bm.table.hosted(rid)) is not None and h.serving(now)
    ]


def make_counter(bm: BindingManager) -> ObjectId:
    rid = bm.new_id()
    bm.host_new(rid, bm.address, Counter, "test-counter", None, {}, "auto")
    return rid


async def counter_on_n1(
    net: Net, pool: ThreadPoolExecutor
) -> tuple[BindingManager, BindingManager, BindingManager, ObjectId]:
    """Run-times c1 (the client, and the object's home), n1 and n2; a counter made at
    c1, called once, and moved to n1: the start of every move n1 -> n2 below."""
    client, n1, n2 = net.add("c1"), net.add("n1"), net.add("n2")
    rid = make_counter(client)
    await call(pool, client, rid)
    await migration.migrate_out(client, rid, "n1")
    return client, n1, n2, rid


def test_a_lost_activate_answer_and_an_unreachable_target_leave_one_copy() -> None:
    """The target activated (the home, here the source, committed) but its answer
    was lost, and then the target could not be reached: the source asks the home,
    which says committed, and switches. The object serves at the target only."""

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        client = net.add("c1")
        net.add("n1")
        rid = make_counter(client)
        assert await call(pool, client, rid) == 1

        def rule(source: str, target: str, op: str) -> str:
            if op == "object.activate":
                return "lose_reply"
            if op == "object.abort":
                net.down.add("n1")  # after that answer, n1 is cut off
                return "drop"
            return "ok"

        net.rule = rule
        event = await migration.migrate_out(client, rid, "n1")
        assert event.ok and event.epoch == 2
        assert serving(net, rid) == ["n1"]
        assert client.table.home_entry(rid).location == "n1"  # type: ignore[union-attr]
        net.down.clear()
        assert await call(pool, client, rid) == 2  # at n1, with its state

    scenario(body)


def test_an_activate_that_never_arrived_is_fenced_and_the_source_serves_again() -> None:
    """The activate never reached the target, which is then cut off: the home (the
    source) has no commit and fences the move, the source reopens, and the stage the
    target still holds can never serve."""

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        client, node = net.add("c1"), net.add("n1")
        rid = make_counter(client)
        await call(pool, client, rid)

        def rule(source: str, target: str, op: str) -> str:
            if op == "object.activate" and source == "c1":
                net.down.add("n1")
                return "drop"
            return "ok"

        net.rule = rule
        with pytest.raises(MigrationError, match="keeps running on c1"):
            await migration.migrate_out(client, rid, "n1")
        assert serving(net, rid) == ["c1"]
        net.down.clear()
        net.rule = lambda *_: "ok"
        staged = node.table.hosted(rid)
        assert staged is not None and staged.staged
        assert staged.stage is not None
        answer = await migration_target.activate(node, rid, staged.stage.mid)  # too late
        assert not answer["active"] and "gave up" in answer["refused"]
        assert serving(net, rid) == ["c1"]
        assert await call(pool, client, rid) == 2

    scenario(body)


def test_a_home_cut_off_mid_move_keeps_both_sides_closed_until_it_answers() -> None:
    """Object homed at c1 moves n1 -> n2; the commit reaches c1 but its answer is
    lost and c1 is then cut off: the target and the source are both in doubt, and
    neither serves; once c1 is back, both hear it was committed."""

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        client, n1, _, rid = await counter_on_n1(net, pool)
        observed: list[list[str]] = []

        def rule(source: str, target: str, op: str) -> str:
            observed.append(serving(net, rid))
            if op == "object.commit":
                net.down.add("c1")
                return "lose_reply"
            return "ok"

        net.rule = rule
        move = asyncio.ensure_future(migration.migrate_out(n1, rid, "n2"))
        for _ in range(200):  # both sides are asking; nobody serves
            await asyncio.sleep(0.01)
            observed.append(serving(net, rid))
        assert not move.done()
        assert observed[-1] == []
        net.down.clear()
        event = await asyncio.wait_for(move, 30)
        assert event.ok and event.epoch == 3
        assert all(len(s) <= 1 for s in observed)
        for _ in range(300):
            if serving(net, rid) == ["n2"]:
                break
            await asyncio.sleep(0.01)
        assert serving(net, rid) == ["n2"]
        assert await call(pool, client, rid) == 2

    scenario(body)


#: How many answers the home garbles before it answers properly (below).
GARBLED = 3


def garble_resolve_for(monkeypatch: pytest.MonkeyPatch, asker: str) -> list[str]:
    """The home answers ``asker``'s first :data:`GARBLED` questions ``object.resolve``
    with nil, which does not say whether the move was committed (as a broken home
    might), after resolving them for real; the list returned grows by one per garbled
    answer."""
    real = migration_home.resolve_here
    garbled: list[str] = []

    def resolve_here(
        bm: BindingManager, rid: ObjectId, mid: str, who: str
    ) -> dict[str, Any] | None:
        answer = real(bm, rid, mid, who)
        if who != asker or len(garbled) >= GARBLED:
            return answer
        garbled.append(mid)
        return None

    monkeypatch.setattr(migration_home, "resolve_here", resolve_here)
    return garbled


def test_a_home_answer_that_does_not_say_committed_keeps_the_source_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Object homed at c1 moves n1 -> n2 and takes effect (c1 commits, n2 opens), but
    n1 hears nothing: the activate's answer is lost, then n2 cannot be reached. n1 asks
    the home, whose first answers do not say whether the move was committed: n1 must
    take them for no answer and ask again (its gate closed), then switch. Before, it
    took such an answer for "not committed" and reopened beside n2: two copies."""
    garbled = garble_resolve_for(monkeypatch, "n1")

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        client, n1, _, rid = await counter_on_n1(net, pool)
        observed: list[list[str]] = []

        def rule(source: str, target: str, op: str) -> str:
            observed.append(serving(net, rid))
            if source == "n1" and op == "object.activate":
                return "lose_reply"
            if source == "n1" and op == "object.abort":
                return "drop"
            return "ok"

        net.rule = rule
        event = await asyncio.wait_for(migration.migrate_out(n1, rid, "n2"), 30)
        assert event.ok and event.epoch == 3
        assert len(garbled) == GARBLED  # asked again after each
        assert all(len(s) <= 1 for s in observed), observed
        assert serving(net, rid) == ["n2"]
        net.rule = lambda *_: "ok"
        assert await call(pool, client, rid) == 2

    scenario(body)


def test_a_home_answer_that_does_not_say_committed_keeps_the_target_asking(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Object homed at c1 moves n1 -> n2; c1 commits but its answer to n2 is lost, so
    n2's stage is in doubt and it asks c1 itself, whose first answers do not say
    whether the move was committed: n2 must ask again, then open. Before, it took such
    an answer for "not committed" and dropped the stage: the object's only copy, as
    the source (told by the home) switched; nothing served it."""
    garbled = garble_resolve_for(monkeypatch, "n2")

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        client, n1, n2, rid = await counter_on_n1(net, pool)

        def rule(source: str, target: str, op: str) -> str:
            return "lose_reply" if op == "object.commit" else "ok"

        net.rule = rule
        event = await asyncio.wait_for(migration.migrate_out(n1, rid, "n2"), 30)
        assert event.ok and event.epoch == 3  # the source heard from the home
        for _ in range(1000):  # the target's questions pause 50 ms, doubling
            if serving(net, rid) == ["n2"] or n2.table.hosted(rid) is None:
                break
            await asyncio.sleep(0.01)
        assert len(garbled) == GARBLED
        assert serving(net, rid) == ["n2"]
        net.rule = lambda *_: "ok"
        assert await call(pool, client, rid) == 2

    scenario(body)


def test_a_commit_answer_that_does_not_say_ok_leaves_the_target_in_doubt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Object homed at c1 moves n1 -> n2; c1 commits the move, but its answer to n2's
    ``object.commit`` is nil (as a broken home might send), which does not say whether
    it committed: n2 must hold its stage in doubt and ask c1, then open, and n1 (told
    "in doubt") must ask too and switch. Before, n2 took such an answer for a refusal
    and dropped the stage: the only copy the home knew, while n1 was fenced."""
    real = migration_home.commit_here
    garbled: list[str] = []

    def commit_here(
        bm: BindingManager, rid: ObjectId, mid: str, source: str, from_epoch: int, target: str
    ) -> dict[str, Any] | None:
        answer = real(bm, rid, mid, source, from_epoch, target)
        if garbled or target != "n2":
            return answer
        garbled.append(mid)
        return None

    monkeypatch.setattr(migration_home, "commit_here", commit_here)

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        client, n1, n2, rid = await counter_on_n1(net, pool)
        event = await asyncio.wait_for(migration.migrate_out(n1, rid, "n2"), 30)
        assert garbled, "the home's commit was never asked"
        assert event.ok and event.epoch == 3, event
        for _ in range(1000):  # the target's questions pause 50 ms, doubling
            if serving(net, rid) == ["n2"] or n2.table.hosted(rid) is None:
                break
            await asyncio.sleep(0.01)
        assert serving(net, rid) == ["n2"]
        assert await call(pool, client, rid) == 2

    scenario(body)


def test_a_stale_copy_is_told_to_stop_by_a_caller_that_knows_a_newer_epoch() -> None:
    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        client, n1 = net.add("c1"), net.add("n1")
        rid = make_counter(client)
        await migration.migrate_out(client, rid, "n1")
        copy = n1.table.hosted(rid)
        assert copy is not None and copy.epoch == 2
        copy.epoch = 1  # as if it had been left behind by a move it never heard of
        status, _, _, _ = await asyncio.get_running_loop().run_in_executor(
            pool, n1.serve_invoke, rid, "add", [], {}, "", 2
        )
        assert status == "moved" and n1.table.hosted(rid) is None

    scenario(body)


# --- any schedule of losses ----------------------------------------------------------

FATES = st.sampled_from(["ok", "ok", "ok", "drop", "lose_reply"])
OPS = ("object.install", "object.activate", "object.commit", "object.abort", "object.resolve")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    moves=st.lists(st.sampled_from(["c1", "n1", "n2"]), min_size=1, max_size=4),
    fates=st.lists(FATES, min_size=10, max_size=40),
)
def test_moves_under_any_schedule_of_losses_keep_one_copy_and_every_acknowledged_add(
    moves: list[str], fates: list[str]
) -> None:
    """A client-homed counter moves around c1, n1, n2 while control messages are
    dropped or lose their answers in the order drawn; after each move (whatever it
    ended as) exactly one copy serves, and it holds every acknowledged add."""

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        config = RuntimeConfig(staged_ttl_s=0.5)
        runtimes = {name: net.add(name, config=config) for name in ("c1", "n1", "n2")}
        client = runtimes["c1"]
        rid = make_counter(client)
        schedule = iter(fates)

        def rule(source: str, target: str, op: str) -> str:
            return next(schedule, "ok") if op in OPS else "ok"

        net.rule = rule
        for acked, target in enumerate(moves, start=1):
            where = [n for n, bm in runtimes.items() if bm.table.hosted(rid) is not None]
            here = next(n for n in where if not runtimes[n].table.hosted(rid).staged)  # type: ignore[union-attr]
            if target != here:
                with contextlib.suppress(ShuttleError, OSError):
                    await asyncio.wait_for(migration.migrate_out(runtimes[here], rid, target), 60)
            for _ in range(500):  # stages in doubt settle with the home by themselves
                if len(serving(net, rid)) == 1 and not any(
                    (h := bm.table.hosted(rid)) is not None and h.staged for bm in runtimes.values()
                ):
                    break
                await asyncio.sleep(0.01)
            assert len(serving(net, rid)) == 1, serving(net, rid)
            net.rule = lambda *_: "ok"
            assert await call(pool, client, rid) == acked
            net.rule = rule

    scenario(body)


def test_a_home_that_cannot_be_reached_at_all_refuses_the_move_at_once() -> None:
    """The target cannot even connect to the object's home: its commit never left,
    so the move is refused (not in doubt) and the source serves again at once."""

    async def body(net: Net, pool: ThreadPoolExecutor) -> None:
        client, n1 = net.add("c1"), net.add("n1")
        net.add("n2")
        rid = make_counter(client)
        await migration.migrate_out(client, rid, "n1")
        net.rule = lambda source, target, op: "ok"
        net.down.add("c1")  # the home: nobody can connect to it
        with pytest.raises(MigrationError, match="cannot be reached"):
            await migration.migrate_out(n1, rid, "n2")
        assert serving(net, rid) == ["n1"]
        assert net.runtimes["n2"].table.hosted(rid) is None  # the stage is gone
        assert not any(op == "object.resolve" for _, _, op, _ in net.log)

    scenario(body)
