"""The packages are layered, and imports only look down (docs/architecture.md, "Layers").

Every ``import shuttle.x`` and ``from shuttle.x import ...`` in src/shuttle, at module
level or inside a function, counts: a lazy import is a dependency all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shuttle

SRC = Path(shuttle.__file__).parent

#: Bottom to top. A package may import packages of lower layers only: not its own
#: layer's siblings, not anything above. Keep in step with docs/architecture.md.
LAYERS: list[tuple[str, ...]] = [
    # ``compiled`` imports nothing of Shuttle's: the package's __init__ runs it first.
    ("errors", "compiled"),
    ("wire", "blockcache", "cdc", "rendezvous", "traces"),
    ("net", "sim"),
    ("cluster",),
    # Side by side: the client does not reach into the node's store, nor it into the client.
    ("client", "store"),
    ("runtime",),
    ("objects",),
    ("node",),
    ("apps", "bench", "faces"),
    ("demo", "testing", "__init__"),
    ("cli",),
    ("__main__",),
]
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}


def _unit(path: Path) -> str:
    """The package (or top-level module) a source file belongs to."""
    rel = path.relative_to(SRC)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported unit) for every import of shuttle code in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    package = list(path.relative_to(SRC).parent.parts)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = package[: len(package) - node.level + 1]
                names = [".".join(["shuttle", *base, *([node.module] if node.module else [])])]
            elif node.module:
                names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] != "shuttle":
                continue
            out.append((node.lineno, parts[1] if len(parts) > 1 else "__init__"))
    return out


def _violations() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        unit = _unit(path)
        for line, target in _imports(path):
            if target == unit:
                continue
            if target not in RANK:
                found.append(f"{path.relative_to(SRC)}:{line} imports {target!r}: not in LAYERS")
            elif RANK[target] >= RANK[unit]:
                found.append(
                    f"{path.relative_to(SRC)}:{line}: {unit} (layer {RANK[unit]}) imports "
                    f"{target} (layer {RANK[target]}); imports must look down"
                )
    return found


def test_every_package_has_a_layer() -> None:
    units = {_unit(p) for p in SRC.rglob("*.py")}
    assert units - set(RANK) == set(), "add the new package to LAYERS and the docs"
    assert set(RANK) - units == set(), "LAYERS names a package that no longer exists"


def test_imports_only_look_down() -> None:
    assert _violations() == []


def test_the_check_sees_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a store module importing the client is reported, even
    lazily inside a function; relative imports are resolved; downward ones pass."""
    (tmp_path / "store").mkdir()
    (tmp_path / "client").mkdir()
    (tmp_path / "store" / "bad.py").write_text(
        "def f():\n    from shuttle.client.model import ObjectInfo\n    return ObjectInfo\n"
    )
    (tmp_path / "store" / "worse.py").write_text("from ..node import config\n")
    (tmp_path / "client" / "good.py").write_text("from shuttle.blockcache import BlockCache\n")
    monkeypatch.setattr(f"{__name__}.SRC", tmp_path)
    assert _violations() == [
        "store/bad.py:2: store (layer 4) imports client (layer 4); imports must look down",
        "store/worse.py:1: store (layer 4) imports node (layer 7); imports must look down",
    ]
