"""``python -m tests.faults --points N [--seed S] [--json FILE]``: run the fault tier
(needs root: network namespaces) and print its figures."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import time
from pathlib import Path

from shuttle.net.netns import netns_unavailable_reason
from tests.faults.harness import run_points
from tests.faults.report import Report, write_json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults", description=__doc__)
    parser.add_argument("--points", type=int, default=1000, help="faults injected (default 1000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--workdir", type=Path, help="where the nodes' data go (default: a temp dir)"
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.points < 1:
        parser.error(f'"--points" must be >= 1, got {args.points}')
    reason = netns_unavailable_reason()
    if reason is not None:
        print(f"fault tier: cannot run: {reason}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.ERROR)
    # A SIGTERM ends the run through its finally clauses: nodes killed, namespaces gone.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="shuttle-faults-", dir=args.workdir) as tmp:
        last = [time.monotonic()]

        def progress(r: Report) -> None:
            if time.monotonic() - last[0] >= 30 or r.points == args.points:
                last[0] = time.monotonic()
                print(
                    f"{r.points} faults, {r.migrations} migrations, {r.acknowledged_calls} "
                    f"acknowledged calls; two live copies {r.two_live_copies}, lost "
                    f"{r.lost_acknowledged_calls}, unclear errors {r.unclear_errors}, "
                    f"{r.elapsed_s:.0f} s",
                    flush=True,
                )

        report = run_points(Path(tmp), args.points, seed=args.seed, progress=progress)
    for p in report.problems[:50]:
        print("PROBLEM", p)
    print(
        f"fault tier: {report.points} faults injected ({report.not_reached} steps not "
        f"reached), {report.migrations} migrations ({report.migrations_ok} completed), "
        f"{report.acknowledged_calls} acknowledged calls, {report.failed_calls} failed with "
        f"clear errors or unclear ones; two live copies {report.two_live_copies}, lost "
        f"acknowledged calls {report.lost_acknowledged_calls}, unclear errors "
        f"{report.unclear_errors}, durable objects lost {report.durable_objects_lost}, "
        f"{report.elapsed_s:.0f} s: {'PASS' if report.ok else 'FAIL'}"
    )
    if args.json is not None:
        write_json(report, args.json)
    return 0 if report.ok and report.points == args.points else 1


if __name__ == "__main__":
    sys.exit(main())
