"""The mobile application: a recorded run of the real ``tre-agrep`` over the Python stdlib.

The paper (section 3.1) drives its simulator with a trace of ``agrep`` searching a
kernel source tree of 1,400 files / 23 MB. Ours is ``tre-agrep`` (Debian package
``tre-agrep``) searching the ``.py`` files of the Python standard library
(``sysconfig``'s ``stdlib`` path, without ``site-packages``): about 1,800 files and
31 MB here.

How the trace is made (:func:`record_agrep`):

1. **The I/O sequence and sizes** come from one run under ``strace -f -tt -T``:
   every open, read and close of a file in the tree, in order, with offsets and the
   bytes each read returned. Files are named relative to the tree.
2. **The think time** comes from runs *without* strace (strace inflates time): the
   CPU time ``wait4`` reports for the whole search, minus the CPU time of the same
   command on an empty input (start-up), divided by the bytes read, gives
   ``cpu_s_per_byte``. The minimum over several runs is used (least disturbed).
3. **The timeline** is rebuilt as if every I/O took no time: the first record is at
   0 s and the gap after each record is the CPU time spent on the bytes it
   returned (``size × cpu_s_per_byte`` after a read, 0 after an open or close).

This is the contract for the simulator: the trace is *dependent* — issue record
``i + 1`` when record ``i`` completes plus the gap ``time[i+1] - time[i]`` scaled by
the speed of the CPU it runs on. The gaps were measured on the machine named in the
sidecar JSON (``host``), which also records the command, the pattern, the counts and
every measured run, so the trace can be regenerated (``shuttle trace record-agrep``)
and compared.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shuttle.errors import ExternalToolError, UsageError
from shuttle.traces import io
from shuttle.traces.formats import read_trace
from shuttle.traces.record import Op, TraceRecord
from shuttle.traces.recorder import record_strace, require_tool, run_measured
from shuttle.traces.strace import StraceReader
from shuttle.traces.summary import summarize

#: Where the committed trace and its sidecar live (repository-relative).
DATA_DIR = Path(__file__).resolve().parents[3] / "data" / "traces"
AGREP_TRACE = DATA_DIR / "agrep-stdlib.csv.gz"

#: What the search looks for: a phrase from the paper's own field, matched with one
#: error (insertion, deletion or substitution), so the approximate matcher does real
#: work as agrep did; ``-c`` prints one count per file, keeping output negligible.
DEFAULT_PATTERN = "file server"
DEFAULT_ERRORS = 1
#: Untraced runs measured; the minimum CPU time is kept (the least disturbed run).
DEFAULT_RUNS = 5
#: Directories of the stdlib tree that are not the standard library itself.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def sidecar_path(trace: Path) -> Path:
    """The JSON sidecar of a trace: ``x.csv.gz`` → ``x.json``."""
    name = trace.name
    for suffix in (".csv.gz", ".csv"):
        if name.endswith(suffix):
            return trace.with_name(name[: -len(suffix)] + ".json")
    return trace.with_name(name + ".json")


def stdlib_tree() -> Path:
    """The Python standard library's source directory (``sysconfig`` ``stdlib``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def tree_files(root: Path) -> list[str]:
    """Every ``.py`` file under ``root`` (relative, sorted), skipping installed packages."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        rel = os.path.relpath(dirpath, root)
        for name in sorted(filenames):
            if name.endswith(".py"):
                found.append(name if rel == "." else f"{rel}/{name}")
    return found


def agrep_command(pattern: str, errors: int, files: list[str]) -> list[str]:
    """The tre-agrep command line for a search of ``files``."""
    return ["tre-agrep", f"-{errors}", "-c", "-e", pattern, *files]


def retime(records: list[TraceRecord], cpu_s_per_byte: float) -> list[TraceRecord]:
    """The zero-I/O-time timeline: first record at 0, gap = CPU time of its bytes.

    Only reads carry work for agrep (it scans what it read); other records are
    followed by no think time.
    """
    out: list[TraceRecord] = []
    t = 0.0
    for r in records:
        out.append(TraceRecord(round(t, 9), r.client, r.op, r.file, r.offset, r.size))
        if r.op is Op.READ:
            t += r.size * cpu_s_per_byte
    return out


def record_agrep(
    out: Path = AGREP_TRACE,
    *,
    tree: Path | None = None,
    pattern: str = DEFAULT_PATTERN,
    errors: int = DEFAULT_ERRORS,
    runs: int = DEFAULT_RUNS,
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Record tre-agrep over ``tree`` (default: the stdlib) to ``out`` and its sidecar.

    Returns the sidecar's contents. Raises :class:`ExternalToolError` if strace or
    tre-agrep is missing or fails, :class:`UsageError` for a bad tree or run count.
    """
    require_tool("tre-agrep")
    require_tool("strace")
    if runs < 1:
        raise UsageError(f"runs must be at least 1, got {runs}")
    root = (tree or stdlib_tree()).resolve()
    files = tree_files(root)
    if not files:
        raise UsageError(f"no .py files under {root}; pass a source tree with --tree")
    total_bytes = sum((root / f).stat().st_size for f in files)
    command = agrep_command(pattern, errors, files)

    progress(f"tracing tre-agrep over {len(files):,} files under strace")
    with tempfile.TemporaryDirectory(prefix="shuttle-agrep-") as tmp:
        log = Path(tmp) / "strace.log"
        record_strace(command, log, cwd=root)
        prefix = str(root) + "/"
        reader = StraceReader(cwd=str(root), include=lambda p: p.startswith(prefix))
        traced = [
            TraceRecord(r.time, r.client, r.op, r.file[len(prefix) :], r.offset, r.size)
            for r in read_trace(log, reader=reader)
        ]
    read_bytes = sum(r.size for r in traced if r.op is Op.READ)
    if read_bytes != total_bytes:
        raise ExternalToolError(
            f"the strace trace holds {read_bytes:,} bytes read but the tree has "
            f"{total_bytes:,}; did tre-agrep skip files or the tree change meanwhile?"
        )

    progress(f"measuring CPU time of {runs} untraced runs")
    searches = [run_measured(command, cwd=root) for _ in range(runs)]
    empties = [run_measured(agrep_command(pattern, errors, ["/dev/null"])) for _ in range(runs)]
    search_cpu_s = min(m.cpu_s for m in searches)
    startup_cpu_s = min(m.cpu_s for m in empties)
    cpu_s_per_byte = max(search_cpu_s - startup_cpu_s, 0.0) / read_bytes

    records = retime(traced, cpu_s_per_byte)
    out.parent.mkdir(parents=True, exist_ok=True)
    io.write_csv(out, records)
    summary = summarize(records)
    meta: dict[str, Any] = {
        "trace": out.name,
        "what": "tre-agrep searching the .py files of the Python standard library",
        "timeline": "zero I/O time: gap after a read = size x cpu_s_per_byte, else 0",
        "command": ["tre-agrep", f"-{errors}", "-c", "-e", pattern, "<files>"],
        "pattern": pattern,
        "errors": errors,
        "tree": f"python{sysconfig.get_python_version()} stdlib",
        "tree_files": len(files),
        "tree_bytes": total_bytes,
        "cpu_s_per_byte": cpu_s_per_byte,
        "search_cpu_s": search_cpu_s,
        "startup_cpu_s": startup_cpu_s,
        "think_s_total": records[-1].time if records else 0.0,
        "runs": {
            "search_cpu_s": [m.cpu_s for m in searches],
            "search_wall_s": [m.wall_s for m in searches],
            "startup_cpu_s": [m.cpu_s for m in empties],
        },
        "host": host_info(),
        **{k: v for k, v in summary.to_dict().items() if k != "out_of_order"},
    }
    sidecar_path(out).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def host_info() -> dict[str, Any]:
    """The machine the think times were measured on (CPU model and clock)."""
    model, mhz = "unknown", 0.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "cpu MHz" and not mhz:
                mhz = float(value)
    except OSError:
        pass
    try:
        version = subprocess.run(
            ["tre-agrep", "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[0]
    except (OSError, IndexError):
        version = "unknown"
    return {
        "cpu_model": model,
        "cpu_mhz": mhz,
        "machine": platform.machine(),
        "tre_agrep": version,
    }


def load_agrep_trace(path: Path | None = None) -> list[TraceRecord]:
    """The recorded mobile application trace (committed under ``data/traces/``).

    Raises :class:`UsageError` if the file is missing (regenerate it with
    ``shuttle trace record-agrep``).
    """
    trace = path or AGREP_TRACE
    if not trace.exists():
        raise UsageError(
            f"the agrep trace {trace} is missing; regenerate it with `shuttle trace record-agrep`"
        )
    return list(io.read_csv(trace))


def load_agrep_meta(path: Path | None = None) -> dict[str, Any]:
    """The sidecar of the agrep trace: command, ``cpu_s_per_byte``, host, counts."""
    side = sidecar_path(path or AGREP_TRACE)
    if not side.exists():
        raise UsageError(f"{side} is missing; regenerate it with `shuttle trace record-agrep`")
    data: dict[str, Any] = json.loads(side.read_text())
    return data
