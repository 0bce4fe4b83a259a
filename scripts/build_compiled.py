#!/usr/bin/env python3
"""Compile Shuttle's hot modules with mypyc (the list: ``shuttle.compiled.MODULES``)
and build its C extensions (``shuttle.compiled.C_EXTENSIONS``) with them.

    .venv/bin/python scripts/build_compiled.py           build if a source changed
    .venv/bin/python scripts/build_compiled.py --force   build anyway
    .venv/bin/python scripts/build_compiled.py --check   exit 1 unless built and current
    .venv/bin/python scripts/build_compiled.py --clean   remove the compiled modules

The extensions land beside their ``.py`` files (``src/shuttle/wire/frames.*.so``) with
one shared library (``src/shuttle/native__mypyc.*.so``) and a manifest
(``src/shuttle/compiled.json``) holding a hash of every compiled source; Shuttle
imports the pure Python modules while the manifest does not match the sources (see
``src/shuttle/compiled.py``). All of these are git-ignored. Needs mypy (mypyc ships
with it), setuptools, a C compiler and Python's headers; scripts/setup.sh installs them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _load_compiled() -> ModuleType:
    """``shuttle.compiled`` by path: this script must not depend on how (or whether)
    the package is installed."""
    path = ROOT / "src" / "shuttle" / "compiled.py"
    spec = importlib.util.spec_from_file_location("_shuttle_compiled", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


compiled = _load_compiled()


def _artefacts() -> list[Path]:
    """Every file a build leaves in the source tree."""
    found: list[Path] = [compiled.MANIFEST] if compiled.MANIFEST.exists() else []
    for module in (*compiled.BUILT, compiled.GROUP + "__mypyc"):
        found += compiled.extension_paths(module)
    # Modules dropped from MODULES since the last build leave extensions behind too.
    # (An interrupted build leaves extensions without a manifest: nothing more to find.)
    manifest = compiled.MANIFEST.exists()
    old = json.loads(compiled.MANIFEST.read_text()).get("modules", {}) if manifest else {}
    for module in old:
        found += compiled.extension_paths(module)
    return sorted(set(found))


def clean() -> None:
    for path in _artefacts():
        path.unlink()
        print(f"build_compiled: removed {path.relative_to(ROOT)}")


def build() -> None:
    """Compile :data:`MODULES` into the source tree, then write the manifest."""
    from mypyc.build import mypycify  # imported here: --check and --clean need no mypy
    from setuptools import Extension, setup  # type: ignore[import-untyped]

    clean()
    src = compiled.SRC
    digests = compiled.source_digests()
    paths = [str(compiled.source_path(m).relative_to(src)) for m in compiled.MODULES]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="shuttle-mypyc-") as tmp:
        cwd = os.getcwd()
        os.chdir(src)  # module names come from the paths below src/
        try:
            extensions = mypycify(
                [
                    # The code is checked by the project's strict mypy run; here mypy
                    # only needs the types. The runtime setup has no msgpack stubs.
                    "--ignore-missing-imports",
                    "--cache-dir",
                    str(Path(tmp) / "mypy"),
                    "--python-version",
                    f"{sys.version_info.major}.{sys.version_info.minor}",
                    *paths,
                ],
                opt_level="3",
                group_name=compiled.GROUP,
                target_dir=str(Path(tmp) / "c"),
            )
            handwritten = [
                Extension(
                    module,
                    [str(compiled.source_path(module).relative_to(src))],
                    extra_compile_args=["-O2", "-Wall", "-Werror"],
                )
                for module in compiled.C_EXTENSIONS
            ]
            setup(
                name="shuttle-compiled",
                ext_modules=extensions + handwritten,
                script_args=[
                    "-q",
                    "build_ext",
                    "--inplace",
                    "--build-temp",
                    str(Path(tmp) / "o"),
                    "--build-lib",
                    str(Path(tmp) / "lib"),
                ],
            )
        finally:
            os.chdir(cwd)
    # Sources edited while compiling would make the build stale: record what was read.
    if compiled.source_digests() != digests:
        clean()
        sys.exit("build_compiled: a source changed during the build; run it again")
    compiled.MANIFEST.write_text(
        json.dumps({"tag": compiled.build_tag(), "modules": digests}, indent=2) + "\n"
    )
    took = time.monotonic() - started
    print(f"build_compiled: compiled {', '.join(compiled.BUILT)} in {took:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="build even if current")
    parser.add_argument("--check", action="store_true", help="exit 1 unless built and current")
    parser.add_argument("--clean", action="store_true", help="remove the compiled modules")
    args = parser.parse_args()
    if args.clean:
        clean()
        return 0
    status = compiled.check()
    if args.check:
        print(f"build_compiled: {status.reason}")
        return 0 if status.compiled else 1
    if status.compiled and not args.force:
        print("build_compiled: up to date")
        return 0
    if shutil.which(os.environ.get("CC", "cc")) is None:
        sys.exit("build_compiled: no C compiler (cc); install gcc (scripts/setup.sh does)")
    build()
    status = compiled.check()
    if not status.compiled:
        sys.exit(f"build_compiled: the build did not take: {status.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
