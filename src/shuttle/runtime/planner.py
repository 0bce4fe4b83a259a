"""The resource manager (ABACUS 5.3-5.4 at the server): digests in, decisions out.

Every run-time summarises what its monitor saw over the last window in a *digest*
(:mod:`shuttle.runtime.digest`): its speed and load, the objects it hosts with their CPU,
memory and checkpoint size, and the edges its objects called along with their bytes
and calls. Clients push theirs to the nodes their stacks use every ``H`` (and a new
stack's first one after ``H/4``); ABACUS's clients did not, and it adapted late.

A node's :class:`ResourceManager` merges the fresh digests with its own, finds the
stacks that end at its storage object (a chain of edges from a client's console),
turns the counts into the model's inputs (:mod:`shuttle.runtime.placement`) and lets
:func:`~shuttle.runtime.placement.choose` decide. Moves of objects hosted on a
client go back to that client in the digest's reply (the client is the source and
drives the migration); moves of objects hosted here the node starts itself. Every
evaluation is appended to the decision log with its inputs, the candidate
placements, their predicted times, and what was done.

Rates, not counts, are merged: each source's counts are divided by the span its
window covers, summed across sources (an object that just moved appears in both the
old and the new host's window), and multiplied by ``H`` for the model.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import parse_digest
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.placement import (
    QUIESCE_S_DEFAULT,
    EdgeView,
    NodeView,
    ObjectView,
    Plan,
    StackView,
    choose,
    modelled_stall_s,
    stall_s,
)

log = logging.getLogger("shuttle.runtime")

#: A digest older than this many windows no longer describes a running application.
DIGEST_STALE_WINDOWS = 3.0
#: Decision-log records kept in memory for ``shuttle placement log``.
LOG_RECORDS_MAX = 2000
#: Longest chain followed from a console (a stack deeper than this is a loop).
STACK_DEPTH_MAX = 16
#: A decision for a client not delivered within this many windows is dropped: the
#: conditions it was made for have passed.
DECISION_TTL_WINDOWS = 2.0
#: Failed migrations back off up to 2**this times retry_after_s.
RETRY_DOUBLINGS_MAX = 4
#: The decision log file is rotated (to .jsonl.1) past this size.
LOG_FILE_BYTES_MAX = 64 << 20


@dataclass
class _Merged:
    """Per object and per edge rates, merged from several digests."""

    cpu_ref_per_s: dict[str, float] = field(default_factory=dict)
    host: dict[str, str] = field(default_factory=dict)
    info: dict[str, dict[str, Any]] = field(default_factory=dict)
    edge_bytes_per_s: dict[tuple[str, str], float] = field(default_factory=dict)
    edge_calls_per_s: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Seconds per second callers blocked on each remote edge beyond the callee's own
    #: time (the measured stall less what the callee reported as its own).
    edge_wait_per_s: dict[tuple[str, str], float] = field(default_factory=dict)
    quiesce: dict[str, float | None] = field(default_factory=dict)


class ResourceManager:
    """A node's placement decisions over the stacks that use its storage."""

    def __init__(
        self,
        bm: BindingManager,
        config: RuntimeConfig,
        *,
        local_digest: Callable[[], dict[str, Any]],
        memory_capacity_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bm = bm
        self.config = config
        self.placement = config.placement()
        self.local_digest = local_digest
        self.memory_capacity_bytes = memory_capacity_bytes
        self.clock = clock
        self.digests: dict[str, tuple[float, dict[str, Any]]] = {}
        #: When each client run-time was last heard from (its objects' lease).
        self.heard: dict[str, float] = {}
        #: Decisions for clients, delivered with the reply to their next digest (if
        #: it comes soon enough to still be meant).
        self.pending: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.records: deque[dict[str, Any]] = deque(maxlen=LOG_RECORDS_MAX)
        self.evaluations = 0
        self._seq = 0
        self._lock = threading.Lock()
        self._log_path = config.decision_log
        if self._log_path is not None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)

    # --- digests ---------------------------------------------------------------------

    def receive(
        self, digest: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
        """Take a client's digest; returns (decisions for that client, moves this node
        must start: (rid, target, reason))."""
        digest = parse_digest(digest)
        client = digest["runtime"]
        if client == self.bm.id:
            raise InvalidArgumentError(
                f"a digest claims to come from {client}, this node itself; a client "
                "run-time names itself in its digests"
            )
        if digest["address"]:
            self.bm.peers.learn(client, digest["address"], _link_profile(digest, self.bm.id))
        with self._lock:
            now = self.clock()
            self.digests[client] = (now, digest)
            self.heard[client] = now
            decisions, local = self.evaluate(trigger=client)
            horizon = now - DECISION_TTL_WINDOWS * self.config.window_s
            mine = [d for t, d in self.pending.pop(client, []) if t >= horizon]
            mine += decisions.pop(client, [])
            for other, items in decisions.items():
                self.pending.setdefault(other, []).extend((now, d) for d in items)
        return mine, local

    def forget(self, client: str) -> None:
        """A client run-time closed: drop its digest and anything pending for it."""
        with self._lock:
            self.digests.pop(client, None)
            self.pending.pop(client, None)

    def snapshot_digests(self) -> dict[str, dict[str, Any]]:
        """The fresh digests (a copy, safe to read while evaluations run)."""
        with self._lock:
            return dict(self.fresh_digests())

    def fresh_digests(self) -> dict[str, dict[str, Any]]:
        horizon = self.clock() - DIGEST_STALE_WINDOWS * self.config.window_s
        for client in [c for c, (t, _) in self.digests.items() if t < horizon]:
            del self.digests[client]
        return {c: d for c, (_, d) in self.digests.items()}

    # --- evaluation ------------------------------------------------------------------

    def evaluate(
        self, trigger: str = ""
    ) -> tuple[dict[str, list[dict[str, Any]]], list[tuple[str, str, str]]]:
        """Decide over every stack using this node. Returns decisions per client and
        the moves this node starts itself."""
        clients = self.fresh_digests()
        local = self.local_digest()
        merged = self._merge([local, *clients.values()])
        notes: list[str] = []
        stacks, nodes = self._stacks(merged, clients, local, notes)
        if not stacks:
            return {}, []
        pinned = self._pinned(merged)
        plan = choose(stacks, nodes, self.placement, pinned=pinned)
        self.evaluations += 1
        decisions: dict[str, list[dict[str, Any]]] = {}
        local_moves: list[tuple[str, str, str]] = []
        actions = []
        for move in plan.executed:
            stack = next(s for s in stacks if s.stack_id == move.stack_id)
            for rid in move.rids:
                target = stack.server if move.to_server else stack.client
                host = merged.host.get(rid, "")
                action = {"rid": rid, "from": host, "to": target, "reason": move.reason}
                actions.append(action)
                if not self.config.adaptive:
                    continue
                if host == self.bm.id:
                    local_moves.append((rid, target, move.reason))
                elif host:
                    decisions.setdefault(host, []).append(
                        {"rid": rid, "to": target, "reason": move.reason}
                    )
        self._record(trigger, stacks, nodes, plan, actions, sorted(pinned), notes)
        return decisions, local_moves

    def _merge(self, digests: list[dict[str, Any]]) -> _Merged:
        m = _Merged()
        window = self.config.window_s
        for d in digests:
            source = str(d.get("runtime", ""))
            span = max(float(d.get("span_s", 0.0)), 1e-3)
            speed = float(d.get("speed", 1.0))
            for o in d.get("objects", []):
                rid = o["rid"]
                # Reference CPU seconds per second: raw CPU at a node of speed R is
                # h·b/R, so h·b = raw·R. Over the time the object was there to count.
                seen = _observed(span, o.get("active_s"))
                m.cpu_ref_per_s[rid] = m.cpu_ref_per_s.get(rid, 0.0) + o["cpu_s"] * speed / seen
                if rid not in m.host or source == self.bm.id:
                    m.host[rid] = source
                    m.info[rid] = o
                    m.quiesce[rid] = d.get("quiesce_s")
            for e in d.get("edges", []):
                key = (e["caller"], e["callee"])
                seen = _observed(span, e.get("active_s"))
                m.edge_bytes_per_s[key] = m.edge_bytes_per_s.get(key, 0.0) + e["bytes"] / seen
                m.edge_calls_per_s[key] = m.edge_calls_per_s.get(key, 0.0) + e["calls"] / seen
                wait = max(0.0, e.get("stall_s", 0.0) - e.get("far_s", 0.0)) / seen
                m.edge_wait_per_s[key] = m.edge_wait_per_s.get(key, 0.0) + wait
        # Objects hosted here are here, whatever an older digest says.
        for rid in self.bm.table.hosted_ids():
            m.host[str(rid)] = self.bm.id
        del window
        return m

    def _stacks(
        self,
        m: _Merged,
        clients: dict[str, dict[str, Any]],
        local: dict[str, Any],
        notes: list[str],
    ) -> tuple[list[StackView], dict[str, NodeView]]:
        me = self.bm.id
        window = self.config.window_s
        nodes = {
            me: NodeView(
                me,
                float(local.get("speed", 1.0)),
                float(local.get("load", 0.0)),
                self.memory_capacity_bytes,
            )
        }
        stacks: list[StackView] = []
        callees: dict[str, list[tuple[float, str]]] = {}
        for (caller, callee), rate in m.edge_bytes_per_s.items():
            callees.setdefault(caller, []).append((rate, callee))
        for client, digest in clients.items():
            nodes[client] = NodeView(
                client, float(digest.get("speed", 1.0)), float(digest.get("load", 0.0))
            )
            link = digest.get("links", {}).get(me, {})
            for console in digest.get("consoles", []):
                chain = [console]
                while len(chain) <= STACK_DEPTH_MAX and chain[-1] in callees:
                    nxt = _next_in_chain(callees[chain[-1]], m.host.get(chain[-1]))
                    if nxt in chain:
                        break
                    chain.append(nxt)
                    if ObjectId.parse(nxt).is_anchored:
                        break  # a node's anchored object ends the stack
                last = chain[-1]
                if (
                    len(chain) >= 2
                    and not ObjectId.parse(last).is_anchored
                    and m.host.get(last) == me
                    and last not in callees
                ):
                    # An object here that called nothing below it this window (a cache
                    # whose reads all hit) still sits on our storage: the edge is idle.
                    chain.append(str(ObjectId.storage(me)))
                end = ObjectId.parse(chain[-1])
                if len(chain) < 3 or not (end.is_anchored and end.home == me):
                    continue  # not a stack through a mobile object to one of our anchored objects
                hosts = [client, *(m.host.get(r, "?") for r in chain[1:-1]), me]
                k = 0
                while k + 1 < len(hosts) and hosts[k + 1] == client:
                    k += 1
                if k >= len(chain) - 1 or any(h != me for h in hosts[k + 1 :]):
                    notes.append(f"{console}: objects on {hosts} are not one client/server split")
                    continue
                objects = []
                for j, rid in enumerate(chain):
                    info = m.info.get(rid, {})
                    anchored = j == 0 or j == len(chain) - 1
                    quiesce = m.quiesce.get(rid)
                    objects.append(
                        ObjectView(
                            rid,
                            m.cpu_ref_per_s.get(rid, 0.0) * window,
                            int(info.get("memory_bytes", 0)),
                            (not anchored) and bool(info.get("movable", False)),
                            int(info.get("checkpoint_bytes", 0)),
                            QUIESCE_S_DEFAULT if quiesce is None else float(quiesce),
                        )
                    )
                edges = tuple(
                    EdgeView(
                        m.edge_bytes_per_s.get((a, b), 0.0) * window,
                        m.edge_calls_per_s.get((a, b), 0.0) * window,
                        m.edge_wait_per_s.get((a, b), 0.0) * window,
                    )
                    for a, b in itertools.pairwise(chain)
                )
                bandwidth = link.get("bandwidth_bytes_per_s")
                peer = _fan_out(chain, callees, m, window)
                if peer is not None:
                    notes.append(
                        f"{console}: {chain[-2]} also calls other nodes "
                        f"({peer.bytes:.0f} B, {peer.calls:.0f} calls per window)"
                    )
                stacks.append(
                    StackView(
                        console,
                        client,
                        me,
                        tuple(objects),
                        edges,
                        k,
                        None if bandwidth is None else float(bandwidth),
                        float(link.get("latency_s", 0.0)),
                        peer,
                        PEER_BANDWIDTH_BYTES_PER_S,
                        PEER_LATENCY_S,
                    )
                )
        return stacks, nodes

    def _pinned(self, m: _Merged) -> set[str]:
        """Objects not to move now: moving already, moved less than a residence ago,
        or failed to move recently (back-off doubling with each failure)."""
        residence = self.config.residence_after_move_s
        pinned = {str(r) for r in self.bm.table.migrating_ids()}
        for rid, info in m.info.items():
            age = info.get("moved_age_s")
            if age is not None and age < residence:
                pinned.add(rid)
            failed_age, failures = info.get("failed_age_s"), int(info.get("failures", 0))
            backoff = self.config.retry_after_s * 2 ** min(failures - 1, RETRY_DOUBLINGS_MAX)
            if failed_age is not None and failures and failed_age < backoff:
                pinned.add(rid)
        for items in self.pending.values():
            pinned.update(d["rid"] for _, d in items)
        return pinned

    # --- the decision log ---------------------------------------------------------------

    def _record(
        self,
        trigger: str,
        stacks: list[StackView],
        nodes: dict[str, NodeView],
        plan: Plan,
        actions: list[dict[str, Any]],
        pinned: list[str],
        notes: list[str],
    ) -> None:
        self._seq += 1
        record = {
            "seq": self._seq,
            "t": round(time.time(), 6),
            "node": self.bm.id,
            "trigger": trigger,
            "adaptive": self.config.adaptive,
            "nodes": {
                n.node_id: {
                    "speed": n.speed,
                    "load": round(n.load, 4),
                    "memory_capacity_bytes": n.memory_capacity_bytes,
                }
                for n in nodes.values()
            },
            "stacks": [_stack_json(s) for s in stacks],
            "pinned": pinned,
            **plan.to_json(),
            "actions": actions,
        }
        if notes:
            record["notes"] = [*record.get("notes", []), *notes]
        self.records.append(record)
        if self._log_path is not None:
            try:
                if self._log_path.exists() and self._log_path.stat().st_size > LOG_FILE_BYTES_MAX:
                    self._log_path.replace(self._log_path.with_suffix(".jsonl.1"))
                with open(self._log_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            except OSError as exc:
                log.warning("cannot append to the decision log %s: %s", self._log_path, exc)

    def log_since(self, seq: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        out = [r for r in list(self.records) if r["seq"] > seq]
        return out[-limit:]


#: The nodes' own network, for a fan-out object at a node calling the others: the
#: nodes of a cluster share a fast network (loopback here; the servers' SAN in
#: ABACUS), taken as unlimited with no latency next to the client's links.
PEER_BANDWIDTH_BYTES_PER_S: float | None = None
PEER_LATENCY_S = 0.0


def _next_in_chain(out: list[tuple[float, str]], host: str | None) -> str:
    """The callee a stack continues through: the one with the most bytes, except that
    an object calling anchored objects on several nodes (a RAID object) continues to
    the one on the node it runs on, so that node alone owns the stack's decisions."""
    if host is not None:
        for _, callee in out:
            rid = ObjectId.parse(callee)
            if rid.is_anchored and rid.home == host:
                return callee
    return max(out)[1]


def _fan_out(
    chain: list[str],
    callees: dict[str, list[tuple[float, str]]],
    m: _Merged,
    window: float,
) -> EdgeView | None:
    """Traffic from the stack's last mobile object to anchored objects on nodes other
    than the stack's end (None if it calls only the one)."""
    end = chain[-1]
    others = [
        callee
        for _, callee in callees.get(chain[-2], [])
        if callee != end and ObjectId.parse(callee).is_anchored
    ]
    if not others:
        return None
    return EdgeView(
        sum(m.edge_bytes_per_s.get((chain[-2], c), 0.0) for c in others) * window,
        sum(m.edge_calls_per_s.get((chain[-2], c), 0.0) for c in others) * window,
    )


#: Shortest observation a rate is computed over (a call or two is not a rate).
OBSERVED_S_MIN = 0.05


def _observed(span_s: float, active_s: Any) -> float:
    """The seconds a count was gathered over: the window, or less if the object or
    edge is younger than the window."""
    seen = span_s if active_s is None else min(span_s, float(active_s))
    return max(seen, OBSERVED_S_MIN)


def _stack_json(s: StackView) -> dict[str, Any]:
    return {
        "stack": s.stack_id,
        "client": s.client,
        "server": s.server,
        "split": s.split,
        "bandwidth_bytes_per_s": s.bandwidth_bytes_per_s,
        "latency_s": s.latency_s,
        "objects": [
            {
                "rid": o.rid,
                "cpu_s": round(o.cpu_s, 6),
                "memory_bytes": o.memory_bytes,
                "migratable": o.migratable,
                "checkpoint_bytes": o.checkpoint_bytes,
                "quiesce_s": round(o.quiesce_s, 6),
            }
            for o in s.objects
        ],
        "edges": [
            {
                "bytes": round(e.bytes),
                "calls": round(e.calls, 3),
                "measured_s": round(e.measured_s, 6),
            }
            for e in s.edges
        ],
        # C_k at the split in force: the paper's estimate and what the model charged.
        "stall_s": {
            "modelled": round(modelled_stall_s(s, s.split), 6),
            "priced": round(stall_s(s, s.split), 6),
        },
        "peer": None
        if s.peer is None
        else {"bytes": round(s.peer.bytes), "calls": round(s.peer.calls, 3)},
    }


def _link_profile(digest: dict[str, Any], node_id: str) -> Any:
    """The client's link profile to this node (to shape calls back to the client)."""
    from shuttle.net.profiles import LinkProfile

    link = digest.get("links", {}).get(node_id)
    if not isinstance(link, dict):
        return None
    bw = link.get("bandwidth_bytes_per_s")
    try:
        return LinkProfile(
            str(link.get("name", "client")),
            None if bw is None else float(bw) * 8,
            float(link.get("latency_s", 0.0)),
        )
    except Exception:  # a malformed profile only costs the shaping of calls back
        return None


def read_log(path: Path) -> list[dict[str, Any]]:
    """Records of a decision log file (JSON lines), skipping torn lines."""
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out
