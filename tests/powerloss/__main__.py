"""``python -m tests.powerloss --points N [--lazyfs DIR|build-lazyfs.sh] [--json FILE]``:
run the power-loss tier (needs root and FUSE) and print its figures."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.powerloss.harness import Report, run_points, write_json
from tests.powerloss.lazyfs import (
    LazyFS,
    LazyFSUnavailable,
    build_cache,
    default_source,
    locate,
    unavailable_reason,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.powerloss", description=__doc__)
    parser.add_argument("--points", type=int, default=1000, help="power cuts (default 1000)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--lazyfs",
        type=Path,
        default=None,
        help="a built LazyFS directory, or build-lazyfs.sh (built once into ~/.cache/shuttle); "
        "default: $SHUTTLE_LAZYFS, else ../shared/vendor/build-lazyfs.sh beside this checkout "
        "or the repository it was cloned from, else a LazyFS already built",
    )
    parser.add_argument("--workdir", type=Path, help="where the mount lives (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.points < 1:
        parser.error(f'"--points" must be >= 1, got {args.points}')
    reason = unavailable_reason()
    if reason is not None:
        print(f"power-loss tier: cannot run: {reason}", file=sys.stderr)
        return 2
    try:
        source = (args.lazyfs or default_source()).resolve()
        build = locate(source, build_cache(source))
    except LazyFSUnavailable as exc:
        print(f"power-loss tier: cannot run: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="shuttle-powerloss-", dir=args.workdir) as tmp:
        work = Path(tmp)
        last = [time.monotonic()]

        def progress(r: Report) -> None:
            if time.monotonic() - last[0] >= 30 or r.points == args.points:
                last[0] = time.monotonic()
                print(
                    f"{r.points} points, {r.acked_ops} acknowledged ops, lost {r.lost}, "
                    f"torn {r.torn}, unclean restarts {r.unclean_restarts}, "
                    f"{r.elapsed_s:.0f} s",
                    flush=True,
                )

        with LazyFS(build, work / "root", work / "mnt", work) as fs:
            report = run_points(fs, args.points, seed=args.seed, progress=progress)
    for p in report.problems[:50]:
        print("PROBLEM", p)
    for e in report.disk_errors[:10]:
        print("DISK ERROR (cut there and checked)", e)
    print(
        f"power-loss tier: {report.points} crash points, {report.acked_ops} acknowledged "
        f"operations, {report.keys_checked} key checks, lost {report.lost}, torn "
        f"{report.torn}, unclean restarts {report.unclean_restarts}, checkpoints "
        f"{report.checkpoints}, LazyFS crashes {report.lazyfs_crashes} and disk errors "
        f"{len(report.disk_errors)} (checked too), "
        f"{report.elapsed_s:.0f} s: {'PASS' if report.ok else 'FAIL'}"
    )
    if args.json is not None:
        write_json(report, args.json)
    return 0 if report.ok and report.points == args.points else 1


if __name__ == "__main__":
    sys.exit(main())
