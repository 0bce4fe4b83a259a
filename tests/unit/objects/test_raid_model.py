"""RAID 5 objects against real storage objects over real object stores, in one process.

Two ``Raid5Object``s write the same file, as two clients would. Every storage call a
writer makes is a step, and hypothesis draws the order in which the two writers' steps
run (a deterministic scheduler lets exactly one call through at a time), so writes are
interleaved *inside* each other, not only between. A writer can also die at any of its
calls (it stops calling, as a killed client does). After every step of the machine:
each stripe's parity is the XOR of its data (the XOR of all its columns is zero), reads
equal a model, and after a crash every stripe whose parity is wrong is reported dirty.
The harness is in ``raid_harness.py``; the directed cases in ``test_raid_object.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from shuttle.objects.fs.raid import Raid5Object
from shuttle.objects.fs.raid_layout import Raid5Layout, record_key
from shuttle.objects.storage import StorageObject
from shuttle.runtime.ids import ObjectId
from tests.unit.objects.raid_harness import KEY, UNIT, Cluster, Crash, Gated, Scheduler, new_writer

#: Writes reach up to three stripes past the start of a 5-column file, often from a
#: unit boundary and whole units long, so that whole stripes are written too.
OFFSETS = st.one_of(st.integers(0, 6 * UNIT), st.integers(0, 6).map(lambda k: k * UNIT))
LENGTHS = st.one_of(st.integers(1, 5 * UNIT), st.integers(1, 8).map(lambda k: k * UNIT))
#: Random bytes (not hypothesis's favourite zeros): two writers' bytes differ.
DATA = st.builds(lambda n, seed: random.Random(seed).randbytes(n), LENGTHS, st.integers(0, 255))
#: Scheduling choices drawn per interleaved rule; after that the writers alternate (a
#: writer spinning on another's open write must not use up the draws forever).
DRAWS_MAX = 200


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
