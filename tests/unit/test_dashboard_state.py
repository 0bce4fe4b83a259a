"""The dashboard's state from nodes' answers (no node, no browser): rates between two
polls, client and node sites, one move per migration, anchored objects left out."""

from __future__ import annotations

from typing import Any

from shuttle.apps.dashboard import _Sample, move, node_rates, objects_and_edges, site
from shuttle.client import Client
from shuttle.client.model import NodeAddress

NODES = [NodeAddress("n1", "127.0.0.1", 7401, None), NodeAddress("n2", "127.0.0.1", 7402, None)]


def _client() -> Client:
    return Client(NODES)  # no connection is made: nothing is asked of the nodes


def test_rates_between_two_polls_and_none_after_a_restart() -> None:
    rates = node_rates(_Sample(10.0, 1000, 500, 10), _Sample(12.0, 5000, 900, 30))
    assert rates == {"bytes_in_per_s": 2000.0, "bytes_out_per_s": 200.0, "requests_per_s": 10.0}
    restarted = node_rates(_Sample(10.0, 1000, 500, 10), _Sample(11.0, 10, 5, 1))
    assert set(restarted.values()) == {0.0}


def test_a_migration_is_a_move_from_a_client_to_a_node_with_its_reason() -> None:
    client = _client()
    assert site("n2", client) == "node n2" and site("c-vm-1-ab", client) == "client c-vm-1-ab"
    event = {"t": 5.0, "rid": "c-vm-1-ab/x-1", "from": "c-vm-1-ab", "to": "n2", "ok": True}
    shown = move({**event, "reason": "net benefit 0.8 s > B_thresh 0.3 s"}, client)
    assert (shown["from"], shown["to"], shown["reason"]) == (
        "client c-vm-1-ab",
        "node n2",
        "net benefit 0.8 s > B_thresh 0.3 s",
    )
    failed = move({**event, "ok": False, "reason": "r", "error": "target busy"}, client)
    assert failed["reason"] == "target busy" and not failed["ok"]


def test_objects_leave_out_anchored_services_and_count_each_client_once() -> None:
    digest: dict[str, Any] = {
        "span_s": 2.0,
        "objects": [
            {"rid": "c-1/g-1", "type": "grep", "cpu_s": 1.0, "calls": 4, "memory_bytes": 10}
        ],
        "edges": [
            {"caller": "c-1/g-1", "callee": "n1/storage", "bytes": 4000, "calls": 4}
            | {"stall_s": 0.2, "remote": True}
        ],
    }
    view: dict[str, Any] = {
        "span_s": 1.0,
        "objects": [
            {"rid": "n1/storage", "type": "storage", "state": "open", "policy": "anchored"}
            | {"memory_bytes": 0, "since_s": 9.0},
            {"rid": "c-2/f-1", "type": "filter", "state": "open", "policy": "auto"}
            | {"memory_bytes": 5, "since_s": 1.5},
        ],
        "window": {"c-2/f-1": {"calls": 10, "cpu_s": 0.5, "bytes_in": 100, "bytes_out": 50}},
        "edges": [],
        "clients": {"c-1": digest},
    }
    out = objects_and_edges({"n1": view, "n2": {**view, "objects": []}}, _client())
    assert [(o["object"], o["runs_at"]) for o in out["objects"]] == [
        ("c-2/f-1", "node n1"),
        ("c-1/g-1", "client c-1"),
    ]
    filt = out["objects"][0]
    assert (filt["cpu_pct"], filt["calls_per_s"], filt["bytes_in_per_s"]) == (50.0, 10.0, 100.0)
    (edge,) = out["edges"]
    assert (edge["bytes_per_s"], edge["calls_per_s"], edge["stall_ms_per_call"]) == (
        2000.0,
        2.0,
        50.0,
    )
