"""The releases ``bench lookaside`` builds from: sdists fetched with ``pip download``
and kept between runs, a generated project for the smoke test, the build's source
files and the subset of them moved at slow links, and what rsync finds unchanged
between two releases (the yardstick for what a lookaside store supplies).
:mod:`shuttle.bench.lookaside` runs the experiment on them."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from shuttle.errors import ExternalToolError

#: The default project and releases: Django's 5.0 series and the feature releases
#: before it. The first is the current release (in Shuttle); the rest are stores one,
#: two, three, four releases back (as the paper's 2.4.17, 2.4.13, 2.4.9, 2.4.0).
PROJECT_DEFAULT = "django"
RELEASES_DEFAULT = ("5.0.4", "5.0.3", "5.0", "4.2", "4.1")

#: Where downloaded sdists and their extracted trees are kept between runs (the
#: defaults take about 60 MB; sympy's and sqlalchemy's releases 475 MB): ``--cache-dir``
#: or ``$SHUTTLE_BENCH_CACHE`` moves it, ``--cache-dir ''`` keeps it in the run's scratch
#: directory (removed at the end).
CACHE_ENV = "SHUTTLE_BENCH_CACHE"
CACHE_DIR_DEFAULT = Path.home() / ".cache" / "shuttle" / "bench-lookaside"


def cache_dir_default() -> Path:
    """``$SHUTTLE_BENCH_CACHE`` if set, else :data:`CACHE_DIR_DEFAULT`."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else CACHE_DIR_DEFAULT


#: Where ``--subdir auto`` looks for the project's package, in order: the flat layout
#: (django/), then the lib/ and src/ layouts (sqlalchemy's lib/sqlalchemy/).
PACKAGE_PARENTS = ("", "lib", "src")
#: What the build reads.
SOURCE_SUFFIX = ".py"


def fetch_release(project: str, version: str, cache_dir: Path = CACHE_DIR_DEFAULT) -> Path:
    """The extracted sdist of ``project`` ``version`` (downloaded with ``pip download``
    the first time, then kept under ``cache_dir``)."""
    base = cache_dir / project.lower()
    tree = base / "src" / version
    if (tree / ".complete").exists():
        return tree
    sdists = base / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    archive = _find_sdist(sdists, project, version)
    if archive is None:
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        argv += ["--quiet", f"{project}=={version}", "-d", str(sdists)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        archive = _find_sdist(sdists, project, version)
        if done.returncode != 0 or archive is None:
            raise ExternalToolError(
                f"pip download of {project}=={version} failed: "
                f"{(done.stderr or done.stdout).strip()[-800:]}. Check the project name and "
                "version (`pip index versions PROJECT` lists them) and that the package "
                "index is reachable."
            )
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    _extract(archive, tree)
    (tree / ".complete").write_text(archive.name)
    return tree


def _find_sdist(sdists: Path, project: str, version: str) -> Path | None:
    want = {project.lower(), project.lower().replace("-", "_"), project.lower().replace("_", "-")}
    for path in sorted(sdists.iterdir()):
        name = path.name.lower()
        for suffix in (".tar.gz", ".tgz", ".tar.bz2", ".zip"):
            if name.endswith(suffix):
                stem = name[: -len(suffix)]
                if any(stem == f"{p}-{version}" for p in want):
                    return path
    return None


def _extract(archive: Path, dest: Path) -> None:
    """Extract ``archive`` into ``dest``, without the sdist's single top directory."""
    staging = dest / ".extract"
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(staging)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(staging, filter="data")
    tops = list(staging.iterdir())
    top = tops[0] if len(tops) == 1 and tops[0].is_dir() else staging
    for item in top.iterdir():
        item.rename(dest / item.name)
    shutil.rmtree(staging)


def make_tiny_releases(dest: Path, count: int = 3, files: int = 24, seed: int = 7) -> list[Path]:
    """A generated project of ``files`` Python modules in ``count`` releases (newest
    first), each older one with a fifth of the files changed: the smoke test's
    project, no download needed."""
    rng = random.Random(seed)
    bodies = {
        f"tiny/pkg{i % 4}/mod{i}.py": "\n".join(
            f"def f{i}_{j}(x):\n    return x * {rng.randint(1, 10**6)} + {j}\n" for j in range(60)
        )
        for i in range(files)
    }
    roots = []
    for r in range(count):
        root = dest / f"tiny-{count - r}"
        for rel, body in bodies.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
        roots.append(root)
        for rel in rng.sample(sorted(bodies), max(1, files // 5)):  # the release before
            bodies[rel] = bodies[rel].replace("+ 1\n", f"+ {rng.randint(2, 99)}\n")
    return roots


@dataclass(frozen=True)
class SourceFile:
    rel: str
    size: int


def find_package(root: Path, project: str) -> str:
    """The directory ``--subdir auto`` builds: the project's package in the flat, lib/ or
    src/ layout (its import name is the project's, lower case, ``-`` as ``_``); else the
    one package under lib/ or src/ (a project whose import name differs); else ``""``
    (every ``.py`` file of the release)."""
    name = project.lower().replace("-", "_")
    for parent in PACKAGE_PARENTS:
        candidate = Path(parent, name)
        if (root / candidate / "__init__.py").is_file():
            return candidate.as_posix()
    for parent in PACKAGE_PARENTS[1:]:
        packages = sorted(
            p for p in (root / parent).glob("*/__init__.py") if p.parent.name != "tests"
        )
        if len(packages) == 1:
            return packages[0].parent.relative_to(root).as_posix()
    return ""


def source_files(root: Path, under: str = "") -> list[SourceFile]:
    """The build's input: every ``.py`` file under ``root / under``, sorted by path
    (relative to ``root``)."""
    out = [
        SourceFile(p.relative_to(root).as_posix(), p.stat().st_size)
        for p in (root / under).rglob(f"*{SOURCE_SUFFIX}")
        if p.is_file() and not p.is_symlink()
    ]
    return sorted(out, key=lambda f: f.rel)


def choose_subset(files: Sequence[SourceFile], budget_bytes: float) -> list[SourceFile]:
    """The files in path order up to ``budget_bytes`` (whole packages, as the order
    keeps each directory's files together): the same subset for every store at one
    bandwidth. All of them if they fit."""
    out: list[SourceFile] = []
    total = 0
    for f in files:
        if total + f.size > budget_bytes and out:
            break
        out.append(f)
        total += f.size
    return out


def rsync_unchanged(
    current: Path, older: Path, files: Sequence[SourceFile], scratch: Path
) -> dict[str, int] | None:
    """What ``rsync --stats`` finds unchanged in ``files`` of the current release when the
    destination holds the older release's files of the same names: its *matched* bytes
    (found in the old file, rsync's rolling blocks of about the square root of the
    file's size) and *literal* bytes (sent). rsync matches within a file of the same
    name only; lookaside matches a chunk wherever the store holds it. None without
    rsync."""
    if shutil.which("rsync") is None:
        return None
    dest = scratch / "rsync-dest"
    shutil.rmtree(dest, ignore_errors=True)
    for f in files:
        old = older / f.rel
        if old.is_file():
            (dest / f.rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(old, dest / f.rel)
    dest.mkdir(parents=True, exist_ok=True)
    listing = scratch / "rsync-files"
    listing.write_text("".join(f"{f.rel}\n" for f in files))
    argv = ["rsync", "-r", "--ignore-times", "--no-whole-file", "--stats"]
    argv += [f"--files-from={listing}", f"{current}/", f"{dest}/"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    stats = {}
    for name in ("Matched data", "Literal data"):
        line = next(x for x in done.stdout.splitlines() if x.startswith(name))
        stats[name.split()[0].lower()] = int(line.split(":")[1].split()[0].replace(",", ""))
    return stats
