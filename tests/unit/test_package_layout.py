"""Each package's ``__init__`` opens with a layout comment (STYLE.md): it names every
module the package has, and no module it does not have."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import shuttle

SRC = Path(shuttle.__file__).parent
PACKAGES = sorted(p.parent for p in SRC.rglob("__init__.py"))
#: A module named in a bullet: ``* ``name``  what it is`` (``shuttle.name`` at the top).
BULLET = re.compile(r"^\s*\* ``(?:shuttle\.)?([\w.]+)``", re.MULTILINE)


def _members(package: Path) -> set[str]:
    modules = {p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    subpackages = {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    return modules | subpackages


def _docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(SRC.parent)))
def test_layout_comment_matches_the_modules(package: Path) -> None:
    doc = _docstring(package)
    assert "Layout" in doc, f"{package}/__init__.py has no layout comment"
    members = _members(package)
    listed = set(BULLET.findall(doc))
    assert listed - members == set(), "the layout lists modules that do not exist"
    unnamed = {m for m in members if f"``{m}``" not in doc and f"``shuttle.{m}``" not in doc}
    assert unnamed == set(), "the layout does not name these modules"
