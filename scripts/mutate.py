#!/usr/bin/env python3
"""Mutation testing of named modules with mutmut (docs/testing.md).

    .venv/bin/python scripts/mutate.py src/shuttle/store/journal.py [MODULE ...]
    make mutate MODULES="src/shuttle/store/journal.py src/shuttle/runtime/gate.py"

Each module is mutated alone, one after the other, against its own tests: the list in
``tests/mutation/modules.toml`` (or, for a module not listed there, the unit tests that
import it, which the run prints so they can be listed). mutmut runs in a work directory
of its own (``build/mutate/<module>/``, so that runs of different modules never share a
cache, and the repository's pyproject.toml needs no mutmut section) with
``SHUTTLE_PURE=1``: several modules are also compiled with mypyc, and a mutant must run
as the pure Python it was made from. mutmut's forced-failure check (every test must
fail when the module's functions raise) proves the mutated copy is the one imported.

The report (``results/mutation/<module>.json`` and ``.md``) gives the score, every
surviving mutant as ``file:line`` with the line before and after, and the survivors
accepted as equivalent in ``tests/mutation/equivalent.toml`` (a mutant that changes
nothing observable), each with its reason. The score is

    caught / (mutants - accepted equivalents)

where *caught* counts mutants a test failed on (killed) or that hung until mutmut's
timeout stopped them; survivors and mutants no test reaches are not caught.

Exit status: 0 when every module meets ``--min-score`` (default 0, report only), 1 if
one does not, 2 on a usage or tooling error.

This script runs mutmut and writes the reports; reading its mutants back into the
original source, the score and the report's text are scripts/mutation_report.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Sequence
from pathlib import Path

# The scoring and the report are scripts/mutation_report.py, beside this file: found
# however this script was started (``python scripts/mutate.py``, or loaded by path).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_report import (
    Equivalent,
    Mutant,
    Report,
    ToolError,
    function_lines,
    locate,
    markdown,
    percent,
    report_from,
    score,
    summary_table,
)

ROOT = Path(__file__).resolve().parent.parent
MODULES_FILE = ROOT / "tests" / "mutation" / "modules.toml"
EQUIVALENT_FILE = ROOT / "tests" / "mutation" / "equivalent.toml"
WORK_DIR = ROOT / "build" / "mutate"
OUT_DIR = ROOT / "results" / "mutation"

#: Seconds between progress lines while mutmut runs.
PROGRESS_EVERY_S = 20.0
#: A mutant's tests may take this many times what they took unmutated before mutmut
#: stops them and counts a timeout (caught: the mutant hangs). mutmut's default of 15
#: made each hanging mutant of the journal cost ten minutes (its tests took 37 s under
#: mutmut's tracing); 4 still leaves room for a machine shared with other jobs.
TIMEOUT_MULTIPLIER = 4
#: pytest-timeout for one unit test during a run (the project's default is 120 s).
TEST_TIMEOUT_S = 60


# --- configuration: which tests answer for a module, which mutants are equivalent -----


def module_path(name: str) -> str:
    """``src/shuttle/x/y.py`` from that path or from ``shuttle.x.y``, checked to exist."""
    path = name if name.endswith(".py") else "src/" + name.replace(".", "/") + ".py"
    path = os.path.relpath(ROOT / path, ROOT) if os.path.isabs(path) else os.path.normpath(path)
    if not path.startswith("src/shuttle/") or not (ROOT / path).is_file():
        raise ToolError(f"{name}: not a module under src/shuttle/ (give src/shuttle/x/y.py)")
    return path


def dotted(path: str) -> str:
    """``shuttle.x.y`` for ``src/shuttle/x/y.py``."""
    return path.removeprefix("src/").removesuffix(".py").replace("/", ".")


def slug(path: str) -> str:
    """A file-name-safe name of a module: ``store.journal`` for src/shuttle/store/journal.py."""
    return dotted(path).removeprefix("shuttle.")


def load_test_map(path: Path = MODULES_FILE) -> dict[str, list[str]]:
    """``{module path: [test paths or node ids]}`` from ``modules.toml``."""
    data = tomllib.loads(path.read_text())
    out: dict[str, list[str]] = {}
    for module, entry in data.items():
        tests = entry.get("tests") if isinstance(entry, dict) else None
        if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests) or not tests:
            raise ToolError(f'{path}: ["{module}"] needs tests = ["tests/...", ...]')
        out[module] = list(tests)
    return out


def load_setup_seconds(module: str, path: Path = MODULES_FILE) -> float:
    """``setup_s`` of ``module`` in ``modules.toml``: seconds each mutant's run spends
    before its tests, beyond what mutmut measured for them (a test that starts the
    session's Ceph: mutmut's first run started it once for all), added to its timeout
    so that a mutant is not counted as hanging for it. 1 s (mutmut's) if not given."""
    entry = tomllib.loads(path.read_text()).get(module, {})
    value = entry.get("setup_s", 1.0) if isinstance(entry, dict) else 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ToolError(f'{path}: ["{module}"] setup_s must be a number of seconds ≥ 0')
    return float(value)


def guess_tests(path: str, tree: Path = ROOT) -> list[str]:
    """The unit test files that import ``path``'s module (by its dotted name or as
    ``from <package> import <module>``)."""
    name = dotted(path)
    package, _, leaf = name.rpartition(".")
    pattern = re.compile(
        rf"(^|\W){re.escape(name)}(\W|$)|from {re.escape(package)} import [^\n]*\b{leaf}\b"
    )
    found = [
        str(p.relative_to(tree))
        for p in sorted((tree / "tests" / "unit").rglob("test_*.py"))
        if pattern.search(p.read_text())
    ]
    return found


def load_equivalents(path: Path = EQUIVALENT_FILE) -> list[Equivalent]:
    data = tomllib.loads(path.read_text()) if path.exists() else {}
    out = []
    for i, entry in enumerate(data.get("equivalent", [])):
        missing = [k for k in ("module", "function", "before", "after", "reason") if k not in entry]
        if missing or not str(entry.get("reason", "")).strip():
            raise ToolError(
                f"{path}: entry {i + 1} lacks {', '.join(missing) or 'a reason'} "
                "(every accepted mutant says where, what and why)"
            )
        unknown = set(entry) - set(Equivalent.__dataclass_fields__)
        if unknown:
            raise ToolError(f"{path}: entry {i + 1} has unknown fields {sorted(unknown)}")
        out.append(Equivalent(**{k: str(v) for k, v in entry.items()}))
    return out


# --- the mutants of a module, read back from mutmut's files ------------------------------


def read_mutants(workdir: Path, path: str, tree: Path = ROOT) -> list[Mutant]:
    """Every mutant of ``path`` with its verdict, from mutmut's files in ``workdir``."""
    from mutmut.stats import status_by_exit_code  # the pinned dev tool

    meta = json.loads((workdir / "mutants" / (path + ".meta")).read_text())
    spans = json.loads((workdir / "mutants" / (path + ".spans")).read_text())["spans"]
    generated = (workdir / "mutants" / path).read_text().splitlines(keepends=True)
    def_lines = function_lines((tree / path).read_text())

    def text(function: str) -> str:
        start, end = spans[function]
        return "".join(generated[start - 1 : end])

    out = []
    for name, code in meta["exit_code_by_key"].items():
        short = name.rpartition(".")[2]
        mangled = short.partition("__mutmut_")[0]
        function, line, before, after, diff, context = locate(
            name, text(mangled + "__mutmut_orig"), text(short), def_lines
        )
        out.append(
            Mutant(
                name=name,
                status=status_by_exit_code[code],
                function=function,
                line=line,
                before=before,
                after=after,
                diff=diff,
                context=context,
                seconds=meta.get("durations_by_key", {}).get(name),
            )
        )
    return sorted(out, key=lambda m: (m.line, m.name))


def list_mutant_names(path: str, tree: Path = ROOT) -> list[str]:
    """The names mutmut gives ``path``'s mutants, without running anything."""
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    mutated = mutate_file_contents(path, (tree / path).read_text())
    return [get_mutant_name(Path(path), n) for n in mutated.mutant_names]


# --- running mutmut -------------------------------------------------------------------------


def mutmut_config(path: str, tests: Sequence[str], setup_s: float = 1.0) -> str:
    """The ``[tool.mutmut]`` section of the work directory's pyproject.toml."""
    return "\n".join(
        [
            "",
            "# Written by scripts/mutate.py for one module's run (docs/testing.md).",
            "[tool.mutmut]",
            'source_paths = ["src"]',
            f"only_mutate = [{json.dumps(path)}]",
            f"pytest_add_cli_args_test_selection = {json.dumps(list(tests))}",
            # The cache provider would write into the shared tree; xdist is not wanted in
            # a worker that runs one mutant's tests; a unit test past a minute is hung (a
            # mutant that deadlocks fails there instead of at mutmut's wall timeout).
            # A fixed seed for hypothesis: the same examples for every mutant and every
            # run, so a verdict does not depend on the examples a run happened to draw.
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "no:xdist", '
            f'"-o", "timeout={TEST_TIMEOUT_S}", "--hypothesis-seed=27"]',
            f"timeout_multiplier = {TIMEOUT_MULTIPLIER}",
            # Added to the tests' own time before multiplying: set-up they need anew in
            # each mutant's run (load_setup_seconds).
            f"timeout_constant = {setup_s}",
            "use_git_change_detection = false",
            "",
        ]
    )


def prepare(
    workdir: Path,
    path: str,
    tests: Sequence[str],
    *,
    fresh: bool,
    tree: Path,
    setup_s: float = 1.0,
) -> None:
    """A work directory holding links to the sources and tests and a pyproject.toml with
    the project's pytest settings and this run's mutmut section."""
    if fresh and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("src", "tests"):
        link = workdir / name
        if not link.is_symlink():
            link.symlink_to(tree / name)
    project = (tree / "pyproject.toml").read_text()
    if "[tool.mutmut]" in project:
        raise ToolError(
            "pyproject.toml has a [tool.mutmut] section; scripts/mutate.py writes its own"
        )
    (workdir / "pyproject.toml").write_text(project + mutmut_config(path, tests, setup_s))
    # Tests that read the sample traces find them beside tests/, as in the repository.
    (workdir / "mutants").mkdir(exist_ok=True)
    data = workdir / "mutants" / "data"
    if not data.is_symlink():
        data.symlink_to(ROOT / "data")


def run_mutmut(workdir: Path, path: str, names: Sequence[str], jobs: int) -> None:
    """Run mutmut in ``workdir`` (all of ``path``'s mutants, or ``names``), printing
    progress from its verdict file; :class:`ToolError` if it fails."""
    mutmut = Path(sys.executable).parent / "mutmut"
    env = {**os.environ, "SHUTTLE_PURE": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    log_path = workdir / "mutmut.log"
    meta = workdir / "mutants" / (path + ".meta")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(mutmut), "run", "--max-children", str(jobs), *names],
            cwd=workdir,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its workers are its process group: stopped with it
        )
        try:
            while True:
                try:
                    proc.wait(timeout=PROGRESS_EVERY_S)
                    break
                except subprocess.TimeoutExpired:
                    _progress(meta, path, names)
        finally:
            if proc.poll() is None:  # interrupted: stop mutmut and the mutant it runs
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise ToolError(
            f"mutmut failed on {path} (exit {proc.returncode}); the end of {log_path}:\n{tail}"
        )


def _progress(meta: Path, path: str, names: Sequence[str]) -> None:
    try:
        codes = json.loads(meta.read_text())["exit_code_by_key"]
    except (OSError, ValueError, KeyError):
        print(f"mutate: {path}: generating mutants and mapping tests", flush=True)
        return
    wanted = set(names) or set(codes)
    done = [c for k, c in codes.items() if k in wanted and c is not None]
    survived = sum(1 for c in done if c in (0, 5, 33))
    print(f"mutate: {path}: {len(done)}/{len(wanted)} tested, {survived} not caught", flush=True)


def mutate_module(
    path: str,
    tests: Sequence[str],
    equivalents: Sequence[Equivalent],
    *,
    jobs: int,
    sample: int | None,
    seed: int,
    survivors_only: bool,
    rescore: bool,
    out_dir: Path,
    work_dir: Path,
    tree: Path,
) -> Report:
    workdir = work_dir / slug(path)
    names: list[str] = []
    if rescore:
        last = out_dir / f"{slug(path)}.json"
        if not last.exists() or not (workdir / "mutants").exists():
            raise ToolError(f"{path}: no previous run to score again; run it first")
        previous = report_from(json.loads(last.read_text()))
        mutants = read_mutants(workdir, path, tree)
        if previous.sample:
            mutants = [m for m in mutants if m.name in set(previous.sample)]
        report = score(
            path, mutants, equivalents, previous.tests, sample=previous.sample, tree=tree
        )
        report.seconds = previous.seconds
        return report
    if survivors_only:
        last = out_dir / f"{slug(path)}.json"
        if not last.exists() or not (workdir / "mutants").exists():
            raise ToolError(f"{path}: no previous run to re-test; run without SURVIVORS first")
        previous = json.loads(last.read_text())
        if previous["source_sha256"] != hashlib.sha256((tree / path).read_bytes()).hexdigest():
            raise ToolError(f"{path} changed since its last run; run it afresh (without SURVIVORS)")
        if previous["tests"] != list(tests):
            raise ToolError(f"{path}: its list of tests changed since its last run; run it afresh")
        names = [m["name"] for m in previous["survivors"]]
        if not names:
            print(f"mutate: {path}: no survivors to re-test")
            return report_from(previous)
    elif sample is not None:
        every = list_mutant_names(path, tree)
        names = sorted(random.Random(seed).sample(every, min(sample, len(every))))
    setup_s = load_setup_seconds(path)
    prepare(workdir, path, tests, fresh=not survivors_only, tree=tree, setup_s=setup_s)
    started = time.monotonic()
    print(f"mutate: {path} against {' '.join(tests)}", flush=True)
    run_mutmut(workdir, path, names, jobs)
    mutants = read_mutants(workdir, path, tree)
    if sample is not None:
        chosen = set(names)
        mutants = [m for m in mutants if m.name in chosen]
    report = score(path, mutants, equivalents, tests, sample=names if sample else (), tree=tree)
    report.seconds = time.monotonic() - started
    return report


def checkout(rev: str) -> Path:
    """The sources, tests and pyproject.toml of git revision ``rev``, exported under
    build/mutate/at-<commit>/tree (to measure a score before a change)."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", rev + "^{commit}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except subprocess.CalledProcessError as exc:
        raise ToolError(f"--at {rev}: not a git revision ({exc.stderr.strip()})") from None
    tree = WORK_DIR / f"at-{commit}" / "tree"
    if not tree.exists():
        tree.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", commit, "src", "tests", "pyproject.toml"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        (tree / "data").symlink_to(ROOT / "data")
    return tree


def write(report: Report, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{slug(report.module)}.json"
    md_path = out_dir / f"{slug(report.module)}.md"
    json_path.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
    md_path.write_text(markdown(report))
    return json_path, md_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="+", help="src/shuttle/x/y.py or shuttle.x.y")
    parser.add_argument("--tests", nargs="+", help="tests to run instead of the listed ones")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--sample", type=int, help="test a seeded sample of this many mutants")
    parser.add_argument("--seed", type=int, default=27, help="the sample's seed")
    parser.add_argument(
        "--survivors", action="store_true", help="re-test only the last run's survivors"
    )
    parser.add_argument(
        "--at", metavar="REV", help="measure the sources and tests of a git revision instead"
    )
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="run nothing: score the last run again (after editing equivalent.toml)",
    )
    parser.add_argument("--min-score", type=float, default=0.0, help="fail below this (0..1)")
    parser.add_argument("--out", type=Path, help="where reports go (default results/mutation)")
    args = parser.parse_args(argv)
    # Stopped by a signal, stop mutmut too (the finally in run_mutmut runs on SystemExit).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        test_map = load_test_map()
        equivalents = load_equivalents()
        paths = [module_path(m) for m in args.modules]
        tree, work_dir, out_dir = ROOT, WORK_DIR, args.out or OUT_DIR
        if args.out:  # a report elsewhere keeps its mutmut files apart too
            work_dir = WORK_DIR / (
                "out-" + hashlib.sha256(str(args.out.resolve()).encode()).hexdigest()[:8]
            )
        if args.sample is not None:  # never in the way of a full run's files
            work_dir, out_dir = work_dir / "sample", args.out or OUT_DIR / "sample"
        if args.at:
            tree = checkout(args.at)
            work_dir = tree.parent
            out_dir = args.out or OUT_DIR / tree.parent.name
        reports = []
        for path in paths:
            if not (tree / path).is_file():
                raise ToolError(f"{path} does not exist at {args.at}")
            tests = args.tests or test_map.get(path)
            if not tests:
                tests = guess_tests(path, tree)
                if not tests:
                    raise ToolError(
                        f"{path}: no tests listed in {MODULES_FILE.relative_to(ROOT)} and no "
                        "unit test imports it; list its tests there or pass --tests"
                    )
                print(
                    f"mutate: {path} is not in {MODULES_FILE.relative_to(ROOT)}; using the "
                    f"unit tests that import it: {' '.join(tests)} (list them there to keep)"
                )
            present = [t for t in tests if (tree / t.partition("::")[0]).exists()]
            if args.at:
                tests = present or tests  # tests added since REV are not there yet
            elif present != list(tests):
                missing = sorted(set(tests) - set(present))
                raise ToolError(f"{path}: listed tests do not exist: {' '.join(missing)}")
            report = mutate_module(
                path,
                tests,
                equivalents,
                jobs=args.jobs,
                sample=args.sample,
                seed=args.seed,
                survivors_only=args.survivors,
                rescore=args.rescore,
                out_dir=out_dir,
                work_dir=work_dir,
                tree=tree,
            )
            _, md_path = write(report, out_dir)
            reports.append(report)
            print(
                f"mutate: {path}: score {percent(report.score)} ({report.caught} caught, "
                f"{len(report.survivors)} survivors, {report.equivalent} equivalent) "
                f"in {report.seconds:.0f} s; {os.path.relpath(md_path, ROOT)}",
                flush=True,
            )
            for e in report.stale_equivalents:
                print(f"mutate: stale equivalent entry for {e['function']}: {e['before']!r}")
        print()
        print(summary_table(reports))
    except ToolError as exc:
        print(f"mutate: {exc}", file=sys.stderr)
        return 2
    low = [r for r in reports if r.score is not None and r.score < args.min_score]
    if low:
        print(f"mutate: below {percent(args.min_score)}: {', '.join(r.module for r in low)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
