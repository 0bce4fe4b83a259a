"""Live runs of ``shuttle grep`` at both placements, interleaved, for ``shuttle sim
predict --live`` to set its predictions beside (:mod:`shuttle.bench.predict`).

Each run is a process of its own, as a user's would be, and reports what its timer
held (``--json-out``). The figure a prediction is compared with is the median of a
placement's runs; :func:`run_live` goes on past the runs asked for while a median is
not yet known to within ``LIVE_MEDIAN_STABLE_FRACTION`` of itself
(:func:`median_interval`: order statistics, free of any assumed distribution).
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuttle.errors import ConfigError, ShuttleError

Progress = Callable[[str], None]

#: Live runs of a placement go on past ``live_runs`` (up to this many times as many)
#: while its median is not yet stable: at a quarter-speed node the server runs' medians
#: of 5 moved 37 % between two idle runs (benchmarks/README.md), more than the 15 %
#: target the predictions are judged by.
LIVE_RUNS_MAX_FACTOR = 3
#: A median is stable when its interval (:func:`median_interval`) lies within this
#: fraction of it on either side: half the target's 15 %, so the live figure moves
#: less than the errors it is the reference of.
LIVE_MEDIAN_STABLE_FRACTION = 0.075
#: Fewer runs than this say nothing of where their median lies, however close.
LIVE_MEDIAN_STABLE_RUNS_MIN = 3
#: The confidence of that interval: 80 %, so that 9-15 runs can reach it (at 95 % the
#: interval of 15 runs is still the 4th to the 12th).
LIVE_MEDIAN_CONFIDENCE = 0.8


def live_grep(
    cluster: Path,
    pattern: str,
    keys: Sequence[str],
    placement: str,
    *,
    link: str | None,
    grep_options: Sequence[str] = (),
) -> float:
    """Run ``shuttle grep`` (a process of its own, as a user would) and return its
    ``elapsed_s``: from making the grep objects to the last answer."""
    return float(
        live_grep_report(cluster, pattern, keys, placement, link=link, grep_options=grep_options)[
            "elapsed_s"
        ]
    )


def live_grep_report(
    cluster: Path,
    pattern: str,
    keys: Sequence[str],
    placement: str,
    *,
    link: str | None,
    grep_options: Sequence[str] = (),
) -> dict[str, Any]:
    """:func:`live_grep`'s run, and its whole report (``--json-out``: ``elapsed_s``,
    and ``phases``, what its timer holds per node)."""
    with tempfile.TemporaryDirectory(prefix="shuttle-predict-") as tmp:
        report = Path(tmp) / "grep.json"
        argv = [sys.executable, "-m", "shuttle", "grep", pattern, *keys]
        argv += ["--placement", placement, "--count", "--json-out", str(report)]
        argv += ["--cluster", str(cluster), *grep_options]
        if link is not None:
            argv += ["--link", link]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode not in (0, 1) or not report.exists():
            raise ShuttleError(
                f"shuttle grep --placement {placement} failed (exit {done.returncode}): "
                + (done.stderr.strip().splitlines() or ["no output"])[-1]
            )
        data: dict[str, Any] = json.loads(report.read_text())
    return data


@dataclass
class LiveRuns:
    """Live run times of each placement. The figure compared with a prediction is the
    median: on a shared machine one run now and then waits seconds for a core, and a
    median of interleaved runs is what a quiet machine would have shown."""

    client_s: list[float] = field(default_factory=list)
    server_s: list[float] = field(default_factory=list)
    #: What each run's timer held, per placement: the reports' ``phases``.
    phases: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        client = statistics.median(self.client_s)
        server = statistics.median(self.server_s)
        return {
            "phases": {site: phase_summary(runs) for site, runs in self.phases.items()},
            "client_s": client,
            "server_s": server,
            "faster": "server" if server < client else "client",
            "mean": {
                "client_s": statistics.fmean(self.client_s),
                "server_s": statistics.fmean(self.server_s),
            },
            "runs": {"client_s": self.client_s, "server_s": self.server_s},
            "spread": {
                "client": _spread(self.client_s),
                "server": _spread(self.server_s),
            },
            # Where each median lies at LIVE_MEDIAN_CONFIDENCE, and whether that is
            # within LIVE_MEDIAN_STABLE_FRACTION of it (the runs stopped there).
            "median_interval": {
                "client": list(median_interval(self.client_s)),
                "server": list(median_interval(self.server_s)),
                "confidence": LIVE_MEDIAN_CONFIDENCE,
            },
            "stable": {
                "client": median_stable(self.client_s),
                "server": median_stable(self.server_s),
                "within": LIVE_MEDIAN_STABLE_FRACTION,
            },
        }


def phase_summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The live timer's phases over runs (the slowest node's stack of each run): the
    median time to the object made (the dial in it) and of each run's median console
    call, the calls a run made, and every run's phases as reported."""
    stacks = [max(r.values(), key=lambda p: p["made_s"] + sum(p["calls_s"])) for r in runs if r]
    if not stacks:
        return {}
    return {
        "made_s": statistics.median(p["made_s"] for p in stacks),
        "call_s": statistics.median(statistics.median(p["calls_s"]) for p in stacks),
        "calls": statistics.median(len(p["calls_s"]) for p in stacks),
        "calls_total_s": statistics.median(sum(p["calls_s"]) for p in stacks),
        "runs": list(runs),
    }


def median_interval(
    values: Sequence[float], confidence: float = LIVE_MEDIAN_CONFIDENCE
) -> tuple[float, float]:
    """A distribution-free confidence interval of the median of ``values``: the order
    statistics ``x(j)`` and ``x(n+1-j)`` for the largest ``j`` with ``P(j <= B <= n-j)
    >= confidence``, ``B`` binomial(n, 1/2) (the count of runs below the true median).
    With too few values for any ``j`` (n < 4 at 80 %), their whole range.

    Raises :class:`ConfigError` for no values or a confidence outside (0, 1)."""
    if not values:
        raise ConfigError("a median interval needs at least one value")
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must be between 0 and 1 (e.g. 0.8), not {confidence!r}")
    ordered = sorted(values)
    n = len(ordered)
    j = 1
    for k in range(1, n // 2 + 1):
        covered = sum(math.comb(n, b) for b in range(k, n - k + 1)) / 2.0**n
        if covered >= confidence:
            j = k
        else:
            break
    return ordered[j - 1], ordered[n - j]


def median_stable(values: Sequence[float], within: float = LIVE_MEDIAN_STABLE_FRACTION) -> bool:
    """Whether the median of ``values`` is known to ``within`` of itself either side
    (its :func:`median_interval`; at least ``LIVE_MEDIAN_STABLE_RUNS_MIN`` values)."""
    if len(values) < LIVE_MEDIAN_STABLE_RUNS_MIN:
        return False
    low, high = median_interval(values)
    middle = statistics.median(values)
    return middle > 0.0 and high - middle <= within * middle and middle - low <= within * middle


def _spread(values: list[float]) -> float:
    """(max - min) / median: how far apart the runs were."""
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0


def run_live(
    cluster: Path,
    pattern: str,
    keys: Sequence[str],
    *,
    link: str | None,
    runs: int,
    runs_max: int | None = None,
    grep_options: Sequence[str] = (),
    after_server: Callable[[], None] | None = None,
    progress: Progress = lambda _m: None,
) -> LiveRuns:
    """At least ``runs`` runs of each placement, interleaved (client, server, client,
    ...), so a change in the machine's load touches both alike; then more rounds, up
    to ``runs_max`` runs (default ``LIVE_RUNS_MAX_FACTOR`` x ``runs``), of each
    placement whose median is not yet stable (:func:`median_stable`). A placement
    whose median is stable sits the later rounds out (a shaped link's client runs
    take seconds and hold still). ``after_server`` is called after each server run."""
    most = LIVE_RUNS_MAX_FACTOR * runs if runs_max is None else max(runs, runs_max)
    out = LiveRuns()
    for i in range(most):
        for placement in ("client", "server"):
            times = out.client_s if placement == "client" else out.server_s
            if i >= runs and median_stable(times):
                continue
            progress(
                f"live run {len(times) + 1} (at least {runs}): shuttle grep --placement {placement}"
            )
            report = live_grep_report(
                cluster, pattern, keys, placement, link=link, grep_options=grep_options
            )
            times.append(float(report["elapsed_s"]))
            out.phases.setdefault(placement, []).append(report.get("phases", {}))
            if placement == "server" and after_server is not None:
                after_server()
        if i + 1 >= runs and median_stable(out.client_s) and median_stable(out.server_s):
            break
    return out
