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
"""

from __future__ import annotations

import argparse
import ast
import difflib
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
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODULES_FILE = ROOT / "tests" / "mutation" / "modules.toml"
EQUIVALENT_FILE = ROOT / "tests" / "mutation" / "equivalent.toml"
WORK_DIR = ROOT / "build" / "mutate"
OUT_DIR = ROOT / "results" / "mutation"

#: mutmut's verdicts (``mutmut.stats.status_by_exit_code``) as this report counts them.
CAUGHT = frozenset({"killed", "timeout", "segfault"})
NOT_CAUGHT = frozenset({"survived", "no tests"})
#: Seconds between progress lines while mutmut runs.
PROGRESS_EVERY_S = 20.0
#: A mutant's tests may take this many times what they took unmutated before mutmut
#: stops them and counts a timeout (caught: the mutant hangs). mutmut's default of 15
#: made each hanging mutant of the journal cost ten minutes (its tests took 37 s under
#: mutmut's tracing); 4 still leaves room for a machine shared with other jobs.
TIMEOUT_MULTIPLIER = 4
#: pytest-timeout for one unit test during a run (the project's default is 120 s).
TEST_TIMEOUT_S = 60


class ToolError(Exception):
    """A usage or tooling error: the message says what to do."""


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


@dataclass(frozen=True)
class Equivalent:
    """A surviving mutant accepted as equivalent: the change, where, and why.
    ``context`` (optional) is the line just above the change, for a change that occurs
    more than once in its function (``continue`` turned into ``break``)."""

    module: str
    function: str
    before: str
    after: str
    reason: str
    context: str = ""

    def matches(self, m: Mutant, module: str) -> bool:
        return (self.module, self.function, self.before, self.after) == (
            module,
            m.function,
            m.before,
            m.after,
        ) and (not self.context or self.context == m.context)


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


@dataclass
class Mutant:
    """One mutant and its verdict, located in the original source."""

    name: str
    status: str
    function: str
    line: int
    before: str
    after: str
    diff: str
    #: The line just above the change (stripped), to tell repeated changes apart.
    context: str = ""
    seconds: float | None = None
    reason: str | None = None  # set when accepted as equivalent


def function_lines(source: str) -> dict[str, int]:
    """``{"Class.method" or "function": line of its def}`` for top-level functions and
    methods (what mutmut mutates)."""
    out: dict[str, int] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    out[f"{node.name}.{item.name}"] = item.lineno
    return out


def split_mutant_name(name: str) -> tuple[str, str]:
    """``(mangled function name, "Class.method" or "function")`` of a mutmut mutant name
    such as ``shuttle.store.journal.xǁJournalǁappend__mutmut_3``."""
    mangled = name.rpartition(".")[2].partition("__mutmut_")[0]
    if mangled.startswith("xǁ"):
        _, cls, func = mangled.split("ǁ")
        return mangled, f"{cls}.{func}"
    return mangled, mangled.removeprefix("x_")


def _def_index(lines: Sequence[str]) -> int:
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("def ", "async def ")):
            return i
    raise ToolError("mutmut's generated function has no def line; is mutmut 3.x installed?")


def locate(
    name: str, orig_text: str, mutant_text: str, def_lines: dict[str, int]
) -> tuple[str, int, str, str, str, str]:
    """``(function, line, before, after, diff, context)`` of a mutant, from the
    generated copies of its function (``orig_text``: mutmut's unmutated copy,
    ``mutant_text``); ``context`` is the nearest non-blank line above the change."""
    mangled, function = split_mutant_name(name)
    generated_orig = mangled + "__mutmut_orig"
    generated = name.rpartition(".")[2]
    leaf = function.rpartition(".")[2]
    orig = orig_text.replace(generated_orig, leaf).splitlines()
    mutant = mutant_text.replace(generated, leaf).splitlines()
    matcher = difflib.SequenceMatcher(a=orig, b=mutant, autojunk=False)
    changed = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if not changed:
        raise ToolError(f"{name}: mutmut's mutant does not differ from the original")
    i1, i2 = min(op[1] for op in changed), max(op[2] for op in changed)
    j1, j2 = min(op[3] for op in changed), max(op[4] for op in changed)
    line = def_lines[function] + i1 - _def_index(orig)
    before = "\n".join(x.strip() for x in orig[i1:i2])
    after = "\n".join(x.strip() for x in mutant[j1:j2])
    diff = "\n".join(
        difflib.unified_diff(orig, mutant, lineterm="", n=1, fromfile="before", tofile="after")
    )
    context = next((x.strip() for x in reversed(orig[:i1]) if x.strip()), "")
    return function, line, before, after, diff, context


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


# --- the score ---------------------------------------------------------------------------


@dataclass
class Report:
    module: str
    tests: list[str]
    source_sha256: str
    mutants: int
    counts: dict[str, int]
    caught: int
    equivalent: int
    score: float | None
    raw_score: float | None
    #: The mutants a sample run tested (empty: every mutant of the module).
    sample: list[str] = field(default_factory=list)
    survivors: list[Mutant] = field(default_factory=list)
    accepted: list[Mutant] = field(default_factory=list)
    #: Accepted equivalents that no surviving mutant matches (the code changed, or a test
    #: now kills it): the entry should go.
    stale_equivalents: list[dict[str, str]] = field(default_factory=list)
    other: list[Mutant] = field(default_factory=list)
    #: Caught by hanging (mutmut's timeout), listed so that a reader can judge them.
    timeouts: list[Mutant] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def score(
    path: str,
    mutants: Sequence[Mutant],
    equivalents: Sequence[Equivalent],
    tests: Sequence[str],
    *,
    sample: Sequence[str] = (),
    tree: Path = ROOT,
) -> Report:
    """The report of one module's run: survivors matched against accepted equivalents."""
    counts: dict[str, int] = {}
    for m in mutants:
        counts[m.status] = counts.get(m.status, 0) + 1
    mine = [e for e in equivalents if e.module == path]
    survivors, accepted, other = [], [], []
    used: set[Equivalent] = set()
    for m in mutants:
        if m.status in CAUGHT:
            continue
        if m.status not in NOT_CAUGHT:
            other.append(m)
            continue
        eq = next((e for e in mine if e.matches(m, path)), None)
        if eq is None:
            survivors.append(m)
        else:
            m.reason = eq.reason
            accepted.append(m)
            used.add(eq)
    caught = sum(1 for m in mutants if m.status in CAUGHT)
    judged = caught + len(survivors) + len(accepted)
    honest = judged - len(accepted)
    stale = [] if sample else [asdict(e) for e in mine if e not in used]
    return Report(
        module=path,
        tests=list(tests),
        source_sha256=hashlib.sha256((tree / path).read_bytes()).hexdigest(),
        mutants=len(mutants),
        counts=counts,
        caught=caught,
        equivalent=len(accepted),
        score=caught / honest if honest else None,
        raw_score=caught / judged if judged else None,
        sample=list(sample),
        survivors=survivors,
        accepted=accepted,
        stale_equivalents=stale,
        other=other,
        timeouts=[m for m in mutants if m.status == "timeout"],
    )


def percent(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f} %"


def markdown(report: Report) -> str:
    """The readable summary of one module's run."""
    r = report
    lines = [
        f"# Mutation testing: {r.module}",
        "",
        f"* score **{percent(r.score)}** ({r.caught} caught of {r.mutants} mutants, "
        f"{r.equivalent} accepted as equivalent; {percent(r.raw_score)} before setting "
        "them aside)" + (f" — a sample of {len(r.sample)}, not every mutant" if r.sample else ""),
        "* verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(r.counts.items())),
        f"* tests: {' '.join(r.tests)}",
        f"* took {r.seconds:.0f} s",
        "",
    ]
    if r.survivors:
        lines += [f"## Survivors ({len(r.survivors)})", ""]
        lines += [
            "Each is a change no test noticed: write the test that fails on it, or, if the",
            "change cannot be observed, accept it in tests/mutation/equivalent.toml",
            "(docs/testing.md). Re-test just these: `make mutate MODULES=... SURVIVORS=1`.",
            "",
        ]
        for m in r.survivors:
            lines += [
                f"### {r.module}:{m.line} in `{m.function}` ({m.status})",
                "",
                f"`{m.name}`",
                "",
                "```diff",
                *[x for x in m.diff.splitlines() if not x.startswith(("---", "+++", "@@"))],
                "```",
                "",
            ]
    if r.accepted:
        lines += [f"## Accepted as equivalent ({len(r.accepted)})", ""]
        lines += [f"* {r.module}:{m.line} `{m.function}`: {m.reason}" for m in r.accepted]
        lines.append("")
    if r.stale_equivalents:
        lines += ["## Stale entries in tests/mutation/equivalent.toml", ""]
        lines += [
            f"* `{e['function']}`: `{e['before']}` → `{e['after']}` matches no survivor: "
            "the code changed or a test now catches it; remove the entry"
            for e in r.stale_equivalents
        ]
        lines.append("")
    if r.timeouts:
        lines += [f"## Caught by hanging ({len(r.timeouts)})", ""]
        lines += [
            "Stopped by mutmut's timeout and counted as caught. On a loaded machine a slow",
            "but correct run can be stopped too: if a change here looks harmless, re-test it.",
            "",
        ]
        lines += [
            f"* {r.module}:{m.line} `{m.function}`: `{m.before}` → `{m.after}`" for m in r.timeouts
        ]
        lines.append("")
    if r.other:
        lines += ["## Not judged", ""]
        lines += [f"* {r.module}:{m.line} `{m.name}`: {m.status}" for m in r.other]
        lines.append("")
    return "\n".join(lines)


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
        previous = _report_from(json.loads(last.read_text()))
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
            return _report_from(previous)
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


def _report_from(data: dict[str, Any]) -> Report:
    fields = {k: v for k, v in data.items() if k in Report.__dataclass_fields__}
    for key in ("survivors", "accepted", "other", "timeouts"):
        fields[key] = [Mutant(**m) for m in fields.get(key, [])]
    return Report(**fields)


def write(report: Report, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{slug(report.module)}.json"
    md_path = out_dir / f"{slug(report.module)}.md"
    json_path.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
    md_path.write_text(markdown(report))
    return json_path, md_path


def summary_table(reports: Iterable[Report]) -> str:
    rows = [
        "| module | mutants | caught | survivors | equivalent | score |",
        "|---|---|---|---|---|---|",
    ]
    for r in reports:
        rows.append(
            f"| {r.module} | {r.mutants} | {r.caught} | {len(r.survivors)} | "
            f"{r.equivalent} | {percent(r.score)} |"
        )
    return "\n".join(rows)


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
