"""Digests: what one run-time saw over a window, as the resource managers read it.

:func:`build_digest` summarises a run-time's monitor window (its speed and load, the
objects it hosts with their CPU, memory and checkpoint size, the edges its objects
called with their bytes, calls and stall, and of that stall the callees' own time
as they reported it); :func:`parse_digest` checks one from the wire
field by field before it reaches a planner (:mod:`shuttle.runtime.planner`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.net.addresses import parse_address
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.monitor import Window

#: Prefix of console objects' local ids.
CONSOLE_PREFIX = "console-"


def _number(value: Any, where: str, *, minimum: float = 0.0, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
        raise InvalidArgumentError(
            f"digest: {where} must be a number ≥ {minimum:g}, got {value!r:.40}"
        )
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"digest: {where} must be a string, got {value!r:.40}")
    return value


def _maps(raw: dict[str, Any], name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The maps in list ``raw[name]``, each with where it is (for the error)."""
    items = raw.get(name, [])
    if not isinstance(items, list):
        raise InvalidArgumentError(f"digest: {name} must be a list")
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        if not isinstance(item, dict):
            raise InvalidArgumentError(f"digest: {where} must be a map")
        yield where, item


def parse_digest(raw: Any) -> dict[str, Any]:
    """Check a digest from the wire field by field; :class:`InvalidArgumentError`
    names the first bad one (a malformed digest must not reach the planner)."""
    if not isinstance(raw, dict):
        raise InvalidArgumentError("digest must be a map")
    runtime = _string(raw.get("runtime"), "runtime")
    if not runtime or "/" in runtime:
        raise InvalidArgumentError(f"digest: runtime must be a run-time id, got {runtime!r:.40}")
    d: dict[str, Any] = {
        "runtime": runtime,
        "address": _string(raw.get("address", ""), "address"),
        "speed": _number(raw.get("speed", 1.0), "speed", minimum=1e-9),
        "load": _number(raw.get("load", 0.0), "load"),
        "span_s": _number(raw.get("span_s", 0.0), "span_s"),
        "quiesce_s": _number(raw.get("quiesce_s"), "quiesce_s", optional=True),
        "objects": [],
        "edges": [],
        "consoles": [],
        "links": {},
    }
    if d["address"]:
        parse_address(d["address"], "digest address")
    for where, o in _maps(raw, "objects"):
        rid = _string(o.get("rid"), f"{where}.rid")
        ObjectId.parse(rid)
        d["objects"].append(
            {
                "rid": rid,
                "type": _string(o.get("type", "?"), f"{where}.type"),
                "active_s": _number(o.get("active_s"), f"{where}.active_s", optional=True),
                "cpu_s": _number(o.get("cpu_s", 0.0), f"{where}.cpu_s"),
                "calls": _number(o.get("calls", 0), f"{where}.calls"),
                "memory_bytes": int(_number(o.get("memory_bytes", 0), f"{where}.memory_bytes")),
                "movable": bool(o.get("movable", False)),
                "checkpoint_bytes": int(
                    _number(o.get("checkpoint_bytes", 0), f"{where}.checkpoint_bytes")
                ),
                "quiesce_s": _number(o.get("quiesce_s"), f"{where}.quiesce_s", optional=True),
                "moved_age_s": _number(o.get("moved_age_s"), f"{where}.moved_age_s", optional=True),
                "failed_age_s": _number(
                    o.get("failed_age_s"), f"{where}.failed_age_s", optional=True
                ),
                "failures": int(_number(o.get("failures", 0), f"{where}.failures")),
            }
        )
    for where, e in _maps(raw, "edges"):
        caller, callee = (
            _string(e.get("caller"), f"{where}.caller"),
            _string(e.get("callee"), f"{where}.callee"),
        )
        ObjectId.parse(caller)
        ObjectId.parse(callee)
        d["edges"].append(
            {
                "caller": caller,
                "callee": callee,
                "bytes": _number(e.get("bytes", 0), f"{where}.bytes"),
                "calls": _number(e.get("calls", 0), f"{where}.calls"),
                "stall_s": _number(e.get("stall_s", 0.0), f"{where}.stall_s"),
                "far_s": _number(e.get("far_s", 0.0), f"{where}.far_s"),
                "remote": bool(e.get("remote", False)),
                "active_s": _number(e.get("active_s"), f"{where}.active_s", optional=True),
            }
        )
    consoles = raw.get("consoles", [])
    if not isinstance(consoles, list):
        raise InvalidArgumentError("digest: consoles must be a list")
    for c in consoles:
        ObjectId.parse(_string(c, "consoles[]"))
        d["consoles"].append(c)
    links = raw.get("links", {})
    if not isinstance(links, dict):
        raise InvalidArgumentError("digest: links must be a map of node id to link")
    for node, link in links.items():
        if not isinstance(link, dict):
            raise InvalidArgumentError(f"digest: links[{node!r:.20}] must be a map")
        d["links"][str(node)] = {
            "name": str(link.get("name", "")),
            "bandwidth_bytes_per_s": _number(
                link.get("bandwidth_bytes_per_s"),
                f"links[{node}].bandwidth",
                minimum=1e-9,
                optional=True,
            ),
            "latency_s": _number(link.get("latency_s", 0.0), f"links[{node}].latency_s"),
        }
    return d


def build_digest(
    bm: BindingManager,
    window: Window,
    load: float,
    links: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What run-time ``bm`` saw over ``window``, for the resource managers."""
    now = time.monotonic()
    objects = []
    for rid, hosted in bm.table.hosted_items():
        key = str(rid)
        counters = window.objects.get(key)
        moved_age = bm.history.moved_age_s(key, now)
        failed_age, failures = bm.history.failures(key, now)
        objects.append(
            {
                "rid": key,
                "type": hosted.type_label,
                "active_s": window.active_s.get(key),
                "cpu_s": counters.cpu_s if counters else 0.0,
                "calls": counters.calls if counters else 0,
                "memory_bytes": hosted.memory_bytes(),
                "movable": hosted.movable and not bm.table.is_migrating(rid),
                "checkpoint_bytes": (
                    bm.hosting.estimate_checkpoint_bytes(hosted) if hosted.movable else 0
                ),
                "quiesce_s": None,
                "moved_age_s": None if moved_age is None else round(moved_age, 3),
                "failed_age_s": None if failed_age is None else round(failed_age, 3),
                "failures": failures,
            }
        )
    edges = [
        {
            "caller": caller,
            "callee": callee,
            "bytes": e.bytes,
            "calls": e.calls,
            "stall_s": e.stall_s,
            "far_s": e.far_s,
            "remote": e.remote,
            "active_s": window.active_s.get((caller, callee)),
        }
        for (caller, callee), e in window.edges.items()
    ]
    consoles = sorted(
        str(rid) for rid, _ in bm.table.homed_items() if rid.local.startswith(CONSOLE_PREFIX)
    )
    return {
        "runtime": bm.id,
        "address": bm.address,
        "speed": bm.speed,
        "load": load,
        "span_s": window.span_s,
        "objects": objects,
        "edges": edges,
        "consoles": consoles,
        "links": links or {},
        "quiesce_s": bm.history.mean_quiesce_s(),
    }
