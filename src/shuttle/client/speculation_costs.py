"""When speculation pays: the paper's cost model, fed by online estimates. No I/O.

Yi's analysis (section 2.4): with T_c the round trip of a version check, T_r the
fetch of the object, T_f the cost of making and joining a branch, and p the
probability that the cached copy is stale,

* normal read:      T1 = T_c + p·T_r
* speculative read: T2 = T_f + p·(T_c + T_r)

so speculation pays exactly when T_f < (1 − p)·T_c (:func:`should_speculate`). The
client measures every term as it goes (:class:`CostModel`): each check's round trip,
each fetch, each branch's cost per mechanism, and whether each check found the copy
stale, as exponentially weighted moving averages, so the choice follows a link that
slows down or an object that starts changing.

The model assumes the work between reads hides the whole check, and that a branch
costs the same whatever it runs. Neither holds everywhere: a thread branch holds
Python's interpreter lock while it computes, so the check beside it is slower, and
when the check outlasts the work the wait shows. So the client also measures what
each way of reading really added to each read (its time less the work's own time),
and :meth:`CostModel.choose` speculates only when the rule holds *and* the
mechanism's measured T2 (or, before it has been used, the model's) beats T1; of the
mechanisms it picks the one with the smallest T2.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Weight of a new sample in the time averages: about the last 10 samples count, so a
#: change of link is followed within a few reads while one slow outlier moves the
#: estimate by a fifth at most.
TIME_ALPHA = 0.2
#: Weight of a new outcome in the staleness estimate: about the last 20 checks count
#: (p = 0.1 needs a window that holds a few stale checks to be told apart from 0).
STALENESS_ALPHA = 0.05
#: Weight of a new sample in the measured cost of each way of reading: about the last
#: 20 reads count, so a stale read (p = 0.1: one in ten) moves it without ruling it.
EXCESS_ALPHA = 0.05
#: The mechanisms a branch can be made with, cheapest first on Linux.
MECHANISMS = ("thread", "fork")


def should_speculate(tf_s: float, tc_s: float, p: float) -> bool:
    """The paper's rule: speculation beats a normal read when T_f < (1 − p)·T_c."""
    return tf_s < (1.0 - p) * tc_s


def expected_normal_s(tc_s: float, tr_s: float, p: float) -> float:
    """T1 = T_c + p·T_r: the expected time a normal read adds."""
    return tc_s + p * tr_s


def expected_speculative_s(tf_s: float, tc_s: float, tr_s: float, p: float) -> float:
    """T2 = T_f + p·(T_c + T_r): the expected time a speculative read adds (when the
    work between reads is long enough to hide the check)."""
    return tf_s + p * (tc_s + tr_s)


@dataclass
class Ewma:
    """An exponentially weighted moving average; the first sample is taken as is."""

    alpha: float
    value: float | None = None
    samples: int = 0

    def add(self, sample: float) -> None:
        self.samples += 1
        if self.value is None:
            self.value = sample
        else:
            self.value += self.alpha * (sample - self.value)


@dataclass
class CostModel:
    """The estimates of T_c, T_r, p and T_f per mechanism, and the decision from them."""

    tc_s: Ewma = field(default_factory=lambda: Ewma(TIME_ALPHA))
    tr_s: Ewma = field(default_factory=lambda: Ewma(TIME_ALPHA))
    p: Ewma = field(default_factory=lambda: Ewma(STALENESS_ALPHA))
    tf_s: dict[str, Ewma] = field(default_factory=lambda: {m: Ewma(TIME_ALPHA) for m in MECHANISMS})
    #: Per way of reading ("none" and each mechanism): what a read added to the
    #: caller's time beyond the work's own, stale reads included (measured T1, T2).
    excess_s: dict[str, Ewma] = field(
        default_factory=lambda: {m: Ewma(EXCESS_ALPHA) for m in ("none", *MECHANISMS)}
    )

    def check(self, seconds: float, *, stale: bool | None) -> None:
        """One version check took ``seconds``; ``stale`` says whether it found the
        cached copy stale (None: there was no cached copy to judge)."""
        self.tc_s.add(seconds)
        if stale is not None:
            self.p.add(1.0 if stale else 0.0)

    def fetch(self, seconds: float) -> None:
        """One fetch of the whole object took ``seconds``."""
        self.tr_s.add(seconds)

    def branch(self, mechanism: str, seconds: float) -> None:
        """Making and joining one branch with ``mechanism`` cost ``seconds``."""
        self.tf_s[mechanism].add(seconds)

    def observe(self, how: str, seconds: float) -> None:
        """One read with ``how`` (``"none"`` or a mechanism) added ``seconds`` to the
        caller's time beyond the work's own."""
        self.excess_s[how].add(seconds)

    def forget_observed(self) -> None:
        """Drop the measured T2s (re-measured from the model's choice on): conditions
        may have changed since a mechanism was last found slower."""
        for how in MECHANISMS:
            self.excess_s[how] = Ewma(EXCESS_ALPHA)

    def t2_s(self, mechanism: str) -> float | None:
        """T2 for ``mechanism``: as measured, else from the model (None: no T_f yet)."""
        measured = self.excess_s[mechanism].value
        if measured is not None:
            return measured
        tf_s, tc_s = self.tf_s[mechanism].value, self.tc_s.value
        if tf_s is None or tc_s is None:
            return None
        return expected_speculative_s(tf_s, tc_s, self.tr_s.value or 0.0, self.p.value or 0.0)

    def unmeasured(self, mechanisms: Iterable[str]) -> list[str]:
        """The mechanisms among ``mechanisms`` whose T_f has no sample yet."""
        return [m for m in mechanisms if self.tf_s[m].value is None]

    def choose(self, mechanisms: Iterable[str] = MECHANISMS) -> str:
        """``"none"`` (a normal read) or the mechanism of ``mechanisms`` with the
        smallest T2, if the rule T_f < (1 − p)·T_c holds for it and its T2 beats T1.

        With no check measured yet there is nothing to win against: a normal read
        (which measures T_c). A mechanism whose T_f is not measured yet is not chosen.
        """
        tc_s = self.tc_s.value
        if tc_s is None:
            return "none"
        p = self.p.value or 0.0
        candidates = []
        for m in mechanisms:
            t2 = self.t2_s(m)
            if t2 is not None:
                candidates.append((t2, m))
        if not candidates:
            return "none"
        t2, best = min(candidates)
        tf_s = self.tf_s[best].value
        assert tf_s is not None, "t2_s is None without a T_f"
        t1 = expected_normal_s(tc_s, self.tr_s.value or 0.0, p)
        return best if should_speculate(tf_s, tc_s, p) and t2 < t1 else "none"

    def as_dict(self) -> dict[str, Any]:
        return {
            "tc_s": self.tc_s.value,
            "tr_s": self.tr_s.value,
            "p": self.p.value,
            "tf_s": {m: e.value for m, e in self.tf_s.items()},
            "t2_s_measured": {m: e.value for m, e in self.excess_s.items()},
            "samples": {
                "tc": self.tc_s.samples,
                "tr": self.tr_s.samples,
                "p": self.p.samples,
                **{f"tf_{m}": e.samples for m, e in self.tf_s.items()},
            },
        }
