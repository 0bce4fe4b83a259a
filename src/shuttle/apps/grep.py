"""``shuttle grep``: search objects with a grep object per node, placed as asked.

For each node holding some of the keys, the application (its console) makes a
``grep`` object reading through that node's storage object and calls ``next`` until
it is done, printing matching lines as ``key:line:text``. Where the object runs is
the placement: ``client`` and ``server`` pin it there; ``auto`` starts it at the
client and lets the node's resource manager move it when that pays. Stacks of
different nodes run concurrently, each in its own thread and console.

A node that keeps its objects in Ceph (``shuttle serve --store rados:POOL``) offers a
third site for a fixed-string pattern: the OSD that holds the bytes (``osdgrep``, a
``cls_lua`` call per slice, made from the node). ``osd`` runs there; ``auto`` first
asks the three-site model (:mod:`shuttle.runtime.site_probe`: a probe read at the
client, then client, node and OSD predicted) and goes to the OSD when it predicts the
OSD best, since an ``osdgrep`` cannot move later; otherwise it adapts between the
client and the node as above.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shuttle.client.client import Client
from shuttle.errors import InvalidArgumentError, NotFoundError
from shuttle.objects.grep import BATCH_BYTES_DEFAULT
from shuttle.objects.lines import BLOCK_BYTES_DEFAULT
from shuttle.runtime.client import Runtime
from shuttle.runtime.osd import literal_of
from shuttle.runtime.refs import Ref
from shuttle.runtime.site_probe import choose, probe_grep

PLACEMENTS = ("client", "server", "osd", "auto")

Match = list[Any]  # [key, line number, line bytes]


@dataclass
class GrepResult:
    """What a grep run did (``--json-out``)."""

    pattern: str
    placement: str
    keys: int
    matches: int = 0
    scanned_bytes: int = 0
    elapsed_s: float = 0.0
    #: Where each node's grep object ran at the start and at the end.
    initial: dict[str, str] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)
    migrations: list[dict[str, Any]] = field(default_factory=list)
    #: Per RADOS-backed node under ``auto``: the three-site model's plan.
    sites: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Per node, what the timer holds (``shuttle sim predict --live`` sets each beside
    #: the model's): ``made_s``, from the start to its object made and located (the
    #: connection's dial is in it: the run-time dials on its first call), and
    #: ``calls_s``, the wall time of each console call after (``next`` ..., ``progress``).
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: The timer's start on ``CLOCK_MONOTONIC`` (comparable across processes: a node's
    #: ``SHUTTLE_CPU_TRACE`` is on the same clock).
    started_monotonic_s: float = 0.0
    #: This process's CPU seconds (every thread) over the timer: the client's own work.
    process_cpu_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "placement": self.placement,
            "keys": self.keys,
            "matches": self.matches,
            "scanned_bytes": self.scanned_bytes,
            "elapsed_s": round(self.elapsed_s, 6),
            "initial_placement": self.initial,
            "final_placement": self.final,
            "migrations": self.migrations,
            "site_plans": self.sites,
            "phases": self.phases,
            "started_monotonic_s": round(self.started_monotonic_s, 6),
            "process_cpu_s": round(self.process_cpu_s, 6),
        }


@dataclass(frozen=True)
class CephSite:
    """How a node on a RADOS store reaches its pool (from its stats): what an
    ``osdgrep`` made on that node needs."""

    conf: str
    keyring: str | None
    user: str
    pool: str
    namespace: str


def ceph_sites(client: Client, keys: Sequence[str]) -> dict[str, CephSite | None]:
    """The :class:`CephSite` of each node holding some of ``keys`` (one stats call
    each), or None for a node on local files; by address (``HOST:PORT``), which names
    a node the same before and after a run-time learns its id. A principal (not the
    cluster key's holder) gets no OSD site: it may neither read a node's counters nor
    make an ``osdgrep``, which reads RADOS past the node's checks."""
    out: dict[str, CephSite | None] = {}
    for node in {client.node_for(k).address: client.node_for(k) for k in keys}.values():
        if client.principal is not None:
            out[node.address] = None
            continue
        rados = client.node_stats(node).get("store", {}).get("rados")
        if not isinstance(rados, dict) or not rados.get("ceph_conf"):
            out[node.address] = None
            continue
        out[node.address] = CephSite(
            str(rados["ceph_conf"]),
            rados.get("ceph_keyring"),
            str(rados.get("ceph_user") or "client.admin"),
            str(rados["pool"]),
            str(rados.get("namespace") or ""),
        )
    return out


def expand_keys(client: Client, keys: Sequence[str]) -> list[str]:
    """Keys as given, with each ``prefix/`` (ending in a slash) replaced by the keys
    under it, across all nodes, in order. A key that does not exist fails early."""
    out: list[str] = []
    for key in keys:
        if key.endswith("/"):
            found = client.list(key)
            if not found:
                raise NotFoundError(f"no objects under {key!r}; `shuttle ls {key}` lists them")
            out += found
        else:
            client.stat(key)
            out.append(key)
    return list(dict.fromkeys(out))


def _where(rt: Runtime, node: str, location: str) -> str:
    return (
        "client" if location == rt.id else f"server ({location})" if location == node else location
    )


def run_grep(
    rt: Runtime,
    pattern: str,
    keys: Sequence[str],
    *,
    placement: str = "auto",
    ignore_case: bool = False,
    block_bytes: int = BLOCK_BYTES_DEFAULT,
    batch_bytes: int = BATCH_BYTES_DEFAULT,
    on_matches: Callable[[list[Match]], None] = lambda _m: None,
    ceph: Mapping[str, CephSite | None] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> GrepResult:
    """Search ``keys`` for ``pattern``; ``on_matches`` gets each batch of matching
    lines (from any thread, one batch at a time). ``ceph``: :func:`ceph_sites` (by
    node address; a node missing is taken as on local files), ``sizes``: each key's
    size (asked of the nodes when not given); both serve the OSD site (``osd``, and
    ``auto`` on RADOS-backed nodes)."""
    if placement not in PLACEMENTS:
        raise InvalidArgumentError(f"--placement must be one of {', '.join(PLACEMENTS)}")
    by_node: dict[str, list[str]] = {}
    for key in keys:
        by_node.setdefault(rt.node_for(key), []).append(key)
    result = GrepResult(pattern, placement, len(keys))
    lock = threading.Lock()
    failures: list[BaseException] = []
    t0 = result.started_monotonic_s = time.monotonic()
    cpu0 = time.process_time()
    wall0 = time.time()
    ceph = dict(ceph or {})
    address = {n.node_id: n.address for n in rt.nodes}
    at_osd = {
        node: _at_osd(rt, node, node_keys, pattern, placement, ceph.get(address[node]),
                      sizes, result, ignore_case=ignore_case, block_bytes=block_bytes,
                      batch_bytes=batch_bytes)
        for node, node_keys in by_node.items()
    }  # fmt: skip
    refs: dict[str, Ref] = {}
    for node, node_keys in by_node.items():
        if at_osd[node]:
            result.initial[node] = result.final[node] = f"osd (through {node})"
            continue
        refs[node] = rt.create(
            "grep",
            at=node if placement == "server" else None,
            placement="auto" if placement == "auto" else "static",
            pattern=pattern,
            storage=rt.storage(node),
            keys=node_keys,
            ignore_case=ignore_case,
            block_bytes=block_bytes,
            batch_bytes=batch_bytes,
        )
        result.initial[node] = _where(rt, node, rt.where(refs[node]))
        result.phases[node] = {"made_s": time.monotonic() - t0, "calls_s": []}

    def drain(grep: Ref, calls_s: list[float]) -> None:
        done = False
        while not done:
            t = time.monotonic()
            done, matches = grep.next()
            calls_s.append(time.monotonic() - t)
            if matches:
                with lock:
                    result.matches += len(matches)
                    on_matches(matches)
        t = time.monotonic()
        progress = grep.progress()
        calls_s.append(time.monotonic() - t)
        with lock:
            result.scanned_bytes += int(progress["scanned_bytes"])

    def scan(node: str) -> None:
        try:
            with rt.console(f"grep-{node}"):
                site = at_osd[node]
                if site is None:
                    drain(refs[node], result.phases[node]["calls_s"])
                    return
                for key in by_node[node]:  # one osdgrep per object, each at its OSD
                    ref = rt.create(
                        "osdgrep",
                        at=node,
                        placement="static",
                        pattern=pattern,
                        conf_path=site.conf,
                        keyring_path=site.keyring,
                        user=site.user,
                        pool=site.pool,
                        namespace=site.namespace,
                        oid=key,  # the RADOS store keeps each key as the object so named
                        key=key,
                        ignore_case=ignore_case,
                    )
                    try:
                        drain(ref, [])
                    finally:
                        rt.destroy(ref)
        except BaseException as exc:  # reported to the caller below
            failures.append(exc)

    threads = [threading.Thread(target=scan, args=(node,), name=f"grep {node}") for node in by_node]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.elapsed_s = time.monotonic() - t0
    result.process_cpu_s = time.process_time() - cpu0
    if failures:
        raise failures[0]
    mine = {str(ref.rid) for ref in refs.values()}
    for node, ref in refs.items():
        result.final[node] = _where(rt, node, rt.where(ref))
    for event in rt.events:
        if event.rid in mine and event.ok:
            result.migrations.append(
                {
                    "t_s": round(event.t - wall0, 3),
                    "object": event.rid,
                    "from": event.source,
                    "to": event.target,
                    "direction": "to_client" if event.target == rt.id else "to_server",
                    "reason": event.reason,
                    "elapsed_s": round(event.elapsed_s, 4),
                }
            )
    return result


def _at_osd(
    rt: Runtime,
    node: str,
    keys: list[str],
    pattern: str,
    placement: str,
    site: CephSite | None,
    sizes: Mapping[str, int] | None,
    result: GrepResult,
    *,
    ignore_case: bool,
    block_bytes: int,
    batch_bytes: int,
) -> CephSite | None:
    """The node's Ceph if this node's search runs at the OSD, else None: always with
    ``osd`` (or a clear error why it cannot), and with ``auto`` when the three-site
    model predicts the OSD best from a probe."""
    if placement not in ("osd", "auto"):
        return None
    literal = literal_of(pattern) is not None
    if placement == "osd":
        if site is None:
            raise InvalidArgumentError(
                f"node {node} keeps its objects in files, not in Ceph: --placement osd "
                "needs nodes started with --store rados:POOL (use client, server or auto)"
            )
        if not literal:
            raise InvalidArgumentError(
                f"the OSD runs fixed strings only (Lua has no regular expressions), not "
                f"{pattern!r}; escape it to search for it literally, or use client, "
                "server or auto"
            )
        return site
    if site is None or not literal or not keys:
        return None
    size = sum(sizes[k] for k in keys) if sizes is not None else None
    if size is None:
        size = sum(int(rt.storage(node).size(k)) for k in keys)
    view = probe_grep(
        rt,
        node,
        keys[0],
        pattern,
        size_bytes=size,
        block_bytes=block_bytes,
        batch_bytes=batch_bytes,
        ignore_case=ignore_case,
    )
    link = next((n.link for n in rt.nodes if n.node_id == node), None)
    plan = choose(view, link)
    result.sites[node] = plan.to_json()
    return site if plan.best == "osd" else None
