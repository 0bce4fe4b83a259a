"""Which hot modules run compiled (mypyc), and the fallback to their pure Python.

The modules in :data:`MODULES` are compiled ahead of time by
``scripts/build_compiled.py`` (``scripts/setup.sh`` runs it) into extension modules
that sit beside their ``.py`` files, plus one shared library
(``shuttle/native__mypyc*.so``) holding their code. Python's import prefers an
extension module to a source file of the same name, so a built checkout imports the
compiled code; the ``.py`` files stay the reference and the fallback.

The build writes :data:`MANIFEST` with a hash of every compiled module's source.
When Shuttle starts (:func:`install`, from ``shuttle/__init__.py``) the pure modules
are imported instead of the compiled ones, all or none, when:

* ``SHUTTLE_PURE=1`` is set (to compare, or to rule the compiled code out), or
* nothing is built (no manifest, or a module's extension is missing), or
* the build is stale: a source changed since it was compiled (a warning says so;
  ``scripts/setup.sh`` rebuilds). Compiled code is never run against sources it was
  not built from.

All or none, because the compiled modules call each other's native code directly: a
compiled connection must not meet a pure reader.

This module imports nothing of Shuttle's and is never compiled itself.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: The modules compiled by mypyc, as one group (one shared library). Keep the list
#: in step with docs/architecture.md ("Compiled hot modules").
MODULES: tuple[str, ...] = (
    "shuttle.wire.frames",
    "shuttle.wire.connection",
    "shuttle.wire.call_checks",
    "shuttle.wire.handshake",
    "shuttle.wire.events",
    "shuttle.wire.states",
    "shuttle.wire.limits",
    # The node's connection, one concept a module (net/node_protocol.py says which).
    "shuttle.net.node_protocol",
    "shuttle.net.node_handshake",
    "shuttle.net.node_dispatch",
    "shuttle.net.node_tls_edge",
    "shuttle.net.node_closing",
    "shuttle.net.server_stats",
    # The blocking client: its calls and fast lane, and the stream of bytes under them
    # (a compiled class extends only compiled classes).
    "shuttle.net.blocking",
    "shuttle.net.blocking_stream",
    # TLS at both edges (the node's protocol and the blocking client call it for every
    # request on a TLS connection).
    "shuttle.net.tls",
    "shuttle.store.rados_miss",  # a RADOS gateway's reads on its loop: hits and misses
    "shuttle.store.rados_read",  # the trusted-entry check and the version bookkeeping
    "shuttle.store.rados_admission",  # which misses are read whole into the cache
    "shuttle.store.rados_aio",  # starting a miss's librados read, and draining its answer
    # The node's warm read below the protocol: the lock-free cache-hit read itself,
    # what it shares with the miss read (the store's view), the block cache, the
    # store's counters, its key locks (whose generation the read checks) and the
    # attribute record it reads the size and version of (a native class: two field
    # loads, not two generic attribute look-ups).
    "shuttle.blockcache",
    "shuttle.store.stats",
    "shuttle.store.locks",
    "shuttle.store.attrs",
    "shuttle.store.loopreads",
    "shuttle.store.fastread",
    # The node's block-cache miss that the page cache holds, below the protocol too: the
    # read itself, the RWF_NOWAIT read it calls and the open files it borrows from.
    "shuttle.store.missread",
    "shuttle.store.nowait",
    "shuttle.store.openfiles",
    # A client's read of a RADOS object its node named (issue 26, item 2): the
    # remembered key's look-up, the librados read and the version check.
    "shuttle.client.rados_direct",
)

#: Extension modules written in C, built with the mypyc group and used with it, all or
#: none: ``shuttle.wire._readlane`` (the read lane, ``shuttle/wire/readlane.py``),
#: ``shuttle.store._nowait`` (a page-cache read into a new bytes object,
#: ``shuttle/store/nowait.py``) and ``shuttle.store._aiodone`` (librados completions
#: through an eventfd, without the GIL: ``shuttle/store/rados_aio.py``).
C_EXTENSIONS: tuple[str, ...] = (
    "shuttle.wire._readlane",
    "shuttle.store._nowait",
    "shuttle.store._aiodone",
)

#: Everything the build makes and the manifest records.
BUILT: tuple[str, ...] = MODULES + C_EXTENSIONS

#: The shared library's module (mypyc's group name plus ``__mypyc``).
GROUP = "shuttle.native"

#: The environment variable that forces the pure Python modules.
PURE_ENV = "SHUTTLE_PURE"

#: Where the build records what it compiled: ``src/shuttle/compiled.json``.
SRC = Path(__file__).resolve().parent.parent
MANIFEST = SRC / "shuttle" / "compiled.json"


def source_path(module: str) -> Path:
    """The source of a module in :data:`BUILT`: its ``.py`` file, or ``.c`` for a C one."""
    return SRC.joinpath(*module.split(".")).with_suffix(".c" if module in C_EXTENSIONS else ".py")


def extension_paths(module: str) -> list[Path]:
    """The built extension files of ``module`` (any ABI suffix): usually one, or none."""
    base = SRC.joinpath(*module.split("."))
    return sorted(
        base.parent / (base.name + suffix)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if (base.parent / (base.name + suffix)).is_file()
    )


def source_digests(modules: Sequence[str] = BUILT) -> dict[str, str]:
    """sha256 of each module's source, as the build records them."""
    return {m: hashlib.sha256(source_path(m).read_bytes()).hexdigest() for m in modules}


def build_tag() -> str:
    """The interpreter the extensions must be built for (its ABI)."""
    return f"{sys.implementation.cache_tag}-{sys.platform}"


@dataclass(frozen=True, slots=True)
class Status:
    """What :func:`install` decided: ``compiled`` True when the extensions are used;
    ``reason`` says why not (or that they are)."""

    compiled: bool
    reason: str
    stale: tuple[str, ...] = ()


def check() -> Status:
    """Whether the compiled modules are there and current (ignores ``SHUTTLE_PURE``)."""
    if not MANIFEST.is_file():
        return Status(False, "not built (run scripts/setup.sh or scripts/build_compiled.py)")
    try:
        manifest = json.loads(MANIFEST.read_text())
        built: dict[str, str] = dict(manifest["modules"])
        tag = str(manifest["tag"])
    except (ValueError, KeyError, TypeError) as exc:
        return Status(False, f"unreadable build manifest {MANIFEST} ({exc}); rebuild")
    if tag != build_tag():
        return Status(False, f"built for {tag}, this interpreter is {build_tag()}; rebuild")
    missing = [m for m in (*BUILT, GROUP + "__mypyc") if not extension_paths(m)]
    if set(built) != set(BUILT) or missing:
        return Status(False, f"the build does not hold every module ({missing or 'list'}); rebuild")
    now = source_digests()
    stale = tuple(m for m in BUILT if now[m] != built[m])
    if stale:
        return Status(
            False,
            f"stale: {', '.join(stale)} changed since it was compiled; "
            "run scripts/setup.sh (or scripts/build_compiled.py) to rebuild",
            stale,
        )
    return Status(True, "compiled (mypyc)")


class _PureFinder(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` source of the compiled modules, ahead of their extensions."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


_status: Status | None = None


def install() -> Status:
    """Decide once per process between the compiled and the pure modules (before any
    of them is imported); returns the decision. A stale build warns."""
    global _status
    if _status is not None:
        return _status
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        status = Status(False, f"pure Python ({PURE_ENV} is set)")
    else:
        status = check()
        if status.stale:
            warnings.warn(
                f"Shuttle's compiled modules are {status.reason}; using the pure Python "
                "modules meanwhile",
                RuntimeWarning,
                stacklevel=2,
            )
    if not status.compiled and not any(isinstance(f, _PureFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _PureFinder())
    _status = status
    return status


def active() -> Status:
    """The decision :func:`install` made for this process."""
    return install()


def is_compiled(module: ModuleType) -> bool:
    """Whether an imported module is the compiled one (an extension module)."""
    origin = getattr(module, "__file__", None) or ""
    return origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
