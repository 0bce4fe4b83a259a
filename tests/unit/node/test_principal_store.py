"""Where a node keeps its principals and the operations that change them, without a
server: the table in a data directory's file, changes one epoch at a time, the
``principals.*`` operations and the reload of a shared table (node/principal_store.py).
The table in a RADOS pool is tests/integration/test_principals_rados.py (it needs Ceph)."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from shuttle.errors import (
    ConfigError,
    InvalidArgumentError,
    NotFoundError,
    NotPermittedError,
    StorageIOError,
    VersionMismatchError,
)
from shuttle.net.principals import (
    Caps,
    PrincipalBook,
    PrincipalTable,
    derive_key,
    new_principal,
    unwrap_key,
)
from shuttle.net.registry import PRINCIPAL_ARG, Mode, OperationRegistry
from shuttle.node import principal_store
from shuttle.node.principal_store import (
    TABLE_FILE,
    FileBackend,
    PrincipalStore,
    backend_for,
    refresh_forever,
    register_principal_ops,
)

CLUSTER_KEY = bytes(range(32))
ALICE = new_principal("alice", Caps.of(read=["data/"]))
ONE = PrincipalTable(1, {"alice": ALICE})


# --- the table in a data directory ----------------------------------------------------


def test_a_node_without_a_stored_table_has_an_empty_one(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path)
    assert backend.load() == PrincipalTable()
    assert backend.where == str(tmp_path / ".shuttle" / "principals.json")
    assert backend_for(None, tmp_path, rados=False).where == backend.where


def test_a_stored_table_is_read_back_private_and_whole(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path)
    backend.save(ONE)
    path = tmp_path / TABLE_FILE
    assert path.read_bytes() == ONE.encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert FileBackend(tmp_path).load() == ONE
    two = ONE.with_principal(new_principal("bob", Caps()))
    backend.save(two)  # replaces the old file, leaves no temporary one
    assert FileBackend(tmp_path).load() == two
    assert sorted(p.name for p in path.parent.iterdir()) == ["principals.json"]


def test_a_table_that_cannot_be_stored_changes_nothing(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path)
    backend.save(ONE)
    (tmp_path / ".shuttle" / "principals.json.tmp").mkdir()  # the temporary file's place
    with pytest.raises(StorageIOError) as info:
        backend.save(ONE.with_principal(new_principal("bob", Caps())))
    assert str(info.value) == (
        f"cannot store the node's principals in {tmp_path / TABLE_FILE} (Is a directory); "
        "nothing was changed"
    )
    assert backend.load() == ONE


def test_a_temporary_file_left_by_a_failed_store_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = FileBackend(tmp_path)

    def replace(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", replace)
    with pytest.raises(StorageIOError, match=r"\(No space left on device\); nothing was changed"):
        backend.save(ONE)
    assert os.listdir(tmp_path / ".shuttle") == []
    assert backend.load() == PrincipalTable()


def test_a_first_table_makes_the_directories_it_needs(tmp_path: Path) -> None:
    backend = FileBackend(tmp_path / "new" / "data")
    backend.save(ONE)
    assert FileBackend(tmp_path / "new" / "data").load() == ONE


def test_a_longer_temporary_file_left_behind_is_overwritten_whole(tmp_path: Path) -> None:
    (tmp_path / ".shuttle").mkdir()
    (tmp_path / ".shuttle" / "principals.json.tmp").write_bytes(b" " * 10_000 + b"garbage")
    FileBackend(tmp_path).save(ONE)
    assert (tmp_path / TABLE_FILE).read_bytes() == ONE.encode()


def test_a_link_in_the_temporary_files_place_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / ".shuttle").mkdir()
    target = tmp_path / "elsewhere"
    target.write_bytes(b"someone else's file")
    (tmp_path / ".shuttle" / "principals.json.tmp").symlink_to(target)
    with pytest.raises(StorageIOError, match=r"\(Too many levels of symbolic links\)"):
        FileBackend(tmp_path).save(ONE)
    assert target.read_bytes() == b"someone else's file"
    assert not (tmp_path / TABLE_FILE).exists()


def test_a_stored_table_that_cannot_be_read_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / TABLE_FILE).mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(ConfigError) as info:
        FileBackend(tmp_path).load()
    assert str(info.value) == (
        f"cannot read the node's principals {tmp_path / TABLE_FILE} (Is a directory)"
    )
    (tmp_path / TABLE_FILE).rmdir()
    (tmp_path / TABLE_FILE).write_bytes(b"{not json")
    with pytest.raises(ConfigError, match=rf"^{tmp_path / TABLE_FILE}: malformed principal table"):
        FileBackend(tmp_path).load()


def test_a_stored_table_reaches_the_disk_before_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr("os.fsync", fsync)
    FileBackend(tmp_path).save(ONE)
    assert synced == ["file", "dir"]  # the data, then the rename


# --- changes, one epoch at a time --------------------------------------------------------


class Backend:
    """A table held in memory, counting what is stored (a node's file, as a test sees it)."""

    where = "memory"

    def __init__(self, table: PrincipalTable | None = None) -> None:
        self.table = table or PrincipalTable()
        self.saved: list[PrincipalTable] = []

    def load(self) -> PrincipalTable:
        return self.table

    def save(self, table: PrincipalTable) -> None:
        self.saved.append(table)
        self.table = table


def test_a_table_of_the_next_epoch_is_stored_over_the_expected_one() -> None:
    backend = Backend()
    store = PrincipalStore(PrincipalBook(CLUSTER_KEY), backend)
    assert store.put(ONE, expected_epoch=0) is ONE
    assert backend.saved == [ONE] and store.load() == ONE


def test_a_table_already_stored_is_taken_as_done() -> None:
    backend = Backend(ONE)
    store = PrincipalStore(PrincipalBook(CLUSTER_KEY), backend)
    same = PrincipalTable.decode(ONE.encode(), "test")
    assert store.put(same, expected_epoch=0) == ONE  # another gateway stored it first
    assert backend.saved == []


def test_a_table_changed_meanwhile_is_refused_and_nothing_stored() -> None:
    backend = Backend(ONE)
    store = PrincipalStore(PrincipalBook(CLUSTER_KEY), backend)
    with pytest.raises(VersionMismatchError) as info:
        store.put(ONE.without("alice"), expected_epoch=0)
    assert str(info.value) == (
        "the principals changed meanwhile: memory is at epoch 1, not 0; nothing was changed: "
        "run the command again"
    )
    other = PrincipalTable(1, {})  # the same epoch, another table
    with pytest.raises(VersionMismatchError):
        store.put(other, expected_epoch=0)
    assert backend.saved == []


@pytest.mark.parametrize("epoch", [0, 1])
def test_a_table_must_move_the_epoch_forward(epoch: int) -> None:
    backend = Backend(ONE)
    store = PrincipalStore(PrincipalBook(CLUSTER_KEY), backend)
    with pytest.raises(InvalidArgumentError) as info:
        store.put(PrincipalTable(epoch, {}), expected_epoch=1)
    assert str(info.value) == f"a new principal table must have an epoch over 1, got {epoch}"
    assert backend.saved == []


def test_changes_are_made_one_at_a_time() -> None:
    # Two puts at once, both expecting epoch 0: the lock makes the second see the
    # first's table, so exactly one is stored.
    entered, release = threading.Event(), threading.Event()

    class Slow(Backend):
        def save(self, table: PrincipalTable) -> None:
            entered.set()
            release.wait(10)
            super().save(table)

    backend = Slow()
    store = PrincipalStore(PrincipalBook(CLUSTER_KEY), backend)
    results: list[object] = []

    def put(table: PrincipalTable) -> None:
        try:
            results.append(store.put(table, expected_epoch=0))
        except VersionMismatchError as exc:
            results.append(exc)

    first = threading.Thread(target=put, args=(ONE,))
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=put, args=(PrincipalTable(1, {}),))
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert backend.saved == [ONE]
    assert ONE in results and any(isinstance(r, VersionMismatchError) for r in results)


# --- the operations ---------------------------------------------------------------------


def registry_for(table: PrincipalTable = ONE) -> tuple[OperationRegistry, PrincipalStore]:
    registry = OperationRegistry()
    store = PrincipalStore(PrincipalBook(CLUSTER_KEY, table), Backend(table))
    register_principal_ops(registry, store, CLUSTER_KEY)
    return registry, store


def run(registry: OperationRegistry, name: str, args: dict[str, Any]) -> Any:
    op = registry.get(name)
    result = op.handler(args, b"")
    if op.mode is Mode.ASYNC:
        assert asyncio.iscoroutine(result)
        return asyncio.run(result)
    return result


def test_the_operations_are_cluster_operations() -> None:
    registry, _ = registry_for()
    admin, user = new_principal("root", Caps.of(admin=True)), new_principal("u", Caps.of(read=[""]))
    for name in ("principals.get", "principals.put", "principal.key"):
        guard = registry.get(name).guard
        assert guard is not None
        guard(admin, {})
        with pytest.raises(NotPermittedError, match=rf"may not call {name}, a cluster operation"):
            guard(user, {})
    assert registry.get("principals.put").mode is Mode.ASYNC
    assert registry.get("principal.key").wants_principal


def test_get_answers_the_table_and_its_digest() -> None:
    registry, _ = registry_for()
    assert run(registry, "principals.get", {}) == {"table": ONE.to_wire(), "digest": ONE.digest()}


def test_put_installs_a_new_table_and_tells_the_book(caplog: pytest.LogCaptureFixture) -> None:
    registry, store = registry_for()
    heard: list[PrincipalTable] = []
    store.book.listeners.append(heard.append)
    two = ONE.with_principal(new_principal("bob", Caps()))
    with caplog.at_level(logging.INFO, logger="shuttle.node"):
        answer = run(registry, "principals.put", {"table": two.to_wire(), "expected_epoch": 1})
        assert answer == {"epoch": 2, "digest": two.digest()}
        assert store.book.table == two and heard == [two]
        # the same table again: done already, and the book is not told twice
        again = run(registry, "principals.put", {"table": two.to_wire(), "expected_epoch": 1})
    assert again == answer and heard == [two]
    assert [r.getMessage() for r in caplog.records] == ["principals: epoch 2 (2 principals)"]


def test_put_refuses_a_malformed_table_as_a_bad_argument() -> None:
    registry, store = registry_for()
    with pytest.raises(InvalidArgumentError) as info:
        run(registry, "principals.put", {"table": {"format": 9}, "expected_epoch": 1})
    assert str(info.value) == (
        "principals.put: malformed principal table (format 9, this build reads 1)"
    )
    with pytest.raises(InvalidArgumentError, match="expected_epoch"):
        run(registry, "principals.put", {"table": ONE.to_wire()})
    assert store.book.table is ONE


def test_key_wraps_a_principals_key_for_its_caller() -> None:
    admin = new_principal("root", Caps.of(admin=True))
    table = ONE.with_principal(admin)
    registry, _ = registry_for(table)
    reply = run(registry, "principal.key", {"name": "alice"})  # the cluster key's holder
    assert unwrap_key(CLUSTER_KEY, "alice", reply) == derive_key(CLUSTER_KEY, ALICE)
    reply = run(registry, "principal.key", {"name": "alice", PRINCIPAL_ARG: admin})
    root_key = derive_key(CLUSTER_KEY, admin)
    assert unwrap_key(root_key, "alice", reply) == derive_key(CLUSTER_KEY, ALICE)
    with pytest.raises(NotFoundError) as info:
        run(registry, "principal.key", {"name": "bob"})
    assert str(info.value) == "no principal 'bob' on this node"
    with pytest.raises(InvalidArgumentError):
        run(registry, "principal.key", {})


# --- the reload of a shared table ------------------------------------------------------


def test_a_shared_table_is_reloaded_and_installed_when_it_changed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(principal_store, "RADOS_REFRESH_S", 0.0)
    later = ONE.with_principal(new_principal("bob", Caps()))
    same_epoch_other = PrincipalTable(2, {"carol": new_principal("carol", Caps())})
    # What each reload finds: the same table, a failing pool, an older table, a later
    # one, another table at the same epoch; then the test ends.
    answers: list[PrincipalTable | Exception] = [
        ONE,
        StorageIOError("the pool is slow"),
        PrincipalTable(0, {}),
        later,
        same_epoch_other,
    ]
    installed: list[PrincipalTable] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        exhausted = asyncio.Event()

        class Pool(Backend):
            def load(self) -> PrincipalTable:  # in the executor's thread
                if not answers:
                    loop.call_soon_threadsafe(exhausted.set)
                    return same_epoch_other
                answer = answers.pop(0)
                if isinstance(answer, Exception):
                    raise answer
                return answer

        store = PrincipalStore(PrincipalBook(CLUSTER_KEY, ONE), Pool())
        store.book.listeners.append(installed.append)
        task = asyncio.create_task(refresh_forever(store))
        waiting = asyncio.create_task(exhausted.wait())
        await asyncio.wait({task, waiting}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        assert waiting.done() and not task.done()  # it reloads forever, failures and all
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.INFO, logger="shuttle.node"):
        asyncio.run(main())
    assert installed == [later, same_epoch_other]
    assert [r.getMessage() for r in caplog.records] == [
        "principals: could not reload (the pool is slow); keeping epoch 1",
        "principals: epoch 2 from the pool",
        "principals: epoch 2 from the pool",
    ]
