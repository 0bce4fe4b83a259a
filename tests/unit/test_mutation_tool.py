"""`make mutate` (scripts/mutate.py) without running mutmut: its configuration files stay
true to the code (every module and test it names exists, every accepted equivalent
mutant still names a line of its function), and its report counts as docs/testing.md
says. The mutation runs themselves take minutes per module and are not part of
`make test` (docs/testing.md)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_shuttle_mutate", ROOT / "scripts" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


mutate = _load()


def test_every_listed_module_and_test_exists() -> None:
    tests = mutate.load_test_map()
    assert tests, "tests/mutation/modules.toml lists no module"
    for module, paths in tests.items():
        assert mutate.module_path(module) == module
        for path in paths:
            assert (ROOT / path.partition("::")[0]).exists(), f"{module}: {path} is missing"


def test_every_accepted_equivalent_still_names_a_line_of_its_function() -> None:
    """An entry whose line no longer exists in its function can match nothing: the code
    changed, and the mutant must be judged again (or the entry removed)."""
    for eq in mutate.load_equivalents():
        source = (ROOT / eq.module).read_text()
        lines = mutate.function_lines(source)
        assert eq.function in lines, f"{eq.module}: no function {eq.function}"
        body = _function_source(source, eq.function)
        stripped = {line.strip() for line in body.splitlines()}
        for line in [*eq.before.splitlines(), *([eq.context] if eq.context else [])]:
            assert line in stripped, f"{eq.module} {eq.function}: no line {line!r}"
        assert eq.reason.strip()


def _function_source(source: str, qualname: str) -> str:
    cls, _, name = qualname.rpartition(".")
    tree = ast.parse(source)
    scope = tree.body
    if cls:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(
        n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    )
    return ast.get_source_segment(source, node) or ""


def test_a_mutant_is_located_by_its_line_in_the_source() -> None:
    orig = (
        "    def x\u01c1Gate\u01c1leave__mutmut_orig(self) -> None:\n"
        "        with self._cond:\n"
        "            self._active -= 1\n"
        "            if self._active == 0:\n"
    )
    mutant = orig.replace("__mutmut_orig", "__mutmut_4").replace("== 0", "!= 0")
    name = "shuttle.runtime.gate.x\u01c1Gate\u01c1leave__mutmut_4"
    function, line, before, after, diff, context = mutate.locate(
        name, orig, mutant, {"Gate.leave": 120}
    )
    assert (function, line, context) == ("Gate.leave", 123, "self._active -= 1")
    assert (before, after) == ("if self._active == 0:", "if self._active != 0:")
    assert "-            if self._active == 0:" in diff


def _mutant(name: str, status: str, before: str = "a", context: str = "") -> object:
    return mutate.Mutant(name, status, "f", 1, before, before + "!", "", context)


def test_the_score_sets_accepted_equivalents_aside() -> None:
    path = "src/shuttle/runtime/gate.py"
    mutants = [
        _mutant("m1", "killed"),
        _mutant("m2", "timeout"),
        _mutant("m3", "survived", before="x"),
        _mutant("m4", "survived", before="y"),
        _mutant("m5", "no tests", before="z"),
        _mutant("m6", "suspicious"),
        _mutant("m7", "survived", before="y", context="above"),
        _mutant("m8", "survived", before="y", context="elsewhere"),
    ]
    accepted = mutate.Equivalent(path, "f", "y", "y!", "the same either way")
    only_here = mutate.Equivalent(path, "f", "y", "y!", "here only", context="above")
    stale = mutate.Equivalent(path, "f", "gone", "gone!", "the line is gone")
    other_module = mutate.Equivalent("src/shuttle/wire/frames.py", "f", "x", "x!", "elsewhere")
    report = mutate.score(path, mutants[:6], [accepted, stale, other_module], ["tests/t.py"])
    assert report.caught == 2 and report.equivalent == 1
    assert [m.name for m in report.survivors] == ["m3", "m5"]  # no tests is not caught
    assert [m.name for m in report.other] == ["m6"]
    assert report.accepted[0].reason == "the same either way"
    assert report.score == pytest.approx(2 / 4)  # caught / (judged - equivalent)
    assert report.raw_score == pytest.approx(2 / 5)
    # An entry with a context accepts only the change under that line.
    narrow = mutate.score(path, mutants[6:], [only_here], ["tests/t.py"])
    assert [m.name for m in narrow.accepted] == ["m7"]
    assert [m.name for m in narrow.survivors] == ["m8"]
    assert [e["before"] for e in report.stale_equivalents] == ["gone"]
    text = mutate.markdown(report)
    assert "score **50.0 %**" in text and "Stale entries" in text


def test_equivalents_without_a_reason_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "equivalent.toml"
    bad.write_text(
        '[[equivalent]]\nmodule = "m"\nfunction = "f"\nbefore = "a"\nafter = "b"\nreason = " "\n'
    )
    with pytest.raises(mutate.ToolError, match="a reason"):
        mutate.load_equivalents(bad)


def test_modules_are_named_by_path_or_dotted_name() -> None:
    assert mutate.module_path("shuttle.store.journal") == "src/shuttle/store/journal.py"
    assert mutate.slug("src/shuttle/objects/fs/dirblocks.py") == "objects.fs.dirblocks"
    with pytest.raises(mutate.ToolError, match="not a module under src/shuttle"):
        mutate.module_path("src/shuttle/no_such_module.py")


def test_a_modules_set_up_time_goes_into_its_timeout(tmp_path: Path) -> None:
    listed = tmp_path / "modules.toml"
    listed.write_text(
        '["src/a.py"]\ntests = ["t"]\nsetup_s = 30\n\n["src/b.py"]\ntests = ["t"]\n'
        '\n["src/c.py"]\ntests = ["t"]\nsetup_s = "long"\n'
    )
    assert mutate.load_setup_seconds("src/a.py", listed) == 30.0
    assert mutate.load_setup_seconds("src/b.py", listed) == 1.0  # mutmut's own
    assert mutate.load_setup_seconds("src/unlisted.py", listed) == 1.0
    with pytest.raises(mutate.ToolError, match=r'\["src/c.py"\] setup_s must be a number'):
        mutate.load_setup_seconds("src/c.py", listed)
    assert "timeout_constant = 30.0\n" in mutate.mutmut_config("src/a.py", ["t"], 30.0)
    assert mutate.load_setup_seconds("src/shuttle/node/principal_store.py") >= 10
