"""Cache coherence between gateways of one RADOS pool (shuttle.store.rados_watch): a
gateway with a warm cache serves it without asking RADOS, yet never serves a version
older than a change another gateway has acknowledged; a gateway whose watch breaks
stops trusting its cache and watches again. Real Ceph, several librados clients."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator

import pytest

from shuttle.cluster.ceph import LocalCeph
from shuttle.cluster.cephclient import mon_command
from shuttle.errors import NotFoundError, StorageIOError
from shuttle.store.rados import RadosStore
from shuttle.store.rados_conn import CephOptions
from shuttle.store.rados_watch import CHANNEL_OBJECT, NOTIFY_TIMEOUT_S, CacheKeeper
from tests.store_suite.conftest import SUITE_CONFIG
from tests.store_suite.gateway_waits import trusting, wait_until


def _counters(s: RadosStore) -> dict[str, int]:
    r = s.stats()["rados"]
    return {k: r[k] for k in ("validations", "stat_free_hits", "inline_hits", "cold_reads")}


class StuckKeeper:
    """A gateway whose announcement callback hangs until ``gate`` opens (fault injection
    into the real callback: librados then does not acknowledge the notify)."""

    def __init__(self, inner: CacheKeeper, gate: threading.Event) -> None:
        self.inner = inner
        self.gate = gate

    def announced(self, key: str, floor: int) -> None:
        self.gate.wait(60)
        self.inner.announced(key, floor)

    def reset(self) -> None:
        self.inner.reset()


Trio = tuple[RadosStore, RadosStore, RadosStore]


@pytest.fixture(scope="module")
def gateways(ceph: LocalCeph) -> Iterator[Trio]:
    """Three gateways on one fresh namespace, shared by the module's tests (a new
    gateway spends PROBATION_S confirming its reads before it trusts its cache)."""
    info = ceph.info()
    opts = CephOptions(info.conf_path, info.keyring_path, op_timeout_s=20)
    namespace = f"c{secrets.token_hex(6)}"
    stores = [RadosStore(info.pool, namespace=namespace, config=SUITE_CONFIG, ceph=opts)]
    try:
        for _ in range(2):
            stores.append(
                RadosStore(info.pool, namespace=namespace, config=SUITE_CONFIG, ceph=opts)
            )
        yield stores[0], stores[1], stores[2]
    finally:
        for s in stores:
            s.close()


@pytest.fixture
def trio(gateways: Trio) -> Iterator[Trio]:
    """The module's gateways, each trusting its cache (a test may have broken one)."""
    for s in gateways:
        s.coherence.keeper = s.reader
        wait_until(lambda s=s: trusting(s), "trusting its cache")  # type: ignore[misc]
    yield gateways
    for s in gateways:
        s.coherence.keeper = s.reader


def test_a_warm_read_sends_no_stat(trio: Trio) -> None:
    a, b, _c = trio
    b.reader.clear()  # as if new: nothing of "k" cached
    start = _counters(b)
    a.put("k", bytes(range(256)) * 64)
    assert b.read("k", 100, 50) == (bytes(range(256)) * 64)[100:150]  # cold: one read
    for i in range(4):  # the blocks past the first: read, and the version they report
        assert b.read("k", 4096 * i, 4096) == bytes(range(256)) * 16
    assert _counters(b)["validations"] == start["validations"]
    before = _counters(b)
    for i in range(20):
        assert b.read("k", 4096 * (i % 4), 4096) == (bytes(range(256)) * 16)
    after = _counters(b)
    assert after["validations"] == before["validations"]
    assert after["stat_free_hits"] - before["stat_free_hits"] == 20
    # And the node's event-loop path answers a resident range from memory alone.
    assert b.read_cached("k", 0, 4096) == bytes(range(256)) * 16
    assert _counters(b)["inline_hits"] == after["inline_hits"] + 1


def _without_a_watch(b: RadosStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Break b's watch and keep it from registering another (as when the channel's PG
    is down for b): b then trusts nothing it has cached until ``monkeypatch.undo()``."""

    def refuse() -> None:
        raise b.coherence.rados.Error("injected: the channel cannot be watched")

    monkeypatch.setattr(b.coherence, "_establish", refuse)
    b.coherence.break_watch()
    wait_until(lambda: not b.coherence.trusted(), "distrusting its cache")


def test_an_untrusting_gateway_reads_in_one_round_trip(
    trio: Trio, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a trusted watch every read asks RADOS, but once only: a block not yet
    resident is read with the version it is of (no stat before it), a resident one is
    confirmed with a stat (issue 26: a miss used to cost a stat and then a read)."""
    a, b, _c = trio
    data = bytes(range(256)) * 64  # 16 KiB: four blocks
    a.put("p", data)
    assert b.read("p", 0, 4096) == data[:4096]
    _without_a_watch(b, monkeypatch)
    before = _counters(b)
    assert b.read("p", 4096, 4096) == data[4096:8192]  # known key, block not resident
    assert b.read("p", 8192, 100) == data[8192:8292]
    during = _counters(b)
    assert during["cold_reads"] - before["cold_reads"] == 2
    assert during["validations"] == before["validations"]  # not a stat and a read each
    assert b.read("p", 4096, 4096) == data[4096:8192]  # resident: confirmed by a stat
    assert _counters(b)["validations"] == during["validations"] + 1
    assert b.read_cached("p", 4096, 4096) is None  # nothing on trust
    monkeypatch.undo()
    wait_until(lambda: trusting(b), "trusting again")


def test_a_gateway_trusts_its_cache_as_soon_as_its_probation_ends(trio: Trio) -> None:
    """Reads during a new watch's probation are confirmed by RADOS; the first read after
    it confirms the entry for good, and the next ones ask RADOS nothing (issue 26: an
    entry confirmed late in the probation stayed on the stat path up to RECONFIRM_S
    longer, so a node's warm reads in its first seconds all cost a round trip)."""
    a, b, _c = trio
    data = bytes(range(256)) * 64
    a.put("r", data)
    resets = b.coherence.watch_resets
    b.coherence.break_watch()
    wait_until(lambda: b.coherence.watch_resets > resets, "watching again")
    # Confirmations shortly before the probation ends (a read, then a stat that makes
    # the entry's size exact), then reads just after it.
    wait_until(lambda: b.coherence.trust_from - time.monotonic() < 0.5, "near the probation's end")
    assert b.read("r", 0, 4096) == data[:4096]
    assert b.read("r", 0, 4096) == data[:4096]
    wait_until(lambda: trusting(b), "trusting again")
    before = _counters(b)
    for _ in range(3):
        assert b.read("r", 0, 4096) == data[:4096]
    after = _counters(b)
    assert after["validations"] - before["validations"] <= 1  # the first one, at most
    assert after["stat_free_hits"] - before["stat_free_hits"] >= 2
    assert b.read_cached("r", 0, 4096) == data[:4096]  # and on the node's event loop


def test_a_change_through_librados_is_seen_by_an_untrusting_gateway(
    trio: Trio, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that cannot trust its watch confirms each read of resident blocks with
    a stat, so a change that announced nothing to it (written with librados directly)
    is read at once, never served from its cache; and it caches the new version."""
    a, b, _c = trio
    a.put("q", b"1" * 8192)
    assert b.read("q", 0, 4096) == b"1" * 4096
    _without_a_watch(b, monkeypatch)
    assert b.read("q", 0, 4096) == b"1" * 4096  # resident, confirmed
    a.conn.ioctx().write("q", b"2" * 4096, 0)  # a new RADOS version, announced to no one
    assert b.read("q", 0, 4096) == b"2" * 4096
    before = _counters(b)
    assert b.read("q", 0, 4096) == b"2" * 4096  # resident now: one stat, no read
    assert _counters(b)["cold_reads"] == before["cold_reads"]
    monkeypatch.undo()
    wait_until(lambda: trusting(b), "trusting again")


def test_no_kind_of_change_is_followed_by_a_stale_warm_read(
    trio: Trio,
) -> None:
    a, b, _c = trio
    want = b"1" * 10000
    start = b.stats()["rados"]

    def check() -> None:
        # Twice: the first may refill b's cache, the second is then a warm hit.
        for _ in range(2):
            assert b.read("k", 0, 8192) == want[:8192]
            assert b.read("k", 8192, 4096) == want[8192:12288]
            cached = b.read_cached("k", 0, 100)
            assert cached is None or cached == want[:100]

    a.put("k", want)
    check()
    a.write("k", 5, b"2" * 10)
    want = want[:5] + b"2" * 10 + want[15:]
    check()
    a.truncate("k", 9000)
    want = want[:9000]
    check()
    a.put("k", b"3" * 12000)
    want = b"3" * 12000
    check()
    up = a.begin_upload("k")
    a.upload_write(up, 0, b"4" * 5000)
    a.commit_upload(up)
    want = b"4" * 5000
    check()
    v = b.stat("k").version
    assert b.read("k", 0, 10, expected_version=v) == b"4" * 10
    a.remove("k")
    with pytest.raises(NotFoundError):
        b.read("k", 0, 100)
    assert b.read_cached("k", 0, 100) is None
    a.create("k")
    a.put("k", b"5" * 100)
    want = b"5" * 100
    check()
    end = b.stats()["rados"]
    assert end["validations"] == start["validations"]  # all of it with the watch trusted
    assert end["announced"] - start["announced"] >= 6


def test_concurrent_writers_through_two_gateways_leave_no_stale_reads(
    trio: Trio,
) -> None:
    """Writers on gateways a and c put unique contents into one key; after each put
    returns, the writer reads through gateway b, whose cache is warm, and must get that
    version or a newer one. A reader on b meanwhile must never see versions go back."""
    a, b, c = trio
    version_of: dict[bytes, int] = {}
    lock = threading.Lock()
    checks: list[tuple[int, bytes]] = []  # (version acknowledged, contents b read after)
    seen_by_reader: list[bytes] = []
    errors: list[str] = []
    stop = threading.Event()
    a.put("k", b"init".ljust(4096, b"."))
    with lock:
        version_of[b"init".ljust(4096, b".")] = a.stat("k").version

    def writer(store: RadosStore, name: str) -> None:
        try:
            for i in range(40):
                data = f"{name}{i}".encode().ljust(4096, b".")
                v = store.put("k", data).version
                with lock:
                    version_of[data] = v
                got = b.read("k", 0, 4096)
                with lock:
                    checks.append((v, got))
        except Exception as exc:
            errors.append(f"{name}: {exc!r}")

    def reader() -> None:
        try:
            while not stop.is_set():
                seen_by_reader.append(b.read("k", 0, 4096))
        except Exception as exc:
            errors.append(f"reader: {exc!r}")

    threads = [
        threading.Thread(target=writer, args=(a, "a")),
        threading.Thread(target=writer, args=(c, "c")),
    ]
    r = threading.Thread(target=reader)
    r.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    r.join()
    assert errors == []
    stale = [(v, version_of[got]) for v, got in checks if version_of[got] < v]
    assert stale == [], "b served a version older than one already acknowledged"
    versions = [version_of[got] for got in seen_by_reader]
    assert versions == sorted(versions), "b's reads went back to an older version"
    assert _counters(b)["stat_free_hits"] > 0


def test_a_broken_watch_stops_trust_and_is_registered_again(
    trio: Trio,
) -> None:
    a, b, _c = trio
    a.put("k", b"1" * 8192)
    b.read("k", 0, 4096)
    assert b.read_cached("k", 0, 4096) == b"1" * 4096
    resets = b.coherence.watch_resets
    b.coherence.break_watch()  # as if the OSD had dropped it
    wait_until(lambda: b.coherence.watch_resets > resets, "watching again")
    assert b.cache.stats().bytes_cached == 0  # announcements may have been missed
    assert b.read_cached("k", 0, 4096) is None
    a.put("k", b"2" * 8192)
    before = _counters(b)
    assert b.read("k", 0, 4096) == b"2" * 4096
    assert b.read("k", 0, 4096) == b"2" * 4096
    # In probation after the new watch: the cached version is confirmed with a stat.
    assert _counters(b)["validations"] - before["validations"] >= 1
    wait_until(lambda: trusting(b), "trusting again")
    before = _counters(b)
    assert b.read("k", 0, 4096) == b"2" * 4096  # read and confirmed after probation
    assert b.read("k", 0, 4096) == b"2" * 4096
    assert _counters(b)["stat_free_hits"] > before["stat_free_hits"]
    a.put("k", b"3" * 8192)  # and the new watch hears announcements
    assert b.read("k", 0, 4096) == b"3" * 4096


def test_a_gateway_that_does_not_acknowledge_holds_changes_back(
    trio: Trio,
) -> None:
    """b's callback is stuck: a's change must not be written (it would leave b's cache
    stale) until b acknowledges; then it is, and b reads it."""
    a, b, _c = trio
    a.put("k", b"old".ljust(4096))
    assert b.read("k", 0, 4096) == b"old".ljust(4096)
    release = threading.Event()
    b.coherence.keeper = StuckKeeper(b.reader, release)
    done = threading.Event()
    result: list[object] = []

    def change() -> None:
        try:
            result.append(a.put("k", b"new".ljust(4096)))
        except Exception as exc:
            result.append(exc)
        done.set()

    timeouts = a.coherence.announce_timeouts
    t = threading.Thread(target=change)
    t.start()
    wait_until(
        lambda: a.coherence.announce_timeouts > timeouts,
        "a's announcement timed out",
        3 * NOTIFY_TIMEOUT_S,
    )
    assert not done.is_set()
    assert b.read("k", 0, 4096) == b"old".ljust(4096)  # not written yet: still current
    release.set()
    t.join(30)
    b.coherence.keeper = b.reader
    assert not isinstance(result[0], Exception), result
    assert b.read("k", 0, 4096) == b"new".ljust(4096)


def test_a_change_that_cannot_be_announced_changes_nothing(
    trio: Trio, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _c = trio
    a.put("k", b"old")
    monkeypatch.setattr("shuttle.store.rados_watch.ANNOUNCE_DEADLINE_S", 0.1)
    never = threading.Event()
    b.coherence.keeper = StuckKeeper(b.reader, never)
    try:
        with pytest.raises(StorageIOError, match="nothing was changed"):
            a.put("k", b"new")
    finally:
        never.set()
        b.coherence.keeper = b.reader
    assert a.read("k") == b"old"


def test_an_osd_restart_under_the_channel_leaves_no_stale_read(ceph: LocalCeph, trio: Trio) -> None:
    """Kill the OSD that is the channel object's primary: the watches move to the new
    primary (or break and are registered again); no change is missed."""
    a, b, _c = trio
    a.put("k", b"1" * 4096)
    assert b.read("k", 0, 4096) == b"1" * 4096
    out = mon_command(
        ceph.admin(),
        prefix="osd map",
        pool=ceph.info().pool,
        object=CHANNEL_OBJECT,
        nspace=b.conn.namespace,
    )
    primary = int(json.loads(out)["acting_primary"])
    ceph.stop_osd(primary)
    try:
        a.put("k", b"2" * 4096)
        assert b.read("k", 0, 4096) == b"2" * 4096
    finally:
        ceph.start_osd(primary)
    a.put("k", b"3" * 4096)
    assert b.read("k", 0, 4096) == b"3" * 4096
    wait_until(lambda: trusting(b), "trusting again")
    b.read("k", 0, 4096)
    before = _counters(b)
    assert b.read("k", 0, 4096) == b"3" * 4096
    assert _counters(b)["stat_free_hits"] > before["stat_free_hits"]


def test_a_read_of_the_version_before_an_announced_change_is_not_cached(
    trio: Trio,
) -> None:
    """Between a change's announcement and its commit a read still gets the old
    version: it may return it (the read overlaps the change) but must not cache it, or
    nothing would ever drop it. The announcement and the commit are made by hand here,
    to hold the gap open."""
    a, b, _c = trio
    v = a.put("k", b"old".ljust(4096)).version
    b.reader.announced("k", v + 1)  # what b's callback does for a's announcement
    assert b.read("k", 0, 4096) == b"old".ljust(4096)
    a.conn.ioctx().write("k", b"new", 0)  # the commit (raw: no announcement of its own)
    assert b.read("k", 0, 4096) == b"new".ljust(4096)
    assert b.read("k", 0, 4096) == b"new".ljust(4096)


def test_a_gateway_without_a_watch_confirms_every_read(
    trio: Trio, monkeypatch: pytest.MonkeyPatch
) -> None:
    """b's watch breaks and cannot be registered again (as when the channel's PG is
    down for b): b keeps its cache but hears no announcements, so it must confirm
    each cached version with a stat."""
    a, b, _c = trio
    a.put("k", b"old".ljust(4096))
    b.read("k", 0, 4096)
    _without_a_watch(b, monkeypatch)
    a.put("k", b"new".ljust(4096))  # announced to a and c only
    before = _counters(b)
    assert b.read("k", 0, 4096) == b"new".ljust(4096)
    assert b.read_cached("k", 0, 4096) is None
    assert _counters(b)["validations"] > before["validations"]
    monkeypatch.undo()
    wait_until(lambda: trusting(b), "trusting again")


def test_a_remove_whose_late_announcement_fails_still_unlists_the_key(
    trio: Trio, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-announcement after a slow commit fails: the caller hears of it, but the
    remove is made, so the key must leave the index like any removed key."""
    a, _b, _c = trio
    a.put("gone", b"x")

    def fail(key: str, version: int, announced_s: float) -> None:
        raise StorageIOError("injected: announcing again failed")

    monkeypatch.setattr(a.coherence, "committed", fail)
    with pytest.raises(StorageIOError, match="injected"):
        a.remove("gone")
    monkeypatch.undo()
    assert "gone" not in a.list("").keys
    with pytest.raises(NotFoundError):
        a.stat("gone")
