"""RAID 5 objects, directed cases, over the harness of ``raid_harness.py`` (real storage
objects over real object stores, in one process): which storage calls a full-stripe
and a small write make, a writer dead between data and parity, bad arguments refused
with what is wrong, swaps and parity deltas from many threads, and the storage
object's side (removing keys, forgetting a removed record). The hypothesis state
machine over interleaved writers is ``test_raid_model.py``.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator

import pytest

from shuttle.errors import InvalidArgumentError, InvalidKeyError, NotFoundError, ObjectFailedError
from shuttle.objects.fs.raid import Raid5Object
from shuttle.objects.fs.raid_layout import Raid5Layout, column_key, record_key
from shuttle.objects.storage import StorageObject
from shuttle.runtime.ids import ObjectId
from tests.unit.objects.raid_harness import (
    KEY,
    UNIT,
    Cluster,
    Counting,
    Crash,
    Gated,
    Scheduler,
    new_writer,
)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(5)
    yield c
    c.close()


@pytest.mark.timeout(30)
def test_a_full_stripe_write_reads_nothing_and_a_small_one_pre_reads_by_swapping(
    cluster: Cluster,
) -> None:
    calls = Counting(cluster)
    raid = Raid5Object(cluster.refs(calls), KEY, UNIT)
    stripe = 4 * UNIT
    raid.write(0, b"x" * stripe)
    assert calls.log == ["stripe_begin", "write", "write", "write", "write", "stripe_put"]
    calls.log.clear()
    raid.write(stripe + 10, b"y" * 100)
    assert calls.log == ["stripe_begin", "swap", "stripe_end"]
    assert raid.read(0, 2 * stripe) == b"x" * stripe + bytes(10) + b"y" * 100


@pytest.mark.timeout(30)
def test_a_writer_dead_between_data_and_parity_leaves_its_stripe_dirty_not_wrong(
    cluster: Cluster,
) -> None:
    scheduler = Scheduler()
    writer = new_writer(cluster, Gated("a", cluster, scheduler))
    writer.write(0, b"o" * 8 * UNIT)
    # The small write's calls: begin (0), swap (1), end (2): die before the end.
    scheduler.crash_at = {"a": 2}
    out = scheduler.run({"a": lambda: writer.write(UNIT, b"n" * 100)}, lambda w: w[0])
    assert isinstance(out["a"], Crash)
    reader = Raid5Object(cluster.refs(Counting(cluster)), KEY, UNIT, stale_intent_s=0.2)
    found = reader.verify()
    assert found["bad"] == [0] and found["dirty"] == [0]
    assert found["intents"][0]["stripe"] == 0
    # Degraded, the lost column's unit would be rebuilt from a parity that is wrong:
    # refused, saying why and what to do (stale_intent_s: its writer is gone).
    column = Raid5Layout(5, UNIT).locate(0)[2]
    reader.mark_failed(column)
    with pytest.raises(ObjectFailedError, match=r"unfinished write .* repair\(\)"):
        reader.read(0, UNIT)
    reader.mark_failed(None)
    assert reader.repair()["repaired"] == [0]
    assert reader.verify()["bad"] == reader.verify()["dirty"] == []
    expected = b"o" * UNIT + b"n" * 100 + b"o" * (7 * UNIT - 100)
    assert reader.read(0, 8 * UNIT) == expected
    reader.mark_failed(column)
    assert reader.read(0, 8 * UNIT) == expected


@pytest.mark.timeout(30)
def test_bad_arguments_are_refused_with_what_is_wrong(cluster: Cluster) -> None:
    refs = cluster.refs(Counting(cluster))
    with pytest.raises(InvalidArgumentError, match=r"3\.\.16 storage objects"):
        Raid5Object(refs[:2], KEY)
    with pytest.raises(InvalidArgumentError, match="power of two"):
        Raid5Object(refs, KEY, 3000)
    with pytest.raises(InvalidArgumentError, match="both n0/storage"):
        Raid5Object([refs[0], refs[1], refs[0]], KEY)
    with pytest.raises(InvalidKeyError):
        Raid5Object(refs, "/abs")
    raid = Raid5Object(refs, KEY, UNIT)
    with pytest.raises(InvalidArgumentError, match="offset must be an integer ≥ 0"):
        raid.read(-1, 10)
    with pytest.raises(InvalidArgumentError, match="offset must be an integer ≥ 0"):
        raid.write(-5, b"x")
    with pytest.raises(InvalidArgumentError, match=r"in 0\.\.4"):
        raid.mark_failed(5)
    with pytest.raises(InvalidArgumentError, match="none is marked"):
        raid.rebuild()
    raid.mark_failed(1)
    with pytest.raises(InvalidArgumentError, match="column 1 is marked failed"):
        raid.repair()


@pytest.mark.timeout(60)
def test_swaps_and_parity_deltas_from_many_threads_are_atomic(cluster: Cluster) -> None:
    """Real threads at once on one storage object: each swap's old bytes are the bytes
    another swap wrote (so the deltas telescope to first ^ last), and XORed parity
    deltas are never lost. A read-then-write without the primitives' lock fails both."""
    storage = cluster.objects[ObjectId.storage("n0")]
    assert isinstance(storage, StorageObject)
    key, record, width = column_key(KEY, 0), record_key(KEY, 0), 64
    initial = random.Random(0).randbytes(width)
    storage.swap(key, 100, initial, False)
    threads_n, rounds = 4, 40
    deltas: list[bytes] = []
    parity_deltas: list[bytes] = []
    start = threading.Barrier(threads_n)

    def work(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        for i in range(rounds):
            new = rng.randbytes(width)
            old = storage.swap(key, 100, new)
            deltas.append(bytes(a ^ b for a, b in zip(old, new, strict=True)))
            intent = f"t{seed}.{i}"
            storage.stripe_begin(record, 7, intent)
            delta = rng.randbytes(width)
            assert storage.stripe_end(record, 7, intent, key, 7 * UNIT, delta)["ok"]
            parity_deltas.append(delta)

    workers = [threading.Thread(target=work, args=(s,)) for s in range(threads_n)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert len(deltas) == threads_n * rounds

    def xor_all(chunks: list[bytes]) -> bytes:
        acc = bytearray(width)
        for c in chunks:
            acc = bytearray(a ^ b for a, b in zip(acc, c, strict=True))
        return bytes(acc)

    final = storage.read(key, 100, width)
    assert xor_all(deltas) == xor_all([initial, final])
    assert storage.read(key, 7 * UNIT, width) == xor_all(parity_deltas)
    assert storage.stripe_record(record)["intents"] == []


def test_the_storage_object_removes_keys_and_forgets_a_removed_record(cluster: Cluster) -> None:
    """``remove`` and ``remove_many`` (what a volume's rm calls on a striped file's
    column nodes): a record removed is forgotten by the parity primitives too, so one
    made again under its name starts empty instead of with the removed file's size
    and intents."""
    storage = cluster.objects[ObjectId.storage("n0")]
    record = record_key(KEY, 0)
    storage.stripe_begin(record, 0, "w1", size=5000)
    storage.put("files/other", b"x")
    assert storage.stripe_record(record)["size"] == 5000
    assert storage.remove_many([record, "files/other", "files/never"]) == [True, True, False]
    assert storage.remove("files/other") is False  # twice: not an error
    assert storage.stripe_record(record) == {"size": 0, "intents": []}
    with pytest.raises(NotFoundError):
        storage.stat("files/other")
    with pytest.raises(InvalidArgumentError, match="keys must be a list of keys"):
        storage.remove_many("files/other")
    with pytest.raises(InvalidKeyError):
        storage.remove_many(["files/ok", "../escape"])
