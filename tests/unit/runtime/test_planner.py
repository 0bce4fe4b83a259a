"""The resource manager: digests from a client and the node's own view become
stacks, the model decides, and decisions go to whoever hosts the object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import Digest
from shuttle.runtime.locations import LocationTable
from shuttle.runtime.peers import Peers
from shuttle.runtime.planner import ResourceManager, read_log
from shuttle.runtime.planner_input import NodeFacts, PlannerKnobs, model_input
from shuttle.testing import FakeClock

CLIENT = "c-test"
GREP = f"{CLIENT}/g-1"
CONSOLE = f"{CLIENT}/console-t"
STORAGE = "n1/storage"


def client_digest(*, moved_age_s: float | None = None, span_s: float = 0.5) -> dict[str, Any]:
    """Half a second at the client over a 10 Mbit/s link: the grep read 600 KB and
    passed 6 KB up, with 10 ms of CPU."""
    return {
        "runtime": CLIENT,
        "address": "127.0.0.1:1",
        "speed": 1.0,
        "load": 0.3,
        "span_s": span_s,
        "objects": [
            {
                "rid": GREP,
                "type": "grep",
                "cpu_s": 0.01,
                "calls": 5,
                "memory_bytes": 1000,
                "movable": True,
                "checkpoint_bytes": 200,
                "quiesce_s": None,
                "moved_age_s": moved_age_s,
            }
        ],
        "edges": [
            {
                "caller": CONSOLE,
                "callee": GREP,
                "bytes": 6_000,
                "calls": 5,
                "stall_s": 0,
                "remote": False,
            },
            {
                "caller": GREP,
                "callee": STORAGE,
                "bytes": 600_000,
                "calls": 10,
                "stall_s": 0.45,
                "remote": True,
            },
        ],
        "consoles": [CONSOLE],
        "links": {"n1": {"name": "lan", "bandwidth_bytes_per_s": 1.25e6, "latency_s": 0.0005}},
        "quiesce_s": None,
    }


def node_digest(load: float = 0.1) -> Digest:
    return Digest("n1", speed=1.0, load=load, span_s=1.0)


def resource_manager(config: RuntimeConfig, clock: FakeClock | None = None) -> ResourceManager:
    """A node's resource manager with nothing hosted: no binding manager needed."""
    return ResourceManager(
        "n1",
        config,
        peers=Peers(),
        locations=LocationTable("n1"),
        local_digest=node_digest,
        clock=(clock or FakeClock(100.0)).now,
        wall_clock=lambda: 1_700_000_000.0,
    )


@pytest.fixture
def manager(tmp_path: Path) -> Any:
    clock = FakeClock(100.0)
    config = RuntimeConfig(decision_log=tmp_path / "placement.jsonl")
    return resource_manager(config, clock), clock


def test_a_client_digest_becomes_a_stack_and_a_decision_for_that_client(manager: Any) -> None:
    rm, _ = manager
    decisions, local_moves = rm.receive(client_digest())
    assert local_moves == []
    assert [(d["rid"], d["to"]) for d in decisions] == [(GREP, "n1")]
    (record,) = rm.log_since(0)
    (stack,) = record["stacks"]
    assert [o["rid"] for o in stack["objects"]] == [CONSOLE, GREP, STORAGE]
    assert stack["split"] == 1
    # Counts over 0.5 s scale to the window H = 1 s.
    assert stack["edges"][1]["bytes"] == 1_200_000
    assert record["moves"][0]["execute"] and record["actions"][0]["to"] == "n1"


def test_every_evaluation_is_appended_to_the_log_file(manager: Any, tmp_path: Path) -> None:
    rm, _ = manager
    rm.receive(client_digest())
    rm.receive(client_digest())
    records = read_log(tmp_path / "placement.jsonl")
    assert [r["seq"] for r in records] == [1, 2]
    json.dumps(records)  # plain JSON all the way down


def test_an_object_that_just_moved_stays_for_its_residence(manager: Any) -> None:
    rm, _ = manager
    decisions, _ = rm.receive(client_digest(moved_age_s=1.0))  # residence is 5 H
    assert decisions == []
    assert rm.log_since(0)[-1]["pinned"] == [GREP]


def test_measure_only_mode_logs_the_decision_but_sends_none(tmp_path: Path) -> None:
    rm = resource_manager(RuntimeConfig(adaptive=False))
    decisions, _ = rm.receive(client_digest())
    assert decisions == []
    assert rm.log_since(0)[-1]["actions"]  # the decision is recorded all the same


def test_a_digest_older_than_three_windows_is_forgotten(manager: Any) -> None:
    rm, clock = manager
    rm.receive(client_digest())
    clock.jump(2.9)
    assert CLIENT in rm.fresh_digests()
    clock.jump(0.2)
    assert rm.fresh_digests() == {}


def test_a_raid_object_calling_several_nodes_is_one_stack_of_the_node_it_favours(
    manager: Any,
) -> None:
    rm, _ = manager
    digest = client_digest()
    raid = digest["edges"][1]
    # The same object also writes to two other nodes' storage (a RAID's columns).
    digest["edges"] += [
        {**raid, "callee": "n2/storage", "bytes": 500_000},
        {**raid, "callee": "n3/storage", "bytes": 400_000},
    ]
    decisions, _ = rm.receive(digest)
    (record,) = rm.log_since(0)
    (stack,) = record["stacks"]
    assert [o["rid"] for o in stack["objects"]] == [CONSOLE, GREP, STORAGE]
    # Counted per window (the digest spans 0.5 s): the other nodes' 900 KB doubled.
    assert stack["peer"] == {"bytes": 1_800_000, "calls": 40}
    assert [(d["rid"], d["to"]) for d in decisions] == [(GREP, "n1")]


def test_a_stack_continues_to_the_node_its_fan_out_object_runs_on() -> None:
    from shuttle.runtime.planner_input import _next_in_chain

    out = [(900.0, "n2/storage"), (100.0, "n1/storage"), (50.0, "c-test/console-x")]
    assert _next_in_chain(out, "n1") == "n1/storage"
    assert _next_in_chain(out, CLIENT) == "n2/storage"


def test_an_object_here_that_called_nothing_below_still_ends_a_stack_at_our_storage() -> None:
    """A cache at the node whose reads all hit makes no calls below it in a window;
    its stack must still be seen, or it could never be sent back to the client."""
    digest = client_digest()
    digest["objects"] = []
    digest["edges"] = [digest["edges"][0]]  # console -> cache only, over the link
    knobs = PlannerKnobs(1.0, 5.0, 5.0)
    seen = model_input(
        node_digest(),
        {CLIENT: Digest.parse(digest)},
        NodeFacts("n1", hosted=frozenset({GREP})),
        knobs,
    )
    (stack,) = seen.stacks
    assert [o.rid for o in stack.objects] == [CONSOLE, GREP, STORAGE]
    assert (stack.edges[1].bytes, stack.edges[1].calls, stack.edges[1].measured_s) == (0, 0, 0)
    # Not hosted here (the table says nothing of it): no stack ends at our storage.
    assert (
        model_input(node_digest(), {CLIENT: Digest.parse(digest)}, NodeFacts("n1"), knobs).stacks
        == ()
    )
