"""Crash states built by hand: the journal says one thing, the files another; reopening
must always end with every acknowledged change applied and attributes matching content."""

from __future__ import annotations

import os
import time
from pathlib import Path

from shuttle.store import ObjectStore, chunk_buffer, object_hash
from shuttle.store.journal import HEADER_BYTES, Journal
from shuttle.store.recovery import write_staging_file


def _check(store: ObjectStore, key: str, content: bytes) -> None:
    attrs = store.stat(key)
    assert store.read(key) == content
    assert attrs.size == len(content)
    assert attrs.hash == object_hash(content)
    assert list(attrs.chunks) == chunk_buffer(content)


def _meta(op: str, key: str, **args: object) -> dict[str, object]:
    return {"op": op, "key": key, "mtime_ns": time.time_ns(), **args}


def test_applied_but_not_checkpointed_changes_survive(root: Path) -> None:
    s = ObjectStore(root)
    s.put("a", b"hello")
    s.write("a", 5, b" world")
    s.put("b/c", os.urandom(3 << 20))  # staged put
    big = s.read("b/c")
    s.truncate("b/c", 1000)
    s.put("gone", b"x")
    s.remove("gone")
    versions = {k: s.stat(k).version for k in ("a", "b/c")}
    s.close(checkpoint=False)
    s = ObjectStore(root)
    assert s.recovery.records == 6
    _check(s, "a", b"hello world")
    _check(s, "b/c", big[:1000])
    assert s.stat_many(["gone"]) == [None]
    assert {k: s.stat(k).version for k in ("a", "b/c")} == versions
    assert s.put("new", b"1").version > max(versions.values())
    s.close()


def test_an_mtime_set_survives_a_crash_before_the_checkpoint(root: Path) -> None:
    s = ObjectStore(root)
    s.put("a", b"dated", mtime_ns=1_000_000_000_000_000_001)
    s.put("b", b"touched")
    version = s.set_mtime("b", 981_173_106 * 10**9).version
    s.close(checkpoint=False)
    with ObjectStore(root) as s:
        assert s.stat("a").mtime_ns == 1_000_000_000_000_000_001
        assert (s.stat("b").mtime_ns, s.stat("b").version) == (981_173_106 * 10**9, version)
        _check(s, "b", b"touched")


def test_durable_record_whose_apply_never_happened_is_redone(root: Path) -> None:
    s = ObjectStore(root)
    s.put("k", b"0123456789")
    s.journal.append(_meta("write", "k", offset=2), b"AB")
    s.journal.append(_meta("truncate", "k", size=8))
    s.journal.append(_meta("put", "fresh"), b"inline data")
    s.journal.append(_meta("write", "deep/new", offset=3, create=True), b"xyz")
    s.close(checkpoint=False)
    with ObjectStore(root) as s:
        _check(s, "k", b"01AB4567")
        _check(s, "fresh", b"inline data")
        _check(s, "deep/new", b"\0\0\0xyz")


def test_torn_range_write_in_the_data_file_is_repaired(root: Path) -> None:
    s = ObjectStore(root)
    s.put("k", b"a" * 10_000)
    s.write("k", 4000, b"b" * 3000)
    s.close(checkpoint=False)
    with open(root / "k", "r+b") as f:  # the crash tore the write: half old, half garbage
        f.seek(5000)
        f.write(b"\xff" * 500)
    with ObjectStore(root) as s:
        _check(s, "k", b"a" * 4000 + b"b" * 3000 + b"a" * 3000)


def test_staged_put_not_yet_renamed_is_completed(root: Path) -> None:
    s = ObjectStore(root)
    s.put("k", b"old")
    staged = write_staging_file(s.layout, b"new contents")
    rel = os.path.relpath(staged, s.layout.internal)
    s.journal.append(_meta("put", "k", staged=rel))
    s.close(checkpoint=False)
    with ObjectStore(root) as s:
        _check(s, "k", b"new contents")
        assert os.listdir(s.layout.staging_dir) == []


def test_replay_starts_at_the_last_put(root: Path) -> None:
    """put A; write; staged put B (renamed, file gone); write. Replaying the first write
    on top of B would corrupt B; replay must start at B's record."""
    s = ObjectStore(root)
    s.put("k", b"A" * 100)
    s.write("k", 0, b"W1" * 40)
    s.put("k", os.urandom(2 << 20))  # staged: its staging file is renamed away
    b = bytearray(s.read("k"))
    s.write("k", 10, b"W2")
    b[10:12] = b"W2"
    s.close(checkpoint=False)
    with ObjectStore(root) as s:
        _check(s, "k", bytes(b))


def test_remove_whose_unlink_was_lost_is_redone(root: Path) -> None:
    s = ObjectStore(root)
    s.put("d/k", b"data")
    s.journal.append(_meta("remove", "d/k"))
    s.close(checkpoint=False)
    with ObjectStore(root) as s:
        assert s.stat_many(["d/k"]) == [None]
        assert not (root / "d" / "k").exists()


def test_torn_journal_tail_is_ignored_and_overwritten(root: Path) -> None:
    s = ObjectStore(root)
    s.put("k", b"acked")
    s.close(checkpoint=False)
    journal = root / ".shuttle" / "journal"
    whole = journal.read_bytes()
    with open(journal, "ab") as f:  # an unacknowledged append cut short by the crash
        f.write(whole[: HEADER_BYTES + 5])
    with ObjectStore(root) as s:
        assert s.recovery.records == 1
        _check(s, "k", b"acked")
        s.put("k2", b"after")
    with ObjectStore(root) as s:
        _check(s, "k2", b"after")


def test_corrupt_record_ends_the_valid_journal(tmp_path: Path) -> None:
    path = str(tmp_path / "journal")
    j = Journal(path, next_seq=1)
    for i in range(3):
        j.append({"op": "write", "key": f"k{i}"}, b"x" * 10)
    j.close()
    raw = bytearray(Path(path).read_bytes())
    record = len(raw) // 3
    raw[record + HEADER_BYTES + 3] ^= 0xFF  # flip a bit in the second record
    Path(path).write_bytes(bytes(raw))
    j = Journal(path, next_seq=1)
    assert [r.meta["key"] for r in j.read_valid(after_seq=0)] == ["k0"]
    assert j.size_bytes == record
    j.close()


def test_checkpointed_records_are_not_replayed(tmp_path: Path) -> None:
    path = str(tmp_path / "journal")
    j = Journal(path, next_seq=5)
    seqs = [j.append({"op": "adopt", "key": "k"}) for _ in range(3)]
    assert seqs == [5, 6, 7]
    j.close()
    j = Journal(path, next_seq=1)
    assert [r.seq for r in j.read_valid(after_seq=6)] == [7]
    assert j.next_seq == 8
    j.close()


def test_concurrent_appends_get_consecutive_sequence_numbers(tmp_path: Path) -> None:
    # Group commit itself (syncs shared between threads) is counted in test_journal.py.
    import threading

    j = Journal(str(tmp_path / "journal"), next_seq=1)
    threads = [
        threading.Thread(target=lambda: [j.append({"op": "adopt", "key": "k"}) for _ in range(50)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert j.records_appended == 200
    j.close()
    j = Journal(str(tmp_path / "journal"), next_seq=1)
    assert [r.seq for r in j.read_valid(after_seq=0)] == list(range(1, 201))
    j.close()


def test_leftover_staging_and_upload_files_are_cleared(root: Path) -> None:
    s = ObjectStore(root)
    s.begin_upload("k")
    write_staging_file(s.layout, b"orphan")
    s.close(checkpoint=False)
    with ObjectStore(root) as s:
        assert os.listdir(s.layout.staging_dir) == []
        assert os.listdir(s.layout.uploads_dir) == []
