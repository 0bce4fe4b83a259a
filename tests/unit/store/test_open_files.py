"""Object files kept open across reads (``shuttle.store.openfiles``): a read never goes
through the file of another version of its object, whatever changed it (a put that
renames a new file into place, an in-place write or put, a truncate, a remove, an
upload's commit, a restart); a removed object's file is closed at once; a file is
never closed under a reader; the cache stays within its bound."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shuttle.errors import InvalidArgumentError
from shuttle.store import ObjectStore, StoreConfig
from shuttle.store.nowait import NowaitReads, platform_pread
from shuttle.store.openfiles import OpenFiles, open_files_max

BLOCK = 4096
OLD = os.urandom(8 * BLOCK)
NEW = os.urandom(8 * BLOCK)


def config(**kw: int) -> StoreConfig:
    # Puts over 1 KiB go through a staging file renamed onto the object: a new inode.
    base = {"cache_capacity_bytes": 1 << 20, "cache_block_size_bytes": BLOCK}
    base["inline_put_bytes_max"] = 1024
    base.update(kw)
    return StoreConfig(**base)  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ObjectStore]:
    s = ObjectStore(tmp_path / "data", config())
    s.put("k", OLD)
    try:
        yield s
    finally:
        s.close()


def miss(store: ObjectStore, offset: int, length: int) -> bytes | None:
    """A block-cache miss read on the caller's thread (the node's event loop)."""
    store.cache.clear()
    return store.read_nowait("k", offset, length)


def deleted_files_open(root: Path) -> list[str]:
    """This process's descriptors of files under ``root`` that have been deleted."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)) and target.endswith("(deleted)"):
            out.append(target)
    return out


def test_a_read_after_a_put_that_renames_a_new_file_reads_the_new_one(
    store: ObjectStore,
) -> None:
    assert miss(store, BLOCK, 100) == OLD[BLOCK : BLOCK + 100]
    assert len(store.open_files) == 1  # kept open
    store.put("k", NEW)  # staged: a new file renamed over the old one
    assert miss(store, BLOCK, 100) == NEW[BLOCK : BLOCK + 100]
    assert store.read("k", 3 * BLOCK, 100, use_cache=True) == NEW[3 * BLOCK : 3 * BLOCK + 100]


def test_a_read_after_an_upload_commit_reads_the_committed_file(store: ObjectStore) -> None:
    assert miss(store, 0, 100) == OLD[:100]
    upload = store.begin_upload("k")
    store.upload_write(upload, 0, NEW)
    store.commit_upload(upload)
    assert miss(store, 0, 100) == NEW[:100]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.write("k", BLOCK, b"x" * 100), id="write"),
        pytest.param(lambda s: s.truncate("k", 2 * BLOCK), id="truncate"),
        pytest.param(lambda s: s.put("k", b"small"), id="inline-put"),
        pytest.param(lambda s: s.set_mtime("k", 1), id="set-mtime"),
    ],
)
def test_every_change_forgets_the_kept_file(
    store: ObjectStore, change: Callable[[ObjectStore], object]
) -> None:
    assert miss(store, 0, 100) == OLD[:100]
    forgotten = store.open_files.forgotten
    change(store)
    assert len(store.open_files) == 0 and store.open_files.forgotten == forgotten + 1
    whole = store.read("k", 0, 1 << 20, use_cache=False)
    assert miss(store, 0, 100) == whole[:100]
    assert store.read_nowait("k", 0, len(whole) + 10) == whole


def test_a_removed_object_s_file_is_closed_at_once(store: ObjectStore, tmp_path: Path) -> None:
    assert miss(store, 0, 100) == OLD[:100]
    store.remove("k")
    assert deleted_files_open(tmp_path) == []  # its space is free, not held by a reader
    assert store.read_nowait("k", 0, 100) is None
    store.put("k", NEW)  # the same key again: a new object
    assert miss(store, 0, 100) == NEW[:100]


def test_a_restart_starts_with_nothing_open(tmp_path: Path) -> None:
    with ObjectStore(tmp_path / "data", config()) as s:
        s.put("k", OLD)
        assert miss(s, 0, 100) == OLD[:100]
        before = len(os.listdir("/proc/self/fd"))
    assert len(os.listdir("/proc/self/fd")) < before  # the kept file closed with the store
    # Changed while no store had it open (as an operator might restore a backup).
    with ObjectStore(tmp_path / "data", config()) as s:
        s.put("k", NEW)
    with ObjectStore(tmp_path / "data", config()) as s:
        assert len(s.open_files) == 0
        s.stat("k")  # its attributes into memory (a miss on the loop needs them there)
        assert miss(s, 0, 100) == NEW[:100]


def test_an_entry_of_another_version_is_never_used(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"one")
    opened: list[int] = []

    def opener(key: str) -> int:
        fd = os.open(path, os.O_RDONLY)
        opened.append(fd)
        return fd

    files = OpenFiles(4)
    first = files.borrow("k", 1, opener)
    files.give_back(first)
    again = files.borrow("k", 1, opener)
    assert again is first and len(opened) == 1  # kept, and reused for its version
    files.give_back(again)
    other = files.borrow("k", 2, opener)
    assert other is not first and len(opened) == 2  # a new version: a new file
    assert first.fd == -1 and first.retired  # the old version's file was closed
    files.give_back(other)
    files.close()


def test_a_file_is_never_closed_under_a_reader(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"data")

    def opener(key: str) -> int:
        return os.open(path, os.O_RDONLY)

    files = OpenFiles(1)
    a = files.borrow("a", 1, opener)
    b = files.borrow("b", 1, opener)  # evicts a, which a reader still holds
    assert len(files) == 1 and files.evictions == 1
    assert os.pread(a.fd, 4, 0) == b"data"  # still open
    files.forget("b")  # a change to b while its reader reads
    assert os.pread(b.fd, 4, 0) == b"data"
    a_fd, b_fd = a.fd, b.fd
    files.give_back(a)
    files.give_back(b)
    for fd in (a_fd, b_fd):  # the last reader closed each
        with pytest.raises(OSError):
            os.fstat(fd)
    assert a.fd == -1 and b.fd == -1


def test_a_miss_on_the_loop_reads_through_a_lease_another_thread_cannot_close(
    tmp_path: Path,
) -> None:
    """While a miss reads (``preadv`` lets other threads run), another key's read evicts
    its file (one kept at most) and a new file takes the lowest free number: the miss
    still reads its own object, because it borrowed the descriptor. Without the lease
    the evicted number would be closed and reused, and the read would return the other
    file's bytes (or fail)."""
    with ObjectStore(tmp_path / "data", config(open_files_max=1)) as s:
        s.put("k", OLD)
        s.put("j", NEW)
        real = platform_pread()
        assert real is not None, "this test needs os.preadv with RWF_NOWAIT (Linux)"
        meanwhile: list[bytes] = []
        decoys: list[int] = []

        def another_thread_reads_j_first(fd: int, length: int, offset: int) -> bytes:
            if not meanwhile:  # once: "j" evicts "k"'s file from the one slot
                s.cache.clear()
                meanwhile.append(s.read("j", 0, 100))
                decoys.append(os.open(tmp_path / "data" / "j", os.O_RDONLY))  # lowest free
            return real(fd, length, offset)

        s.nowait = NowaitReads(another_thread_reads_j_first)
        s.cache.clear()
        try:
            assert s.read_nowait("k", BLOCK, 100) == OLD[BLOCK : BLOCK + 100]
        finally:
            for fd in decoys:
                os.close(fd)
        assert meanwhile == [NEW[:100]] and s.stats()["open_files"]["evictions"] >= 1


def test_the_cache_stays_within_its_bound(tmp_path: Path) -> None:
    with ObjectStore(tmp_path / "data", config(open_files_max=3)) as s:
        for i in range(10):
            s.put(f"k{i}", OLD)
            s.cache.clear()
            assert s.read_nowait(f"k{i}", 0, 100) == OLD[:100]
            assert len(s.open_files) <= 3
        assert s.stats()["open_files"]["evictions"] == 7
    with ObjectStore(tmp_path / "none", config(open_files_max=0)) as s:
        s.put("k", OLD)
        assert miss(s, 0, 100) == OLD[:100] and len(s.open_files) == 0


def test_the_bound_fits_the_descriptor_limit() -> None:
    assert open_files_max(128, 20_000) == 128
    assert open_files_max(128, 1024) == 64  # a sixteenth of the limit
    assert open_files_max(128, 8) == 0
    with pytest.raises(InvalidArgumentError, match=r"open_files_max.*>= 0"):
        StoreConfig(open_files_max=-1)


def test_out_of_descriptors_gives_the_kept_files_back(store: ObjectStore) -> None:
    store.put("j", NEW)
    assert miss(store, 0, 100) == OLD[:100] and len(store.open_files) == 1

    def no_descriptors(key: str) -> int:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    store._open_for_read = no_descriptors  # type: ignore[method-assign]
    store.cache.clear()
    assert store.read_nowait("j", 0, 100) is None  # the thread path reports it
    assert len(store.open_files) == 0
