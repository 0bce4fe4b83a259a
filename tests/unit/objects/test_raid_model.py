"""RAID 5 objects against real storage objects over real object stores, in one process.

Two ``Raid5Object``s write the same file, as two clients would. Every storage call a
writer makes is a step, and hypothesis draws the order in which the two writers' steps
run (a deterministic scheduler lets exactly one call through at a time), so writes are
interleaved *inside* each other, not only between. A writer can also die at any of its
calls (it stops calling, as a killed client does). After every step of the machine:
each stripe's parity is the XOR of its data (the XOR of all its columns is zero), reads
equal a model, and after a crash every stripe whose parity is wrong is reported dirty.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from shuttle.errors import InvalidArgumentError, InvalidKeyError, NotFoundError, ObjectFailedError
from shuttle.objects.fs.raid import Raid5Object
from shuttle.objects.fs.raid_layout import Raid5Layout, column_key, record_key
from shuttle.objects.storage import StorageObject
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.mobile import bound_method
from shuttle.runtime.refs import Ref
from shuttle.store import ObjectStore

UNIT = 512
KEY = "files/f"
#: Writes reach up to three stripes past the start of a 5-column file, often from a
#: unit boundary and whole units long, so that whole stripes are written too.
OFFSETS = st.one_of(st.integers(0, 6 * UNIT), st.integers(0, 6).map(lambda k: k * UNIT))
LENGTHS = st.one_of(st.integers(1, 5 * UNIT), st.integers(1, 8).map(lambda k: k * UNIT))
#: Random bytes (not hypothesis's favourite zeros): two writers' bytes differ.
DATA = st.builds(lambda n, seed: random.Random(seed).randbytes(n), LENGTHS, st.integers(0, 255))
#: A stuck scheduler is a bug in the test or the code: fail instead of hanging.
STEP_TIMEOUT_S = 10.0
#: Scheduling choices drawn per interleaved rule; after that the writers alternate (a
#: writer spinning on another's open write must not use up the draws forever).
DRAWS_MAX = 200
#: Calls two writes may make between them: past it they are livelocked (a bug).
CALLS_MAX = 2000


def _tmp_root() -> str:
    shm = Path("/dev/shm")
    return tempfile.mkdtemp(prefix="raid-", dir=shm if shm.is_dir() else None)


class Cluster:
    """``columns`` storage objects, each over an object store of its own."""

    def __init__(self, columns: int) -> None:
        self.root = _tmp_root()
        self.stores = [ObjectStore(Path(self.root) / f"n{c}") for c in range(columns)]
        self.objects = {
            ObjectId.storage(f"n{c}"): StorageObject(s) for c, s in enumerate(self.stores)
        }

    def call(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return bound_method(self.objects[ref.rid], method)(*args, **kwargs)

    def refs(self, invoker: Any) -> list[Ref]:
        return [Ref(rid, "127.0.0.1:1", invoker) for rid in self.objects]

    def column(self, c: int, key: str = KEY) -> bytes:
        try:
            return self.stores[c].read(column_key(key, c))
        except NotFoundError:
            return b""

    def unit(self, c: int, stripe: int, key: str = KEY) -> bytes:
        data = self.column(c, key)[stripe * UNIT : (stripe + 1) * UNIT]
        return data + bytes(UNIT - len(data))

    def close(self) -> None:
        for s in self.stores:
            s.close()
        shutil.rmtree(self.root, ignore_errors=True)


class Crash(BaseException):
    """The writer's process died here (not an error the RAID code may catch)."""


class Scheduler:
    """Lets the writers' storage calls run one at a time, in the order ``choose``
    picks. Outside :meth:`run` calls pass straight through."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.active = False
        self.parked: set[str] = set()
        self.granted: str | None = None
        self.calls: dict[str, int] = {}
        self.steps = 0
        self.crash_at: dict[str, int] = {}
        self.stopping = False

    def before_call(self, name: str) -> None:
        if not self.active:
            return
        with self.cond:
            self.parked.add(name)
            self.cond.notify_all()
            if not self.cond.wait_for(
                lambda: self.granted == name or self.stopping, STEP_TIMEOUT_S
            ):
                raise AssertionError(f"writer {name} was never let through")
            if self.stopping:  # the run failed: end this thread now, quietly
                self.parked.discard(name)
                raise Crash()
            self.granted = None
            self.parked.discard(name)
            n = self.calls.get(name, 0)
            self.calls[name] = n + 1
            self.cond.notify_all()
            if self.crash_at.get(name) == n:
                raise Crash()

    def run(
        self, jobs: dict[str, Callable[[], Any]], choose: Callable[[list[str]], str]
    ) -> dict[str, Any]:
        """Run ``jobs`` on threads, one storage call at a time; each job's result, or
        the exception it ended with."""
        results: dict[str, Any] = {}
        finished: set[str] = set()

        def body(name: str, job: Callable[[], Any]) -> None:
            try:
                results[name] = job()
            except BaseException as exc:
                results[name] = exc
            with self.cond:
                finished.add(name)
                self.cond.notify_all()

        self.active, self.calls, self.steps = True, {}, 0
        threads = [threading.Thread(target=body, args=item, daemon=True) for item in jobs.items()]
        for t in threads:
            t.start()
        try:
            while True:
                with self.cond:
                    ready = self.cond.wait_for(
                        lambda: all(n in self.parked or n in finished for n in jobs),
                        STEP_TIMEOUT_S,
                    )
                    assert ready, "a writer neither called nor finished"
                    waiting = sorted(self.parked)
                    if not waiting:
                        break
                    self.steps += 1
                    assert self.steps <= CALLS_MAX, f"livelock: {CALLS_MAX} calls, no end"
                    self.granted = choose(waiting)
                    self.cond.notify_all()
                    assert self.cond.wait_for(lambda: self.granted is None, STEP_TIMEOUT_S)
        finally:
            with self.cond:
                self.stopping = True
                self.cond.notify_all()
            for t in threads:
                t.join(STEP_TIMEOUT_S)
            self.active, self.stopping, self.crash_at = False, False, {}
        return results


class Gated:
    """One writer's invoker: every call waits for the scheduler, then runs."""

    def __init__(self, name: str, cluster: Cluster, scheduler: Scheduler) -> None:
        self.name, self.cluster, self.scheduler = name, cluster, scheduler

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.scheduler.before_call(self.name)
        return self.cluster.call(ref, method, args, kwargs)


def new_writer(cluster: Cluster, invoker: Gated) -> Raid5Object:
    raid = Raid5Object(cluster.refs(invoker), KEY, UNIT, stale_intent_s=600.0)
    raid._sleep = lambda _s: None  # back-off costs steps, not time
    return raid


def apply(model: bytearray, offset: int, data: bytes) -> None:
    if offset > len(model):
        model.extend(bytes(offset - len(model)))
    model[offset : offset + len(data)] = data


def check_each_byte_is_one_of(
    got: bytes,
    old: bytearray,
    writes: list[tuple[int, bytes]],
    cut_short: tuple[int, bytes] | None = None,
) -> None:
    """Every byte is one of the writes' that covered it, the old one if none did; a
    write ``cut_short`` by a crash may have left its bytes old too."""
    for i, b in enumerate(got):
        before = old[i] if i < len(old) else 0
        covering = [d[i - o] for o, d in writes if o <= i < o + len(d)]
        if cut_short is not None and cut_short[0] <= i < cut_short[0] + len(cut_short[1]):
            covering += [cut_short[1][i - cut_short[0]], *([] if covering else [before])]
        if covering:
            assert b in covering, f"byte {i} is {b}, written as one of {covering}"
        else:
            assert b == before, f"byte {i} changed unwritten"


class RaidModel(RuleBasedStateMachine):
    @initialize(columns=st.integers(3, 5))
    def setup(self, columns: int) -> None:
        self.cluster = Cluster(columns)
        self.layout = Raid5Layout(columns, UNIT)
        self.scheduler = Scheduler()
        self.invokers = [Gated(n, self.cluster, self.scheduler) for n in ("a", "b")]
        self.writers = [new_writer(self.cluster, i) for i in self.invokers]
        self.model = bytearray()
        self.failed: int | None = None

    def teardown(self) -> None:
        if hasattr(self, "cluster"):
            self.cluster.close()

    def chooser(self, data: st.DataObject) -> Callable[[list[str]], str]:
        draws = iter(range(DRAWS_MAX))

        def choose(waiting: list[str]) -> str:
            if next(draws, None) is None:
                return waiting[self.scheduler.steps % len(waiting)]
            return data.draw(st.sampled_from(waiting))

        return choose

    # --- rules -----------------------------------------------------------------------

    @rule(who=st.integers(0, 1), offset=OFFSETS, data=DATA)
    def write(self, who: int, offset: int, data: bytes) -> None:
        self.writers[who].write(offset, data)
        apply(self.model, offset, data)

    @rule(a=st.tuples(OFFSETS, DATA), b=st.tuples(OFFSETS, DATA), data=st.data())
    def write_concurrently(
        self, a: tuple[int, bytes], b: tuple[int, bytes], data: st.DataObject
    ) -> None:
        out = self.scheduler.run(
            {"a": lambda: self.writers[0].write(*a), "b": lambda: self.writers[1].write(*b)},
            self.chooser(data),
        )
        for result in out.values():
            if isinstance(result, BaseException):
                raise result
        got = self.writers[0].read(0, 1 << 20)
        assert len(got) == max(len(self.model), a[0] + len(a[1]), b[0] + len(b[1]))
        check_each_byte_is_one_of(got, self.model, [a, b])
        self.model = bytearray(got)

    @rule(who=st.integers(0, 1), offset=st.integers(0, 8 * UNIT), length=st.integers(0, 8 * UNIT))
    def read(self, who: int, offset: int, length: int) -> None:
        assert self.writers[who].read(offset, length) == bytes(self.model[offset : offset + length])

    @rule(who=st.integers(0, 1), write=st.tuples(OFFSETS, DATA), data=st.data())
    def read_while_writing(self, who: int, write: tuple[int, bytes], data: st.DataObject) -> None:
        """A read (degraded or not) beside a write sees each byte old or new, never a
        mix of the two XORed (a rebuild from a torn snapshot)."""
        out = self.scheduler.run(
            {
                "ab"[who]: lambda: self.writers[who].read(0, 1 << 20),
                "ab"[1 - who]: lambda: self.writers[1 - who].write(*write),
            },
            self.chooser(data),
        )
        for result in out.values():
            if isinstance(result, BaseException):
                raise result
        check_each_byte_is_one_of(out["ab"[who]], self.model, [], cut_short=write)
        apply(self.model, *write)

    @precondition(lambda self: self.failed is None)
    @rule(data=st.data())
    def fail_a_column(self, data: st.DataObject) -> None:
        self.failed = data.draw(st.integers(0, self.layout.columns - 1))
        for w in self.writers:
            w.mark_failed(self.failed)

    @precondition(lambda self: self.failed is not None)
    @rule(who=st.integers(0, 1))
    def rebuild(self, who: int) -> None:
        assert self.writers[who].rebuild()["column"] == self.failed
        self.writers[1 - who].mark_failed(None)
        self.failed = None

    @rule(who=st.integers(0, 1))
    def migrate(self, who: int) -> None:
        """What a migration does: checkpoint, a fresh instance, restore."""
        old = self.writers[who]
        moved = Raid5Object.__new__(Raid5Object)
        moved.attach(ObjectId.parse("c1/raid"), self.invokers[who])
        moved.restore(old.checkpoint())
        moved._sleep = old._sleep
        assert moved.failed == old.failed
        self.writers[who] = moved

    @precondition(lambda self: self.failed is None)
    @rule(
        who=st.integers(0, 1),
        offset=OFFSETS,
        data=DATA,
        at=st.integers(0, 12),
        other=st.tuples(OFFSETS, DATA),
        choices=st.data(),
    )
    def crash_mid_write(
        self,
        who: int,
        offset: int,
        data: bytes,
        at: int,
        other: tuple[int, bytes],
        choices: st.DataObject,
    ) -> None:
        """Writer ``who`` dies at its ``at``-th storage call while the other writes:
        no stripe may be wrong without being reported dirty; repair fixes them all."""
        name = "ab"[who]
        self.scheduler.crash_at = {name: at}
        out = self.scheduler.run(
            {
                name: lambda: self.writers[who].write(offset, data),
                "ab"[1 - who]: lambda: self.writers[1 - who].write(*other),
            },
            self.chooser(choices),
        )
        survivor = out["ab"[1 - who]]
        if isinstance(survivor, BaseException):
            raise survivor
        crashed = out[name]
        if isinstance(crashed, BaseException) and not isinstance(crashed, Crash):
            raise crashed
        self.writers[who] = new_writer(self.cluster, self.invokers[who])  # its process died
        checker = self.writers[1 - who]
        found = checker.verify()
        assert set(self.bad_stripes()) <= set(found["dirty"]), (self.bad_stripes(), found)
        assert set(found["bad"]) <= set(found["dirty"])
        repaired = checker.repair()
        assert set(repaired["repaired"]) >= set(found["dirty"])
        assert self.bad_stripes() == []
        got = checker.read(0, 1 << 20)
        check_each_byte_is_one_of(got, self.model, [other], cut_short=(offset, data))
        self.model = bytearray(got)

    # --- invariants ------------------------------------------------------------------

    def stripes(self) -> range:
        return range(self.layout.stripes(len(self.model)) + 1)

    def bad_stripes(self) -> list[int]:
        """Stripes whose columns do not XOR to zero (parity != XOR of the data)."""
        bad = []
        for s in self.stripes():
            acc = bytearray(UNIT)
            for c in range(self.layout.columns):
                for i, b in enumerate(self.cluster.unit(c, s)):
                    acc[i] ^= b
            if any(acc):
                bad.append(s)
        return bad

    @invariant()
    def parity_is_the_xor_of_the_data(self) -> None:
        if not hasattr(self, "cluster"):
            return
        if self.failed is None:
            assert self.bad_stripes() == []
            return
        # Degraded: the failed column's stored units are stale; its true contents are
        # the model's, and with them every stripe that still has parity must add up.
        f = self.failed
        for s in self.stripes():
            if self.layout.parity_column(s) == f:
                continue
            index = next(
                i for i in range(self.layout.data_columns) if self.layout.data_column(s, i) == f
            )
            start = s * self.layout.stripe_bytes + index * UNIT
            truth = bytes(self.model[start : start + UNIT])
            acc = bytearray(truth + bytes(UNIT - len(truth)))
            for c in range(self.layout.columns):
                if c != f:
                    for i, b in enumerate(self.cluster.unit(c, s)):
                        acc[i] ^= b
            assert not any(acc), f"stripe {s} does not add up with column {f} failed"

    @invariant()
    def no_write_is_left_open_and_the_size_is_shared(self) -> None:
        if not hasattr(self, "cluster"):
            return
        for c in range(self.layout.columns):
            if c != self.failed:
                storage = self.cluster.objects[ObjectId.storage(f"n{c}")]
                assert isinstance(storage, StorageObject)
                assert storage.stripe_record(record_key(KEY, c))["intents"] == []
        assert self.writers[0].size() == self.writers[1].size() == len(self.model)


TestRaidModel = RaidModel.TestCase
TestRaidModel.settings = settings(
    max_examples=40,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- directed cases --------------------------------------------------------------------


class Counting:
    """A plain invoker that logs each call's method and its ``return_old`` flag."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.log: list[str] = []

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if method == "swap":
            self.log.append("swap" if (args[3] if len(args) > 3 else True) else "write")
        else:
            self.log.append(method)
        return self.cluster.call(ref, method, args, kwargs)


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
