"""A trace of one mobile object: its storage calls and its console's calls, with the CPU
between them.

``shuttle trace record-object`` runs a built-in object (``grep``, ``count``,
``filter``) in process at the client, over the real storage calls of a live node,
and writes what :mod:`shuttle.sim.mobile` replays. The recording is a dependent trace
on a *zero-I/O timeline*, like the agrep trace (:mod:`shuttle.traces.agrep`): a
record's ``time`` is the CPU the program had used before it, so the gap before a
record is the computing between two calls, measured on the calling thread's CPU
clock (``time.thread_time``: waits for the node are not in it).

Records, in the order they happened:

* ``call`` -- the console calls the object (``size``: bytes of the call's arguments
  as the run-time packs them); the gap before it is the console's own CPU;
* ``read`` (and metadata operations for ``size``/``stat``/``list``) -- the object's
  storage calls, ``file`` the key, ``offset`` and ``size`` the bytes returned;
* ``return`` -- the object answers (``size``: bytes of its result, packed).

Where the object runs decides what crosses a link: at the client its storage calls
do, at the server its console's calls and answers do. This module only collects and
writes; running the object belongs above the run-time (``shuttle.bench.objrecord``).
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shuttle.traces import io
from shuttle.traces.agrep import sidecar_path
from shuttle.traces.record import Op, TraceRecord

#: The ``file`` of console records (no storage object has this key: keys have no
#: angle brackets in practice, and the simulator tells console records by their op).
CONSOLE_FILE = "<console>"

#: Storage methods that are metadata requests, and the operation each is traced as.
_METADATA_METHODS = {"size": Op.GETATTR, "stat": Op.GETATTR, "list": Op.READDIR}


class ObjectTraceRecorder:
    """Collects the records of one object's run; ``clock`` is the CPU clock of the
    thread the object and its console run on."""

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.records: list[TraceRecord] = []
        #: CPU seconds used so far outside calls: the timeline.
        self.cpu_s = 0.0
        self.storage_calls = 0
        self.bytes_read = 0
        self.console_calls = 0
        #: The stack being recorded (one per node): the records' ``client``.
        self.stack = 0
        self._mark = clock()

    def _now(self) -> float:
        """Add the CPU since the last mark to the timeline; return the timeline."""
        now = self.clock()
        self.cpu_s += max(0.0, now - self._mark)
        self._mark = now
        return self.cpu_s

    def _append(self, op: Op, file: str, offset: int, size: int, at_s: float) -> None:
        self.records.append(TraceRecord(at_s, self.stack, op, file, offset, size))
        # What the recorder itself did until now is not the program's.
        self._mark = self.clock()

    def call(self, nbytes: int) -> None:
        """The console calls the object with ``nbytes`` of arguments."""
        self.console_calls += 1
        self._append(Op.CALL, CONSOLE_FILE, 0, nbytes, self._now())

    def answer(self, nbytes: int) -> None:
        """The object answers its console with ``nbytes``."""
        self._append(Op.RETURN, CONSOLE_FILE, 0, nbytes, self._now())

    def storage(self, call: Callable[[], Any], op: Op, key: str, offset: int) -> Any:
        """Make storage call ``call`` (a read, or a metadata call); record it with the
        bytes it returned (for a read) and the CPU before it."""
        at_s = self._now()
        result = call()
        size = len(result) if op is Op.READ else 0
        self.storage_calls += 1
        if op is Op.READ:
            self.bytes_read += size
        self._append(op, key, offset, size, at_s)
        return result

    def finish(self) -> float:
        """The CPU after the last record (the program's tail); returns the timeline's end."""
        return self._now()


class RecordingStorage:
    """A storage reference that records each call: pass it to an object in place of
    the reference it would read through."""

    def __init__(self, inner: Any, recorder: ObjectTraceRecorder) -> None:
        self._inner = inner
        self._recorder = recorder

    def read(self, key: str, offset: int = 0, length: int | None = None) -> Any:
        """Up to ``length`` bytes of ``key`` from ``offset``, through the real storage."""
        return self._recorder.storage(
            lambda: self._inner.read(key, offset, length), Op.READ, key, offset
        )

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)
        op = _METADATA_METHODS.get(name, Op.OTHER)

        def call(*args: Any, **kwargs: Any) -> Any:
            key = str(args[0]) if args else str(kwargs.get("key", kwargs.get("prefix", "")))
            return self._recorder.storage(lambda: method(*args, **kwargs), op, key, 0)

        return call


def host_info() -> dict[str, Any]:
    """The machine a trace was recorded on: its name, CPU model and clock, cores.

    ``cpu_mhz`` is what the simulator scales think times by (``recording_cpu_mhz``)."""
    model, mhz = "unknown", 0.0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "cpu MHz" and not mhz:
                mhz = float(value)
    except (OSError, ValueError):
        pass
    return {
        "hostname": socket.gethostname(),
        "cpu_model": model,
        "cpu_mhz": mhz,
        "cpus": os.cpu_count() or 1,
        "machine": platform.machine(),
    }


def write_object_trace(
    path: Path, recorder: ObjectTraceRecorder, meta: dict[str, Any]
) -> dict[str, Any]:
    """Write the trace to ``path`` (``.gz`` compresses) and its sidecar beside it
    (``x.csv.gz`` -> ``x.json``): ``meta`` plus the counts and the host. Returns the
    sidecar's contents."""
    n = io.write_csv(path, recorder.records)
    sidecar = {
        "trace": path.name,
        "what": "one mobile object run in process over a live node's storage calls",
        "timeline": "zero I/O time: a record's time is the thread CPU used before it",
        **meta,
        "records": n,
        "storage_calls": recorder.storage_calls,
        "bytes_read": recorder.bytes_read,
        "console_calls": recorder.console_calls,
        "think_s_total": recorder.cpu_s,
        "host": host_info(),
    }
    sidecar_path(path).write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar


def read_sidecar(path: Path) -> dict[str, Any]:
    """The sidecar of a trace written by :func:`write_object_trace` ({} if none)."""
    try:
        data = json.loads(sidecar_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
