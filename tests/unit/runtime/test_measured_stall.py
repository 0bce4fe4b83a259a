"""Pricing the link at what the monitor measured (docs/runtime.md, "The placement
model", where we differ from the paper): the per-call overhead learned on the edge
that crosses the link now, the callee's own time reported back and taken out, and
the gate that lets callbacks in while a migration drains.

The numbers are ABACUS 6.5's directory stack as a client under high contention saw
it on the LAN (H = 0.25 s): the directory object's edge to the node's isolation
object carried 70 KB in 17 calls per window, while its console made 5 inserts.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuttle.errors import ConfigError, RequestTimeoutError
from shuttle.runtime.binding import BindingManager
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import Digest
from shuttle.runtime.gate import Gate, GateState
from shuttle.runtime.locations import LocationTable
from shuttle.runtime.mobile import CallMoved, MobileObject
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import Peers
from shuttle.runtime.placement import (
    EdgeView,
    NodeView,
    ObjectView,
    PlacementConfig,
    StackView,
    call_overhead_s,
    choose,
    modelled_stall_s,
    predict,
    stall_s,
)
from shuttle.runtime.planner import ResourceManager
from shuttle.testing import FakeClock

LAN = 1.25e6  # 10 Mbit/s in bytes per second
LATENCY_S = 0.0005
H = 0.25
CONFIG = PlacementConfig(window_s=H, threshold_fraction=0.3)  # B_thresh = 0.075 s
NODES = {"c": NodeView("c", 1.0, 0.5), "n1": NodeView("n1", 1.0, 0.5)}


def directory_stack(
    *,
    split: int = 1,
    measured_s: float = 0.0,
    inserts: float = 5,
    commit_calls: float = 17,
    commit_bytes: float = 70_000,
) -> StackView:
    """console -> directory -> isolation. At split 1 the directory edge to the node is
    the remote one and carries the measurement; at split 0 the console's is."""
    edges = (
        EdgeView(44 * inserts, inserts, measured_s if split == 0 else 0.0),
        EdgeView(commit_bytes, commit_calls, measured_s if split == 1 else 0.0),
    )
    return StackView(
        "s",
        "c",
        "n1",
        (
            ObjectView("c/console-dir", 0.0, migratable=False),
            ObjectView("c/dir-1", 0.005, memory_bytes=32_768, checkpoint_bytes=30_000),
            ObjectView("n1/isolation", 0.005, migratable=False),
        ),
        edges,
        split,
        LAN,
        LATENCY_S,
    )


def test_the_papers_estimate_keeps_a_contended_directory_at_the_client() -> None:
    # C_1 = 70,000 / 1.25e6 + 2 × 0.5 ms × 17 = 0.056 + 0.017 = 0.073 s;
    # C_0 = 220 / 1.25e6 + 2 × 0.5 ms × 5 = 0.005176 s. Saving 0.0678 s, minus the
    # move (0.01 quiesce + 30,000 / 1.25e6 + 1 ms = 0.035 s): 0.033 s ≤ 0.075 s.
    stack = directory_stack()
    assert stall_s(stack, 1) == pytest.approx(0.073)
    (move,) = choose([stack], NODES, CONFIG).moves
    assert move.to_server and not move.execute
    assert move.net_s == pytest.approx(0.073 - 0.005176 - 0.035, abs=1e-6)


def test_a_measured_stall_over_the_estimate_moves_the_directory_to_the_node() -> None:
    # The client blocked 0.23 s of the 0.25 s window: 0.157 s over the estimate,
    # 9.24 ms per call of the 17. The split in force is priced at 0.23 s; split 0
    # pays the same 9.24 ms for each of its 5 calls: 0.005176 + 0.046176 = 0.051353.
    stack = directory_stack(measured_s=0.23)
    assert call_overhead_s(stack) == pytest.approx(0.157 / 17)
    assert stall_s(stack, 1) == pytest.approx(0.23)
    assert stall_s(stack, 0) == pytest.approx(0.005176 + 5 * 0.157 / 17)
    (move,) = choose([stack], NODES, CONFIG).executed
    assert move.to_server and move.rids == ("c/dir-1",)
    assert move.net_s == pytest.approx(0.23 - 0.051353 - 0.035, abs=1e-5)


def test_at_the_node_the_measured_overhead_keeps_it_there() -> None:
    # At split 0 the console's 5 calls measured 0.05 s ((0.05 - 0.005176) / 5 =
    # 8.96 ms over the estimate per call); moving back would pay that on each of the
    # directory's 17 calls: C_1 = 0.073 + 17 × 8.96 ms = 0.2254 s. It stays.
    stack = directory_stack(split=0, measured_s=0.05)
    plan = choose([stack], NODES, CONFIG)
    assert stall_s(stack, 0) == pytest.approx(0.05)
    assert stall_s(stack, 1) == pytest.approx(0.073 + 17 * (0.05 - 0.005176) / 5)
    assert not plan.moves


def test_only_the_edge_of_the_split_in_force_is_read() -> None:
    # A stale measurement on an edge that is local now says nothing about the link.
    edges = (EdgeView(220, 5, 0.0), EdgeView(70_000, 17, 0.5))
    stack = StackView("s", "c", "n1", directory_stack().objects, edges, 0, LAN, LATENCY_S)
    assert call_overhead_s(stack) == 0.0
    assert stall_s(stack, 1) == pytest.approx(modelled_stall_s(stack, 1))


SAN = 12.5e6  # 100 Mbit/s in bytes per second
SAN_LATENCY_S = 0.0001


def raid_stack(measured_s: float) -> StackView:
    """ABACUS 6.2's write as one column's node saw it on the SAN (round numbers from
    its decision log): console -> file -> raid5 at the client -> this node's storage,
    and the RAID object's calls to the four other columns as the fan-out."""
    return StackView(
        "s",
        "c",
        "n1",
        (
            ObjectView("c/console-raid", 0.0, migratable=False),
            ObjectView("c/file-2", 0.001),
            ObjectView("c/raid-1", 0.006),
            ObjectView("n1/storage", 0.034, migratable=False),
        ),
        (
            EdgeView(80_000, 10),
            EdgeView(80_000, 10),
            EdgeView(80_000, 18, measured_s),
        ),
        2,
        SAN,
        SAN_LATENCY_S,
        peer=EdgeView(160_000, 10),
    )


def test_the_fan_out_calls_across_the_client_link_pay_the_measured_overhead() -> None:
    # The edge to this node: 80,000 / 12.5e6 + 2 × 0.1 ms × 18 = 0.010 s estimated,
    # 0.094 s measured: (0.094 - 0.010) / 18 = 4.67 ms over per call. The four other
    # columns' 10 calls cross the same link: 0.0128 + 0.002 + 10 × 4.67 ms = 0.06147 s,
    # so C_2 = 0.094 + 0.06147. At the node (split 1) the fan-out goes over the nodes'
    # network and the file's 10 calls pay the overhead: C_1 = 0.0064 + 0.002 + 0.04667.
    # Saving 0.1004 s less the move (0.01 quiesce + 0.2 ms) = 0.0902 > 0.075: it moves.
    # (With the fan-out at its estimate alone the saving was 0.0537 s and it stayed.)
    stack = raid_stack(measured_s=0.094)
    per_call = (0.094 - 0.010) / 18
    assert call_overhead_s(stack) == pytest.approx(per_call)
    assert stall_s(stack, 2) == pytest.approx(0.094 + 0.0148 + 10 * per_call)
    assert stall_s(stack, 1) == pytest.approx(0.0084 + 10 * per_call)
    assert modelled_stall_s(stack, 2) == pytest.approx(0.010 + 0.0148)  # the paper's C_k
    (move,) = choose([stack], NODES, CONFIG).executed
    assert move.to_server and move.rids == ("c/raid-1",)
    assert move.net_s == pytest.approx(0.094 + 0.0148 - 0.0084 - 0.0102, abs=1e-6)


def test_a_negative_or_infinite_measurement_is_refused() -> None:
    with pytest.raises(ConfigError, match="measured stall"):
        EdgeView(1.0, 1.0, -0.1)
    with pytest.raises(ConfigError, match="measured stall"):
        EdgeView(1.0, 1.0, float("inf"))


@settings(max_examples=200, deadline=None)
@given(
    split=st.sampled_from([0, 1]),
    inserts=st.floats(1, 50),
    calls=st.floats(1, 200),
    kbytes=st.floats(0, 500),
    under=st.floats(0, 1),
)
def test_a_measurement_at_or_under_the_estimate_changes_nothing(
    split: int, inserts: float, calls: float, kbytes: float, under: float
) -> None:
    """The paper's model, untouched, whenever the link costs what it estimates."""
    plain = directory_stack(
        split=split, inserts=inserts, commit_calls=calls, commit_bytes=kbytes * 1000
    )
    estimate = modelled_stall_s(plain, split)
    measured = directory_stack(
        split=split,
        inserts=inserts,
        commit_calls=calls,
        commit_bytes=kbytes * 1000,
        measured_s=under * estimate,
    )
    a, b = choose([plain], NODES, CONFIG), choose([measured], NODES, CONFIG)
    assert a.best.response_s == b.best.response_s
    assert a.current.response_s == b.current.response_s
    assert [m.execute for m in a.moves] == [m.execute for m in b.moves]


@settings(max_examples=200, deadline=None)
@given(
    inserts=st.floats(1, 50),
    calls=st.floats(1, 200),
    kbytes=st.floats(0, 500),
    measured=st.floats(0, 1),
)
def test_at_the_split_in_force_the_edge_costs_the_larger_of_estimate_and_measurement(
    inserts: float, calls: float, kbytes: float, measured: float
) -> None:
    for split in (0, 1):
        stack = directory_stack(
            split=split,
            inserts=inserts,
            commit_calls=calls,
            commit_bytes=kbytes * 1000,
            measured_s=measured,
        )
        expected = max(modelled_stall_s(stack, split), measured)
        assert stall_s(stack, split) == pytest.approx(expected, rel=1e-9, abs=1e-12)
        # The other split is charged the same overhead per call: never less than
        # its estimate, and the current placement's prediction is what was measured.
        other = 1 - split
        assert stall_s(stack, other) >= modelled_stall_s(stack, other)
        current = predict([stack], {}, NODES, H)
        assert current.response_s["s"] >= expected


@settings(max_examples=100, deadline=None)
@given(calls=st.floats(5, 200), extra=st.floats(0, 0.5))
def test_more_measured_stall_at_the_client_never_makes_moving_less_worth_it(
    calls: float, extra: float
) -> None:
    """The directory makes at least as many calls as its console: the per-call
    overhead weighs more on the client's side, so the benefit only grows."""
    low = directory_stack(commit_calls=calls, inserts=5)
    high = directory_stack(
        commit_calls=calls, inserts=5, measured_s=modelled_stall_s(low, 1) + extra
    )
    benefit = {
        id(s): predict([s], {}, NODES, H).response_s["s"]
        - predict([s], {"s": 0}, NODES, H).response_s["s"]
        for s in (low, high)
    }
    assert benefit[id(high)] >= benefit[id(low)] - 1e-12


# --- the planner: the stall less the callee's own time, from the digests -------------

CLIENT = "c-test"
DIR = f"{CLIENT}/d-1"
CONSOLE = f"{CLIENT}/console-dir"
ISOLATION = "n1/isolation"


class Anchor(MobileObject):
    anchored = True
    migratable = False


def directory_digest(stall_s: float, far_s: float) -> dict[str, Any]:
    """A quarter second at the client: 5 inserts, 17 calls to the isolation object
    that blocked ``stall_s``, of which the isolation object reported ``far_s``."""
    return {
        "runtime": CLIENT,
        "address": "127.0.0.1:1",
        "speed": 1.0,
        "load": 0.5,
        "span_s": H,
        "objects": [
            {
                "rid": DIR,
                "type": "directory",
                "cpu_s": 0.005,
                "calls": 5,
                "memory_bytes": 32_768,
                "movable": True,
                "checkpoint_bytes": 30_000,
            }
        ],
        "edges": [
            {"caller": CONSOLE, "callee": DIR, "bytes": 220, "calls": 5, "remote": False},
            {
                "caller": DIR,
                "callee": ISOLATION,
                "bytes": 70_000,
                "calls": 17,
                "stall_s": stall_s,
                "far_s": far_s,
                "remote": True,
            },
        ],
        "consoles": [CONSOLE],
        "links": {"n1": {"name": "lan", "bandwidth_bytes_per_s": LAN, "latency_s": LATENCY_S}},
    }


@pytest.fixture
def manager() -> Any:
    clock = FakeClock(100.0)
    config = RuntimeConfig(window_s=H, threshold_fraction=0.3)
    return ResourceManager(
        "n1",
        config,
        peers=Peers(),
        locations=LocationTable("n1"),
        local_digest=lambda: Digest("n1", speed=1.0, load=0.5, span_s=H),
        clock=clock.now,
    )


def test_the_planner_charges_the_stall_less_the_callees_own_time(manager: Any) -> None:
    # 0.24 s blocked, of which the isolation object's own work was 0.01 s: 0.23 s.
    decisions, _ = manager.receive(directory_digest(0.24, 0.01))
    (record,) = manager.log_since(0)
    (stack,) = record["stacks"]
    assert stack["edges"][1]["measured_s"] == pytest.approx(0.23)
    assert stack["stall_s"] == {"modelled": pytest.approx(0.073), "priced": pytest.approx(0.23)}
    assert [(d["rid"], d["to"]) for d in decisions] == [(DIR, "n1")]


def test_a_stall_that_is_the_callees_own_work_moves_nothing(manager: Any) -> None:
    # The same wait, all of it the isolation object's own (a slow disk, say): moving
    # the directory would not remove it, so the estimate stands and nothing moves.
    decisions, _ = manager.receive(directory_digest(0.24, 0.2))
    (record,) = manager.log_since(0)
    assert record["stacks"][0]["stall_s"]["priced"] == pytest.approx(0.073)
    assert decisions == []


# --- the monitor: a call's own time, less what it blocked on remote calls -------------


def test_a_calls_own_time_leaves_out_its_remote_calls() -> None:
    clock = FakeClock(10.0)
    monitor = ResourceMonitor(1.0, clock)
    outer = monitor.enter("n1/isolation")
    clock.jump(0.01)
    inner = monitor.enter("n1/helper")  # a nested local call that calls out
    clock.jump(0.01)
    monitor.record_edge(
        "n1/helper", "c/d-1", bytes_down=10, bytes_up=0, stall_s=0.3, remote=True, far_s=0.1
    )
    clock.jump(0.3)
    assert monitor.exit(inner) == pytest.approx(0.01)  # 0.31 s of wall, 0.3 s remote
    clock.jump(0.08)
    assert monitor.exit(outer) == pytest.approx(0.1)  # 0.4 s of wall, 0.3 s remote
    _, edges = monitor.totals()
    edge = edges[("n1/helper", "c/d-1")]
    assert (edge.stall_s, edge.far_s) == (pytest.approx(0.3), pytest.approx(0.1))


# --- the gate: callbacks go in while a migration drains ---------------------------------


def test_an_admitted_call_enters_while_the_gate_drains_and_not_after() -> None:
    """Two objects that call back into each other quiesce at once, an update active
    in each, each update waiting for a callback into the other. Admitted, the
    callbacks go in while the gates drain, and both drain; once a gate has drained
    (the checkpoint's turn) nothing goes in, and held calls learn the object left."""
    a, b = Gate(), Gate()
    assert a.enter() and b.enter()  # an active update in each
    results: dict[str, float | None] = {}
    movers = [
        threading.Thread(target=lambda n=n, g=g: results.update({n: g.quiesce(timeout_s=10)}))
        for n, g in (("a", a), ("b", b))
    ]
    for t in movers:
        t.start()
    deadline = time.monotonic() + 10
    while not (a.state is GateState.QUIESCING and b.state is GateState.QUIESCING):
        assert time.monotonic() < deadline, "the gates never started to quiesce"
        time.sleep(0.001)
    # a's update waits for its callback into b: it goes in although b is quiescing.
    assert b.enter(hold_s=1, admit=True)
    b.leave()
    a.leave()  # a's update returns; a drains
    movers[0].join(10)
    assert results["a"] is not None
    with pytest.raises(RequestTimeoutError):
        a.enter(hold_s=0.05, admit=True)  # drained: held like any other call
    b.leave()  # b's update (its callback into a delivered wherever a lands) returns
    movers[1].join(10)
    assert results["b"] is not None
    a.retire()
    assert a.enter(admit=True) is False  # the held callback re-resolves where a went


def test_a_retrys_back_off_counts_as_stall_on_its_remote_edge() -> None:
    """A directory object's back-off after a conflict is time lost to its remote
    commits: it is charged to the edge (no call added), and only to an edge that
    has had calls."""
    monitor = ResourceMonitor(1.0, FakeClock(10.0))
    monitor.record_wait("c/d-1", "n1/isolation", 0.02)  # no call yet: nothing to charge
    assert monitor.totals()[1] == {}
    monitor.record_edge(
        "c/d-1", "n1/isolation", bytes_down=100, bytes_up=10, stall_s=0.01, remote=True
    )
    monitor.record_wait("c/d-1", "n1/isolation", 0.02)
    edge = monitor.totals()[1][("c/d-1", "n1/isolation")]
    assert (edge.calls, edge.stall_s) == (1, pytest.approx(0.03))


def test_a_window_shows_an_edge_whose_only_call_is_still_in_progress() -> None:
    """A console blocked in one long update (retrying under contention) completes no
    call for windows on end: its run-time must still report the stack."""
    clock = FakeClock(10.0)
    monitor = ResourceMonitor(1.0, clock)
    token = monitor.begin_call("c/console-dir", "c/d-1")
    clock.jump(0.5)
    assert monitor.window().edges == {}  # in flight for less than a window: not yet
    clock.jump(4.5)
    monitor.tick()
    clock.jump(1.5)
    window = monitor.window()
    assert window.edges[("c/console-dir", "c/d-1")].calls == 0
    monitor.end_call(token)
    clock.jump(1.5)
    monitor.tick()
    clock.jump(1.5)
    assert ("c/console-dir", "c/d-1") not in monitor.window().edges


# --- a call that gives way to its object's move ---------------------------------------


class Yielding(MobileObject):
    """An update that waits for its object to be drained, then gives way once."""

    concurrent = True

    def __init__(self) -> None:
        self.tries = 0
        self._started = threading.Event()

    def update(self) -> int:
        self.tries += 1
        self._started.set()
        if self.tries == 1:
            deadline = time.monotonic() + 10
            while not self.moving():
                assert time.monotonic() < deadline, "the object was never drained"
                time.sleep(0.001)
            raise CallMoved("nothing done yet: call me where I land")
        return self.tries


def test_a_call_that_gives_way_lets_the_drain_end_and_runs_again() -> None:
    with ThreadPoolExecutor(2) as pool:
        bm = BindingManager(
            "c1", config=RuntimeConfig(), peers=Peers(), monitor=ResourceMonitor(1.0), executor=pool
        )
        rid = bm.new_id()
        bm.host_new(rid, "", Yielding, "", None, {}, "auto")
        ref = bm.ref(rid, "127.0.0.1:1")
        hosted = bm.table.hosted(rid)
        assert hosted is not None
        obj = hosted.impl
        result: list[int] = []
        caller = threading.Thread(target=lambda: result.append(ref.update()))
        caller.start()
        assert obj._started.wait(10)
        drained = hosted.gate.quiesce(timeout_s=10)
        assert drained is not None, "the active call held the drain up"
        assert bm.is_moving(rid)  # drained, still quiescing: the checkpoint's turn
        hosted.gate.reopen()  # the move was cancelled: the call runs again here
        caller.join(10)
        assert result == [2]


def test_a_remote_calls_stall_is_counted_as_it_accrues_and_only_once() -> None:
    """A window sees the time a caller spent blocked in it, not the calls that ended
    in it: a 1 s remote call in progress shows in each window it spans, and its
    return adds only what the ticks had not counted."""
    clock = FakeClock(10.0)
    monitor = ResourceMonitor(0.25, clock)
    edge = ("c/d-1", "n1/isolation")
    monitor.record_edge(*edge, bytes_down=1, bytes_up=1, stall_s=0.01, remote=True)
    token = monitor.begin_call(*edge)
    for _ in range(4):
        clock.jump(0.25)
        monitor.tick()
    assert monitor.totals()[1][edge].stall_s == pytest.approx(1.01)
    assert monitor.window().edges[edge].stall_s == pytest.approx(0.25)
    clock.jump(0.05)
    monitor.record_edge(*edge, bytes_down=1, bytes_up=1, stall_s=1.05, remote=True)
    monitor.end_call(token)
    assert monitor.totals()[1][edge].stall_s == pytest.approx(1.06)
