"""Record a built-in mobile object as a mobile trace (``shuttle trace record-object``).

The object (``grep``, ``count`` or ``filter``) is made in process at the client, as
its class, with a storage reference that records every call
(:class:`~shuttle.traces.objtrace.RecordingStorage`) around the run-time's real
reference to the node; a console loop then calls it as ``shuttle grep`` does (create,
``next`` until it is done, ``progress``). The CPU of the thread between calls is the
think time; the bytes of every storage call, call and answer are recorded as the
run-time would pack them. What the trace means and how the simulator replays it:
:mod:`shuttle.traces.objtrace`, ``docs/simulator.md``.

Keys on several nodes make several stacks, one per node, as ``shuttle grep`` runs
them; each is recorded in turn and its records carry the stack's number in the
``client`` column (the sidecar's ``stacks`` names each one's node and keys).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.objects.grep import BATCH_BYTES_DEFAULT
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT
from shuttle.runtime import values
from shuttle.runtime.client import Runtime
from shuttle.runtime.mobile import builtin_type
from shuttle.traces.objtrace import ObjectTraceRecorder, RecordingStorage, write_object_trace

#: The objects that can be recorded, and what their console loop looks like.
OBJECTS = ("grep", "count", "filter")


@dataclass(frozen=True)
class ObjectRun:
    """One object's run: its type, its keys and its other parameters."""

    kind: str
    keys: Sequence[str]
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in OBJECTS:
            raise InvalidArgumentError(
                f"record-object knows {', '.join(OBJECTS)}, not {self.kind!r}"
            )
        if not self.keys:
            raise InvalidArgumentError("no keys to read; name at least one object key")
        if self.kind == "filter" and len(self.keys) != 1:
            raise InvalidArgumentError(
                f"filter reads one object; give one key, not {len(self.keys)}"
            )

    def object_params(self, storage: Any, keys: list[str]) -> dict[str, Any]:
        """The constructor's keyword arguments with ``storage`` and ``keys``."""
        if self.kind == "filter":
            return {"storage": storage, "key": keys[0], **self.params}
        return {"storage": storage, "keys": keys, **self.params}


def grep_run(
    pattern: str,
    keys: Sequence[str],
    *,
    ignore_case: bool = False,
    block_bytes: int = BLOCK_BYTES_DEFAULT,
    batch_bytes: int = BATCH_BYTES_DEFAULT,
) -> ObjectRun:
    """The run ``shuttle grep PATTERN KEYS`` makes, with the same defaults."""
    params = {
        "pattern": pattern,
        "ignore_case": ignore_case,
        "block_bytes": block_bytes,
        "batch_bytes": batch_bytes,
    }
    return ObjectRun("grep", list(keys), params)


def _console_loop(kind: str) -> Callable[[Any, ObjectTraceRecorder], None]:
    """How the console drives the object: ``next`` until it says it is done."""

    def grep_like(obj: Any, rec: ObjectTraceRecorder) -> None:
        matches = 0
        done = False
        while not done:
            rec.call(len(values.pack([[], {}])))
            result = obj.next()
            rec.answer(len(values.pack(result)))
            done, found = result
            if kind == "grep":
                matches += len(found)  # what shuttle grep's console does with them

    def filter_loop(obj: Any, rec: ObjectTraceRecorder) -> None:
        while True:
            rec.call(len(values.pack([[], {}])))
            data = obj.next()
            rec.answer(len(data))  # a filter's blocks come back raw
            if not data:
                return

    return filter_loop if kind == "filter" else grep_like


def record_stack(
    rt: Runtime, run: ObjectRun, node: str, keys: list[str], rec: ObjectTraceRecorder
) -> None:
    """Record one node's stack: create the object, drain it, and (a grep, as ``shuttle
    grep`` does) ask its progress."""
    cls = builtin_type(run.kind)
    real = rt.storage(node)
    storage = RecordingStorage(real, rec)
    with rt.console(f"record-{run.kind}"):
        # The creation carries the parameters (with the reference), as object.create.
        rec.call(len(values.pack(run.object_params(real, keys))))
        obj: Any = cls(**run.object_params(storage, keys))
        rec.answer(0)
        _console_loop(run.kind)(obj, rec)
        if run.kind == "grep":  # shuttle grep asks how far it got (its scanned bytes)
            rec.call(len(values.pack([[], {}])))
            progress = obj.progress()
            rec.answer(len(values.pack(progress)))


def by_node(rt: Runtime, keys: Sequence[str]) -> dict[str, list[str]]:
    """Keys grouped by the node that holds them, in order of first appearance."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(rt.node_for(key), []).append(key)
    return groups


def record_object(
    rt: Runtime, run: ObjectRun, out: Path, *, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Run ``run`` in process over ``rt``'s nodes, one stack per node; write the trace
    to ``out`` and its sidecar; return the sidecar."""
    rec = ObjectTraceRecorder(time.thread_time)
    stacks = []
    started = time.perf_counter()
    for index, (node, keys) in enumerate(by_node(rt, run.keys).items()):
        first = len(rec.records)
        rec.stack = index
        record_stack(rt, run, node, keys, rec)
        stacks.append(
            {
                "stack": index,
                "node": node,
                "keys": len(keys),
                "records": len(rec.records) - first,
            }
        )
    wall_s = time.perf_counter() - started
    meta = {
        "name": run.kind,
        "object": run.kind,
        "params": {k: v for k, v in run.params.items()},
        "keys": len(run.keys),
        "stacks": stacks,
        "recording_wall_s": wall_s,
        **(extra or {}),
    }
    return write_object_trace(out, rec, meta)
