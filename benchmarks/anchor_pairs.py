"""This tree against an anchor, interleaved: the command line, the pairs and the ratios
that the in-process micro-benchmarks share (``promise_hits.py``, ``worker_read_cpu.py``).

A benchmark script names its ``child()`` (one tree's figures, a flat dict of floats,
run in a fresh interpreter with that tree's ``src`` first on its path) and calls
``main(child, ...)``. A pair runs the anchor (another checkout's ``src``, the code
before a change) and this tree back to back, alternating which goes first, so the
machine's load falls on both alike; the report is every figure of every pair, and per
figure this tree's over the anchor's: median and range over the pairs (the noise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

#: This checkout's ``src``.
HERE = Path(__file__).resolve().parent.parent / "src"

Figures = dict[str, float]


def measure(script: str, src: Path, env: Mapping[str, str]) -> Figures:
    """``script --child`` in a fresh interpreter with ``src`` first on its path."""
    out = subprocess.run(
        [sys.executable, script, "--child"],
        env={**os.environ, **env, "PYTHONPATH": str(src)},
        check=True,
        capture_output=True,
        text=True,
    )
    figures: Figures = json.loads(out.stdout)
    return figures


def run_pairs(
    script: str, anchor: Path, pairs: int, env: Mapping[str, str]
) -> list[dict[str, Figures]]:
    """``pairs`` pairs of (anchor, this tree), every other pair in the reverse order."""
    got_pairs = []
    for n in range(pairs):
        order = [("anchor", anchor), ("this", HERE)]
        got = {name: measure(script, src, env) for name, src in order[:: 1 - 2 * (n % 2)]}
        got_pairs.append(got)
        shown = ", ".join(
            f"{what} {got['anchor'][what]:.2f} -> {got['this'][what]:.2f}" for what in got["this"]
        )
        print(f"pair {n + 1}: {shown} (anchor -> this)")
    return got_pairs


def ratios(got_pairs: list[dict[str, Figures]]) -> dict[str, dict[str, float]]:
    """Per figure, this tree's over the anchor's: median, min and max over the pairs."""
    out = {}
    for what in got_pairs[0]["this"]:
        r = [p["this"][what] / p["anchor"][what] for p in got_pairs]
        out[what] = {"median": statistics.median(r), "min": min(r), "max": max(r)}
    return out


def main(
    child: Callable[[], Figures],
    script: str,
    description: str,
    pairs: int,
    env: Mapping[str, str] | None = None,
) -> None:
    """The command line: ``--child`` prints ``child()``'s figures; otherwise the pairs."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--anchor", type=Path, help="another checkout's src (the code before)")
    ap.add_argument("--pairs", type=int, default=pairs, help="interleaved pairs")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child()))
        return
    if args.anchor is None or not (args.anchor / "shuttle").is_dir():
        ap.error("--anchor must be a directory holding the shuttle package (a checkout's src)")
    got_pairs = run_pairs(script, args.anchor, args.pairs, env or {})
    report: dict[str, Any] = {"pairs": got_pairs, "load_avg": os.getloadavg()}
    for what, r in ratios(got_pairs).items():
        report[f"{what}_ratio"] = r
        print(
            f"{what}: this / anchor median {r['median']:.3f} (pairs {r['min']:.3f}..{r['max']:.3f})"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
