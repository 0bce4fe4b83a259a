"""The docs name files and modules that exist: every relative link in docs/*.md,
README.md and benchmarks/README.md, every path in an inline code span of docs/*.md and
README.md (``src/...``, ``tests/...``, ``benchmarks/...``, ``scripts/...``, ``docs/...``),
every such file named in running text (and ``shuttle/x.py``, under src/) and every
``shuttle.x.y`` module named so. Modules are split and renamed often; a page
that sends a reader to a file that is gone is the first thing a new user trips on.

Paths and module names are checked against the tree, without importing anything, so
the check is cheap and deterministic. A code span with a placeholder (``$t``,
``[-nopin]``, ``{a,b}``, ``*``, ``<name>``, ``src/...``) is a pattern, not a path, and is skipped;
fenced code blocks are skipped too (their ``docs/x`` are object keys, not files).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted(ROOT.glob("docs/*.md")), ROOT / "README.md"]
LINKED = [*PAGES, ROOT / "benchmarks" / "README.md"]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"(?:src|tests|benchmarks|scripts|docs)/[\w./-]*")
#: A file named in running text: (docs/security.md), tests/integration/nodeproc.py.
_NAMED_FILE = re.compile(
    r"(?<![\w/.~-])((?:src|tests|benchmarks|scripts|docs|shuttle)/[\w./-]*"
    r"\.(?:md|py|c|h|toml|sh|json|png|csv|gz))\b"
)
_MODULE = re.compile(r"shuttle(?:\.[a-z_][a-z0-9_]*)+")
_PLACEHOLDER = re.compile(r"[$*{}\[\]<>…]|\.\.\.")
#: Names spelled like modules that are not: why each is named in the docs.
NOT_MODULES = {"shuttle.attrs": "the xattr of an object's attribute record (storage-format.md)"}


def _prose(page: Path) -> str:
    return _FENCE.sub("", page.read_text())


def _links(page: Path) -> list[str]:
    return [
        m.group(1).split("#")[0]
        for m in _LINK.finditer(_prose(page))
        if not re.match(r"[a-z]+:", m.group(1)) and not m.group(1).startswith("#")
    ]


def _spans(page: Path) -> list[str]:
    return [m.group(1).strip() for m in _SPAN.finditer(_prose(page))]


def _named_files(page: Path) -> list[str]:
    """Files named in running text and in code spans of one word; a span with spaces is
    a command, whose ``docs/x.md`` is an object key."""
    text = _SPAN.sub(lambda m: "" if " " in m.group(1) else m.group(1), _prose(page))
    # ``shuttle/net/netns.py`` is the package's file, under src/.
    return [re.sub(r"^shuttle/", "src/shuttle/", m.group(1)) for m in _NAMED_FILE.finditer(text)]


def _names_nothing(span: str) -> bool:
    """``span`` is a path or a module name that does not exist."""
    if _PATH.fullmatch(span):
        return not (ROOT / span.rstrip("/")).exists()
    if _MODULE.fullmatch(span):
        return span not in NOT_MODULES and not _module_exists(span)
    return False


def _module_exists(name: str) -> bool:
    """``shuttle.a.b`` is a module, a package, or an attribute defined in one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT / "src" / Path(*parts[:cut])
        source = next(
            (p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None
        )
        if source is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        # An attribute (a class, a function, a constant; deeper, the class's method):
        # its first part must be defined in the module.
        # A re-export counts (``shuttle.connect`` is ``shuttle.client``'s).
        name = re.escape(rest[0])
        defined = re.compile(
            rf"^(?:class |def |async def )?{name}\b|import [^\n]*\b{name}\b|^\s+{name},?$", re.M
        )
        return bool(defined.search(source.read_text()))
    return False


@pytest.mark.parametrize("page", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(page: Path) -> None:
    missing = [t for t in _links(page) if t and not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_and_modules_named_exist(page: Path) -> None:
    missing = {s for s in _spans(page) if not _PLACEHOLDER.search(s) and _names_nothing(s)}
    missing |= {f for f in _named_files(page) if not (ROOT / f).exists()}
    assert not missing, f"{page.relative_to(ROOT)} names what does not exist: {sorted(missing)}"


def test_the_check_sees_a_missing_file_and_a_missing_module(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "See [gone](gone.md), `src/shuttle/nothing_here.py` and `shuttle.no_such.module`.\n"
        "Read more in docs/gone.md, not `shuttle cat docs/key.md`; see shuttle/gone.py.\n"
        "```sh\nshuttle put README.md docs/x   # a key, not a file\n```\n"
    )
    assert _links(page) == ["gone.md"]
    spans = _spans(page)
    assert spans[:2] == ["src/shuttle/nothing_here.py", "shuttle.no_such.module"]
    assert not (ROOT / spans[0]).exists() and not _module_exists(spans[1])
    assert _named_files(page) == [
        "src/shuttle/nothing_here.py",
        "docs/gone.md",
        "src/shuttle/gone.py",
    ]
    assert _module_exists("shuttle.client.namespace")
    assert _module_exists("shuttle.client.namespace.Namespace")
    assert _module_exists("shuttle.connect")  # re-exported by the package
    assert not _module_exists("shuttle.client.namespace.Nothing")
