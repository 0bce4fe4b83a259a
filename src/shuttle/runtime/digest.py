"""Digests: what one run-time saw over a window, as the resource managers read it.

A :class:`Digest` is frozen data, parsed once: :meth:`Digest.parse` checks one from
the wire field by field and fills in the defaults (the only place they live), and
:meth:`Digest.to_wire` gives back the map :meth:`Digest.parse` takes.
:func:`build_digest` summarises a run-time's monitor window (its speed and load, the
objects it hosts with their CPU, memory and checkpoint size, the edges its objects
called with their bytes, calls and stall, and of that stall the callees' own time
as they reported it). The planner's input (:mod:`shuttle.runtime.planner_input`)
reads digests and nothing else of the run-time that sent them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from shuttle.errors import ConfigError, InvalidArgumentError
from shuttle.net.addresses import parse_address
from shuttle.runtime.ids import ObjectId

if TYPE_CHECKING:  # build_digest reads them; the types and the parser need neither
    from shuttle.runtime.binding import BindingManager
    from shuttle.runtime.monitor import Window

#: Prefix of console objects' local ids.
CONSOLE_PREFIX = "console-"


@dataclass(frozen=True, slots=True)
class ObjectDigest:
    """One hosted object over the window."""

    rid: str
    type: str = "?"
    #: Seconds the object was here to count (None: the whole window).
    active_s: float | None = None
    #: Raw CPU seconds at the host (reference seconds are this times its speed).
    cpu_s: float = 0.0
    calls: float = 0
    memory_bytes: int = 0
    #: Free to move now (its policy is "auto" and it is not moving already).
    movable: bool = False
    #: Size of the object's last real checkpoint (a move's, or the one it arrived
    #: with); 0 before its first.
    checkpoint_bytes: int = 0
    #: Not used by the planner (the run-time's mean, :attr:`Digest.quiesce_s`, is):
    #: kept so the wire format stays as it was.
    quiesce_s: float | None = None
    moved_age_s: float | None = None
    failed_age_s: float | None = None
    failures: int = 0


@dataclass(frozen=True, slots=True)
class EdgeDigest:
    """Calls from ``caller`` to ``callee`` over the window."""

    caller: str
    callee: str
    bytes: float = 0
    calls: float = 0
    #: Seconds the caller blocked on these calls, and of that the callee's own time.
    stall_s: float = 0.0
    far_s: float = 0.0
    remote: bool = False
    active_s: float | None = None
    #: Calls on the edge still in progress as the window ended.
    in_flight: int = 0


@dataclass(frozen=True, slots=True)
class LinkDigest:
    """The sender's link to one node."""

    name: str = ""
    #: None: unlimited.
    bandwidth_bytes_per_s: float | None = None
    latency_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CpuUse:
    """The CPU the sender's process used over its window and the CPU it could have
    had (CPU seconds per second, all its threads;
    :func:`~shuttle.runtime.load.available_cpu_s`), and how many CPUs it may run on.
    A node's tells its resource manager how much of its CPU is committed already
    (docs/runtime.md, "Many clients")."""

    own_per_s: float = 0.0
    available_per_s: float = 1.0
    cpus: int = 1
    #: The share of its CPUs busy with any process over the window, 0 to 1 (None:
    #: not measured). A client's tells the node whether the clients' CPUs are the
    #: bound: then work the node takes off them is throughput (docs/runtime.md,
    #: "Many clients", "The clients' saturation").
    busy_share: float | None = None


def _frozen_links(links: Mapping[str, LinkDigest]) -> Mapping[str, LinkDigest]:
    return MappingProxyType(dict(links))


@dataclass(frozen=True, slots=True)
class Digest:
    """What run-time ``runtime`` saw over its last window (``span_s`` seconds)."""

    runtime: str
    address: str = ""
    speed: float = 1.0
    load: float = 0.0
    span_s: float = 0.0
    #: Mean quiesce time of the sender's recent migrations (None: no history).
    quiesce_s: float | None = None
    objects: tuple[ObjectDigest, ...] = ()
    edges: tuple[EdgeDigest, ...] = ()
    consoles: tuple[str, ...] = ()
    #: Read-only: node id -> the sender's link to it.
    links: Mapping[str, LinkDigest] = field(default_factory=lambda: MappingProxyType({}))
    #: The CPU its process and the others on its CPUs used (None: not measured).
    cpu: CpuUse | None = None
    #: Calls in progress in the objects it hosts, on average over the window.
    calls_in_progress: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.links, MappingProxyType):
            object.__setattr__(self, "links", _frozen_links(self.links))

    @staticmethod
    def parse(raw: Any) -> Digest:
        """Check a digest from the wire field by field; :class:`InvalidArgumentError`
        names the first bad one (a malformed digest must not reach the planner)."""
        return _parse(raw)

    def to_wire(self) -> dict[str, Any]:
        """The plain map :meth:`parse` takes back (msgpack- and JSON-ready)."""
        return {
            "runtime": self.runtime,
            "address": self.address,
            "speed": self.speed,
            "load": self.load,
            "span_s": self.span_s,
            "quiesce_s": self.quiesce_s,
            "objects": [_fields(o) for o in self.objects],
            "edges": [_fields(e) for e in self.edges],
            "consoles": list(self.consoles),
            "links": {node: _fields(link) for node, link in self.links.items()},
            "cpu": None if self.cpu is None else _fields(self.cpu),
            "calls_in_progress": self.calls_in_progress,
        }


def _fields(item: ObjectDigest | EdgeDigest | LinkDigest | CpuUse) -> dict[str, Any]:
    return {name: getattr(item, name) for name in type(item).__slots__}


def _number(value: Any, where: str, *, minimum: float = 0.0, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= minimum:
        raise InvalidArgumentError(
            f"digest: {where} must be a number ≥ {minimum:g}, got {value!r:.40}"
        )
    if value == float("inf"):
        raise InvalidArgumentError(f"digest: {where} must be finite, got {value!r}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"digest: {where} must be a string, got {value!r:.40}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"digest: {where} must be true or false, got {value!r:.40}")
    return value


def _rid(value: Any, where: str) -> str:
    rid = _string(value, where)
    try:
        ObjectId.parse(rid)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"digest: {where}: {exc}") from exc
    return rid


def _maps(raw: Mapping[str, Any], name: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The maps in list ``raw[name]``, each with where it is (for the error)."""
    items = raw.get(name, [])
    if not isinstance(items, list | tuple):
        raise InvalidArgumentError(f"digest: {name} must be a list, got {items!r:.40}")
    for i, item in enumerate(items):
        where = f"{name}[{i}]"
        if not isinstance(item, Mapping):
            raise InvalidArgumentError(f"digest: {where} must be a map, got {item!r:.40}")
        yield where, item


def _parse_object(o: Mapping[str, Any], where: str) -> ObjectDigest:
    return ObjectDigest(
        rid=_rid(o.get("rid"), f"{where}.rid"),
        type=_string(o.get("type", "?"), f"{where}.type"),
        active_s=_number(o.get("active_s"), f"{where}.active_s", optional=True),
        cpu_s=_number(o.get("cpu_s", 0.0), f"{where}.cpu_s"),
        calls=_number(o.get("calls", 0), f"{where}.calls"),
        memory_bytes=int(_number(o.get("memory_bytes", 0), f"{where}.memory_bytes")),
        movable=_flag(o.get("movable", False), f"{where}.movable"),
        checkpoint_bytes=int(_number(o.get("checkpoint_bytes", 0), f"{where}.checkpoint_bytes")),
        quiesce_s=_number(o.get("quiesce_s"), f"{where}.quiesce_s", optional=True),
        moved_age_s=_number(o.get("moved_age_s"), f"{where}.moved_age_s", optional=True),
        failed_age_s=_number(o.get("failed_age_s"), f"{where}.failed_age_s", optional=True),
        failures=int(_number(o.get("failures", 0), f"{where}.failures")),
    )


def _parse_edge(e: Mapping[str, Any], where: str) -> EdgeDigest:
    return EdgeDigest(
        caller=_rid(e.get("caller"), f"{where}.caller"),
        callee=_rid(e.get("callee"), f"{where}.callee"),
        bytes=_number(e.get("bytes", 0), f"{where}.bytes"),
        calls=_number(e.get("calls", 0), f"{where}.calls"),
        stall_s=_number(e.get("stall_s", 0.0), f"{where}.stall_s"),
        far_s=_number(e.get("far_s", 0.0), f"{where}.far_s"),
        remote=_flag(e.get("remote", False), f"{where}.remote"),
        active_s=_number(e.get("active_s"), f"{where}.active_s", optional=True),
        in_flight=int(_number(e.get("in_flight", 0), f"{where}.in_flight")),
    )


def _parse_link(link: Any, node: str) -> LinkDigest:
    where = f"links[{node!r:.40}]"
    if not isinstance(link, Mapping):
        raise InvalidArgumentError(f"digest: {where} must be a map, got {link!r:.40}")
    return LinkDigest(
        name=_string(link.get("name", ""), f"{where}.name"),
        bandwidth_bytes_per_s=_number(
            link.get("bandwidth_bytes_per_s"),
            f"{where}.bandwidth_bytes_per_s",
            minimum=1e-9,
            optional=True,
        ),
        latency_s=_number(link.get("latency_s", 0.0), f"{where}.latency_s"),
    )


def _parse_cpu(cpu: Any) -> CpuUse | None:
    if cpu is None:
        return None
    if not isinstance(cpu, Mapping):
        raise InvalidArgumentError(f"digest: cpu must be a map or null, got {cpu!r:.40}")
    return CpuUse(
        own_per_s=_number(cpu.get("own_per_s", 0.0), "cpu.own_per_s"),
        available_per_s=_number(cpu.get("available_per_s", 1.0), "cpu.available_per_s"),
        cpus=int(_number(cpu.get("cpus", 1), "cpu.cpus", minimum=1)),
        busy_share=_share(cpu.get("busy_share"), "cpu.busy_share"),
    )


def _share(value: Any, where: str) -> float | None:
    share = _number(value, where, optional=True)
    if share is None:
        return None
    if share > 1:
        raise InvalidArgumentError(f"digest: {where} must be a share from 0 to 1, got {share!r}")
    return float(share)


def _parse(raw: Any) -> Digest:
    if not isinstance(raw, Mapping):
        raise InvalidArgumentError(f"digest must be a map, got {raw!r:.40}")
    runtime = _string(raw.get("runtime"), "runtime")
    if not runtime or "/" in runtime:
        raise InvalidArgumentError(
            f"digest: runtime must be a run-time id (no '/'), got {runtime!r:.40}"
        )
    address = _string(raw.get("address", ""), "address")
    if address:
        try:
            parse_address(address, "address")
        except ConfigError as exc:  # the sender's fault, not this node's configuration
            raise InvalidArgumentError(f"digest: {exc}") from exc
    consoles = raw.get("consoles", [])
    if not isinstance(consoles, list | tuple):
        raise InvalidArgumentError(f"digest: consoles must be a list, got {consoles!r:.40}")
    links = raw.get("links", {})
    if not isinstance(links, Mapping):
        raise InvalidArgumentError(
            f"digest: links must be a map of node id to link, got {links!r:.40}"
        )
    return Digest(
        runtime=runtime,
        address=address,
        speed=_number(raw.get("speed", 1.0), "speed", minimum=1e-9),
        load=_number(raw.get("load", 0.0), "load"),
        span_s=_number(raw.get("span_s", 0.0), "span_s"),
        quiesce_s=_number(raw.get("quiesce_s"), "quiesce_s", optional=True),
        objects=tuple(_parse_object(o, where) for where, o in _maps(raw, "objects")),
        edges=tuple(_parse_edge(e, where) for where, e in _maps(raw, "edges")),
        consoles=tuple(_rid(c, f"consoles[{i}]") for i, c in enumerate(consoles)),
        links={
            _string(node, "links (a node id)"): _parse_link(link, node)
            for node, link in links.items()
        },
        cpu=_parse_cpu(raw.get("cpu")),
        calls_in_progress=_number(raw.get("calls_in_progress", 0.0), "calls_in_progress"),
    )


def build_digest(
    bm: BindingManager,
    window: Window,
    load: float,
    links: Mapping[str, LinkDigest] | None = None,
    cpu: CpuUse | None = None,
) -> Digest:
    """What run-time ``bm`` saw over ``window``, for the resource managers.

    Reads counters and tables only: no object runs here. A checkpoint's size is the
    one its last real checkpoint had (:attr:`Hosted.checkpoint_bytes`, set by a move
    and by an arrival), so an object whose checkpoint fails is not called every
    window to find out, and its failure shows where a checkpoint is needed: the move
    fails with the object's error, and its back-off is in the next digest."""
    now = time.monotonic()
    objects = []
    for rid, hosted in bm.table.hosted_items():
        key = str(rid)
        counters = window.objects.get(key)
        moved_age = bm.history.moved_age_s(key, now)
        failed_age, failures = bm.history.failures(key, now)
        objects.append(
            ObjectDigest(
                rid=key,
                type=hosted.type_label,
                active_s=window.active_s.get(key),
                cpu_s=counters.cpu_s if counters else 0.0,
                calls=counters.calls if counters else 0,
                memory_bytes=hosted.memory_bytes(),
                movable=hosted.movable and not bm.table.is_migrating(rid),
                checkpoint_bytes=bm.hosting.last_checkpoint_bytes(hosted) if hosted.movable else 0,
                moved_age_s=None if moved_age is None else round(moved_age, 3),
                failed_age_s=None if failed_age is None else round(failed_age, 3),
                failures=failures,
            )
        )
    edges = tuple(
        EdgeDigest(
            caller=caller,
            callee=callee,
            bytes=e.bytes,
            calls=e.calls,
            stall_s=e.stall_s,
            far_s=e.far_s,
            remote=e.remote,
            active_s=window.active_s.get((caller, callee)),
            in_flight=window.in_flight.get((caller, callee), 0),
        )
        for (caller, callee), e in window.edges.items()
    )
    consoles = sorted(
        str(rid) for rid, _ in bm.table.homed_items() if rid.local.startswith(CONSOLE_PREFIX)
    )
    return Digest(
        runtime=bm.id,
        address=bm.address,
        speed=bm.speed,
        load=load,
        span_s=window.span_s,
        quiesce_s=bm.history.mean_quiesce_s(),
        objects=tuple(objects),
        edges=edges,
        consoles=tuple(consoles),
        links=links or {},
        cpu=cpu,
        calls_in_progress=round(window.calls_in_progress, 4),
    )
