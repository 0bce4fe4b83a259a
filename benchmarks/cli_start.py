"""How long the ``shuttle`` command takes to start (issue 25, item 6: target < 0.2 s).

    .venv/bin/python benchmarks/cli_start.py [--runs 10] [--json-out FILE] [--compare SRC]

``--compare SRC`` also times the same commands from another checkout's ``src`` folder
(``git archive main | tar -x -C /tmp/main``, then ``--compare /tmp/main/src``), in the
same rounds: before and after under the same load.

Runs each command ``--runs`` times as a whole process, interleaved round by round with
two anchors: ``python -c pass`` (the interpreter alone) and a two-command typer app's
``--help`` (the floor of any typer command's help: typer, click, rich). Prints the
median wall time and CPU time (user + system, of the child: on a shared, loaded machine
wall time mostly measures the queue for a core, CPU time much less so), the spread, and
the ratio to the typer floor, with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: The smallest typer app with rich help: the floor for any ``--help``.
TYPER_FLOOR = """
import typer
app = typer.Typer(add_completion=False)
@app.command()
def ls(prefix: str = "", long: bool = False) -> None:
    "List."
@app.command()
def put(key: str) -> None:
    "Put."
app()
"""

#: The commands timed; the first two are the anchors.
COMMANDS: dict[str, list[str]] = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "typer app ls --help": [sys.executable, "-c", TYPER_FLOOR, "ls", "--help"],
    "shuttle --version": [sys.executable, "-m", "shuttle", "--version"],
    "shuttle ls --help": [sys.executable, "-m", "shuttle", "ls", "--help"],
    "shuttle --help": [sys.executable, "-m", "shuttle", "--help"],
    "shuttle cluster up --help": [sys.executable, "-m", "shuttle", "cluster", "up", "--help"],
}


def _time(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json-out", type=Path, help="write the figures here")
    parser.add_argument("--compare", type=Path, help="another checkout's src folder")
    args = parser.parse_args()
    runs: dict[str, tuple[list[str], dict[str, str] | None]] = {
        name: (argv, None) for name, argv in COMMANDS.items()
    }
    if args.compare is not None:
        # PYTHONPATH comes before the virtualenv's editable install on sys.path.
        env = {**os.environ, "PYTHONPATH": str(args.compare.resolve())}
        for name, argv in COMMANDS.items():
            if name.startswith("shuttle"):
                # The other checkout may not have --version: time `version` there.
                other = [a if a != "--version" else "version" for a in argv]
                runs[f"{name} (compare)"] = (other, env)
    load_before = os.getloadavg()
    walls: dict[str, list[float]] = {name: [] for name in runs}
    cpus: dict[str, list[float]] = {name: [] for name in runs}
    for argv, env in runs.values():  # one warm-up each: the page cache, .pyc files
        _time(argv, env)
    for _ in range(args.runs):
        for name, (argv, env) in runs.items():
            wall, cpu = _time(argv, env)
            walls[name].append(wall)
            cpus[name].append(cpu)
    load_after = os.getloadavg()
    floor = statistics.median(cpus["typer app ls --help"])
    report: dict[str, object] = {
        "runs": args.runs,
        "load_before": load_before,
        "load_after": load_after,
        "cpus": os.cpu_count(),
        "compare": str(args.compare) if args.compare else None,
        "commands": {},
    }
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print(
        f"{'command':<36} {'wall s':>7} {'(min':>6} {'max)':>6} {'cpu s':>6} {'(min':>6} "
        f"{'max)':>6} {'cpu ÷ typer':>11}"
    )
    for name in runs:
        wall, cpu = walls[name], cpus[name]
        print(
            f"{name:<36} {statistics.median(wall):>7.3f} {min(wall):>6.3f} {max(wall):>6.3f} "
            f"{statistics.median(cpu):>6.3f} {min(cpu):>6.3f} {max(cpu):>6.3f} "
            f"{statistics.median(cpu) / floor:>11.2f}"
        )
        report["commands"][name] = {  # type: ignore[index]
            "wall_median_s": statistics.median(wall),
            "wall_s": wall,
            "cpu_median_s": statistics.median(cpu),
            "cpu_s": cpu,
            "cpu_ratio_to_typer_floor": statistics.median(cpu) / floor,
        }
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
