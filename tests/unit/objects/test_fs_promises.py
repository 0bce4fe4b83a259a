"""The promise cache (objects/fs/promises.py) against a simple model of a node that
keeps promises and calls back, over every interleaving hypothesis finds of fetches
(taken, answered, finished or failed), revalidations, writes, restarts and time.

The model: each block has a current timestamp at the node; a fetch reads it when the
node answers (and the node records a promise); a write bumps it and, if a promise
is held, calls the cache back (``invalidate``) before it returns; the holder's own
write calls nobody back (its copy is replaced by the write's install). A restart forgets
every promise and calls back everything (what a node with its promise log does). A
fetch's answer may be kept exactly when no callback for its block, and no restart,
came after it was sent; then nothing the cache holds is ever older than the node.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shuttle.errors import InvalidArgumentError
from shuttle.objects.fs.promises import MARKS_PRUNE_AT, PromiseCache, Ticket

BLOCKS = st.sampled_from(["a", "b", "c"])
LIFETIME_S = 10.0
CAPACITY = 2


@dataclass
class Fetch:
    name: str
    ticket: Ticket
    #: The timestamp the node answered with (None: not answered yet).
    ts: int | None = None
    #: A callback for this block, or a restart, came after it was sent.
    overtaken: bool = False
    #: A revalidation of the copy held at this timestamp (None: a plain fetch).
    renewing: int | None = None
    #: The holder's own write of the block (the node calls no one back about it, so
    #: the copy held before is replaced only by this write's install, or dropped).
    writing: bool = False


class PromiseModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.cache: PromiseCache[str, int] = PromiseCache(
            lifetime_s=LIFETIME_S, capacity=CAPACITY, clock=lambda: self.now
        )
        self.current = {"a": 1, "b": 1, "c": 1}
        self.promised: set[str] = set()
        self.fetches: list[Fetch] = []

    def _callback(self, names: list[str]) -> None:
        for f in self.fetches:
            if f.name in names:
                f.overtaken = True
        self.cache.invalidate(names)

    @rule(name=BLOCKS)
    def send_fetch(self, name: str) -> None:
        self.fetches.append(Fetch(name, self.cache.begin()))

    @rule(name=BLOCKS)
    def send_own_write(self, name: str) -> None:
        self.fetches.append(Fetch(name, self.cache.begin(), writing=True))

    @rule(name=BLOCKS)
    def send_revalidation(self, name: str) -> None:
        held, fresh = self.cache.look(name)
        if held is not None and not fresh:
            self.fetches.append(Fetch(name, self.cache.begin(), renewing=held.ts))

    @precondition(lambda self: any(f.ts is None for f in self.fetches))
    @rule(data=st.data())
    def node_answers(self, data: st.DataObject) -> None:
        waiting = [f for f in self.fetches if f.ts is None]
        f = data.draw(st.sampled_from(waiting))
        if f.writing:
            self.current[f.name] += 1
        f.ts = self.current[f.name]
        self.promised.add(f.name)

    @precondition(lambda self: any(f.ts is not None for f in self.fetches))
    @rule(data=st.data())
    def answer_arrives(self, data: st.DataObject) -> None:
        answered = [f for f in self.fetches if f.ts is not None]
        f = data.draw(st.sampled_from(answered))
        self.fetches.remove(f)
        assert f.ts is not None
        if f.renewing is None:
            held = self.cache.get(f.name)
            newer_held = held is not None and held.ts >= f.ts
            kept = self.cache.install(f.name, f.ts, f.ts, f.ticket)
            assert kept == (not f.overtaken and not newer_held)
            if f.overtaken:  # refused: as a callback for the block, to the others out
                for g in self.fetches:
                    g.overtaken |= g.name == f.name
        else:
            held = self.cache.get(f.name)
            if held is not None:
                kept = self.cache.renew(f.name, held, f.ts)
                assert kept == (held.ts == f.ts == f.renewing)
        self.cache.end(f.ticket)

    @precondition(lambda self: bool(self.fetches))
    @rule(data=st.data())
    def fetch_fails(self, data: st.DataObject) -> None:
        f = data.draw(st.sampled_from(self.fetches))
        self.fetches.remove(f)
        if f.writing:  # in doubt: whatever the block holds now, no copy of ours is it
            self._callback([f.name])
        self.cache.end(f.ticket)

    @rule(name=BLOCKS)
    def others_write(self, name: str) -> None:
        self.current[name] += 1
        if name in self.promised:
            self.promised.discard(name)
            self._callback([name])

    @rule()
    def restart(self) -> None:
        self.promised.clear()
        for f in self.fetches:
            f.overtaken = True
        self.cache.invalidate_where(lambda name: True)

    @rule(name=BLOCKS)
    def evicted(self, name: str) -> None:
        self.cache.drop(name)

    @rule(seconds=st.sampled_from([1.0, LIFETIME_S]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(name=BLOCKS)
    def use(self, name: str) -> None:
        held, fresh = self.cache.look(name)
        if fresh:
            assert held is not None and self.now < held.expires
            assert held.value == self.current[name] or self._writing(name)

    @invariant()
    def nothing_held_is_older_than_the_node_or_unpromised(self) -> None:
        """Older only while the holder's own write of the block, already applied at
        the node, is on its way back (its install replaces the copy, or drops it)."""
        for name, held in self.cache.items():
            assert held.ts == self.current[name] or self._writing(name), f"{name} at {held.ts}"
            assert name in self.promised, f"{name} held with no promise at the node"

    def _writing(self, name: str) -> bool:
        """The holder's own write of ``name`` is applied and on its way back: a read
        of ours answered before it may be held until its answer replaces it."""
        return any(f.writing and f.name == name and f.ts is not None for f in self.fetches)

    @invariant()
    def bounded(self) -> None:
        assert len(self.cache) <= CAPACITY
        if not self.fetches:
            assert self.cache.marks_held() == 0


TestPromiseModel = PromiseModel.TestCase
TestPromiseModel.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_a_fetch_nothing_interrupts_is_kept_and_hits_until_its_promise_lapses() -> None:
    now = [0.0]
    cache: PromiseCache[str, bytes] = PromiseCache(lifetime_s=5.0, clock=lambda: now[0])
    with cache.fetching() as ticket:
        assert cache.install("x", b"1", 7, ticket)
    assert cache.look("x")[1]
    now[0] = 5.0
    held, fresh = cache.look("x")
    assert held is not None and not fresh
    assert cache.renew("x", held, 7)
    assert cache.look("x")[1]
    now[0] = 20.0
    assert not cache.renew("x", held, 8)  # changed while lapsed: dropped
    assert cache.look("x") == (None, False)


def test_marks_stay_bounded_while_fetches_overlap_without_a_pause() -> None:
    """Busy holders always have a fetch out; marks older than every fetch still out
    can stop nothing and go, so they do not pile up (a fetch that never ends keeps
    what it needs, and no more is ever asked of it)."""
    cache: PromiseCache[int, None] = PromiseCache()
    out = cache.begin()
    for i in range(3 * MARKS_PRUNE_AT):
        cache.invalidate([i])
        nxt = cache.begin()  # the next fetch starts before the last one ends
        cache.end(out)
        out = nxt
        assert cache.marks_held() <= MARKS_PRUNE_AT + 1
    cache.end(out)
    assert cache.marks_held() == 0


def test_a_copy_dropped_for_any_reason_is_reported_to_the_owner() -> None:
    gone: list[str] = []
    cache: PromiseCache[str, None] = PromiseCache(capacity=1, on_drop=gone.append)
    with cache.fetching() as t:
        cache.install("a", None, 1, t)
        cache.install("b", None, 1, t)  # over capacity: a goes
    cache.invalidate(["b"])
    assert gone == ["a", "b"]


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [({"lifetime_s": 0}, "lifetime_s must be > 0"), ({"capacity": 0}, "capacity must be ≥ 1")],
)
def test_bad_settings_say_which(kwargs: dict[str, float], says: str) -> None:
    with pytest.raises(InvalidArgumentError, match=says):
        PromiseCache(**kwargs)  # type: ignore[arg-type]
