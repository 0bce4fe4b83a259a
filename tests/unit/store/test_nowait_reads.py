"""A block-cache miss read on the caller's thread with RWF_NOWAIT
(``ObjectStore.read_nowait``, what a node does on its event loop): the same bytes and
cache fill as the thread path when the page cache holds the blocks; None, having
counted and cached nothing, when the kernel would block, has only part, or cannot say
(then never asked again); and never a wait for a writer. The file system's answers are
played by an injected ``pread``."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shuttle.store import ObjectStore, StoreConfig
from shuttle.store.nowait import NowaitReads, ReusedBufferPread, platform_pread

BLOCK = 4096
DATA = os.urandom(10 * BLOCK + 100)  # a short last block too


class FileSystem:
    """A pread with RWF_NOWAIT as a file system might answer it: ``would_block`` makes
    it fail with EAGAIN, ``short`` return part, ``errno`` fail with that error; else the
    platform's real call. ``calls`` counts what it was asked."""

    def __init__(self) -> None:
        self.would_block = False
        self.short = False
        self.errno: int | None = None
        self.calls = 0
        real = platform_pread()
        assert real is not None, "these tests need os.preadv with RWF_NOWAIT (Linux)"
        self.real = real

    def __call__(self, fd: int, length: int, offset: int) -> bytes:
        self.calls += 1
        if self.would_block:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        if self.errno is not None:
            raise OSError(self.errno, os.strerror(self.errno))
        got = self.real(fd, length, offset)
        return got[: len(got) // 2] if self.short else got


@pytest.fixture
def fs() -> FileSystem:
    return FileSystem()


@pytest.fixture
def store(tmp_path: Path, fs: FileSystem) -> Iterator[ObjectStore]:
    s = ObjectStore(
        tmp_path / "data", StoreConfig(cache_capacity_bytes=1 << 20, cache_block_size_bytes=BLOCK)
    )
    s.nowait = NowaitReads(fs)
    s.put("k", DATA)
    s.read("k", 0, len(DATA), use_cache=False)  # the whole file in the page cache
    s.cache.clear()
    try:
        yield s
    finally:
        s.close()


@pytest.mark.parametrize(
    ("offset", "length"),
    [(5 * BLOCK + 10, 100), (BLOCK - 50, 200), (0, 3 * BLOCK), (10 * BLOCK, 500), (9 * BLOCK, 99)],
)
def test_a_miss_the_page_cache_holds_is_read_like_the_thread_path(
    store: ObjectStore, offset: int, length: int
) -> None:
    want = DATA[offset : offset + length]
    before = store.cache.stats()
    assert store.read_nowait("k", offset, length) == want
    after = store.cache.stats()
    blocks = (min(offset + length, len(DATA)) - 1) // BLOCK - offset // BLOCK + 1
    # Counted and cached exactly as the thread path's cache.read counts its fetch.
    assert after.misses - before.misses == blocks and after.blocks_cached == blocks
    assert (
        after.bytes_from_disk - before.bytes_from_disk
        == min((offset // BLOCK + blocks) * BLOCK, len(DATA)) - offset // BLOCK * BLOCK
    )
    assert store.nowait.served == 1
    assert store.read_cached("k", offset, length) == want  # now a block-cache hit
    assert store.stats()["nowait"] == {"served": 1, "would_block": 0, "unsupported": None}


def test_a_read_that_would_block_is_declined_and_leaves_no_trace(
    store: ObjectStore, fs: FileSystem
) -> None:
    fs.would_block = True
    before, reads_before = store.cache.stats(), store.stats()["bytes_read"]
    assert store.read_nowait("k", 2 * BLOCK, 100) is None
    after = store.cache.stats()
    assert (after.misses, after.bytes_from_disk, after.blocks_cached) == (
        before.misses,
        before.bytes_from_disk,
        0,
    )
    assert store.stats()["bytes_read"] == reads_before
    assert store.nowait.would_block == 1 and store.nowait.enabled
    assert store.read("k", 2 * BLOCK, 100) == DATA[2 * BLOCK : 2 * BLOCK + 100]  # the pool's way
    fs.would_block = False
    assert store.read_nowait("k", 6 * BLOCK, 100) == DATA[6 * BLOCK : 6 * BLOCK + 100]


def test_a_short_read_is_declined_for_the_thread_path_to_finish(
    store: ObjectStore, fs: FileSystem
) -> None:
    fs.short = True  # only part of the range is resident
    assert store.read_nowait("k", 0, 2 * BLOCK) is None
    assert store.cache.stats().blocks_cached == 0 and store.nowait.would_block == 1


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_a_file_system_without_nowait_falls_back_once_and_is_remembered(
    store: ObjectStore, fs: FileSystem, code: int
) -> None:
    fs.errno = code
    assert store.read_nowait("k", 0, 100) is None
    assert not store.nowait.enabled and f"errno {code}" in str(store.nowait.unsupported)
    assert store.read_nowait("k", BLOCK, 100) is None
    assert fs.calls == 1  # asked once, then never again
    assert store.read("k", BLOCK, 100) == DATA[BLOCK : BLOCK + 100]


def test_another_error_is_declined_for_the_thread_path_to_report(
    store: ObjectStore, fs: FileSystem
) -> None:
    fs.errno = errno.EIO
    assert store.read_nowait("k", 0, 100) is None
    assert store.nowait.enabled  # a disk error says nothing about the flag


def test_it_never_waits_for_a_writer(store: ObjectStore) -> None:
    lock = store._locks.lock_for("k")
    lock.acquire_write()  # a change under way (this thread: a wait would hang the test)
    try:
        assert store.read_nowait("k", 0, 100) is None
    finally:
        lock.release_write()
    assert store.read_nowait("k", 0, 100) == DATA[:100]
    assert lock.try_acquire_read()  # and it gave its shared hold back
    lock.release_read()


def test_what_the_usual_way_must_answer_is_declined(store: ObjectStore, fs: FileSystem) -> None:
    version = store.stat("k").version
    assert store.read_nowait("k", 0, 100, version + 1) is None  # the mismatch is raised there
    assert store.read_nowait("k", len(DATA), 100) is None  # at the end: b"" there
    assert store.read_nowait("nope", 0, 100) is None
    assert store.read_nowait("../k", 0, 100) is None
    assert store.read_nowait("k", -1, 100) is None
    assert store.read_nowait("k", 0, 1 << 30) is None  # over the cached-read size
    assert fs.calls == 0
    assert store.read_nowait("k", 0, 100, version) == DATA[:100]


def test_without_a_block_cache_it_reads_just_the_range(tmp_path: Path, fs: FileSystem) -> None:
    with ObjectStore(tmp_path / "data", StoreConfig(cache_capacity_bytes=0)) as s:
        s.nowait = NowaitReads(fs)
        s.put("k", DATA)
        assert s.read_nowait("k", 123, 4000) == DATA[123:4123]
        assert s.cache.stats().bytes_from_disk == 0


def _c_read() -> Any:
    try:
        from shuttle.store import _nowait
    except ImportError:
        pytest.skip("the C read is not built (scripts/build_compiled.py)")
    return _nowait.pread_nowait


def test_the_c_read_answers_as_the_reference_does(tmp_path: Path) -> None:
    """``_nowait.c`` against :class:`ReusedBufferPread` on the same file: a resident
    range, one that runs past the end (short), one past the end (empty), a bad
    descriptor (the same OSError) and bad arguments (refused, saying which)."""
    c_read, reference = _c_read(), ReusedBufferPread()
    path = tmp_path / "f"
    path.write_bytes(DATA)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, len(DATA), 0)  # resident
        for length, offset in ((BLOCK, 0), (BLOCK, 3 * BLOCK + 7), (BLOCK, 10 * BLOCK), (50, 0)):
            got = c_read(fd, length, offset)
            assert type(got) is bytes and got == reference(fd, length, offset)
            assert got == DATA[offset : offset + length]
        assert c_read(fd, 100, len(DATA) + 5) == reference(fd, 100, len(DATA) + 5) == b""
    finally:
        os.close(fd)
    errors = []
    for read in (c_read, reference):
        with pytest.raises(OSError) as caught:
            read(fd, 100, 0)  # closed
        errors.append((type(caught.value), caught.value.errno))
    assert errors[0] == errors[1] == (OSError, errno.EBADF)
    with pytest.raises(ValueError, match="must be >= 0"):
        c_read(0, -1, 0)
    with pytest.raises(TypeError, match="takes 3 arguments"):
        c_read(0, 1)


def test_the_platform_read_is_the_c_one_with_the_compiled_modules() -> None:
    from shuttle import compiled

    read = platform_pread()
    if compiled.active().compiled:
        assert read is _c_read()
    else:
        assert isinstance(read, ReusedBufferPread)
