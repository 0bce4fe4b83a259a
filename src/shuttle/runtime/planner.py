"""The resource manager (ABACUS 5.3-5.4 at the server): digests in, decisions out.

Every run-time summarises what its monitor saw over the last window in a *digest*
(:class:`~shuttle.runtime.digest.Digest`): its speed and load, the objects it hosts
with their CPU, memory and checkpoint size, and the edges its objects called along
with their bytes and calls. Clients push theirs to the nodes their stacks use every
``H`` (and a new stack's first one after ``H/4``); ABACUS's clients did not, and it
adapted late.

A node's :class:`ResourceManager` keeps the fresh digests, the clients it heard
from, the decisions waiting for their client, and the decision log, under one lock.
The decision itself is pure: :func:`~shuttle.runtime.planner_input.model_input`
turns the digests, the node's own measurements and its location table's facts into
the model's stacks, :func:`~shuttle.runtime.placement.choose` decides, and
:func:`~shuttle.runtime.planner_input.route_moves` says who acts. Moves of objects
hosted on a client go back to that client in the digest's reply (the client is the
source and drives the migration); moves of objects hosted here the node starts
itself. Every evaluation is recorded in the decision log with its inputs, the
candidate placements, their predicted times, and what was done; the log file is
written after the lock is let go, so a slow disk delays no digest's evaluation.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from shuttle.errors import InvalidArgumentError
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import Digest
from shuttle.runtime.locations import LocationTable
from shuttle.runtime.peers import Peers
from shuttle.runtime.placement import (
    NodeView,
    Plan,
    StackView,
    choose,
    modelled_stall_s,
    stall_s,
)
from shuttle.runtime.placement_climb import AdmissionClimb
from shuttle.runtime.planner_input import (
    ModelInput,
    NodeFacts,
    PlannerKnobs,
    arrivals_unobserved,
    model_input,
    route_moves,
)

log = logging.getLogger("shuttle.runtime")

#: A digest older than this many windows no longer describes a running application.
DIGEST_STALE_WINDOWS = 3.0
#: Decision-log records kept in memory for ``shuttle placement log``.
LOG_RECORDS_MAX = 2000
#: A decision for a client not delivered within this many windows is dropped: the
#: conditions it was made for have passed.
DECISION_TTL_WINDOWS = 2.0
#: The decision log file is rotated (to .jsonl.1) past this size.
LOG_FILE_BYTES_MAX = 64 << 20
#: A node evaluates once it has heard from every client since its last evaluation (a
#: round), or after this many windows at the latest. One client: every digest, as
#: before. 64 clients each sending a digest every H made 64 evaluations a second over
#: 128 stacks each, and the planner, not the objects, saturated the node.
ROUND_WINDOWS_MAX = 0.5
#: With at most this many clients a node evaluates on every digest, as before rounds:
#: a round delays every client's decision but the last one's to its next digest, a
#: window later (ABACUS 6.5's four directory clients moved at 0.09-0.54 s instead of
#: by 0.21 s, and its adaptive run went from 1.07x to 1.40x the node's static run),
#: while a few clients' evaluations cost the node little (8 stacks, ~16 a second).
ROUND_CLIENTS_MIN = 4

Decision = dict[str, str]
LocalMove = tuple[str, str, str]


class ResourceManager:
    """Node ``node_id``'s placement decisions over the stacks that use its storage.

    ``locations`` is the node's location table (read for the objects hosted here and
    those moving away), ``peers`` learns where a client listens from its digest,
    ``local_digest`` gives the node's own digest, ``clock`` (monotonic) ages digests
    and decisions, and ``wall_clock`` stamps the decision log."""

    def __init__(
        self,
        node_id: str,
        config: RuntimeConfig,
        *,
        peers: Peers,
        locations: LocationTable,
        local_digest: Callable[[], Digest],
        memory_capacity_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.placement = config.placement()
        self.knobs = PlannerKnobs(
            config.window_s, config.residence_after_move_s, config.retry_after_s
        )
        self.peers = peers
        self.locations = locations
        self.local_digest = local_digest
        self.memory_capacity_bytes = memory_capacity_bytes
        self.clock = clock
        self.wall_clock = wall_clock
        self.digests: dict[str, tuple[float, Digest]] = {}
        #: When each client run-time was last heard from (its objects' lease).
        self.heard: dict[str, float] = {}
        #: Decisions for clients, delivered with the reply to their next digest (if
        #: it comes soon enough to still be meant).
        self.pending: dict[str, list[tuple[float, Decision]]] = {}
        #: The decision log in memory: each record as its JSON line with its ``seq``
        #: (``config.log_as_text``), or as the dict (as before). A record at 64 clients
        #: is about 7,000 objects; as dicts 2,000 of them made every full collection of
        #: the node traverse millions, 150 ms at a few hundred (docs/runtime.md, "The
        #: node profiled"), charged 20-fold to the call it landed in on a slow node.
        self.records: deque[tuple[int, str] | dict[str, Any]] = deque(maxlen=LOG_RECORDS_MAX)
        self._as_text = config.log_as_text
        self.evaluations = 0
        #: Clients heard from since the last evaluation, and when that was.
        self._round: set[str] = set()
        self._evaluated_at = -float("inf")
        #: Objects this node decided to move to itself and has not observed here for a
        #: window yet: rid -> when decided (the many-clients rule's arrivals).
        self._arriving: dict[str, float] = {}
        #: The servers whose CPU budget the clients' saturation raised at the last
        #: evaluation (held while the node is the bound: ``PlacementConfig.saturated_hold``).
        self._raised: frozenset[str] = frozenset()
        #: The admission edge climbed on the clients' measured calls a second
        #: (``--cpu-climb``; None: the fixed budget).
        self.climb = (
            AdmissionClimb(
                self.placement.server_cpu_share_max,
                self.placement.server_cpu_share_evict,
                config.window_s,
            )
            if config.cpu_climb
            else None
        )
        self._seq = 0
        self._lock = threading.Lock()
        self._log_path = config.decision_log
        #: Records evaluated but not yet in the log file (written in ``seq`` order
        #: under ``_file_lock``, after ``_lock`` is let go).
        self._unwritten: list[str | dict[str, Any]] = []
        self._file_lock = threading.Lock()
        if self._log_path is not None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)

    # --- digests ---------------------------------------------------------------------

    def receive(self, raw: Any) -> tuple[list[Decision], list[LocalMove]]:
        """Take a client's digest (from the wire: checked here, once); returns
        (decisions for that client, moves this node must start: (rid, target,
        reason)). :class:`InvalidArgumentError` names a malformed digest's first bad
        field; nothing is kept from it."""
        digest = raw if isinstance(raw, Digest) else Digest.parse(raw)
        client = digest.runtime
        if client == self.node_id:
            raise InvalidArgumentError(
                f"a digest claims to come from {client}, this node itself; a client "
                "run-time names itself in its digests"
            )
        if digest.address:
            self.peers.learn(client, digest.address, _link_profile(digest, self.node_id))
        with self._lock:
            now = self.clock()
            self.digests[client] = (now, digest)
            self.heard[client] = now
            self._round.add(client)
            decisions: dict[str, tuple[Decision, ...]] = {}
            local: list[LocalMove] = []
            if self._round_complete(now):
                decisions, local = self.evaluate(trigger=client)
                self._round.clear()
                self._evaluated_at = now
            horizon = now - DECISION_TTL_WINDOWS * self.config.window_s
            mine = [d for t, d in self.pending.pop(client, []) if t >= horizon]
            mine += decisions.pop(client, ())
            for other, items in decisions.items():
                self.pending.setdefault(other, []).extend((now, d) for d in items)
        self._write_log()
        return mine, local

    def _round_complete(self, now: float) -> bool:
        """Whether to evaluate now: every client with a fresh digest has sent one since
        the last evaluation, or :data:`ROUND_WINDOWS_MAX` windows have passed; with
        :data:`ROUND_CLIENTS_MIN` clients or fewer, always."""
        if now - self._evaluated_at >= ROUND_WINDOWS_MAX * self.config.window_s:
            return True
        fresh = set(self.fresh_digests())
        return len(fresh) <= ROUND_CLIENTS_MIN or fresh <= self._round

    def forget(self, client: str) -> None:
        """A client run-time closed: drop its digest and anything pending for it."""
        with self._lock:
            self.digests.pop(client, None)
            self.pending.pop(client, None)

    def snapshot_digests(self) -> dict[str, dict[str, Any]]:
        """The fresh digests as plain maps (a copy, safe to read while evaluations
        run; ``runtime.placement``'s ``clients``)."""
        with self._lock:
            return {c: d.to_wire() for c, d in self.fresh_digests().items()}

    def fresh_digests(self) -> dict[str, Digest]:
        """The digests younger than ``DIGEST_STALE_WINDOWS`` windows; older ones are
        dropped. Call under the lock."""
        horizon = self.clock() - DIGEST_STALE_WINDOWS * self.config.window_s
        for client in [c for c, (t, _) in self.digests.items() if t < horizon]:
            del self.digests[client]
        return {c: d for c, (_, d) in self.digests.items()}

    # --- evaluation ------------------------------------------------------------------

    def facts(self) -> NodeFacts:
        """What the node knows of itself now, besides its digest."""
        return NodeFacts(
            self.node_id,
            self.memory_capacity_bytes,
            frozenset(str(r) for r in self.locations.hosted_ids()),
            frozenset(str(r) for r in self.locations.migrating_ids()),
            frozenset(d["rid"] for items in self.pending.values() for _, d in items),
        )

    def evaluate(
        self, trigger: str = ""
    ) -> tuple[dict[str, tuple[Decision, ...]], list[LocalMove]]:
        """Decide over every stack using this node (call under the lock). Returns
        decisions per client and the moves this node starts itself."""
        # The evaluation's own CPU, in its record: it is the node's too, and with many
        # clients it counts against the budget its hosted objects share.
        started_cpu = time.thread_time()
        local, facts, now = self.local_digest(), self.facts(), self.clock()
        given = model_input(local, self.fresh_digests(), facts, self.knobs)
        if not given.stacks:
            return {}, []
        self._arriving = arrivals_unobserved(
            self._arriving, local, facts.hosted, now, self.config.window_s
        )
        config = self.placement
        send_back: dict[str, str] = {}
        climbing: dict[str, Any] | None = None
        if self.climb is not None and config.aggregate(len({s.client for s in given.stacks})):
            # The clients' aggregate calls a second, by their latest windows: the
            # objective the admission edge climbs on (docs/runtime.md).
            rate = sum(s.edges[0].calls for s in given.stacks) / config.window_s
            settled = not self._arriving and not facts.migrating
            # Over the clients with a fresh digest (their stacks come and go with
            # their calls' kinds from one window to the next).
            share = self.climb.observe(now, rate, settled, self.digests)
            config = replace(config, server_cpu_share_max=share)
            send_back = self.climb.send_back(now)
            climbing = {
                "share": share,
                "state": self.climb.state,
                "rate": round(rate, 3),
                "settled": settled,
                "last": self.climb.last,
            }
        plan = choose(
            given.stacks,
            given.nodes,
            config,
            pinned=given.pinned,
            arriving={self.node_id: len(self._arriving)},
            send_back=send_back,
            raised_before=self._raised,
        )
        self._raised = plan.raised
        self.evaluations += 1
        routing = route_moves(plan, given, self.node_id, adaptive=self.config.adaptive)
        if self.config.adaptive:
            # One object per stack (the first to move) stands for its stack's arrival.
            self._arriving.update({m.rids[0]: now for m in plan.executed if m.to_server})
            if climbing is not None and self.climb is not None:
                self.climb.arrived(m.stack_id for m in plan.executed if m.to_server)
                self.climb.left(m.stack_id for m in plan.executed if not m.to_server)
        cpu_s = time.thread_time() - started_cpu
        self._record(trigger, given, plan, list(routing.actions), climbing, cpu_s)
        return dict(routing.decisions), list(routing.local_moves)

    # --- the decision log ---------------------------------------------------------------

    def _record(
        self,
        trigger: str,
        given: ModelInput,
        plan: Plan,
        actions: list[dict[str, str]],
        climbing: dict[str, Any] | None = None,
        cpu_s: float | None = None,
    ) -> None:
        self._seq += 1
        record: dict[str, Any] = {
            "seq": self._seq,
            "t": round(self.wall_clock(), 6),
            "node": self.node_id,
            "trigger": trigger,
            "adaptive": self.config.adaptive,
            "nodes": _nodes_json(given.nodes),
            "stacks": [_stack_json(s) for s in given.stacks],
            "pinned": sorted(given.pinned),
            **plan.to_json(),
            "actions": actions,
        }
        if cpu_s is not None:
            record["cpu_s"] = round(cpu_s, 6)
        if given.notes:
            record["notes"] = [*record.get("notes", []), *given.notes]
        if climbing is not None:
            record["climb"] = climbing
        kept: str | dict[str, Any] = record
        if self._as_text:
            # Encoded once, here, for the memory and the file alike: a str is nothing a
            # collection looks into.
            kept = json.dumps(record)
            self.records.append((self._seq, kept))
        else:
            self.records.append(record)
        if self._log_path is not None:
            self._unwritten.append(kept)

    def _write_log(self) -> None:
        """Append the records evaluated so far to the log file, in order (outside
        ``_lock``: the file's I/O holds up no evaluation)."""
        if self._log_path is None:
            return
        with self._file_lock:
            with self._lock:
                records, self._unwritten = self._unwritten, []
            if not records:
                return
            try:
                if self._log_path.exists() and self._log_path.stat().st_size > LOG_FILE_BYTES_MAX:
                    self._log_path.replace(self._log_path.with_suffix(".jsonl.1"))
                with open(self._log_path, "a") as f:
                    f.writelines(
                        (r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records
                    )
            except OSError as exc:
                log.warning("cannot append to the decision log %s: %s", self._log_path, exc)

    def log_since(self, seq: int = 0, limit: int = 200) -> list[dict[str, Any]]:
        out = [r for r in list(self.records) if _seq_of(r) > seq][-limit:]
        return [json.loads(r[1]) if isinstance(r, tuple) else r for r in out]


def _seq_of(record: tuple[int, str] | dict[str, Any]) -> int:
    return record[0] if isinstance(record, tuple) else int(record["seq"])


def _nodes_json(nodes: Mapping[str, NodeView]) -> dict[str, Any]:
    return {
        n.node_id: {
            "speed": n.speed,
            "load": round(n.load, 4),
            "calls_in_progress": round(n.calls_in_progress, 4),
            "memory_capacity_bytes": n.memory_capacity_bytes,
            **({} if n.cpus_busy is None else {"cpus_busy": round(n.cpus_busy, 3)}),
        }
        for n in nodes.values()
    }


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
                "in_flight": e.in_flight,
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


def _link_profile(digest: Digest, node_id: str) -> Any:
    """The client's link profile to this node (to shape calls back to the client)."""
    from shuttle.net.profiles import LinkProfile

    link = digest.links.get(node_id)
    if link is None:
        return None
    bw = link.bandwidth_bytes_per_s
    try:
        return LinkProfile(link.name, None if bw is None else bw * 8, link.latency_s)
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
