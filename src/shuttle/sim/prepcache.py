"""A disk cache of prepared intervals, so a second sweep skips the two passes.

Preparing a generated background (:mod:`shuttle.sim.prepare`) reads tens of millions
of records twice; both sweeps of the paper need the same intervals. The result --
each interval's timed records and warm caches -- is a few tens of megabytes of
arrays, saved as one ``.npz`` file named by a key.

The key is a hash of everything the result depends on: the background's description
(generator configuration and seed, or the trace file's path, size and modification
time), the experiment's interval parameters, the block size, and the source code of
the modules that produce the data (the generator and the preparation), so a change
to any of them is a miss, never a stale hit.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shuttle.sim.config import ExperimentConfig
from shuttle.sim.prepare import IntervalData
from shuttle.sim.workload import Columns, Interval, WarmState

#: Bump when the file layout changes.
FORMAT_VERSION = 1

#: Modules whose code decides the prepared data.
_CODE_MODULES = (
    "shuttle.sim.prepare",
    "shuttle.sim.workload",
    "shuttle.traces.background",
    "shuttle.traces.formats",
)
_COLUMNS = ("time_s", "client", "kind", "file", "offset", "size")


def cache_key(
    background: dict[str, Any], experiment: ExperimentConfig, block_size_bytes: int
) -> str:
    """The hash naming the prepared data of these inputs."""
    code = hashlib.sha256()
    for name in _CODE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        source = getattr(module, "__file__", None)
        if source:
            code.update(Path(source).read_bytes())
    inputs = {
        "format": FORMAT_VERSION,
        "background": background,
        "experiment": {
            "intervals": experiment.intervals,
            "interval_s": experiment.interval_s,
            "warmup_s": experiment.warmup_s,
            "warmup_timed_s": experiment.warmup_timed_s,
            "overrun_s_max": experiment.overrun_s_max,
        },
        "block_size_bytes": block_size_bytes,
        "code": code.hexdigest(),
    }
    text = json.dumps(inputs, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def file_identity(path: Path) -> dict[str, Any]:
    """What names a trace file's contents cheaply: resolved path, size, mtime."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def save(path: Path, intervals: list[IntervalData], records: int) -> None:
    """Write ``intervals`` to ``path`` atomically (a reader never sees half a file)."""
    arrays: dict[str, Any] = {"records": np.int64(records), "count": np.int64(len(intervals))}
    for k, data in enumerate(intervals):
        i = data.interval
        arrays[f"{k}.interval"] = np.array([i.index, i.start_s, i.end_s, i.requests])
        for name in _COLUMNS:
            arrays[f"{k}.{name}"] = getattr(data.background, name)
        arrays[f"{k}.file_count"] = np.int64(data.background.file_count)
        arrays[f"{k}.warm_blocks"] = data.warm.blocks_lru_first
        arrays[f"{k}.warm_files"] = data.warm.metadata_files
        arrays[f"{k}.warm_records"] = np.int64(data.warm.records)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as stream:
            np.savez(stream, **arrays)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load(path: Path) -> tuple[list[IntervalData], int] | None:
    """The intervals saved at ``path``, or None if there is no usable file."""
    try:
        with np.load(path) as saved:
            intervals = []
            for k in range(int(saved["count"])):
                index, start_s, end_s, requests = saved[f"{k}.interval"].tolist()
                columns = Columns(
                    time_s=saved[f"{k}.time_s"],
                    client=saved[f"{k}.client"],
                    kind=saved[f"{k}.kind"],
                    file=saved[f"{k}.file"],
                    offset=saved[f"{k}.offset"],
                    size=saved[f"{k}.size"],
                    file_count=int(saved[f"{k}.file_count"]),
                )
                warm = WarmState(
                    blocks_lru_first=saved[f"{k}.warm_blocks"],
                    metadata_files=saved[f"{k}.warm_files"],
                    records=int(saved[f"{k}.warm_records"]),
                )
                interval = Interval(int(index), float(start_s), float(end_s), int(requests))
                intervals.append(IntervalData(interval, columns, warm))
            return intervals, int(saved["records"])
    except (OSError, KeyError, ValueError):
        return None
