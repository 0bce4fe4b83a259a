"""A node evaluates once per round of digests (``runtime/planner.py``): with a few
clients (``ROUND_CLIENTS_MIN``), on every digest as before; with more, once every
client has been heard from since the last evaluation, or after ``ROUND_WINDOWS_MAX``
windows at the latest. 64 clients each sending a digest every ``H`` had made the node
evaluate 64 times a second.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import Digest
from shuttle.runtime.locations import LocationTable
from shuttle.runtime.peers import Peers
from shuttle.runtime.planner import ROUND_CLIENTS_MIN, ROUND_WINDOWS_MAX, ResourceManager
from shuttle.testing import FakeClock


def digest(client: str) -> dict[str, Any]:
    """Half a second of a grep at ``client`` reading 600 KB over a 10 Mbit/s link."""
    grep, console = f"{client}/g-1", f"{client}/console-t"
    return copy.deepcopy(
        {
            "runtime": client,
            "address": "127.0.0.1:1",
            "speed": 1.0,
            "load": 0.3,
            "span_s": 0.5,
            "objects": [
                {
                    "rid": grep,
                    "type": "grep",
                    "cpu_s": 0.01,
                    "calls": 5,
                    "memory_bytes": 1000,
                    "movable": True,
                    "checkpoint_bytes": 200,
                    "quiesce_s": None,
                }
            ],
            "edges": [
                {"caller": console, "callee": grep, "bytes": 6_000, "calls": 5, "stall_s": 0},
                {
                    "caller": grep,
                    "callee": "n1/storage",
                    "bytes": 600_000,
                    "calls": 10,
                    "stall_s": 0.45,
                },
            ],
            "consoles": [console],
            "links": {"n1": {"name": "lan", "bandwidth_bytes_per_s": 1.25e6, "latency_s": 0.0005}},
            "quiesce_s": None,
        }
    )


@pytest.fixture
def manager() -> tuple[ResourceManager, FakeClock]:
    clock = FakeClock(100.0)
    rm = ResourceManager(
        "n1",
        RuntimeConfig(),
        peers=Peers(),
        locations=LocationTable("n1"),
        local_digest=lambda: Digest("n1", speed=1.0, load=0.1, span_s=1.0),
        clock=clock.now,
        wall_clock=lambda: 1_700_000_000.0,
    )
    return rm, clock


def test_one_client_is_evaluated_on_every_digest(manager: Any) -> None:
    rm, _ = manager
    for _ in range(3):
        rm.receive(digest("c-a"))
    assert rm.evaluations == 3


def test_a_few_clients_are_evaluated_on_every_digest(manager: Any) -> None:
    """ABACUS's experiments have up to four clients: each gets its decision in the
    reply to its own digest, not a window later when the round completes."""
    rm, clock = manager
    clients = [f"c-{i}" for i in range(ROUND_CLIENTS_MIN)]
    for c in clients:
        rm.receive(digest(c))
        clock.jump(0.01)
    first = rm.evaluations
    for c in clients:
        rm.receive(digest(c))
        clock.jump(0.01)
    assert rm.evaluations == first + ROUND_CLIENTS_MIN


def test_many_clients_are_evaluated_once_per_round(manager: Any) -> None:
    rm, clock = manager
    # No limit on the stacks on their way to the node: this is about when each client
    # hears its decision (test_placement_many_arrivals.py has the limit).
    rm.placement = replace(rm.placement, arrivals_max=0)
    clients = [f"c-{i}" for i in range(8)]
    decided: dict[str, list[dict[str, Any]]] = {}
    for c in clients:  # the first digests: each is new, so each completes a round
        decided[c], _ = rm.receive(digest(c))
        clock.jump(0.01)
    first = rm.evaluations
    for c in clients:  # a second round: one evaluation, when the last client is heard
        mine, _ = rm.receive(digest(c))
        decided[c] += mine
        clock.jump(0.01)
    assert rm.evaluations == first + 1
    # Every client's grep was decided on, in its own digest's reply or a later one.
    for c in clients:
        mine, _ = rm.receive(digest(c))
        decided[c] += mine
    assert all(any(d["rid"] == f"{c}/g-1" for d in decided[c]) for c in clients)


def test_a_silent_client_does_not_hold_up_the_round_for_long(manager: Any) -> None:
    rm, clock = manager
    others = [f"c-{i}" for i in range(ROUND_CLIENTS_MIN)]  # heard from, then silent
    for c in [*others, "c-a"]:
        rm.receive(digest(c))
    for c in [*others, "c-a"]:
        rm.receive(digest(c))  # the last completes the round of all of them
    before = rm.evaluations
    rm.receive(digest("c-a"))  # the others have not been heard from since
    assert rm.evaluations == before
    clock.jump(ROUND_WINDOWS_MAX * rm.config.window_s)
    rm.receive(digest("c-a"))
    assert rm.evaluations == before + 1
