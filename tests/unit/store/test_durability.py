"""Checkpoint durability: which sync mode a file system gets, and that the per-file mode
fsyncs every object file, attribute file and directory changed since the last
checkpoint (a FUSE file system such as LazyFS never sees a syncfs)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from shuttle.errors import ConfigError, StorageIOError
from shuttle.store import ObjectStore, StoreConfig
from shuttle.store.durability import choose_sync_mode, filesystem_type

Inode = tuple[int, int]


def _mountinfo(path: Path, fstype: str) -> str:
    dev = os.stat(path).st_dev
    return (
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"43 27 {os.major(dev)}:{os.minor(dev)} / {path} rw,nosuid master:1 - {fstype} src rw\n"
    )


def test_filesystem_type_is_read_from_mountinfo(tmp_path: Path) -> None:
    dev = os.stat(tmp_path).st_dev
    assert filesystem_type(_mountinfo(tmp_path, "fuse.lazyfs"), dev) == "fuse.lazyfs"
    assert filesystem_type("27 1 254:0 / / rw - ext4 /dev/vda rw\n", os.makedev(9, 9)) is None


@pytest.mark.parametrize(
    ("fstype", "mode"),
    [("ext4", "syncfs"), ("xfs", "syncfs"), ("fuse.lazyfs", "fsync"), ("nfs4", "fsync")],
)
def test_auto_uses_syncfs_only_where_it_is_honoured(tmp_path: Path, fstype: str, mode: str) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        assert choose_sync_mode("auto", fd, mountinfo=_mountinfo(tmp_path, fstype)) == mode
        assert choose_sync_mode("auto", fd, mountinfo="") == "fsync"  # unknown: the safe way
        assert choose_sync_mode("syncfs", fd, mountinfo=_mountinfo(tmp_path, "fuse")) == "syncfs"
        with pytest.raises(ConfigError, match="sync_mode"):
            choose_sync_mode("sometimes", fd)  # type: ignore[arg-type]
    finally:
        os.close(fd)


class FsyncLog:
    """Records the inode of every fsync (then does it)."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.synced: set[Inode] = set()
        self._lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        st = os.fstat(fd)
        with self._lock:
            self.synced.add((st.st_dev, st.st_ino))
        self.real(fd)


def _inode(path: Path | str) -> Inode:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def _changes(store: ObjectStore) -> list[str]:
    """One change of every kind; returns the keys that exist afterwards."""
    store.put("a/b/inline", b"x" * 5000)  # in place, new directories
    store.put("a/staged", os.urandom(2 << 20))  # staging file renamed into place
    store.write("c/written", 100, b"y" * 300, create=True)
    store.put("d/truncated", b"z" * 9000)
    store.truncate("d/truncated", 10)
    up = store.begin_upload("e/uploaded")
    store.upload_write(up, 0, b"u" * 4000)
    store.commit_upload(up)
    store.put("gone/soon/x", b"1")
    store.remove("gone/soon/x")  # unlink, then the empty directories are pruned
    return ["a/b/inline", "a/staged", "c/written", "d/truncated", "e/uploaded"]


def test_fsync_checkpoint_syncs_every_changed_file_and_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    store = ObjectStore(root, StoreConfig(sync_mode="fsync"))
    try:
        assert store.durability.mode == "fsync"
        store.put("untouched/old", b"before")
        store.checkpoint()
        keys = _changes(store)
        fsyncs = FsyncLog(os.fsync)
        monkeypatch.setattr(os, "fsync", fsyncs)
        store.checkpoint()
        monkeypatch.undo()
        must: dict[str, Inode] = {}
        for key in keys:
            must[f"object {key}"] = _inode(root / key)
            attr = Path(store.attrs.path_of(key))
            must[f"attributes of {key}"] = _inode(attr)
            must[f"attribute directory of {key}"] = _inode(attr.parent)
            parts = key.split("/")
            for i in range(len(parts)):
                where = root.joinpath(*parts[:i])
                must[f"directory {where}"] = _inode(where)
        must["attrs directory"] = _inode(store.layout.attrs_dir)
        missing = sorted(name for name, ino in must.items() if ino not in fsyncs.synced)
        assert not missing, f"not fsynced at the checkpoint: {missing}"
        assert _inode(root / "untouched" / "old") not in fsyncs.synced  # only what changed
        assert not (root / "gone").exists()
        assert store.durability.filesystem_syncs == 0
        assert store.durability.files_synced >= 2 * len(keys)
    finally:
        store.close()


def test_recovery_syncs_the_objects_it_redid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    store = ObjectStore(root, StoreConfig(sync_mode="fsync"))
    keys = _changes(store)
    store.close(checkpoint=False)  # as a crash leaves it: everything in the journal
    fsyncs = FsyncLog(os.fsync)
    monkeypatch.setattr(os, "fsync", fsyncs)
    store = ObjectStore(root, StoreConfig(sync_mode="fsync"))
    monkeypatch.undo()
    try:
        assert store.recovery.records > 0
        for key in keys:
            assert _inode(root / key) in fsyncs.synced, key
            assert _inode(store.attrs.path_of(key)) in fsyncs.synced, key
    finally:
        store.close()


def test_a_failed_checkpoint_fsync_keeps_the_journal_and_stops_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    store = ObjectStore(root, StoreConfig(sync_mode="fsync"))
    store.put("k", b"acknowledged")
    real = os.fsync
    target = _inode(root / "k")

    def failing(fd: int) -> None:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) == target:
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(StorageIOError, match="could not make changes durable"):
        store.checkpoint()
    monkeypatch.undo()
    assert store.journal.size_bytes > 0  # not emptied: the change is still redoable
    with pytest.raises(StorageIOError, match="Restart the node"):
        store.put("k2", b"refused")
    store.close()
    with ObjectStore(root, StoreConfig(sync_mode="fsync")) as again:
        assert again.read("k") == b"acknowledged"
        assert again.recovery.records >= 1


def test_auto_mode_on_this_file_system_matches_its_type(tmp_path: Path) -> None:
    with ObjectStore(tmp_path / "data") as store:
        store.put("k", b"v")
        store.checkpoint()
        with open("/proc/self/mountinfo") as f:
            fstype = filesystem_type(f.read(), os.stat(tmp_path).st_dev)
        want = "syncfs" if fstype in ("ext3", "ext4", "xfs", "btrfs", "tmpfs") else "fsync"
        assert store.durability.mode == want
        synced = store.durability.filesystem_syncs + store.durability.files_synced
        assert synced > 0


def test_a_fresh_store_makes_the_journal_name_durable_before_any_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "data"
    internal = root / ".shuttle"
    real = os.fsync
    synced_with_journal: list[bool] = []

    def recording(fd: int) -> None:
        st = os.fstat(fd)
        if internal.exists() and (st.st_dev, st.st_ino) == _inode(internal):
            synced_with_journal.append((internal / "journal").exists())
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    store = ObjectStore(root)  # a fresh store: no checkpoint at open
    monkeypatch.undo()
    try:
        assert True in synced_with_journal, "the journal's directory entry was never synced"
    finally:
        store.close()
