"""The admission edge found by hill climbing on the measured objective
(docs/runtime.md, "The admission edge"): with many clients, the share of its CPU a
node lets arriving stacks fill is raised a step at a time while the clients'
aggregate calls per second, as the node's digests measure them, do not fall; a step
after which they fell by more than their noise is taken back (the stacks it let in
are sent back) and the node holds there for a while before it tries again. Pure, no
I/O, its clock passed in; kept by the node's
:class:`~shuttle.runtime.planner.ResourceManager` (``shuttle serve --cpu-climb``).

Why: a fixed budget cannot be right on every machine. On the idle machine the best
static splits ran the node at 0.81-0.86 of its core, and past about 0.9 every
placement was slower (at 64 clients, share 0.5: 206 calls a second with 32 cheap
filters at the node, 165 with all 64); the budget of 0.7 stopped adaptive at 7-11
(0.95-1.01 of the better static where the best split was 1.12-1.15), 0.85 let 13-28
come. Where others' processes share the node's core, the share at which its
throughput stops rising is lower, and moves with their load. Bhardwaj, Kulkarni and
Stutsman (ATC 2020) admit by the server's measured saturation; the objective itself,
measured, is the surer sign of it.

The noise guard: a trial's mean rate is compared with the reference's by the
standard error of their difference (per-second aggregate rates of one static
placement vary by 3-9 % on the idle machine, 15-30 % near saturation). A step is
kept unless the rate fell by more than :data:`CLIMB_FALL_Z` of those: the curve rises
slowly to its top and falls steeply past it (at share 0.5 on the idle machine,
189 / 191 / 206 / 165 calls a second with 0 / 16 / 32 / 64 at the node), so a rise
within the noise is still a step towards the top, and a fall beyond it is the
overshoot to undo. Samples are taken only while no arrival is on its way (its cost
is not in the rate until it has been at the node for a window) and none is moving."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from shuttle.errors import ConfigError

#: The share of the node's CPU each trial adds to the admission edge. On the idle
#: machine the best splits ran the node at 0.81-0.86 of its core with the budget at
#: 0.7: one step of 0.1 reaches them, a second the share that sends stacks back (0.9).
CLIMB_STEP = 0.1
#: Windows of settled rate (no arrival on its way) that make one measurement: three
#: one-second samples put the standard error of a mean at 2-5 % of it on the idle
#: machine, under the 6-15 % between the placements being told apart.
CLIMB_SAMPLES = 3
#: A trial is taken back only if its mean rate is under the reference's by more than
#: this many standard errors of their difference (one: a fall this large happens by
#: chance in about one trial in six).
CLIMB_FALL_Z = 1.0
#: Windows a node holds its edge after a trial it took back, before it measures a
#: new reference and tries again: the load it climbed against may have changed.
CLIMB_HOLD_WINDOWS = 10
#: Windows a trial waits for an arrival: if none came, the edge did not bind (the
#: node's use was under it, or nothing was worth moving), and the trial ends at the
#: edge it started from, learning nothing.
CLIMB_TRIAL_WINDOWS_MAX = 6
#: A change of more than this share of the clients the node hears from (they come
#: and go) starts the climb again from the floor: the edge was learned for another
#: workload. A smaller change only starts a new reference (a rate measured over other
#: clients is no reference). In the mix benchmark every pass brings 64 new clients,
#: and the old ones' digests go stale over 3 windows: sums over both read as a rise
#: of 3x (220 ± 83 calls a second against 72 ± 5). Clients, not stacks: a stack with
#: no call in its window is not in the model, and at 64 clients 14-38 % of the
#: stacks came and went from one evaluation to the next in a steady pass.
CLIMB_RESTART_CHANGE = 0.5
#: Windows a stack a failed trial sends back is asked to leave (a stack that moved
#: stays put for its residence, 5 H by default, before it may move again).
CLIMB_SEND_BACK_WINDOWS = 8


@dataclass(frozen=True, slots=True)
class Measure:
    """A mean aggregate rate, calls per second, and its standard error."""

    mean: float
    se: float

    @staticmethod
    def of(samples: list[float]) -> Measure:
        se = statistics.stdev(samples) / math.sqrt(len(samples)) if len(samples) > 1 else 0.0
        return Measure(statistics.fmean(samples), se)


@dataclass
class AdmissionClimb:
    """One node's admission edge: the share of its CPU arrivals may fill, from
    ``floor`` (the configured budget: arrivals under it come as without the climb)
    to ``ceiling`` (the share past which it sends stacks back). Feed it each
    evaluation (:meth:`observe`) and the arrivals each one decided (:meth:`arrived`);
    read :attr:`share` and :meth:`send_back`."""

    floor: float
    ceiling: float
    window_s: float
    step: float = CLIMB_STEP
    samples_per_measure: int = CLIMB_SAMPLES
    share: float = 0.0
    #: "reference" (measuring the rate at the edge now), "trial" (the edge raised a
    #: step, waiting for arrivals and measuring what they give) or "hold".
    state: str = "reference"
    #: What the last change was and why (the decision log's note).
    last: str = ""
    _samples: list[float] = field(default_factory=list)
    _sampled_at: float = -math.inf
    _reference: Measure | None = None
    _previous: float = 0.0
    _trial_at: float = 0.0
    _trial_stacks: list[str] = field(default_factory=list)
    _hold_until: float = -math.inf
    _back: dict[str, float] = field(default_factory=dict)
    _clients: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not 0 < self.floor <= self.ceiling <= 1:
            raise ConfigError(
                f"the admission edge climbs from the CPU budget to the share that sends "
                f"stacks back: 0 < {self.floor!r} ≤ {self.ceiling!r} ≤ 1 does not hold"
            )
        if not (self.step > 0 and self.samples_per_measure >= 2 and self.window_s > 0):
            raise ConfigError(
                "the climb needs a step > 0, at least two samples a measure and a window > 0"
            )
        self.share = self.floor
        self._previous = self.floor

    def observe(self, now: float, rate: float, settled: bool, stacks: Iterable[str] = ()) -> float:
        """This evaluation's aggregate calls per second (``rate``, summed over the
        latest windows of ``stacks``, their ids) and whether nothing is on its way to
        the node or moving (``settled``); returns the share arrivals may fill now. One
        sample a window at most: evaluations come more often, over the same digests."""
        self._population(frozenset(stacks))
        if self.state == "hold":
            if now < self._hold_until:
                return self.share
            self._enter("reference", "held long enough: measuring a new reference")
        if not settled:
            self._samples.clear()  # what the arrivals cost is not in the rate yet
            return self.share
        if now - self._sampled_at < self.window_s:
            return self.share
        self._sampled_at = now
        if self.state == "trial" and not self._trial_stacks:
            if now - self._trial_at >= CLIMB_TRIAL_WINDOWS_MAX * self.window_s:
                why = f"no arrival at {self.share:.2f}: the edge did not bind"
                self.share = self._previous
                self._hold(now, f"{why}; back to {self.share:.2f}")
            return self.share
        self._samples.append(rate)
        if len(self._samples) < self.samples_per_measure:
            return self.share
        measure = Measure.of(self._samples)
        self._samples.clear()
        if self.state == "reference" or self._reference is None:
            self._reference = measure
            self._try(now, f"reference {measure.mean:.1f} ± {measure.se:.1f} calls/s")
            return self.share
        ref = self._reference
        noise = CLIMB_FALL_Z * math.hypot(measure.se, ref.se)
        if measure.mean < ref.mean - noise:
            fell = (
                f"{measure.mean:.1f} ± {measure.se:.1f} calls/s after the step to "
                f"{self.share:.2f}, under {ref.mean:.1f} ± {ref.se:.1f} before it by more "
                f"than the noise ({noise:.1f})"
            )
            for stack_id in self._trial_stacks:
                self._back[stack_id] = now + CLIMB_SEND_BACK_WINDOWS * self.window_s
            self.share = self._previous
            self._hold(now, f"fell: {fell}; back to {self.share:.2f}")
            return self.share
        self._reference = measure
        self._try(
            now,
            f"kept {self.share:.2f}: {measure.mean:.1f} ± {measure.se:.1f} calls/s against "
            f"{ref.mean:.1f} ± {ref.se:.1f} before it",
        )
        return self.share

    def arrived(self, stack_ids: Iterable[str]) -> None:
        """The stacks an evaluation decided to move to the node: during a trial, the
        ones its step let in (sent back if it fails)."""
        if self.state == "trial":
            self._trial_stacks.extend(stack_ids)

    def send_back(self, now: float) -> dict[str, str]:
        """The stacks a failed trial let in and asks to leave, with the reason (each
        until :data:`CLIMB_SEND_BACK_WINDOWS` after the trial failed)."""
        self._back = {s: until for s, until in self._back.items() if until > now}
        return {
            s: f"the admission edge's last step lowered the clients' calls a second; sent "
            f"back with the stacks it let in (many clients: {self.last})"
            for s in sorted(self._back)
        }

    def left(self, stack_ids: Iterable[str]) -> None:
        """Stacks that left the node: nothing more to ask of them."""
        for s in stack_ids:
            self._back.pop(s, None)

    def _population(self, clients: frozenset[str]) -> None:
        """A rate is a reference only for the clients it was measured over: when they
        change, measure again (a trial not judged is not kept); when most of them
        change, from the floor (:data:`CLIMB_RESTART_CHANGE`). A hold goes on through
        a small change."""
        if clients == self._clients:
            return
        changed = len(clients ^ self._clients) / max(len(clients | self._clients), 1)
        self._clients = clients
        if self.state == "hold" and changed <= CLIMB_RESTART_CHANGE:
            self._reference = None  # measured again when the hold ends
            return
        if self.state == "trial":
            self.share = self._previous
        if changed > CLIMB_RESTART_CHANGE:
            self.share = self._previous = self.floor
            self._back.clear()
        self._reference = None
        self._trial_stacks = []
        self._enter("reference", f"the clients changed ({changed:.0%}): a new reference")

    def _try(self, now: float, why: str) -> None:
        if self.share + self.step > self.ceiling + 1e-9:
            self._hold(now, f"{why}; at the ceiling {self.ceiling:.2f}")
            return
        self._previous = self.share
        self.share = round(self.share + self.step, 6)
        self._trial_at = now
        self._trial_stacks = []
        self._enter("trial", f"{why}; trying {self.share:.2f}")

    def _hold(self, now: float, why: str) -> None:
        self._hold_until = now + CLIMB_HOLD_WINDOWS * self.window_s
        self._trial_stacks = []
        self._enter("hold", why)

    def _enter(self, state: str, why: str) -> None:
        self.state = state
        self._samples.clear()
        self.last = why
