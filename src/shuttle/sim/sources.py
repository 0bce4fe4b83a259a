"""Where an experiment's traces come from: a file, or the generators in ``traces``.

* Background: any trace file :func:`shuttle.traces.formats.read_trace` reads
  (canonical CSV, nfsdump, strace, block traces), or the documented generator
  :func:`shuttle.traces.background.generate` with a ``[background]`` config table
  (its :class:`~shuttle.traces.background.BackgroundConfig`) and the experiment's seed.
* Mobile application: any trace file, or the committed recording of ``tre-agrep``
  over the Python standard library (:func:`shuttle.traces.agrep.load_agrep_trace`).

Each loader returns the trace as :class:`~shuttle.sim.workload.Columns` and a
description of its origin for the experiment's stated configuration.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from shuttle.errors import ConfigError
from shuttle.sim.config import from_mapping
from shuttle.sim.kernel import derive_seed
from shuttle.sim.prepare import ChunkSource, columns_source
from shuttle.sim.prepcache import file_identity
from shuttle.sim.workload import CALL, Columns, kind_of
from shuttle.traces.record import TraceRecord

Progress = Callable[[int], None]


def _counting(records: Iterable[TraceRecord], progress: Progress | None) -> Iterator[TraceRecord]:
    if progress is None:
        yield from records
        return
    # Report every 2**16 records: often enough for a bar, rarely enough to be free.
    n = 0
    for record in records:
        yield record
        n += 1
        if not n & 0xFFFF:
            progress(n)
    progress(n)


def _module(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(
            f"{what} ({name}) is not available in this build; pass a trace file instead"
        ) from exc


def load_trace_file(path: Path, format: str = "auto", progress: Progress | None = None) -> Columns:
    """Read any supported trace file into columns (time-ordered, first record at 0 s)."""
    from shuttle.traces.formats import read_trace

    return Columns.from_records(_counting(read_trace(path, format), progress))


def describe_background(
    path: Path | None, table: Mapping[str, Any], seed: int, format: str = "auto"
) -> dict[str, Any]:
    """What the background will be, without reading or generating it.

    Raises :class:`~shuttle.errors.ConfigError` for a ``[background]`` table given
    with a file, or a bad generator parameter.
    """
    if path is not None:
        if table:
            raise ConfigError(
                "a [background] table configures the generator; it cannot apply to a trace "
                f"file ({path}); drop one of them"
            )
        try:
            identity = file_identity(path)
        except OSError as exc:
            raise ConfigError(f"cannot read background trace {str(path)!r}: {exc}") from exc
        return {"source": str(path), "format": format, "file": identity}
    background = _module("shuttle.traces.background", "the background generator")
    config = from_mapping(background.BackgroundConfig, table, "[background]")
    description: dict[str, Any] = {
        "source": "generated (shuttle.traces.background)",
        "seed": derive_seed(seed, "background"),
    }
    if hasattr(config, "to_dict"):
        description["config"] = config.to_dict()
    elif dataclasses.is_dataclass(config):
        description["config"] = dataclasses.asdict(config)  # type: ignore[arg-type]
    return description


def load_background(
    path: Path | None,
    table: Mapping[str, Any],
    seed: int,
    format: str = "auto",
    progress: Progress | None = None,
) -> tuple[ChunkSource, dict[str, Any]]:
    """The background trace: read from ``path``, or generated from ``table`` and ``seed``.

    A file is read whole (it is finite and already on disk); the generator is asked
    for pieces of columns as they are needed, so hours of trace never sit in memory.
    Returns the source and :func:`describe_background`'s description.
    """
    description = describe_background(path, table, seed, format)
    if path is not None:
        columns = load_trace_file(path, format, progress)
        if bool((columns.kind >= CALL).any()):
            raise ConfigError(
                f"{path} is the trace of one mobile object (it holds its console's calls); "
                "it can be the mobile application (--mobile), not the background"
            )
        return columns_source(columns), description
    background = _module("shuttle.traces.background", "the background generator")
    config = from_mapping(background.BackgroundConfig, table, "[background]")
    generator_seed = description["seed"]
    if not hasattr(background, "generate_columns"):
        records = background.generate(config, generator_seed)
        columns = Columns.from_records(_counting(records, progress))
        return columns_source(columns), description
    kinds = np.array([kind_of(op) for op in background.OPS], dtype=np.int8)

    def chunks(start_s: float, end_s: float) -> Iterator[Columns]:
        end = None if math.isinf(end_s) else end_s
        for chunk in background.generate_columns(config, generator_seed, start_s, end):
            yield Columns(
                time_s=chunk.time_s,
                client=chunk.client,
                kind=kinds[chunk.op],
                file=chunk.file,
                offset=chunk.offset,
                size=chunk.size,
                file_count=0,
            )

    return chunks, description


def load_mobile(path: Path | None, format: str = "auto") -> tuple[Columns, dict[str, Any]]:
    """The mobile application's trace: from ``path``, or the recorded agrep run.

    The description carries ``recording_cpu_mhz`` when the trace has a sidecar JSON
    naming the machine its think times were measured on (``host.cpu_mhz``), as the
    recorded agrep trace does; :func:`recording_speed` turns it into a speed. It
    also carries the program's ``name`` for titles and legends: the sidecar's
    ``name``, else the first word of its ``command``, else the file's name.
    """
    if path is not None:
        columns = load_trace_file(path, format)
        description: dict[str, Any] = {
            "source": str(path),
            "format": format,
            "records": len(columns),
        }
        sidecar = _sidecar(path)
        description["name"] = _program_name(path, sidecar)
    else:
        agrep = _module("shuttle.traces.agrep", "the recorded agrep trace")
        columns = Columns.from_records(agrep.load_agrep_trace())
        description = {
            "source": "recorded tre-agrep over the Python standard library (shuttle.traces.agrep)",
            "records": len(columns),
            "name": "agrep",
        }
        sidecar = _sidecar(agrep.AGREP_TRACE)
    mhz = sidecar.get("host", {}).get("cpu_mhz")
    if isinstance(mhz, int | float) and mhz > 0:
        description["recording_cpu_mhz"] = float(mhz)
        description["think_s_total"] = float(columns.time_s[-1]) if len(columns) else 0.0
    return columns, description


def recording_speed(description: dict[str, Any], cpu_reference_hz: float) -> float | None:
    """The speed of the CPU a mobile trace was recorded on, relative to the reference.

    A clock ratio (``recording_cpu_mhz`` over the reference clock): it ignores how
    much more a modern core does per cycle, so it understates the recording CPU's
    speed -- the think times it implies at the reference are a lower bound. None if
    the trace does not say where it was recorded.
    """
    mhz = description.get("recording_cpu_mhz")
    if mhz is None:
        return None
    return float(mhz) * 1e6 / cpu_reference_hz


def _program_name(trace: Path, sidecar: dict[str, Any]) -> str:
    name = sidecar.get("name")
    if isinstance(name, str) and name:
        return name
    command = sidecar.get("command")
    if isinstance(command, list) and command and isinstance(command[0], str):
        return Path(command[0]).name
    return _stem(trace)


def _stem(trace: Path) -> str:
    """The trace's name without ``.csv.gz`` / ``.csv``."""
    name = trace.name
    for suffix in (".csv.gz", ".csv"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _sidecar(trace: Path) -> dict[str, Any]:
    """The JSON sidecar of a trace file (``x.csv.gz`` -> ``x.json``), or {}."""
    side = trace.with_name(_stem(trace) + ".json")
    try:
        data = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
