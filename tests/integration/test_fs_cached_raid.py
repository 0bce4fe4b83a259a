"""The full file stack, ``file -> cache -> raid5 -> storage``, against five real node
processes on 127.0.0.1: two clients caching one striped file stay coherent (a write
through either a cache or a bare RAID object breaks the other's promises before it
returns), cached reads give what was written in every placement and when degraded,
a RAID object that tells no isolation object of its writes is refused under a
cache, with a message that says what to do; a volume's ``rm`` calls back every cache
of the file before it returns, and a striped file whose columns were ranked by the
hash the volume used before reads and is removed as it was written."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from typing import Any

import pytest

from shuttle.errors import InvalidArgumentError, NotFoundError
from shuttle.objects.fs import volume
from shuttle.objects.fs.raid_layout import column_key, record_key
from shuttle.objects.fs.volume import Volume
from shuttle.rendezvous import ranked
from shuttle.runtime.client import Runtime
from shuttle.runtime.refs import Ref
from tests.integration.test_fs_files import write_and_read_back
from tests.integration.test_fs_raid import NODES, STRIPE, UNIT, Cluster

BLOCK = 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cached-raid"))
    yield c
    for p in c.procs.values():
        p.terminate()


def raid(rt: Runtime, key: str, at: str | None = None, **params: Any) -> Ref:
    """A RAID object of ``key`` that tells the isolation object of the key's node of
    its writes (unless ``params`` say otherwise)."""
    params.setdefault("callbacks", rt.service(rt.node_for(key), "isolation"))
    return rt.create(
        "raid5",
        at=at,
        placement="static",
        storages=[rt.storage(n) for n in NODES],
        key=key,
        unit_bytes=UNIT,
        **params,
    )


def stack(rt: Runtime, key: str, at: str | None = None) -> tuple[Ref, Ref, Ref]:
    """``file -> cache -> raid5``, all at the client or all at ``at``."""
    below = raid(rt, key, at)
    cache = rt.create(
        "cache",
        at=at,
        placement="static",
        isolation=rt.service(rt.node_for(key), "isolation"),
        key=key,
        block_bytes=BLOCK,
        data=below,
    )
    file = rt.create("file", at=at, placement="static", backing=cache, key=key)
    return file, cache, below


@pytest.mark.timeout(60)
def test_a_write_by_one_client_reaches_the_other_s_cached_raid_file_through_its_callback(
    cluster: Cluster,
) -> None:
    key = "vol/cached-raid/coherent"
    with cluster.runtime() as a, cluster.runtime() as b:
        fa, ca, _ = stack(a, key)
        fb, cb, rb = stack(b, key)
        fa.write(0, b"x" * (3 * BLOCK))
        assert fb.read(0, 16) == b"x" * 16  # b caches block 0 under a promise
        assert fb.read(0, 16) == b"x" * 16  # ... and the second read is a hit
        assert cb.stats()["hits"] == 1
        raid_reads = rb.stats()["reads"]
        fa.write(4, b"NEW!")  # breaks b's promise before it returns
        assert fb.read(0, 16) == b"xxxxNEW!xxxxxxxx"
        stats = cb.stats()
        assert stats["invalidations"] == 1 and stats["installation_reads"] == 2
        assert rb.stats()["reads"] == raid_reads + 1  # the one re-read, through b's RAID
        hits = ca.stats()["hits"]
        assert fa.read(0, 8) == b"xxxxNEW!"
        assert ca.stats()["hits"] == hits + 1  # a's own copy stayed valid: its write is the news


@pytest.mark.timeout(60)
def test_a_write_through_a_bare_raid_object_breaks_the_caches_promises(cluster: Cluster) -> None:
    key = "vol/cached-raid/bare-writer"
    with cluster.runtime() as a, cluster.runtime() as b:
        fb, cb, _ = stack(b, key)
        writer = raid(a, key)  # no cache above it, as the RAID benchmark's stacks
        writer.write(0, b"a" * (2 * STRIPE))
        assert fb.read(STRIPE, 10) == b"a" * 10
        writer.write(STRIPE + 2, b"BB")
        assert fb.read(STRIPE, 10) == b"aaBBaaaaaa"
        assert cb.stats()["invalidations"] == 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize("at", [None, "n2"])
def test_a_cached_raid_file_reads_what_was_written_healthy_and_degraded(
    cluster: Cluster, at: str | None
) -> None:
    rng, model = random.Random(11), bytearray()
    with cluster.runtime() as rt:
        file, cache, below = stack(rt, f"vol/cached-raid/model-{at}", at)
        for _ in range(40):
            off = rng.randrange(0, 6 * STRIPE)
            data = rng.randbytes(rng.randrange(1, 3 * BLOCK) if rng.random() < 0.7 else STRIPE)
            write_and_read_back(file, rng, model, off, data, 2 * BLOCK)
        assert file.size() == len(model)
        assert file.read(0, len(model)) == bytes(model)
        assert cache.stats()["hits"] > 0
        for column in (0, 3):
            below.mark_failed(column)
            assert file.read(0, len(model)) == bytes(model), f"column {column} failed"
        below.mark_failed(None)
        found = below.verify()
        assert found["bad"] == found["dirty"] == []


@pytest.mark.timeout(60)
def test_a_raid_object_that_tells_no_isolation_object_is_refused_under_a_cache(
    cluster: Cluster,
) -> None:
    key = "vol/cached-raid/untold"
    with cluster.runtime() as rt:
        below = raid(rt, key, callbacks=None)
        cache = rt.create(
            "cache",
            placement="static",
            isolation=rt.service(rt.node_for(key), "isolation"),
            key=key,
            block_bytes=BLOCK,
            data=below,
        )
        with pytest.raises(InvalidArgumentError, match=r"callbacks=Runtime\.service"):
            cache.write(0, b"z" * 10)
        with pytest.raises(InvalidArgumentError, match="tells no isolation object"):
            cache.read(0, 10)
        assert below.size() == 0  # refused before anything was written
        with pytest.raises(InvalidArgumentError, match="callbacks must be an isolation"):
            raid(rt, key, callbacks="n1/isolation")
        with pytest.raises(InvalidArgumentError, match="data must be the file's raid5"):
            rt.create("cache", isolation=cache, key=key, data="raid")


@pytest.mark.timeout(90)
def test_a_volume_s_striped_file_is_a_cached_stack_that_two_clients_share(
    cluster: Cluster,
) -> None:
    data = random.Random(3).randbytes(5 * STRIPE + 77)
    with (
        Volume(cluster.runtime(), "cachedraid", owns_runtime=True) as one,
        Volume(cluster.runtime(), "cachedraid", owns_runtime=True) as two,
    ):
        one.put("/striped", data, raid=True)
        entry = one.directory.lookup("/striped")
        assert entry["home"] == one.rt.node_for(entry["key"])  # named, as the columns are
        with one.open("/striped") as f1, two.open("/striped") as f2:
            _file, cache, below = f1.refs  # file -> cache -> raid5
            assert "cached_blocks" in cache.stats() and "small_writes" in below.stats()
            assert f2.read(100, 50) == data[100:150]  # cached by two
            f1.write(120, b"CHANGED")
            assert f2.read(100, 50) == data[100:120] + b"CHANGED" + data[127:150]
        assert two.cat("/striped") == data[:120] + b"CHANGED" + data[127:]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("striped", [False, True], ids=["plain", "raid5"])
def test_rm_calls_back_every_cache_of_the_file_before_it_returns(
    cluster: Cluster, striped: bool
) -> None:
    """``rm`` goes through the run-time: the file's home isolation object removes it
    and breaks the promises of every cache holding its blocks before ``rm`` returns,
    so another client's open file stops serving the removed bytes at once (removed
    past the isolation object, its cache kept them for the promise's lifetime)."""
    data = random.Random(5).randbytes(3 * STRIPE + 11)
    path = f"/gone-{striped}"
    with (
        Volume(cluster.runtime(), "removing", owns_runtime=True) as one,
        Volume(cluster.runtime(), "removing", owns_runtime=True) as two,
    ):
        one.put(path, data, raid=striped)
        entry = one.directory.lookup(path)
        key = entry["key"]
        with two.open(path) as f:
            assert f.read(0, 64) == data[:64]
            cache = f.refs[1]
            assert cache.stats()["cached_blocks"] == 1  # under a promise at the home
            one.rm(path)
            assert cache.stats()["cached_blocks"] == 0 and cache.stats()["invalidations"] == 1
            assert f.read(0, 64).strip(b"\0") == b""  # the bytes are gone, not served
        assert one.directory.lookup(path) is None
        placed = (
            [
                (node, name)
                for c, node in enumerate(entry["columns"])
                for name in (column_key(key, c), record_key(key, c))
            ]
            if striped
            else [(one.rt.node_for(key), key)]
        )
        for node, gone in placed:
            with pytest.raises(NotFoundError):
                one.rt.storage(node).stat(gone)


def _columns_before_the_shared_hash(nodes: list[str], key: str, count: int) -> list[str]:
    """How a volume ranked a striped file's columns until 2026-11-28."""
    order = sorted(nodes, key=lambda n: hashlib.blake2b(f"{n}/{key}".encode()).digest())
    return order[: min(count, len(order))]


@pytest.mark.timeout(90)
def test_a_striped_file_written_with_the_old_column_hash_reads_and_is_removed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The column order is part of a file's entry and read from there, never
    recomputed, so files a volume made before it used the one rendezvous hash read
    as they were written (docs/objectfs.md, "Volumes")."""
    data = random.Random(9).randbytes(4 * STRIPE + 5)
    key = "oldhash/.files/00c0ffee00c0ffee"  # a key the two hashes order differently
    old = _columns_before_the_shared_hash(NODES, key, 5)
    assert old != ranked(NODES, key)
    with Volume(cluster.runtime(), "oldhash", owns_runtime=True) as before:
        monkeypatch.setattr(volume, "_columns", _columns_before_the_shared_hash)
        monkeypatch.setattr(volume.secrets, "token_hex", lambda n: "00c0ffee00c0ffee")
        before.put("/old", data, raid=True)
        monkeypatch.undo()
        assert before.directory.lookup("/old")["columns"] == old
    with Volume(cluster.runtime(), "oldhash", owns_runtime=True) as after:
        assert after.cat("/old") == data
        after.rm("/old")
        for column, node in enumerate(old):
            with pytest.raises(NotFoundError):
                after.rt.storage(node).stat(column_key(key, column))
