"""Conditions that swing around the break-even point: does the run-time thrash?

One filter reads an object over the LAN. Its CPU cost is chosen so that the node is
the better place while the node is idle and the client is while a competing process
loads the node's CPU: with compute : transfer ratio ``r`` and pass fraction ``p``,
the client takes ``(1 + r)·N``, the idle node ``(p + r)·N`` and the loaded node
``(p + 2r)·N``; the break-even over equal idle and loaded time is
``r = 2 (1 - p)`` (1.6 for ``p`` = 0.2). The competing load (a CPU-bound process pinned
to the node's CPU) is switched on and off every ``period_s`` with SIGSTOP/SIGCONT.

Two questions, two periods: with a long period (longer than the residence time) each
switch should be followed by a migration, and we measure how long after the switch it
completes (the target: within 3 H); with a short period the placement should not
follow every swing (the target: at most one migration per 5 H, and the run within
10 % of the better static placement).
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
    #: Compute : transfer; None: the break-even 2 (1 - pass fraction).
    cpu_ratio: float | None = None
    #: Seconds the competing load stays on, then off, then on...
    period_s: float = 3.0
    client_cpu: int | None = None
    node_cpu: int | None = None


@contextlib.contextmanager
def competing_load(cpu: int | None, period_s: float) -> Iterator[list[tuple[float, bool]]]:
    """A CPU-bound process on ``cpu``, off for the first period, then on, off, ...
    Yields the list of (time.time(), on) switches as they happen."""
    burner = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        stdin=subprocess.DEVNULL,
    )
    switches: list[tuple[float, bool]] = []
    stop = threading.Event()
    try:
        if cpu is not None:
            os.sched_setaffinity(burner.pid, {cpu})
        burner.send_signal(signal.SIGSTOP)

        def toggle() -> None:
            on = False
            while not stop.wait(period_s):
                on = not on
                burner.send_signal(signal.SIGCONT if on else signal.SIGSTOP)
                switches.append((time.time(), on))

        switcher = threading.Thread(target=toggle, daemon=True)
        switcher.start()
        yield switches
    finally:
        stop.set()
        burner.kill()
        burner.wait(5)


def _one(bench: Bench, settings: SwingSettings, placement: str, per_mb: float) -> dict[str, Any]:
    config = RuntimeConfig(window_s=settings.window_s, threshold_fraction=settings.threshold)
    with competing_load(bench.node_cpu, settings.period_s) as switches, bench.runtime(config) as rt:
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
        before = [t for t, _ in marks if t <= m["t_s"]]
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
    ratio = (
        settings.cpu_ratio if settings.cpu_ratio is not None else 2 * (1 - settings.pass_fraction)
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
        "cpu_s_per_mb": round(per_mb, 5),
        "placements": {p: summary([r["elapsed_s"] for r in runs[p]]) for p in PLACEMENTS},
        "adaptive_over_best_static": round(means["adaptive"] / best, 4),
        "migrations_per_5h": [round(x, 3) for x in per_5h],
        "lag_after_switch_s": lags,
        "lag_after_switch_in_h": [round(x / settings.window_s, 3) for x in lags],
        "runs": runs,
    }
