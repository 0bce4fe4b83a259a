"""What a mutation run of one module found, read and scored (scripts/mutate.py runs
mutmut and writes the reports): each mutant located in the original source
(:func:`locate`), survivors matched against the mutants accepted as equivalent
(:class:`Equivalent`), the score and the readable report (docs/testing.md). Nothing
here runs mutmut or a test.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: mutmut's verdicts (``mutmut.stats.status_by_exit_code``) as this report counts them.
CAUGHT = frozenset({"killed", "timeout", "segfault"})
NOT_CAUGHT = frozenset({"survived", "no tests"})


class ToolError(Exception):
    """A usage or tooling error: the message says what to do."""


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


def report_from(data: dict[str, Any]) -> Report:
    fields = {k: v for k, v in data.items() if k in Report.__dataclass_fields__}
    for key in ("survivors", "accepted", "other", "timeouts"):
        fields[key] = [Mutant(**m) for m in fields.get(key, [])]
    return Report(**fields)
