"""``shuttle dashboard``: a local web page that shows the cluster live.

The page (``dashboard.html``, static, plain JavaScript) polls one JSON endpoint,
``/api/state``, which this module builds from what the nodes already report, asked of
every node on each poll (at most every :data:`GATHER_INTERVAL_S`):

* ``node.stats``: each node's load (ready threads averaged over H, as the placement
  model sees it), requests, bytes in and out (turned into rates between two polls),
  and its disk's capacity and free space;
* ``runtime.objects``: the mobile objects each node hosts (and those at clients, as
  their last digest reported them) with their measured CPU, calls and bytes over the
  window H; the edges between objects with their bytes, calls and stall; the recent
  migrations with their reasons;
* ``runtime.log``: the placement model's evaluations that proposed a move (the same
  records the nodes append to ``DATA/.shuttle/runtime/placement.jsonl``).

Everything is read-only: the dashboard holds a client of the cluster (its key, when
the cluster has one) and answers anyone who can reach its port, so it listens on
127.0.0.1 unless told otherwise (docs/security.md, "The dashboard").
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from shuttle.client.client import Client
from shuttle.errors import ShuttleError
from shuttle.runtime import values
from shuttle.runtime.ids import ObjectId

#: A poll within this long of the last gathering is answered from it: several open
#: pages (or a page's retries) cost the nodes one round of questions.
GATHER_INTERVAL_S = 0.5
#: Migrations and decisions kept for the page (the nodes keep their last 50 each).
MOVES_MAX = 100
DECISIONS_MAX = 30
#: How often the page polls (it reads it from the state; the CLI's --interval).
POLL_S_DEFAULT = 1.0

PAGE = "dashboard.html"


@dataclass
class _Sample:
    """A node's cumulative counters at one poll, for rates between two polls."""

    t: float
    bytes_in: int
    bytes_out: int
    requests: int


@dataclass
class Gatherer:
    """Asks every node of ``client``'s cluster what it reports and merges the answers
    into the page's state (:meth:`state`). Thread-safe: the HTTP server's threads share
    one gatherer, and one gathering at a time runs."""

    client: Client
    poll_s: float = POLL_S_DEFAULT
    clock: Callable[[], float] = time.monotonic
    _samples: dict[str, _Sample] = field(default_factory=dict)
    _moves: dict[tuple[str, str, str, int], dict[str, Any]] = field(default_factory=dict)
    _log_seq: dict[str, int] = field(default_factory=dict)
    _decisions: list[dict[str, Any]] = field(default_factory=list)
    _last: tuple[float, dict[str, Any]] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def state(self) -> dict[str, Any]:
        """The page's state: at most :data:`GATHER_INTERVAL_S` old."""
        with self._lock:
            now = self.clock()
            if self._last is not None and now - self._last[0] < GATHER_INTERVAL_S:
                return self._last[1]
            state = self._gather(now)
            self._last = (now, state)
            return state

    def _gather(self, now: float) -> dict[str, Any]:
        stats: dict[str, dict[str, Any]] = {}
        views: dict[str, dict[str, Any]] = {}
        for node in self.client.nodes:
            try:
                stats[node.node_id] = self.client.node_stats(node)
            except ShuttleError as exc:
                stats[node.node_id] = {"error": str(exc)}
                continue
            try:
                views[node.node_id] = self._call(node.node_id, "runtime.objects", {})
                records = self._call(
                    node.node_id,
                    "runtime.log",
                    {"since": self._log_seq.get(node.node_id, 0), "limit": 200},
                )
            except ShuttleError as exc:
                views[node.node_id] = {"error": str(exc)}
                continue
            if records:
                self._log_seq[node.node_id] = records[-1]["seq"]
                self._decisions += [decision(r) for r in records if r.get("moves")]
        self._decisions = self._decisions[-DECISIONS_MAX:]
        for view in views.values():
            for event in view.get("events", []):
                # A migration is recorded at its source and at its target: keep one.
                key = (event["rid"], event["from"], event["to"], round(event["t"]))
                self._moves.setdefault(key, move(event, self.client))
        while len(self._moves) > MOVES_MAX:
            del self._moves[min(self._moves, key=lambda k: self._moves[k]["t"])]
        return {
            "time": time.time(),
            "poll_s": self.poll_s,
            "nodes": [
                self._node(n.node_id, n.address, stats[n.node_id], now) for n in self.client.nodes
            ],
            **objects_and_edges(views, self.client),
            "moves": sorted(self._moves.values(), key=lambda m: m["t"], reverse=True),
            "decisions": list(reversed(self._decisions)),
        }

    def _call(self, node_id: str, op: str, args: dict[str, Any]) -> Any:
        response = self.client.connection(self.client.node(node_id)).call(op, args)
        return values.unpack(response.payload)

    def _node(
        self, node_id: str, address: str, stats: dict[str, Any], now: float
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"id": node_id, "address": address}
        if "error" in stats:
            return {**out, "error": stats["error"]}
        server, runtime = stats.get("server", {}), stats.get("runtime", {})
        space = stats.get("store", {}).get("space", {})
        sample = _Sample(
            now,
            int(server.get("bytes_in", 0)),
            int(server.get("bytes_out", 0)),
            int(server.get("requests", 0)),
        )
        before = self._samples.get(node_id)
        self._samples[node_id] = sample
        rates = (
            node_rates(before, sample)
            if before is not None
            else {"bytes_in_per_s": 0.0, "bytes_out_per_s": 0.0, "requests_per_s": 0.0}
        )
        return {
            **out,
            "load": runtime.get("load"),
            "speed": runtime.get("speed"),
            "hosted": runtime.get("hosted"),
            "migrations": runtime.get("migrations"),
            "requests": sample.requests,
            "bytes_in": sample.bytes_in,
            "bytes_out": sample.bytes_out,
            **rates,
            "connections": server.get("connections_open"),
            "uptime_s": server.get("uptime_s"),
            "capacity_bytes": space.get("total_bytes"),
            "free_bytes": space.get("free_bytes"),
        }


def node_rates(before: _Sample, after: _Sample) -> dict[str, float]:
    """Bytes and requests per second between two polls (0 over no time, or after a
    restart reset the counters)."""
    span = after.t - before.t
    if span <= 0:
        return {"bytes_in_per_s": 0.0, "bytes_out_per_s": 0.0, "requests_per_s": 0.0}

    def rate(a: int, b: int) -> float:
        return max(0.0, (b - a) / span)

    return {
        "bytes_in_per_s": rate(before.bytes_in, after.bytes_in),
        "bytes_out_per_s": rate(before.bytes_out, after.bytes_out),
        "requests_per_s": rate(before.requests, after.requests),
    }


def site(runtime_id: str, client: Client) -> str:
    """``node n2`` for a node's id, ``client <id>`` for any other run-time."""
    node_ids = {n.node_id for n in client.nodes}
    return f"node {runtime_id}" if runtime_id in node_ids else f"client {runtime_id}"


def move(event: dict[str, Any], client: Client) -> dict[str, Any]:
    """A migration as the page shows it."""
    return {
        "t": event["t"],
        "object": event["rid"],
        "from": site(event["from"], client),
        "to": site(event["to"], client),
        "ok": bool(event["ok"]),
        "reason": event["reason"] if event["ok"] else event.get("error") or event["reason"],
        "seconds": event.get("elapsed_s", 0.0),
    }


def decision(record: dict[str, Any]) -> dict[str, Any]:
    """A placement evaluation that proposed moves, reduced to what the page shows."""
    return {
        "t": record["t"],
        "node": record["node"],
        "loads": {n: v.get("load") for n, v in record.get("nodes", {}).items()},
        "moves": [
            {
                "objects": m["objects"],
                "direction": m["direction"],
                "benefit_s": m["benefit_s"],
                "cost_s": m["cost_s"],
                "execute": m["execute"],
                "reason": m["reason"],
            }
            for m in record.get("moves", [])
        ],
    }


def objects_and_edges(views: dict[str, dict[str, Any]], client: Client) -> dict[str, Any]:
    """Mobile objects (not the nodes' anchored services) and the edges between objects,
    with rates over each reporter's window, from the nodes' views and the clients'
    digests they hold (each client once)."""
    objects: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    clients_seen: set[str] = set()

    def per_s(x: float, span: float) -> float:
        return x / span if span > 0 else 0.0

    def edge(e: dict[str, Any], span: float, where: str) -> dict[str, Any]:
        calls = e["calls"]
        return {
            "caller": e["caller"],
            "callee": e["callee"],
            "bytes_per_s": per_s(e["bytes"], span),
            "calls_per_s": per_s(calls, span),
            "stall_ms_per_call": 1e3 * e["stall_s"] / calls if e["remote"] and calls else None,
            "remote": bool(e["remote"]),
            "measured_at": where,
        }

    for node_id, view in views.items():
        if "error" in view:
            continue
        span = float(view.get("span_s", 0.0))
        window = view.get("window", {})
        for o in view.get("objects", []):
            if ObjectId.parse(o["rid"]).is_anchored:
                continue
            w = window.get(o["rid"], {})
            objects.append(
                {
                    "object": o["rid"],
                    "type": o["type"],
                    "runs_at": f"node {node_id}",
                    "state": o["state"],
                    "policy": o["policy"],
                    "cpu_pct": 100 * per_s(w.get("cpu_s", 0.0), span),
                    "calls_per_s": per_s(w.get("calls", 0), span),
                    "bytes_in_per_s": per_s(w.get("bytes_in", 0), span),
                    "bytes_out_per_s": per_s(w.get("bytes_out", 0), span),
                    "memory_bytes": o["memory_bytes"],
                    "here_s": o["since_s"],
                }
            )
        edges += [edge(e, span, f"node {node_id}") for e in view.get("edges", [])]
        for client_id, digest in view.get("clients", {}).items():
            if client_id in clients_seen:
                continue
            clients_seen.add(client_id)
            cspan = float(digest.get("span_s", 0.0))
            for o in digest.get("objects", []):
                objects.append(
                    {
                        "object": o["rid"],
                        "type": o["type"],
                        "runs_at": site(client_id, client),
                        "state": "open",
                        "policy": "auto" if o.get("movable") else "static",
                        "cpu_pct": 100 * per_s(o["cpu_s"], cspan),
                        "calls_per_s": per_s(o["calls"], cspan),
                        "bytes_in_per_s": None,
                        "bytes_out_per_s": None,
                        "memory_bytes": o["memory_bytes"],
                        "here_s": None,
                    }
                )
            edges += [edge(e, cspan, site(client_id, client)) for e in digest.get("edges", [])]
    return {"objects": objects, "edges": edges}


def page_bytes() -> bytes:
    """The static page (package data beside this module)."""
    return resources.files("shuttle.apps").joinpath(PAGE).read_bytes()


def make_server(gatherer: Gatherer, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server of the page (``/``) and its state (``/api/state``); ``port`` 0
    picks a free one (``server.server_address`` says which)."""
    page = page_bytes()

    class Handler(BaseHTTPRequestHandler):
        server_version = "shuttle-dashboard"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, "text/html; charset=utf-8", page)
            elif path == "/api/state":
                try:
                    body = json.dumps(gatherer.state(), default=_jsonable).encode()
                except Exception as exc:  # the page shows it and polls again
                    body = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
                    self._send(HTTPStatus.SERVICE_UNAVAILABLE, "application/json", body)
                    return
                self._send(HTTPStatus.OK, "application/json", body)
            else:
                self._send(HTTPStatus.NOT_FOUND, "text/plain", b"not found: try /\n")

        def _send(self, status: HTTPStatus, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a poll a second would flood the terminal

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server


def _jsonable(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else str(value)
