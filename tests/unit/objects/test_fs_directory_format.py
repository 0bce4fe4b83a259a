"""The directory object's pure parts (block format, paths, the blocks an update
writes) and the object itself over in-memory isolation objects: operation sequences
against a dict model, two clients kept coherent by callbacks, a checkpoint that
carries the cache."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    LimitExceededError,
    NotFoundError,
    ServerError,
)
from shuttle.objects.fs import dirblocks
from shuttle.objects.fs import directory as d
from shuttle.objects.fs.isolation import IsolationObject
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.refs import Ref

names = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="/\0"), min_size=1, max_size=40
).filter(lambda s: s not in (".", ".."))
values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
entries = st.builds(
    lambda key, extra: {"type": "file", "key": key, **extra},
    st.text(max_size=60),
    st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k != "type"), values, max_size=2
    ),
)


# --- blocks ---------------------------------------------------------------------------


@given(
    st.text(min_size=1, max_size=32),
    st.text(max_size=32),
    st.integers(0, dirblocks.DIR_BLOCKS_MAX),
    st.booleans(),
)
def test_a_header_block_round_trips(dir_id: str, parent: str, blocks: int, removed: bool) -> None:
    header = dirblocks.Header(dir_id, parent, blocks, removed)
    raw = dirblocks.encode_header(header)
    assert len(raw) == dirblocks.BLOCK_BYTES
    assert dirblocks.decode_header(raw) == header


@given(st.dictionaries(names, entries, max_size=12))
def test_an_entry_block_round_trips_or_says_it_is_full(block: dict[str, dict[str, Any]]) -> None:
    try:
        raw = dirblocks.encode_entries(block)
    except LimitExceededError:
        assert dirblocks.body_bytes(block) > dirblocks.BODY_BYTES_MAX
        return
    assert len(raw) == dirblocks.BLOCK_BYTES
    assert dirblocks.decode_entries(raw) == block


def test_no_block_is_an_absent_directory_and_damage_is_reported() -> None:
    assert dirblocks.decode_header(b"") is None
    raw = bytearray(dirblocks.encode_entries({"a": {"type": "file"}}))
    raw[dirblocks._BLOCK_HEAD.size] ^= 1
    with pytest.raises(ServerError, match="checksum"):
        dirblocks.decode_entries(bytes(raw))
    with pytest.raises(ServerError, match="not a directory block of kind 1"):
        dirblocks.decode_header(dirblocks.encode_entries({}))
    with pytest.raises(ServerError, match="cut short"):
        dirblocks.decode_entries(b"SDIR")


# --- paths ----------------------------------------------------------------------------


def test_paths_split_into_names() -> None:
    assert dirblocks.split_path("/") == []
    assert dirblocks.split_path("/a/b c/é") == ["a", "b c", "é"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("a/b", "not absolute"),
        ("", "not absolute"),
        ("/a//b", "empty component"),
        ("/a/", "empty component"),
        ("/a/../b", "'..' is not allowed"),
        ("/./b", "'.' is not allowed"),
        ("/a\0b", "NUL"),
        ("/" + "x" * 256, "at most 255"),
        ("/" + "a/" * 2100 + "a", "over 4096"),
        (7, "a path is a string"),
    ],
)
def test_bad_paths_say_what_is_wrong(path: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        dirblocks.split_path(path)


def test_entries_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="mkdir"):
        dirblocks.check_entry({"type": "dir", "id": "x"}, "a")
    with pytest.raises(InvalidArgumentError, match="needs a"):
        dirblocks.check_entry({"key": "k"}, "a")
    with pytest.raises(InvalidArgumentError, match="keep it short"):
        dirblocks.check_entry({"type": "file", "key": "k" * 2000}, "a")


# --- the blocks an update writes, against a dict model --------------------------------


def apply(blocks: dict[int, bytes], writes: list[dirblocks.Write]) -> None:
    for key, offset, raw in writes:
        assert key == "v/.dirs/root"
        blocks[offset] = raw


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 400), st.integers(0, 150)), max_size=300))
def test_inserts_and_removes_keep_the_names_of_a_dict(ops: list[tuple[bool, int, int]]) -> None:
    """Long keys (up to 150 bytes) fill blocks, so removes leave holes and inserts
    spill into new blocks; the listing is always the model's, each name once."""
    blocks: dict[int, bytes] = {}
    model: dict[str, dict[str, Any]] = {}
    for insert, n, pad in ops:
        name = f"file-{n}"
        view = dirblocks.view_of("v/.dirs/root", blocks)
        if insert:
            entry = {"type": "file", "key": "k" * pad}
            if name in model:
                with pytest.raises(AlreadyExistsError):
                    dirblocks.plan_insert(view, name, entry, name)
                continue
            writes = dirblocks.plan_insert(view, name, entry, name)
            if len(writes) == 2:  # a new block and the header: no block had room
                assert all(
                    dirblocks.body_bytes({**b, name: entry}) > dirblocks.BODY_BYTES_MAX
                    for b in view.blocks
                )
            apply(blocks, writes)
            model[name] = entry
        else:
            if name not in model:
                with pytest.raises(NotFoundError):
                    dirblocks.plan_remove(view, name, name)
                continue
            writes, removed = dirblocks.plan_remove(view, name, name)
            assert removed == model.pop(name)
            apply(blocks, writes)
    view = dirblocks.view_of("v/.dirs/root", blocks)
    assert view.listing() == sorted([n, e] for n, e in model.items())


def test_a_full_directory_says_so() -> None:
    full = {f"n{i:04}": {"type": "file", "key": "k" * 100} for i in range(32)}
    view = dirblocks.DirView(
        "v/.dirs/root",
        dirblocks.Header("root", "", dirblocks.DIR_BLOCKS_MAX),
        0,
        [full] * dirblocks.DIR_BLOCKS_MAX,
        [0] * dirblocks.DIR_BLOCKS_MAX,
    )
    with pytest.raises(LimitExceededError, match="directory is full"):
        dirblocks.plan_insert(view, "new", {"type": "file", "key": "k" * 100}, "/new")


# --- the object over in-memory isolation objects ---------------------------------------


class MemoryStore:
    """What the isolation object reads through: blocks in a dict."""

    def __init__(self) -> None:
        self.objects: dict[str, bytearray] = {}

    def read(self, key: str, offset: int, length: int) -> bytes:
        if key not in self.objects:
            raise NotFoundError(key)
        return bytes(self.objects[key][offset : offset + length])

    def write(self, key: str, offset: int, data: bytes, create: bool = True) -> None:
        obj = self.objects.setdefault(key, bytearray())
        if len(obj) < offset:
            obj.extend(bytes(offset - len(obj)))
        obj[offset : offset + len(data)] = data


class MemoryAtomicity:
    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self.applied = 0

    def apply(self, writes: list[Any]) -> dict[str, int]:
        for key, offset, data in writes:
            self.store.write(key, offset, data)
        self.applied += 1
        return {"seq": self.applied, "blocks": len(writes)}


class LocalRuntime:
    """An invoker that calls objects in this process (plain calls, as on one node)."""

    def __init__(self) -> None:
        self.objects: dict[ObjectId, Any] = {}

    def add(self, rid: ObjectId, obj: Any) -> Ref:
        obj.attach(rid, self)
        self.objects[rid] = obj
        return self.own_ref(rid)

    def own_ref(self, rid: ObjectId) -> Ref:
        return Ref(rid, "local", self)

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self.objects[ref.rid], method)(*args, **kwargs)


def cluster(clients: int) -> tuple[LocalRuntime, list[d.DirectoryObject], dict[str, Any]]:
    """Two nodes' isolation objects and ``clients`` directory objects over them."""
    rt = LocalRuntime()
    isolations, stores = {}, {}
    for node in ("n1", "n2"):
        stores[node] = MemoryStore()
        iso = IsolationObject(stores[node], MemoryAtomicity(stores[node]))  # type: ignore[arg-type]
        isolations[node] = rt.add(ObjectId(node, "isolation"), iso)
    dirs = []
    for c in range(clients):
        obj = d.DirectoryObject.__new__(d.DirectoryObject)
        obj.attach(ObjectId(f"c{c}", "1"), rt)
        obj.__init__("vol", isolations)  # type: ignore[misc]
        rt.add(ObjectId(f"c{c}", "1"), obj)
        dirs.append(obj)
    return rt, dirs, stores


def walk(model: dict[str, str], path: str) -> tuple[type[Exception], str] | None:
    """The error resolving directory ``path`` gives in the model (the first ancestor
    missing, or not a directory), or None."""
    names = [n for n in path.split("/") if n]
    for i in range(len(names)):
        prefix = "/" + "/".join(names[: i + 1])
        if prefix not in model:
            return NotFoundError, f"{prefix}: no such directory"
        if model[prefix] != "dir":
            return InvalidArgumentError, f"{prefix} is not a directory"
    return None


paths = st.sampled_from(["/a", "/b", "/a/x", "/a/y", "/b/x", "/a/x/z", "/c"])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 1), st.sampled_from(["mkdir", "create", "remove"]), paths),
        max_size=40,
    )
)
def test_two_clients_operations_match_a_dict_model(ops: list[tuple[int, str, str]]) -> None:
    """Either client may act; the other's next listing shows it (callbacks), and
    every error is the one the model predicts."""
    _, dirs, _ = cluster(2)
    model: dict[str, str] = {"/": "dir"}  # path -> type

    def parent(p: str) -> str:
        return p.rsplit("/", 1)[0] or "/"

    for who, op, path in ops:
        obj = dirs[who]
        problem = walk(model, parent(path))
        if problem is not None:
            error, message = problem
            with pytest.raises(error, match=message):
                if op == "remove":
                    obj.remove(path)
                else:
                    getattr(obj, op)(path, *([] if op == "mkdir" else [{"type": "file"}]))
            continue
        if op == "remove":
            if path not in model:
                with pytest.raises(NotFoundError):
                    obj.remove(path)
                continue
            if any(parent(q) == path for q in model if q != "/"):
                with pytest.raises(InvalidArgumentError, match="not empty"):
                    obj.remove(path)
                continue
            assert obj.remove(path)["type"] == model.pop(path)
            continue
        if path in model:
            with pytest.raises(AlreadyExistsError):
                getattr(obj, op)(path, *([] if op == "mkdir" else [{"type": "file"}]))
            continue
        if op == "mkdir":
            obj.mkdir(path)
            model[path] = "dir"
        else:
            obj.create(path, {"type": "file", "key": path})
            model[path] = "file"
        for o in dirs:
            listed = {name: e["type"] for name, e in o.listdir(parent(path))}
            expect = {
                q.rsplit("/", 1)[1]: t
                for q, t in model.items()
                if q != "/" and parent(q) == parent(path)
            }
            assert listed == expect
    for o in dirs:
        for p, t in model.items():
            entry = o.lookup(p)
            assert entry is not None and entry["type"] == t


def test_a_cached_directory_is_read_once_and_a_callback_drops_it() -> None:
    _, (a, b), _ = cluster(2)
    a.create("/f", {"type": "file"})
    reads = a.stats()["installation_reads"]
    for _ in range(5):
        assert [n for n, _ in a.listdir("/")] == ["f"]
    assert a.stats()["installation_reads"] == reads  # all from the cache
    b.create("/g", {"type": "file"})
    assert a.stats()["invalidations"] >= 1
    assert [n for n, _ in a.listdir("/")] == ["f", "g"]


def test_a_stale_cache_makes_the_commit_conflict_and_the_update_retry() -> None:
    _, (a, b), _ = cluster(2)
    a.create("/f", {"type": "file"})
    b.listdir("/")
    # b's callback is lost (as if it could not be delivered): its copy is stale.
    b.invalidate = lambda key, offsets: None  # type: ignore[method-assign]
    a.create("/g", {"type": "file"})
    b.create("/h", {"type": "file"})
    assert b.stats()["retries"] == 1 and b.stats()["conflicts"] == 1
    assert [n for n, _ in a.listdir("/")] == ["f", "g", "h"]
    samples = b.stats()["timeline"]
    assert [s[1:] for s in samples] == [[0, 1], [1, 1]]  # (inserts, retries) over time


def test_a_read_that_a_callback_overtakes_is_not_cached() -> None:
    """The isolation object breaks a promise after it answered the read but before
    the reader stored the block: the block must not be cached (nobody would tell)."""
    rt, (a, b), _ = cluster(2)
    b.listdir("/")
    iso = rt.objects[ObjectId(a._node("vol/.dirs/root"), "isolation")]
    real_read = iso.read

    def read_then_b_writes(*args: Any) -> Any:
        result = real_read(*args)
        iso.read = real_read
        b.create("/late", {"type": "file"})  # breaks a's promise: a.invalidate runs
        return result

    iso.read = read_then_b_writes
    a.listdir("/")
    assert [n for n, _ in a.listdir("/")] == ["late"]


def test_the_checkpoint_carries_the_cache_and_the_counters() -> None:
    rt, (a,), _ = cluster(1)
    a.mkdir("/d")
    a.create("/d/f", {"type": "file", "key": "k"})
    before = a.stats()
    moved = d.DirectoryObject.__new__(d.DirectoryObject)
    moved.attach(a.rid, rt)
    moved.restore(a.checkpoint())
    rt.objects[a.rid] = moved
    assert moved.lookup("/d/f") == {"type": "file", "key": "k"}
    after = moved.stats()
    assert after["installation_reads"] == before["installation_reads"]  # warm cache
    assert after["inserts"] == 2 and after["cached_blocks"] == before["cached_blocks"]


def test_mkdir_and_rmdir_across_two_nodes_and_errors() -> None:
    _, (a, b), stores = cluster(2)
    for i in range(12):  # some children land on the other node than the root
        a.mkdir(f"/d{i}")
    a.create("/d3/f", {"type": "file"})
    with pytest.raises(InvalidArgumentError, match="not empty"):
        b.remove("/d3")
    with pytest.raises(InvalidArgumentError, match="is not a directory"):
        b.create("/d3/f/g", {"type": "file"})
    with pytest.raises(NotFoundError, match="/nope: no such directory"):
        b.create("/nope/g", {"type": "file"})
    with pytest.raises(InvalidArgumentError, match="root directory"):
        b.remove("/")
    assert b.remove("/d3/f") == {"type": "file"}
    for i in range(12):
        b.remove(f"/d{i}")
    assert a.listdir("/") == []
    with pytest.raises(NotFoundError, match="/d5: no such directory"):
        a.create("/d5/x", {"type": "file"})
    # Every child's header is on the node rendezvous hashing gives its key.
    assert {a._node(k) for s in stores.values() for k in s.objects} == {"n1", "n2"}
    for node, store in stores.items():
        assert all(a._node(k) == node for k in store.objects)


def test_a_mkdir_that_loses_its_name_after_making_its_child_marks_the_child_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, (a, b), stores = cluster(2)
    root_node = a._node("vol/.dirs/root")
    ids = (f"{i:016x}" for i in itertools.count())
    # a's child lands on the other node than the root (its header is written first);
    # b's lands wherever.
    mine = next(i for i in ids if a._node(f"vol/.dirs/{i}") != root_node)
    monkeypatch.setattr(d, "new_dir_id", lambda: mine)
    real_commit = a._commit

    def commit_then_b_takes_the_name(node: str, reads: Any, writes: Any) -> bool:
        ok = real_commit(node, reads, writes)
        if writes[0][0] == f"vol/.dirs/{mine}" and not reads:  # the child's header
            monkeypatch.setattr(d, "new_dir_id", lambda: "b" * 16)
            b.mkdir("/x")
        return ok

    monkeypatch.setattr(a, "_commit", commit_then_b_takes_the_name)
    with pytest.raises(AlreadyExistsError, match="/x already exists"):
        a.mkdir("/x")
    orphan = stores[a._node(f"vol/.dirs/{mine}")].objects[f"vol/.dirs/{mine}"]
    assert dirblocks.decode_header(bytes(orphan[: dirblocks.BLOCK_BYTES])) == dirblocks.Header(
        mine, "root", 0, True
    )
    assert a.lookup("/x") == {"type": "dir", "id": "b" * 16}
    a.create("/x/f", {"type": "file"})
    assert [n for n, _ in b.listdir("/x")] == ["f"]


def other_node_id(a: d.DirectoryObject, start: int) -> str:
    """A directory id whose blocks are not on the root's node."""
    root = a._node("vol/.dirs/root")
    return next(
        i
        for i in (f"{n:016x}" for n in itertools.count(start))
        if a._node(f"vol/.dirs/{i}") != root
    )


def test_rmdir_across_nodes_against_an_insert_into_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rmdir marks the child removed, then drops the parent's entry. An insert that
    comes after the mark finds the directory gone; one that comes between the emptiness
    check and the mark makes the mark conflict, and the rmdir then says "not empty"."""
    _, (a, b), _ = cluster(2)
    for n, name in enumerate(("early", "late")):
        monkeypatch.setattr(d, "new_dir_id", lambda n=n: other_node_id(a, 1000 * n))
        a.mkdir(f"/{name}")
    b.listdir("/early"), b.listdir("/late")  # b has both cached: its inserts need no read
    real_commit = a._commit

    def commit_with_b_inserting(name: str, before: bool) -> Any:
        def commit(node: str, reads: Any, writes: Any) -> bool:
            child = a.lookup(f"/{name}")
            assert child is not None
            marking = writes[0][:2] == (f"vol/.dirs/{child['id']}", 0)
            if marking and before:
                b.create(f"/{name}/f", {"type": "file"})
            ok = real_commit(node, reads, writes)
            if marking and not before and ok:
                with pytest.raises(NotFoundError, match="was removed"):
                    b.create(f"/{name}/f", {"type": "file"})
            return ok

        return commit

    monkeypatch.setattr(a, "_commit", commit_with_b_inserting("late", before=False))
    a.remove("/late")
    assert a.lookup("/late") is None and b.lookup("/late") is None
    monkeypatch.setattr(a, "_commit", commit_with_b_inserting("early", before=True))
    with pytest.raises(InvalidArgumentError, match="/early is a directory that is not empty"):
        a.remove("/early")
    assert [n for n, _ in a.listdir("/early")] == ["f"]
    assert a.stats()["conflicts"] == 1


def test_a_lapsed_promise_is_renewed_and_a_node_restart_is_found_out() -> None:
    rt, (a, b), stores = cluster(2)
    later = [0.0]
    a._promises.clock = lambda: later[0]
    a.create("/f", {"type": "file"})
    later[0] = 1e9  # past the promise's lifetime: the same blocks, renewed
    reads = a.stats()["installation_reads"]
    assert [n for n, _ in a.listdir("/")] == ["f"]
    assert a.stats()["revalidations"] >= 1 and a.stats()["installation_reads"] == reads
    for node in ("n1", "n2"):  # both nodes restart: isolation objects that know no one
        fresh = IsolationObject(stores[node], MemoryAtomicity(stores[node]))  # type: ignore[arg-type]
        rt.objects[ObjectId(node, "isolation")] = fresh
    b.create("/g", {"type": "file"})  # calls no one back
    assert [n for n, _ in a.listdir("/")] == ["f"]  # within the lifetime a cannot know
    later[0] = 2e9
    assert [n for n, _ in a.listdir("/")] == ["f", "g"]


def test_a_restart_s_callback_for_a_whole_directory_stops_a_read_of_a_block_not_held_yet() -> None:
    """A node that restarted calls every holder back for every block of a key it held
    (``invalidate(key, [])``, what ``IsolationObject.recover`` sends). A read of one of
    the key's blocks that the old node answered, and whose answer arrives after that
    callback, must not be kept: the new node holds no promise for it, so it would tell
    nobody of the next change. (The directory's old guard, numbered invalidations of
    the blocks it held, let such a block in: it was not held when the callback came.)"""
    rt, (a, b), stores = cluster(2)
    b.create("/f", {"type": "file"})
    key = "vol/.dirs/root"
    node = a._node(key)
    old = rt.objects[ObjectId(node, "isolation")]
    real_read = old.read

    def answered_then_the_node_restarts(k: str, offset: int, *args: Any) -> Any:
        result = real_read(k, offset, *args)
        if offset == d.BLOCK_BYTES:  # the entry block: answered by the old node
            old.read = real_read
            fresh = IsolationObject(stores[node], MemoryAtomicity(stores[node]))  # type: ignore[arg-type]
            rt.objects[ObjectId(node, "isolation")] = fresh
            a.invalidate(key, [])  # the restarted node's callback overtakes the answer
        return result

    old.read = answered_then_the_node_restarts
    assert [n for n, _ in a.listdir("/")] == ["f"]
    b.create("/late", {"type": "file"})  # the new node calls back whom it promised
    assert [n for n, _ in a.listdir("/")] == ["f", "late"]
