"""Conditions that swing around the break-even point: does the run-time thrash?

One filter (pass fraction ``p``) reads an object over the LAN, with compute :
transfer ratio ``r``. A competing load, ``k`` CPU-bound processes pinned to the
node's CPU, is switched on and off every ``period_s`` (SIGSTOP/SIGCONT); while it is
on, the node's load is ``L = 1 + k``. Per unit of transfer time ``N`` the client takes
``(1 + r)``, the idle node ``(p + r)``, the loaded node ``(p + L r)``. For the
run-time's decision to flip both ways, each direction must save more than
``B_thresh``:

* idle, to the node: ``(1 - p) > B (1 + r)``, so ``r < (1 - p)/B - 1``;
* loaded, back to the client: ``(p + L r)(1 - B) > 1 + r``, so
  ``r > (1 - p (1 - B)) / (L (1 - B) - 1)``.

With ``p`` = 0.2, ``B`` = 0.3 and two competitors (``L`` = 3) that is 0.78 < r < 1.67.
The default ``r`` is where both moves save the same fraction, ``(1 - p)/(1 + r) =
((L - 1) r + p - 1)/(p + L r)``: 1.06, saving 39 % each way, a margin of 9 points over
``B_thresh`` for the measurements' noise. (One competitor cannot open the band: the
loaded node would lose only 24 % to the client, inside the threshold's dead band.)

Two questions, two periods: with a long period (longer than the residence time) each
switch should be followed by a migration, and we measure how long after the switch it
completes (the target: within 3 H); with a short period the placement must not follow
every swing (the target: at most one migration per 5 H, and the run within 10 % of the
better static placement).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from shuttle.bench.abacus import (
    PLACEMENTS,
    Bench,
    Progress,
    bench_node,
    cpu_s_per_mb,
    run_filter,
    summary,
)
from shuttle.net.profiles import parse_link_profile
from shuttle.runtime.config import RuntimeConfig


@dataclass
class SwingSettings:
    size_bytes: int = 16 << 20
    link: str = "lan"
    runs: int = 2
    window_s: float = 1.0
    threshold: float = 0.3
    block_bytes: int = 64 << 10
    pass_fraction: float = 0.2
    #: Compute : transfer; None: where both directions of a move save the same
    #: fraction of the time (module docstring).
    cpu_ratio: float | None = None
    #: Seconds the competing load stays on, then off, then on...
    period_s: float = 3.0
    #: CPU-bound processes switched on and off on the node's CPU.
    load_procs: int = 2
    client_cpu: int | None = None
    node_cpu: int | None = None


def balanced_ratio(pass_fraction: float, load: float) -> float:
    """The ``r`` at which moving to the idle node and back from the loaded one save
    the same fraction of the time (bisection; the two fractions cross once)."""

    def gap(r: float) -> float:
        to_node = (1 - pass_fraction) / (1 + r)
        to_client = ((load - 1) * r + pass_fraction - 1) / (pass_fraction + load * r)
        return to_node - to_client

    low, high = 0.0, 100.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if gap(mid) > 0 else (low, mid)
    return (low + high) / 2


def band(pass_fraction: float, threshold: float, load: float) -> tuple[float, float]:
    """The ratios ``r`` for which both directions of a move clear ``threshold``."""
    low = (1 - pass_fraction * (1 - threshold)) / (load * (1 - threshold) - 1)
    high = (1 - pass_fraction) / threshold - 1
    return low, high


@contextlib.contextmanager
def competing_load(
    cpu: int | None, period_s: float, procs: int = 2
) -> Iterator[list[tuple[float, bool]]]:
    """``procs`` CPU-bound processes on ``cpu``, off for the first period, then on,
    off, ... Yields the list of (time.time(), on) switches as they happen."""
    # Each burner in a session of its own: with the kernel's autogroup scheduling
    # (Debian's default) the CPU is shared between sessions first, so two burners in
    # one session would take half the node's CPU between them (L = 2, not 3).
    burners = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(procs)
    ]
    switches: list[tuple[float, bool]] = []
    stop = threading.Event()
    try:
        for burner in burners:
            if cpu is not None:
                os.sched_setaffinity(burner.pid, {cpu})
            burner.send_signal(signal.SIGSTOP)

        def toggle() -> None:
            on = False
            while not stop.wait(period_s):
                on = not on
                for burner in burners:
                    burner.send_signal(signal.SIGCONT if on else signal.SIGSTOP)
                switches.append((time.time(), on))

        switcher = threading.Thread(target=toggle, daemon=True)
        switcher.start()
        yield switches
    finally:
        stop.set()
        for burner in burners:
            burner.kill()
            burner.wait(5)


def _one(bench: Bench, settings: SwingSettings, placement: str, per_mb: float) -> dict[str, Any]:
    config = RuntimeConfig(window_s=settings.window_s, threshold_fraction=settings.threshold)
    load = competing_load(bench.node_cpu, settings.period_s, settings.load_procs)
    with load as switches, bench.runtime(config) as rt:
        wall0 = time.time()
        run = run_filter(
            rt,
            bench,
            placement,
            pass_fraction=settings.pass_fraction,
            cpu_per_mb=per_mb,
            block_bytes=settings.block_bytes,
            wall0=wall0,
        )
        marks = [(round(t - wall0, 3), on) for t, on in switches]
    lags = []
    for m in run.migrations:
        # The lag from the switch that made this move worth it: the last switch to the
        # condition the move answers (load on: to the client; load off: to the node).
        wanted = m["direction"] == "to_client"
        before = [t for t, on in marks if t <= m["t_s"] and on == wanted]
        if before:
            lags.append(round(m["t_s"] - before[-1], 3))
    return {
        "elapsed_s": run.elapsed_s,
        "migrations": run.migrations,
        "switches": marks,
        "lag_after_switch_s": lags,
        "final": run.final,
        "trace": run.trace,
    }


def run_swing_benchmark(settings: SwingSettings, progress: Progress) -> dict[str, Any]:
    link = parse_link_profile(settings.link)
    low, high = band(settings.pass_fraction, settings.threshold, 1 + settings.load_procs)
    ratio = (
        settings.cpu_ratio
        if settings.cpu_ratio is not None
        else round(balanced_ratio(settings.pass_fraction, 1 + settings.load_procs), 3)
    )
    per_mb = cpu_s_per_mb(ratio, link)
    node_args = ["--window", str(settings.window_s), "--threshold", str(settings.threshold)]
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PLACEMENTS}
    with bench_node(
        link,
        size_bytes=settings.size_bytes,
        node_args=node_args,
        client_cpu=settings.client_cpu,
        node_cpu=settings.node_cpu,
    ) as bench:
        for i in range(settings.runs):
            for placement in PLACEMENTS:
                progress(
                    f"period {settings.period_s:g} s, run {i + 1}/{settings.runs}: {placement}"
                )
                runs[placement].append(_one(bench, settings, placement, per_mb))
    means = {p: statistics.fmean(r["elapsed_s"] for r in runs[p]) for p in PLACEMENTS}
    best = min(means["client"], means["server"])
    adaptive = runs["adaptive"]
    per_5h = [len(r["migrations"]) / (r["elapsed_s"] / (5 * settings.window_s)) for r in adaptive]
    lags = [lag for r in adaptive for lag in r["lag_after_switch_s"]]
    return {
        "experiment": "swing",
        "settings": asdict(settings),
        "cpu_ratio": ratio,
        "cpu_ratio_band": [round(low, 3), round(high, 3)],
        "cpu_s_per_mb": round(per_mb, 5),
        "placements": {p: summary([r["elapsed_s"] for r in runs[p]]) for p in PLACEMENTS},
        "adaptive_over_best_static": round(means["adaptive"] / best, 4),
        "migrations_per_5h": [round(x, 3) for x in per_5h],
        "lag_after_switch_s": lags,
        "lag_after_switch_in_h": [round(x / settings.window_s, 3) for x in lags],
        "runs": runs,
    }
