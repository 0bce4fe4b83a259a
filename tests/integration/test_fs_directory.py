"""Directory objects against real keyed nodes: concurrent inserts from several clients
into one directory lose nothing and duplicate nothing in every placement and across
migrations; two clients racing for one name get one winner; callbacks keep a client's
cached directory current; objects moved to the directory's node take turns."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from shuttle.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError
from shuttle.objects.fs.directory import open_directory
from shuttle.runtime.client import Runtime
from shuttle.runtime.refs import Ref
from tests.integration.test_runtime import Nodes

CLIENTS = 4
INSERTS_PER_CLIENT = 25


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    """Two keyed nodes shared by the module's tests (each test has a volume of its own)."""
    n = Nodes(tmp_path_factory.mktemp("fsdir"))
    yield n
    for p in n.procs:
        p.terminate()


@pytest.fixture
def volume() -> str:
    return f"vol{next(_volumes)}"


_volumes = itertools.count()


def dir_node(rt: Runtime, d: Ref, volume: str, path: str) -> str:
    """The node that holds directory ``path``'s blocks."""
    entry = d.lookup(path)
    assert entry is not None and entry["type"] == "dir"
    return rt.node_for(f"{volume}/.dirs/{entry['id']}")


def run_together(workers: list[Callable[[], None]]) -> None:
    """Run each worker on a thread of its own, all starting at once; re-raise the
    first failure."""
    start = threading.Barrier(len(workers))
    errors: list[BaseException] = []

    def run(work: Callable[[], None]) -> None:
        start.wait(30)
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("placement", ["client", "node", "mixed", "migrating"])
def test_concurrent_inserts_into_one_directory_lose_nothing_and_duplicate_nothing(
    nodes: Nodes, volume: str, placement: str
) -> None:
    with ExitStack() as stack:
        rts = [stack.enter_context(nodes.runtime()) for _ in range(CLIENTS)]
        first = open_directory(rts[0], volume, placement="static")
        first.mkdir("/shared")
        node = dir_node(rts[0], first, volume, "/shared")
        rts[0].destroy(first)
        placements: dict[str, list[str | None]] = {
            "client": [None, None, None, None],
            "node": [node, node, node, node],
            "mixed": [None, node, None, node],
            "migrating": [None, None, None, None],
        }
        at = placements[placement]
        dirs = [
            open_directory(rt, volume, at=where, placement="static")
            for rt, where in zip(rts, at, strict=True)
        ]
        half = threading.Barrier(CLIENTS + 1)  # every inserter is half-way (and the mover)
        moved = threading.Event()

        def inserter(c: int) -> Callable[[], None]:
            def work() -> None:
                for i in range(INSERTS_PER_CLIENT):
                    if i == INSERTS_PER_CLIENT // 2 and placement == "migrating":
                        half.wait(30)
                        moved.wait(30)  # the first moves happen between the halves
                    dirs[c].create(f"/shared/c{c}-{i:03}", {"type": "file", "key": f"k{c}-{i}"})

            return work

        done = threading.Event()
        moves: list[dict[str, Any]] = []

        def mover() -> None:
            half.wait(30)
            targets = [node, "client"]
            while not done.is_set() or len(moves) < 4:
                c = len(moves) % 2  # clients 0 and 1 move, 2 and 3 stay at the client
                to = targets[(len(moves) // 2) % 2]
                moves.append(rts[c].migrate(dirs[c], to))
                moved.set()

        workers = [inserter(c) for c in range(CLIENTS)]
        if placement == "migrating":

            def insert_all() -> None:
                try:
                    run_together(workers)
                finally:
                    done.set()

            run_together([insert_all, mover])
            assert all(m["ok"] for m in moves), moves
        else:
            run_together(workers)

        expected = sorted(
            [f"c{c}-{i:03}", {"type": "file", "key": f"k{c}-{i}"}]
            for c in range(CLIENTS)
            for i in range(INSERTS_PER_CLIENT)
        )
        for d in dirs:  # every client's view (from its cache, kept by callbacks)
            assert d.listdir("/shared") == expected
        cold = open_directory(rts[0], volume, placement="static")  # and the blocks'
        assert cold.listdir("/shared") == expected
        stats = [d.stats() for d in dirs]
        assert sum(s["inserts"] for s in stats) == CLIENTS * INSERTS_PER_CLIENT
        if placement == "node":
            # One run-time's objects take turns on a directory: no conflict at all.
            assert sum(s["retries"] for s in stats) == 0, stats


@pytest.mark.timeout(60)
@pytest.mark.parametrize("at", ["client", "node"])
def test_two_clients_inserting_one_name_one_wins_the_other_is_told(
    nodes: Nodes, volume: str, at: str
) -> None:
    rounds = 12
    with nodes.runtime() as ra, nodes.runtime() as rb:
        a = open_directory(ra, volume, placement="static")
        a.mkdir("/race")
        where = dir_node(ra, a, volume, "/race") if at == "node" else None
        b = open_directory(rb, volume, at=where, placement="static")
        outcomes: dict[str, list[str]] = {"a": [], "b": []}

        def racer(name: str, d: Ref) -> Callable[[], None]:
            def work() -> None:
                for i in range(rounds):
                    try:
                        d.create(f"/race/r{i}", {"type": "file", "key": name})
                        outcomes[name].append("won")
                    except AlreadyExistsError as exc:
                        assert f"/race/r{i} already exists" in str(exc)
                        outcomes[name].append("lost")
                    barrier.wait(30)  # next round together

            return work

        barrier = threading.Barrier(2)
        run_together([racer("a", a), racer("b", b)])
        listing = a.listdir("/race")
        assert [n for n, _ in listing] == [f"r{i}" for i in sorted(range(rounds), key=str)]
        for i in range(rounds):
            won = {who for who in "ab" if outcomes[who][i] == "won"}
            assert len(won) == 1, (i, outcomes)
            assert b.lookup(f"/race/r{i}") == {"type": "file", "key": won.pop()}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("b_at", ["client", "node"])
def test_a_client_s_cached_directory_shows_another_client_s_insert(
    nodes: Nodes, volume: str, b_at: str
) -> None:
    with nodes.runtime() as ra, nodes.runtime() as rb:
        a = open_directory(ra, volume, placement="static")
        a.mkdir("/d")
        a.create("/d/mine", {"type": "file"})
        assert [n for n, _ in a.listdir("/d")] == ["mine"]
        reads = a.stats()["installation_reads"]
        assert [n for n, _ in a.listdir("/d")] == ["mine"]
        assert a.stats()["installation_reads"] == reads  # A answers from its cache
        where = dir_node(ra, a, volume, "/d") if b_at == "node" else None
        b = open_directory(rb, volume, at=where, placement="static")
        b.create("/d/theirs", {"type": "file"})
        # B's insert returned: A's promise was broken before it did.
        assert a.stats()["invalidations"] >= 1
        assert [n for n, _ in a.listdir("/d")] == ["mine", "theirs"]
        b.remove("/d/mine")
        assert a.lookup("/d/mine") is None
        assert [n for n, _ in a.listdir("/d")] == ["theirs"]


@pytest.mark.timeout(60)
def test_callbacks_follow_a_directory_object_that_moved_with_its_cache(
    nodes: Nodes, volume: str
) -> None:
    with nodes.runtime() as ra, nodes.runtime() as rb:
        a = open_directory(ra, volume, placement="static")
        a.mkdir("/d")
        a.create("/d/one", {"type": "file"})
        node = dir_node(ra, a, volume, "/d")
        reads = a.stats()["installation_reads"]
        b = open_directory(rb, volume, placement="static")
        for to in (node, "client", node):
            assert ra.migrate(a, to)["ok"]
            # The cache came along: the listing needs no read...
            assert [n for n, _ in a.listdir("/d")] == ["one"]
            assert a.stats()["installation_reads"] == reads
        # ...and the promises held: B's insert breaks them wherever A now runs.
        b.create("/d/two", {"type": "file"})
        assert [n for n, _ in a.listdir("/d")] == ["one", "two"]
        assert ra.where(a) == node


@pytest.mark.timeout(60)
@pytest.mark.parametrize("a_at", ["client", "node"])
def test_a_directory_object_that_ends_gives_back_its_callback_promises(
    nodes: Nodes, volume: str, a_at: str
) -> None:
    # Left behind, they made the next writer call back an object that was gone (a
    # few tries each): in ABACUS 6.5 the last client stalled half a second on them.
    with nodes.runtime() as rb:
        b = open_directory(rb, volume, placement="static")
        b.mkdir("/d")
        node = dir_node(rb, b, volume, "/d")
        isolation = rb.service(node, "isolation")
        held = isolation.stats()["callbacks_held"]
        ra = nodes.runtime()
        a = open_directory(ra, volume, at=node if a_at == "node" else None, placement="static")
        assert [n for n, _ in a.listdir("/d")] == []
        assert isolation.stats()["callbacks_held"] > held
        if a_at == "node":
            ra.destroy(a)  # destroyed by its application
            assert isolation.stats()["callbacks_held"] == held
        ra.close()  # at the client: it ends with its application
        assert isolation.stats()["callbacks_held"] == held
        b.create("/d/f", {"type": "file"})
        assert [n for n, _ in b.listdir("/d")] == ["f"]


@pytest.mark.timeout(60)
def test_errors_reach_the_caller_with_their_class_and_what_was_wrong(
    nodes: Nodes, volume: str
) -> None:
    with nodes.runtime() as rt:
        d = open_directory(rt, volume, at=rt.nodes[0].node_id, placement="static")
        d.mkdir("/a")
        d.create("/a/f", {"type": "file"})
        with pytest.raises(NotFoundError, match=r"/a/nope: no such directory \(in /a/nope/x\)"):
            d.create("/a/nope/x", {"type": "file"})
        with pytest.raises(InvalidArgumentError, match="/a/f is not a directory"):
            d.listdir("/a/f")
        with pytest.raises(AlreadyExistsError, match="/a already exists"):
            d.mkdir("/a")
        with pytest.raises(InvalidArgumentError, match="not empty"):
            d.remove("/a")
        with pytest.raises(InvalidArgumentError, match="not absolute"):
            d.lookup("a")
        assert d.lookup("/a/g") is None
