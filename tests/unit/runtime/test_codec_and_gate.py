"""The value codec (references travel and rebind), the call gate's lifecycle and the
migration's step table."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuttle.errors import InvalidArgumentError, LocalProtocolError
from shuttle.runtime import values
from shuttle.runtime.gate import Gate, GateState
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.refs import Ref


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple[Any, ...]]] = []

    def invoke(self, ref: Ref, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self.calls.append((str(ref.rid), method, args))
        return "ok"


refs = st.builds(
    lambda home, local: Ref(ObjectId(home, local), "127.0.0.1:9"),
    st.text("abcn1:.", min_size=1, max_size=8),
    st.text("abc0123-", min_size=1, max_size=8),
)
plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary() | refs,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@given(plain)
def test_values_round_trip_and_references_come_back_bound(value: Any) -> None:
    recorder = Recorder()
    back = values.unpack(values.pack(value), recorder)
    assert back == value
    stack = [back]
    while stack:
        v = stack.pop()
        if isinstance(v, Ref):
            assert v.call("ping") == "ok"
        elif isinstance(v, list):
            stack += v
        elif isinstance(v, dict):
            stack += v.values()


def test_values_refuse_what_cannot_travel_with_a_clear_message() -> None:
    with pytest.raises(InvalidArgumentError, match="cannot travel between run-times"):
        values.pack({"f": object()})


def test_an_unbound_reference_says_how_to_bind_it() -> None:
    with pytest.raises(LocalProtocolError, match="not bound"):
        Ref(ObjectId("n1", "1"), "x:1").read()


def test_object_ids_parse_and_refuse_garbage() -> None:
    rid = ObjectId.parse("127.0.0.1:7400/ab-3")
    assert (rid.home, rid.local) == ("127.0.0.1:7400", "ab-3")
    assert ObjectId.storage("n1").is_storage
    for bad in ("nohome", "/x", "n1/"):
        with pytest.raises(InvalidArgumentError):
            ObjectId.parse(bad)


def test_gate_holds_calls_while_quiescing_and_releases_them_when_reopened() -> None:
    gate = Gate()
    assert gate.enter()
    drained = threading.Event()
    result: list[float | None] = []

    def migrate() -> None:
        result.append(gate.quiesce(timeout_s=10))
        drained.set()

    mover = threading.Thread(target=migrate)
    mover.start()
    entered: list[bool] = []
    held = threading.Thread(target=lambda: entered.append(gate.enter()))
    # The migration waits for the active call; a new call would wait behind it.
    gate.leave()
    drained.wait(10)
    assert gate.state is GateState.QUIESCING and result[0] is not None
    held.start()
    gate.reopen()  # the migration was cancelled: the held call goes on here
    held.join(10)
    assert entered == [True]
    mover.join()


def test_gate_tells_held_calls_the_object_left() -> None:
    gate = Gate()
    assert gate.quiesce(timeout_s=1) is not None
    outcome: list[bool] = []
    held = threading.Thread(target=lambda: outcome.append(gate.enter()))
    held.start()
    gate.retire()
    held.join(10)
    assert outcome == [False]


def test_gate_cancels_a_quiesce_that_does_not_drain() -> None:
    gate = Gate()
    assert gate.enter()
    assert gate.quiesce(timeout_s=0.01) is None
    assert gate.state is GateState.OPEN  # the object keeps serving
    gate.leave()


def test_gate_transitions_outside_the_table_are_refused() -> None:
    gate = Gate(GateState.STAGED)
    with pytest.raises(LocalProtocolError, match="cannot quiesce in state staged"):
        gate.quiesce(1)
    gate.activate()
    with pytest.raises(LocalProtocolError):
        gate.activate()
