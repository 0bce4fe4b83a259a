"""The planner's input as data: a digest parsed once into frozen types, and a pure
function from digests and the node's own facts to the stacks the model sees. No
binding manager here, except in the last test, which checks on real run-times
that a failing checkpoint shows where it matters instead of being swallowed."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuttle.errors import InvalidArgumentError, MigrationError
from shuttle.runtime import migration, mobile
from shuttle.runtime.config import RuntimeConfig
from shuttle.runtime.digest import (
    CpuUse,
    Digest,
    EdgeDigest,
    LinkDigest,
    ObjectDigest,
    build_digest,
)
from shuttle.runtime.locations import LocationTable
from shuttle.runtime.mobile import MobileObject
from shuttle.runtime.monitor import ResourceMonitor
from shuttle.runtime.peers import Peers
from shuttle.runtime.placement import PlacementConfig, choose
from shuttle.runtime.planner import ResourceManager
from shuttle.runtime.planner_input import (
    ModelInput,
    NodeFacts,
    PlannerKnobs,
    model_input,
    route_moves,
)
from shuttle.testing import FakeClock
from tests.unit.runtime.netsim import Net
from tests.unit.runtime.test_planner import CLIENT, CONSOLE, GREP, STORAGE, client_digest

KNOBS = PlannerKnobs(window_s=1.0, residence_after_move_s=5.0, retry_after_s=5.0)
NODE = Digest("n1", speed=1.0, load=0.1, span_s=1.0)

# --- parsing ----------------------------------------------------------------------------

runtime_ids = st.sampled_from(["c-a", "c-b", "n1", "n2"])
rids = st.builds(
    lambda home, local: f"{home}/{local}",
    runtime_ids,
    st.sampled_from(["storage", "g-1", "console-x", "cache-7"]),
)
counts = st.floats(min_value=0, max_value=1e12, allow_nan=False)
optional_s = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False)
whole = st.integers(min_value=0, max_value=1 << 40)

objects = st.builds(
    ObjectDigest,
    rid=rids,
    type=st.sampled_from(["?", "grep", "cache"]),
    active_s=optional_s,
    cpu_s=counts,
    calls=whole,
    memory_bytes=whole,
    movable=st.booleans(),
    checkpoint_bytes=whole,
    quiesce_s=optional_s,
    moved_age_s=optional_s,
    failed_age_s=optional_s,
    failures=st.integers(0, 100),
)
edges = st.builds(
    EdgeDigest,
    caller=rids,
    callee=rids,
    bytes=counts,
    calls=whole,
    stall_s=counts,
    far_s=counts,
    remote=st.booleans(),
    active_s=optional_s,
)
links = st.builds(
    LinkDigest,
    name=st.sampled_from(["", "lan", "wan"]),
    bandwidth_bytes_per_s=st.none() | st.floats(min_value=1, max_value=1e12),
    latency_s=st.floats(min_value=0, max_value=1),
)
digests = st.builds(
    Digest,
    runtime=runtime_ids,
    address=st.sampled_from(["", "127.0.0.1:7001"]),
    speed=st.floats(min_value=0.01, max_value=100),
    load=st.floats(min_value=0, max_value=64),
    span_s=st.floats(min_value=0, max_value=10),
    quiesce_s=optional_s,
    objects=st.lists(objects, max_size=4).map(tuple),
    edges=st.lists(edges, max_size=4).map(tuple),
    consoles=st.lists(rids, max_size=3).map(tuple),
    links=st.dictionaries(runtime_ids, links, max_size=2),
    cpu=st.none()
    | st.builds(
        CpuUse,
        own_per_s=st.floats(min_value=0, max_value=64),
        available_per_s=st.floats(min_value=0, max_value=64),
        cpus=st.integers(1, 64),
        busy_share=st.none() | st.floats(min_value=0, max_value=1),
    ),
)


def over_the_wire(digest: Digest) -> Any:
    """As a client sends it and a node's handler receives it (msgpack both ways)."""
    return msgpack.unpackb(msgpack.packb(digest.to_wire()), strict_map_key=False)


@given(digests)
def test_a_digest_parsed_from_the_wire_is_the_digest_that_was_sent(digest: Digest) -> None:
    assert Digest.parse(over_the_wire(digest)) == digest


def test_what_a_digest_leaves_out_takes_the_types_defaults() -> None:
    """The defaults live in one place: a sender that omits a field means what the
    frozen type's default says, and the planner applies none of its own."""
    raw = {
        "runtime": "c-a",
        "objects": [{"rid": "c-a/g-1"}],
        "edges": [{"caller": "c-a/console-x", "callee": "n1/storage"}],
        "links": {"n1": {}},
    }
    assert Digest.parse(raw) == Digest(
        "c-a",
        objects=(ObjectDigest("c-a/g-1"),),
        edges=(EdgeDigest("c-a/console-x", "n1/storage"),),
        links={"n1": LinkDigest()},
    )


def test_a_digest_is_frozen() -> None:
    digest = Digest.parse(client_digest())
    with pytest.raises(AttributeError):
        digest.load = 9.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        digest.links["n9"] = LinkDigest()  # type: ignore[index]


#: (path into the wire map, a value that is wrong there).
BAD_FIELDS: list[tuple[tuple[Any, ...], Any]] = [
    (("runtime",), None),
    (("runtime",), "c/x"),
    (("address",), 7),
    (("address",), "no port"),
    (("speed",), 0),
    (("speed",), "fast"),
    (("load",), -1),
    (("load",), math.nan),
    (("span_s",), math.inf),
    (("span_s",), True),
    (("quiesce_s",), "soon"),
    (("objects",), {"rid": GREP}),
    (("objects", 0), "grep"),
    (("objects", 0, "rid"), "no-slash"),
    (("objects", 0, "rid"), None),
    (("objects", 0, "cpu_s"), -0.5),
    (("objects", 0, "memory_bytes"), "1 KB"),
    (("objects", 0, "movable"), "yes"),
    (("objects", 0, "checkpoint_bytes"), [200]),
    (("objects", 0, "moved_age_s"), -1),
    (("objects", 0, "failures"), "many"),
    (("edges",), "none"),
    (("edges", 1, "caller"), 12),
    (("edges", 1, "callee"), ""),
    (("edges", 1, "bytes"), None),
    (("edges", 1, "stall_s"), -0.1),
    (("edges", 1, "remote"), 1),
    (("consoles",), CONSOLE),
    (("consoles", 0), 5),
    (("links",), [1]),
    (("links", "n1"), "lan"),
    (("links", "n1", "bandwidth_bytes_per_s"), 0),
    (("links", "n1", "latency_s"), "1 ms"),
    (("links", "n1", "name"), 3),
]


def _spoil(raw: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    at: Any = raw
    for step in path[:-1]:
        at = at[step]
    at[path[-1]] = value


def _where(path: tuple[Any, ...]) -> str:
    """How the error names the field: ``objects[0].rid``, ``links['n1'].name``."""
    out = str(path[0])
    for step in path[1:]:
        if isinstance(step, int):
            out += f"[{step}]"
        elif out == "links":
            out += f"[{step!r}]"
        else:
            out += f".{step}"
    return out


@given(st.sampled_from(BAD_FIELDS))
def test_a_malformed_digest_is_refused_naming_its_field(case: tuple[tuple[Any, ...], Any]) -> None:
    path, value = case
    raw = client_digest()
    _spoil(raw, path, value)
    with pytest.raises(InvalidArgumentError) as refused:
        Digest.parse(raw)
    message = str(refused.value)
    assert message.startswith("digest")
    assert _where(path) in message, message


@given(st.sampled_from(BAD_FIELDS))
def test_a_node_keeps_nothing_of_a_malformed_digest(case: tuple[tuple[Any, ...], Any]) -> None:
    path, value = case
    raw = client_digest()
    _spoil(raw, path, value)
    rm = resource_manager()
    with pytest.raises(InvalidArgumentError):
        rm.receive(raw)
    assert rm.digests == {} and rm.heard == {} and rm.evaluations == 0


# --- the pure function ------------------------------------------------------------------


def resource_manager() -> ResourceManager:
    return ResourceManager(
        "n1",
        RuntimeConfig(),
        peers=Peers(),
        locations=LocationTable("n1"),
        local_digest=lambda: NODE,
        clock=FakeClock(100.0).now,
        wall_clock=lambda: 1_700_000_123.5,
    )


def seen(raw: dict[str, Any], facts: NodeFacts | None = None) -> ModelInput:
    return model_input(NODE, {CLIENT: Digest.parse(raw)}, facts or NodeFacts("n1"), KNOBS)


def test_a_client_digest_becomes_the_stack_the_model_sees() -> None:
    given_ = seen(client_digest())
    (stack,) = given_.stacks
    assert [o.rid for o in stack.objects] == [CONSOLE, GREP, STORAGE]
    assert (stack.client, stack.server, stack.split) == (CLIENT, "n1", 1)
    grep = stack.objects[1]
    # 10 ms of CPU over half a second, scaled to H = 1 s; size from the digest.
    assert grep.cpu_s == pytest.approx(0.02)
    assert (grep.memory_bytes, grep.migratable, grep.checkpoint_bytes) == (1000, True, 200)
    assert stack.edges[1].bytes == pytest.approx(1_200_000)
    assert stack.bandwidth_bytes_per_s == 1.25e6 and stack.latency_s == 0.0005
    assert set(given_.nodes) == {"n1", CLIENT}
    assert given_.hosts[GREP] == CLIENT
    assert given_.pinned == frozenset()


def test_the_same_input_gives_the_same_stacks() -> None:
    assert seen(client_digest()) == seen(client_digest())


@pytest.mark.parametrize(
    ("facts", "change", "pinned"),
    [
        (NodeFacts("n1", migrating=frozenset({GREP})), {}, True),
        (NodeFacts("n1", pending=frozenset({GREP})), {}, True),
        (NodeFacts("n1"), {"moved_age_s": 4.9}, True),  # residence 5 s
        (NodeFacts("n1"), {"moved_age_s": 5.1}, False),
        (NodeFacts("n1"), {"failed_age_s": 4.0, "failures": 1}, True),  # back-off 5 s
        (NodeFacts("n1"), {"failed_age_s": 6.0, "failures": 1}, False),
        (NodeFacts("n1"), {"failed_age_s": 6.0, "failures": 2}, True),  # doubled: 10 s
        (NodeFacts("n1"), {"failed_age_s": 79.0, "failures": 9}, True),  # capped: 80 s
        (NodeFacts("n1"), {"failed_age_s": 81.0, "failures": 9}, False),
    ],
)
def test_what_pins_an_object(facts: NodeFacts, change: dict[str, Any], pinned: bool) -> None:
    raw = client_digest()
    raw["objects"][0].update(change)
    assert (GREP in seen(raw, facts).pinned) is pinned


def test_an_object_the_location_table_hosts_here_is_here_whatever_a_digest_says() -> None:
    given_ = seen(client_digest(), NodeFacts("n1", hosted=frozenset({GREP})))
    assert given_.hosts[GREP] == "n1"
    (stack,) = given_.stacks
    assert stack.split == 0  # only the console at the client


def test_moves_go_to_whoever_hosts_the_object() -> None:
    given_ = seen(client_digest())
    plan = choose(given_.stacks, given_.nodes, PlacementConfig(), pinned=given_.pinned)
    told = routing = route_moves(plan, given_, "n1", adaptive=True)
    reason = plan.executed[0].reason
    assert routing.actions == ({"rid": GREP, "from": CLIENT, "to": "n1", "reason": reason},)
    assert {c: [d["rid"] for d in ds] for c, ds in routing.decisions.items()} == {CLIENT: [GREP]}
    assert routing.local_moves == ()
    # The node hosts it (the digest is older): the node moves it itself.
    here = ModelInput(given_.stacks, given_.nodes, given_.pinned, {**given_.hosts, GREP: "n1"})
    routing = route_moves(plan, here, "n1", adaptive=True)
    assert routing.decisions == {} and [m[0] for m in routing.local_moves] == [GREP]
    # Measure only: listed, nobody told.
    quiet = route_moves(plan, given_, "n1", adaptive=False)
    assert quiet.actions == told.actions
    assert quiet.decisions == {} and quiet.local_moves == ()


def test_the_decision_log_is_stamped_by_the_clock_it_was_given() -> None:
    rm = resource_manager()
    rm.receive(client_digest())
    (record,) = rm.log_since(0)
    assert record["t"] == 1_700_000_123.5
    assert rm.snapshot_digests() == {CLIENT: Digest.parse(client_digest()).to_wire()}


# --- a failing checkpoint, on real run-times --------------------------------------------


class Brittle(MobileObject):
    """An object whose checkpoint always fails, counting how often it was asked."""

    type_name = "test-brittle"
    asked = 0

    def __init__(self) -> None:
        self.n = 0

    def add(self) -> int:
        self.n += 1
        return self.n

    def checkpoint(self) -> bytes:
        type(self).asked += 1
        raise RuntimeError("the state is on a device that went away")


@pytest.fixture
def brittle_type() -> Iterator[None]:
    mobile.BUILTIN_TYPES["test-brittle"] = Brittle
    Brittle.asked = 0
    yield
    del mobile.BUILTIN_TYPES["test-brittle"]


def test_a_failing_checkpoint_is_reported_where_it_is_needed_not_swallowed(
    brittle_type: None,
) -> None:
    """Digests no longer run checkpoints (they did every window and hid a failure);
    the move that needs one fails with the object's own error, and the next digest
    carries the failure, so the planner backs off."""

    async def main() -> None:
        with ThreadPoolExecutor(4) as pool:
            net = Net(pool)
            client = net.add("c1")
            net.add("n1")
            rid = client.new_id()
            client.host_new(rid, client.address, Brittle, "test-brittle", None, {}, "auto")
            window = ResourceMonitor(1.0).window()
            for _ in range(3):  # three windows' digests
                digest = build_digest(client, window, 0.0)
            assert Brittle.asked == 0
            (entry,) = digest.objects
            assert (entry.rid, entry.checkpoint_bytes, entry.failures) == (str(rid), 0, 0)

            with pytest.raises(MigrationError, match="went away"):
                await migration.migrate_out(client, rid, "n1")
            assert Brittle.asked == 1
            (event,) = client.history.events()
            assert not event.ok and "RuntimeError" in event.error
            hosted = client.table.hosted(rid)
            assert hosted is not None and hosted.serving(time.monotonic())  # still serves

            (entry,) = build_digest(client, window, 0.0).objects
            assert entry.failures == 1 and entry.failed_age_s is not None
            clients = {"c1": build_digest(client, window, 0.0)}
            given_ = model_input(Digest("n1", span_s=1.0), clients, NodeFacts("n1"), KNOBS)
            assert str(rid) in given_.pinned
            for bm in net.runtimes.values():
                for task in list(bm.tasks):
                    task.cancel()

    asyncio.run(main())
