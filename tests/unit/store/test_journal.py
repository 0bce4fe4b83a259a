"""The journal's own promises, one by one (docs/storage-format.md, "The journal"): an
append is on disk and synced before it returns, the bytes of a record are exactly the
documented format, and a reader stops at anything that is not the next valid record.

The syscalls are the journal's contract with the disk, so these tests watch them: a
fake ``fdatasync`` counts (and can hold) syncs, a fake ``pwritev`` can write short.
Each test names, in a comment, the mutant of ``store/journal.py`` it was seen to fail
against (``make mutate MODULES=src/shuttle/store/journal.py``; docs/testing.md).
"""

from __future__ import annotations

import os
import stat
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import blake3
import msgpack
import pytest

from shuttle.store import ObjectStore, StoreConfig
from shuttle.store import journal as journal_mod
from shuttle.store.journal import HEADER_BYTES, MAGIC, Journal

#: Longest a test waits for another thread (far above what it needs; past it the test
#: fails rather than hangs).
WAIT_S = 10.0


class SyncRecorder:
    """A fake ``os.fdatasync``: records each call (the descriptor and the file's size
    at that moment), then calls the real one; ``hold`` makes a call wait for an event
    first, as a slow disk would."""

    def __init__(self, real: Callable[[int], None]) -> None:
        self.real = real
        self.calls: list[tuple[int, int]] = []
        self.hold: threading.Event | None = None
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self.lock:
            self.calls.append((fd, os.fstat(fd).st_size))
            hold, self.hold = self.hold, None  # only the first call waits
        if hold is not None and not hold.wait(WAIT_S):
            raise AssertionError("the held sync was never released")
        self.real(fd)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> SyncRecorder:
    recorder = SyncRecorder(os.fdatasync)
    monkeypatch.setattr(journal_mod.os, "fdatasync", recorder)
    return recorder


def _record(meta: dict[str, object], data: bytes = b"") -> bytes:
    """A record as the format in docs/storage-format.md says, built independently."""
    blob = msgpack.packb(meta, use_bin_type=True)
    digest = blake3.blake3(blob + data).digest()
    head = MAGIC + len(blob).to_bytes(4, "little") + len(data).to_bytes(8, "little") + digest
    return head + blob + data


# --- the bytes on disk -------------------------------------------------------------------

#: One record, as the journal writes it: ``put`` of a 37-byte key with 4 bytes of data
#: at sequence number 7. If this test fails the on-disk format changed: a journal written
#: by the previous version would not be replayed. Change it only on purpose, with a
#: format version and a note in docs/storage-format.md. (The key is longer than 31
#: bytes so that its encoding, str8, pins msgpack's use_bin_type=True: the old spec's
#: encoding would give it str16.)
GOLDEN_KEY = "objects/2024/report-final-version.txt"
GOLDEN_RECORD = bytes.fromhex(
    "53484a31"  # magic "SHJ1"
    "44000000"  # meta_len 68 (u32, little-endian)
    "0400000000000000"  # data_len 4 (u64, little-endian)
    "21ca6046fda330533bd6ca48326c30ba"  # blake3(meta + data), 32 bytes
    "f0ed9a5420d1897cc3d5a2f65881a3ae"
    "84a26f70a3707574a36b6579d925"  # msgpack {"op": "put", "key": (str8, 37 bytes)
    "6f626a656374732f323032342f7265706f72742d66696e616c2d76657273696f6e2e747874"
    "a86d74696d655f6e73cd0539a373657107"  # "mtime_ns": 1337, "seq": 7}
    "64617461"  # data "data"
)


def test_a_record_is_the_documented_bytes(tmp_path: Path) -> None:
    # Mutants: any change to the header's fields, the digest's input or the meta's
    # encoding (e.g. hasher.update(data) deleted, use_bin_type=False).
    path = tmp_path / "journal"
    j = Journal(str(path), next_seq=7)
    assert j.append({"op": "put", "key": GOLDEN_KEY, "mtime_ns": 1337}, b"data") == 7
    j.close()
    assert path.read_bytes() == GOLDEN_RECORD
    meta = {"op": "put", "key": GOLDEN_KEY, "mtime_ns": 1337, "seq": 7}
    assert _record(meta, b"data") == GOLDEN_RECORD
    assert HEADER_BYTES == 4 + 4 + 8 + 32


def test_a_fresh_journal_counts_from_nothing(tmp_path: Path) -> None:
    # Mutants: the counters' initial values (syncs, bytes_appended, records_since_reset
    # = 1), their increments (+= 2, = total, -= total), the file's mode (0o644 dropped:
    # an executable journal), self.path, close() no longer idempotent.
    path = tmp_path / "journal"
    j = Journal(str(path), next_seq=1)
    assert (j.path, j.size_bytes, j.next_seq) == (str(path), 0, 1)
    assert (j.records_appended, j.syncs, j.bytes_appended, j.records_since_reset) == (0, 0, 0, 0)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~umask
    j.append({"op": "put", "key": "a"}, b"12345")
    j.append({"op": "remove", "key": "a"})
    size = path.stat().st_size
    assert (j.records_appended, j.syncs, j.bytes_appended, j.records_since_reset) == (2, 2, size, 2)
    assert (j.size_bytes, j.next_seq) == (size, 3)
    j.close()
    j.close()  # closing twice is harmless


def test_records_follow_each_other_and_read_back(tmp_path: Path) -> None:
    # Mutants: self._end += total (offset of the next record), the yielded data slice.
    path = tmp_path / "journal"
    j = Journal(str(path), next_seq=1)
    j.append({"op": "put", "key": "a"}, b"one")
    j.append({"op": "write", "key": "b", "offset": 3}, memoryview(b"two"))
    j.append({"op": "remove", "key": "a"})
    assert j.size_bytes == path.stat().st_size
    j.close()
    assert path.read_bytes() == b"".join(
        [
            _record({"op": "put", "key": "a", "seq": 1}, b"one"),
            _record({"op": "write", "key": "b", "offset": 3, "seq": 2}, b"two"),
            _record({"op": "remove", "key": "a", "seq": 3}),
        ]
    )
    j = Journal(str(path), next_seq=1)
    got = [(r.seq, r.meta["op"], r.data) for r in j.read_valid(after_seq=0)]
    assert got == [(1, "put", b"one"), (2, "write", b"two"), (3, "remove", b"")]
    assert (j.next_seq, j.size_bytes) == (4, path.stat().st_size)
    j.close()


# --- durability ----------------------------------------------------------------------------


def test_an_append_is_synced_before_it_returns(tmp_path: Path, syncs: SyncRecorder) -> None:
    # Mutant: os.fdatasync(self._fd) deleted from _sync_to (the unit tests passed).
    j = Journal(str(tmp_path / "journal"), next_seq=1)
    j.append({"op": "put", "key": "k"}, b"x" * 100)
    size = (tmp_path / "journal").stat().st_size
    assert syncs.calls == [(j._fd, size)]  # one sync, after the whole record was written
    assert j.syncs == 1
    j.append({"op": "put", "key": "k"}, b"y")
    assert len(syncs.calls) == 2 and syncs.calls[1][1] > size
    j.close()


def test_group_commit_shares_syncs_between_threads(tmp_path: Path, syncs: SyncRecorder) -> None:
    """Eight threads append one record each while the first sync is held (a slow disk):
    the records written meanwhile need at most one more sync between them, not one each.
    Counted, not timed, so a loaded machine cannot make it flaky."""
    # Mutants: self._synced = max(...) deleted (every append syncs: 8 syncs); the early
    # return when self._synced >= end deleted; target = self._end replaced.
    appenders = 8
    j = Journal(str(tmp_path / "journal"), next_seq=1)
    written = threading.Semaphore(0)
    real_pwritev = os.pwritev

    def counting_pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
        n = real_pwritev(fd, buffers, offset)
        written.release()
        return n

    all_written = threading.Event()
    syncs.hold = all_written
    errors: list[BaseException] = []

    def append() -> None:
        try:
            j.append({"op": "adopt", "key": "k"})
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(journal_mod.os, "pwritev", counting_pwritev)
        threads = [threading.Thread(target=append) for _ in range(appenders)]
        for t in threads:
            t.start()
        for _ in range(appenders):
            assert written.acquire(timeout=WAIT_S), "an appender never wrote its record"
        all_written.set()  # the slow sync finishes only now
        for t in threads:
            t.join(WAIT_S)
    assert not errors and not any(t.is_alive() for t in threads)
    assert j.records_appended == appenders
    assert 1 <= len(syncs.calls) <= 2, f"{len(syncs.calls)} syncs for {appenders} records"
    assert j.syncs == len(syncs.calls)
    # The last sync saw every record on disk: each append returned after it.
    assert syncs.calls[-1][1] == j.size_bytes
    j.close()


def test_a_sync_already_covered_is_skipped(tmp_path: Path, syncs: SyncRecorder) -> None:
    """The rule group commit rests on: an appender whose record an earlier sync covered
    (the synced offset reached its record's end) does not sync again."""
    # Mutant: `if self._synced >= end` turned into `>` (a record ending exactly where the
    # last sync reached was synced twice).
    j = Journal(str(tmp_path / "journal"), next_seq=1)
    j.append({"op": "put", "key": "k"})
    assert len(syncs.calls) == 1
    j._sync_to(j.size_bytes)  # what a second appender covered by that sync does
    j._sync_to(1)
    assert len(syncs.calls) == 1 and j.syncs == 1
    j.close()


def test_a_short_write_is_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # pwritev may write less than asked (POSIX allows it; a signal, a full pipe); the
    # journal then writes the rest with pwrite, which may itself be short.
    # Mutants: the fallback loop deleted or its offsets changed (pos = self._end + written,
    # view[written:], pos + n), `if written != total` inverted.
    real_pwrite = os.pwrite
    pwrites: list[int] = []

    def short_pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
        return real_pwrite(fd, b"".join(bytes(b) for b in buffers)[:10], offset)

    def short_pwrite(fd: int, data: memoryview, offset: int) -> int:
        n = real_pwrite(fd, data[:7], offset)
        pwrites.append(n)
        return n

    monkeypatch.setattr(journal_mod.os, "pwritev", short_pwritev)
    monkeypatch.setattr(journal_mod.os, "pwrite", short_pwrite)
    path = tmp_path / "journal"
    j = Journal(str(path), next_seq=1)
    j.append({"op": "put", "key": "a"}, b"first record")
    j.append({"op": "put", "key": "b"}, memoryview(b"second"))
    j.close()
    assert len(pwrites) > 2
    assert path.read_bytes() == _record({"op": "put", "key": "a", "seq": 1}, b"first record") + (
        _record({"op": "put", "key": "b", "seq": 2}, b"second")
    )


def test_a_checkpoint_shrinks_the_journal_to_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Mutants: os.ftruncate(self._fd, 0) or os.fsync deleted from reset, self._end not
    # reset (the next record would follow a hole), records_since_reset not reset.
    fsyncs: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        fsyncs.append(fd)
        real_fsync(fd)

    root = tmp_path / "data"
    store = ObjectStore(root, StoreConfig())
    journal_file = Path(store.layout.journal_file)
    for i in range(5):
        store.put(f"k{i}", b"small contents kept in the journal")
    assert journal_file.stat().st_size == store.journal.size_bytes > 0
    assert store.journal.records_since_reset == 5
    monkeypatch.setattr(journal_mod.os, "fsync", fsync)
    store.checkpoint()
    assert store.journal._fd in fsyncs  # the truncation itself is made durable
    assert journal_file.stat().st_size == 0
    assert (store.journal.size_bytes, store.journal.records_since_reset) == (0, 0)
    store.put("after", b"x")
    assert journal_file.stat().st_size == store.journal.size_bytes
    with open(journal_file, "rb") as f:
        assert f.read(4) == MAGIC  # the next record starts the file again
    store.close()


# --- what a reader accepts --------------------------------------------------------------


def _three_records(path: Path) -> list[int]:
    """Write records 1..3 (each with data); the byte offset where each starts, and the end."""
    j = Journal(str(path), next_seq=1)
    starts = []
    for i in range(3):
        starts.append(j.size_bytes)
        j.append({"op": "write", "key": f"k{i}", "offset": 0}, bytes([65 + i]) * 20)
    starts.append(j.size_bytes)
    j.close()
    return starts


def _replayed(path: Path) -> tuple[list[str], int]:
    j = Journal(str(path), next_seq=1)
    keys = [r.meta["key"] for r in j.read_valid(after_seq=0)]
    size = j.size_bytes
    j.close()
    return keys, size


def test_a_record_with_corrupt_data_ends_the_journal(tmp_path: Path) -> None:
    """The checksum covers the data, not just the metadata: a record whose data bytes
    rotted is not replayed (it would write garbage into an object)."""
    # Mutants: the digest comparison deleted or made `and`, blake3 over body[:meta_len],
    # `len(body) != body_len or ...` changed.
    path = tmp_path / "journal"
    starts = _three_records(path)
    raw = bytearray(path.read_bytes())
    raw[starts[2] - 1] ^= 0x01  # the last byte of record 2: its data, not its metadata
    path.write_bytes(bytes(raw))
    assert _replayed(path) == (["k0"], starts[1])


def test_a_repeated_record_is_not_replayed_twice(tmp_path: Path) -> None:
    """A record whose sequence number does not grow (a block written twice, an old
    record left behind a shorter journal) is where the valid journal ends."""
    # Mutants: `if seq <= prev_seq: break` deleted or made `<`, prev_seq = seq deleted.
    path = tmp_path / "journal"
    starts = _three_records(path)
    raw = path.read_bytes()
    second = raw[starts[1] : starts[2]]
    path.write_bytes(raw[: starts[2]] + second + raw[starts[2] :])
    assert _replayed(path) == (["k0", "k1"], starts[2])
    # A lower sequence number after a higher one ends it too.
    path.write_bytes(raw + raw[: starts[1]])
    assert _replayed(path) == (["k0", "k1", "k2"], starts[3])


def test_the_append_point_follows_the_last_valid_record(tmp_path: Path) -> None:
    # Mutant: self._end = self._synced = offset after the loop deleted (the next append
    # would go to offset 0 and overwrite record 1).
    path = tmp_path / "journal"
    starts = _three_records(path)
    with open(path, "ab") as f:
        f.write(b"SHJ1 torn garbage")
    j = Journal(str(path), next_seq=1)
    assert len(list(j.read_valid(after_seq=0))) == 3
    assert j.append({"op": "put", "key": "k3"}) == 4
    j.close()
    keys, size = _replayed(path)
    assert keys == ["k0", "k1", "k2", "k3"] and size > starts[3]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("magic", b"SHJ0"),
        ("meta_len", journal_mod.META_BYTES_MAX + 1),
        ("data_len", journal_mod.DATA_BYTES_MAX + 1),
    ],
)
def test_a_header_out_of_bounds_ends_the_journal(tmp_path: Path, field: str, value: object) -> None:
    """Garbage lengths are refused before anything is allocated or read."""
    # Mutants: the magic check or a bound check deleted or turned (> into >=, or into and).
    path = tmp_path / "journal"
    starts = _three_records(path)
    raw = bytearray(path.read_bytes())
    at = starts[1]
    if field == "magic":
        raw[at : at + 4] = value  # type: ignore[assignment]
    elif field == "meta_len":
        raw[at + 4 : at + 8] = int(value).to_bytes(4, "little")  # type: ignore[call-overload]
    else:
        raw[at + 8 : at + 16] = int(value).to_bytes(8, "little")  # type: ignore[call-overload]
    path.write_bytes(bytes(raw))
    assert _replayed(path) == (["k0"], starts[1])


def test_records_at_the_bounds_are_read(tmp_path: Path) -> None:
    # Metadata of exactly META_BYTES_MAX bytes is valid (the limit is inclusive).
    # Mutant: meta_len > META_BYTES_MAX turned into >=.
    path = tmp_path / "journal"
    j = Journal(str(path), next_seq=1)
    base = len(msgpack.packb({"op": "put", "key": "k", "pad": "", "seq": 1}))
    pad = "p" * (journal_mod.META_BYTES_MAX - base - 2)  # str8 -> str16 adds two bytes
    j.append({"op": "put", "key": "k", "pad": pad})
    j.close()
    meta_len = int.from_bytes(path.read_bytes()[4:8], "little")
    assert meta_len == journal_mod.META_BYTES_MAX
    assert _replayed(path) == (["k"], path.stat().st_size)


def test_metadata_that_is_not_a_record_ends_the_journal(tmp_path: Path) -> None:
    # A checksummed body whose metadata has no sequence number (or is not msgpack) is not
    # a record of this journal: reading stops there and raises nothing.
    path = tmp_path / "journal"
    starts = _three_records(path)
    raw = path.read_bytes()
    for meta in (b"\xc1", msgpack.packb({"op": "put"}), msgpack.packb({"seq": "x"})):
        head = MAGIC + len(meta).to_bytes(4, "little") + (0).to_bytes(8, "little")
        path.write_bytes(raw[: starts[1]] + head + blake3.blake3(meta).digest() + meta)
        assert _replayed(path) == (["k0"], starts[1])


def test_a_truncated_record_ends_the_journal(tmp_path: Path) -> None:
    # Mutants: offset + HEADER_BYTES + body_len > size turned into >= (a record that ends
    # exactly at the end of the file is whole), the loop's header bound changed.
    path = tmp_path / "journal"
    starts = _three_records(path)
    raw = path.read_bytes()
    for cut in (starts[3] - 1, starts[2] + HEADER_BYTES, starts[2] + HEADER_BYTES - 1):
        path.write_bytes(raw[:cut])
        assert _replayed(path) == (["k0", "k1"], starts[2])
    path.write_bytes(raw)
    assert _replayed(path) == (["k0", "k1", "k2"], starts[3])


def test_metadata_past_its_bound_ends_the_journal_even_when_whole(tmp_path: Path) -> None:
    """META_BYTES_MAX is part of the format: a record with more metadata is garbage,
    however well formed the rest is (the store never writes one: its keys are at most
    1 KiB)."""
    # Mutant: `meta_len > META_BYTES_MAX or data_len > DATA_BYTES_MAX` turned into `and`
    # (the metadata bound only held together with the data bound).
    path = tmp_path / "journal"
    starts = _three_records(path)
    raw = path.read_bytes()
    meta = {"op": "put", "key": "big", "pad": "p" * journal_mod.META_BYTES_MAX, "seq": 2}
    path.write_bytes(raw[: starts[1]] + _record(meta))
    assert _replayed(path) == (["k0"], starts[1])


def test_a_torn_header_claiming_a_huge_record_costs_no_memory(tmp_path: Path) -> None:
    """A crash can leave a header whose lengths are garbage: reading stops there before
    anything of that size is read (a 64 MiB claim at the end of a small file)."""
    # Mutants: `offset + HEADER_BYTES + body_len > size` turned (- for +): the reader then
    # asked pread for the whole claimed length before noticing it was not there.
    path = tmp_path / "journal"
    starts = _three_records(path)
    claim = MAGIC + (100).to_bytes(4, "little") + (64 << 20).to_bytes(8, "little") + bytes(32)
    path.write_bytes(path.read_bytes() + claim + b"x" * 200)
    tracemalloc.start()
    try:
        result = _replayed(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result == (["k0", "k1", "k2"], starts[3])
    assert peak < 8 << 20, f"{peak} bytes at peak reading a torn 64 MiB claim"
