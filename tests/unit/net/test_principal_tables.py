"""The principal table nodes store, without sockets: its encoding (and the documented
bytes), epochs, its limit, malformed tables refused naming what is wrong, and a node's
book of principals over it. Whole messages, golden bytes and limits at exactly their
value are here because mutation testing of net/principals.py asked for them: each
failed against a mutant every other test let through (docs/testing.md).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuttle.errors import ConfigError, InvalidArgumentError
from shuttle.net import principals
from shuttle.net.principals import (
    Caps,
    Principal,
    PrincipalBook,
    PrincipalTable,
    derive_key,
    new_principal,
)
from tests.unit.net.principalhelp import ALICE, CLUSTER_KEY, names, prefixes


@given(
    entries=st.dictionaries(
        names, st.tuples(prefixes, prefixes, st.booleans(), st.booleans()), max_size=5
    ),
    epoch=st.integers(0, 2**40),
)
def test_a_table_survives_its_encoding(
    entries: dict[str, tuple[list[str], list[str], bool, bool]], epoch: int
) -> None:
    table = PrincipalTable(
        epoch, {n: new_principal(n, Caps.of(r, w, s, a)) for n, (r, w, s, a) in entries.items()}
    )
    again = PrincipalTable.decode(table.encode(), "test")
    assert again == table and again.digest() == table.digest()
    assert PrincipalTable.from_wire(table.to_wire(), "test") == table


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b"[]",
        b'{"format": 2, "epoch": 1, "principals": {}}',
        b'{"format": 1, "epoch": -1, "principals": {}}',
        b'{"format": 1, "epoch": 1, "principals": {"bad name!": {}}}',
        b'{"format": 1, "epoch": 1, "principals": {"a": {"read": [], "write": [],'
        b' "ship": false, "admin": false, "salt": "00"}}}',
    ],
)
def test_a_malformed_stored_table_is_refused_naming_where_it_is(data: bytes) -> None:
    with pytest.raises(ConfigError, match=r"^DATA/.shuttle/principals.json: malformed"):
        PrincipalTable.decode(data, "DATA/.shuttle/principals.json")


def test_changes_make_new_epochs_and_leave_the_old_table_alone() -> None:
    empty = PrincipalTable()
    one = empty.with_principal(new_principal("a", Caps()))
    two = one.without("a")
    assert (empty.epoch, one.epoch, two.epoch) == (0, 1, 2)
    assert one.names() == ["a"] and two.names() == [] and empty.names() == []
    assert one.digest() != two.digest() != empty.digest()


def test_a_principal_records_when_it_was_made(monkeypatch: pytest.MonkeyPatch) -> None:
    assert new_principal("a", Caps(), now_ns=5).created_ns == 5
    monkeypatch.setattr("time.time_ns", lambda: 1234)
    assert new_principal("a", Caps()).created_ns == 1234


def test_a_table_entry_without_a_creation_time_reads_as_made_at_zero() -> None:
    entry = {"read": [], "write": [], "ship": False, "admin": False, "salt": "00" * 16}
    wire = {"format": 1, "epoch": 1, "principals": {"a": entry}}
    assert PrincipalTable.from_wire(wire, "test").principals["a"].created_ns == 0


def test_a_stored_table_is_the_documented_bytes() -> None:
    table = PrincipalTable(
        3,
        {
            "alice": ALICE,
            "bob": Principal("bob", Caps.of(ship=True, admin=True), bytes(16), 0),
        },
    )
    assert table.encode() == (
        b'{"epoch":3,"format":1,"principals":{"alice":{"admin":false,'
        b'"created_ns":1700000000000000000,"read":["data/"],'
        b'"salt":"000102030405060708090a0b0c0d0e0f","ship":false,"write":["scratch/"]},'
        b'"bob":{"admin":true,"created_ns":0,"read":[],'
        b'"salt":"00000000000000000000000000000000","ship":true,"write":[]}}}'
    )
    assert table.digest() == "663b8763fbdf9dcc"


def test_removing_one_principal_keeps_the_others() -> None:
    table = PrincipalTable().with_principal(ALICE).with_principal(new_principal("bob", Caps()))
    assert table.without("alice").names() == ["bob"]
    assert table.without("nobody").names() == ["alice", "bob"]


def test_a_table_holds_exactly_its_limit_of_principals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(principals, "PRINCIPALS_MAX", 3)
    full = PrincipalTable()
    for name in ("a", "b", "c"):
        full = full.with_principal(new_principal(name, Caps()))
    assert full.names() == ["a", "b", "c"]
    assert full.with_principal(new_principal("a", Caps.of(ship=True))).names() == ["a", "b", "c"]
    with pytest.raises(InvalidArgumentError) as info:
        full.with_principal(new_principal("d", Caps()))
    assert str(info.value) == "a cluster holds at most 3 principals"
    wire = full.to_wire()
    assert PrincipalTable.from_wire(wire, "test") == full
    wire["principals"]["d"] = new_principal("d", Caps()).to_json()
    with pytest.raises(ConfigError) as error:
        PrincipalTable.from_wire(wire, "test")
    assert str(error.value) == (
        "test: malformed principal table (principals must be a map of at most 3 entries)"
    )


GOOD_ENTRY = {"read": [], "write": [], "ship": False, "admin": False, "salt": "00" * 16}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ([], "not a map"),
        ({"epoch": 1, "principals": {}}, "format None, this build reads 1"),
        ({"format": 2, "epoch": 1, "principals": {}}, "format 2, this build reads 1"),
        ({"format": 1, "epoch": True, "principals": {}}, "epoch must be an integer ≥ 0, got True"),
        ({"format": 1, "epoch": -1, "principals": {}}, "epoch must be an integer ≥ 0, got -1"),
        ({"format": 1, "epoch": "1", "principals": {}}, "epoch must be an integer ≥ 0, got '1'"),
        (
            {"format": 1, "epoch": 1, "principals": []},
            "principals must be a map of at most 10000 entries",
        ),
        ({"format": 1, "epoch": 1, "principals": {"a": []}}, "principal 'a' is not a map"),
        (
            {"format": 1, "epoch": 1, "principals": {"a": {**GOOD_ENTRY, "salt": "00"}}},
            "principal 'a': a salt is 16 bytes",
        ),
        (
            {"format": 1, "epoch": 1, "principals": {"a": {**GOOD_ENTRY, "created_ns": "0"}}},
            "principal 'a': created_ns must be an integer",
        ),
        ({"format": 1, "epoch": 1, "principals": {"a": {}}}, "'read'"),
    ],
)
def test_a_malformed_table_names_what_is_wrong_with_it(value: object, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        PrincipalTable.from_wire(value, "DATA/.shuttle/principals.json")
    assert str(info.value) == f"DATA/.shuttle/principals.json: malformed principal table ({reason})"


def test_a_book_resolves_the_principals_of_its_table_and_tells_listeners_of_a_new_one() -> None:
    book = PrincipalBook(CLUSTER_KEY)
    assert book.get("alice") is None and book.table == PrincipalTable()
    heard: list[tuple[str, PrincipalTable]] = []
    book.listeners.append(lambda t: heard.append(("first", t)))
    book.listeners.append(lambda t: heard.append(("second", t)))
    table = PrincipalTable().with_principal(ALICE)
    book.replace(table)
    assert book.table is table and heard == [("first", table), ("second", table)]
    assert book.get("alice") is ALICE and book.resolve("alice") is ALICE


def test_a_book_derives_each_principals_key_once_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    derived: list[str] = []

    def derive(cluster_key: bytes, principal: Principal) -> bytes:
        derived.append(principal.name)
        return derive_key(cluster_key, principal)

    monkeypatch.setattr(principals, "derive_key", derive)
    monkeypatch.setattr(principals, "PRINCIPALS_MAX", 2)  # the cache starts afresh past 4
    ps = [new_principal(f"p{i}", Caps()) for i in range(7)]
    book = PrincipalBook(CLUSTER_KEY, PrincipalTable(1, {p.name: p for p in ps}))
    keys = [book.key_for(p) for p in ps[:5]]
    assert len(set(keys)) == 5 and keys[0] == derive_key(CLUSTER_KEY, ps[0])
    assert book.key_for(ps[0]) == keys[0] and book.key_of("p4") == keys[4]
    assert derived == ["p0", "p1", "p2", "p3", "p4"]  # five held: none derived again
    book.key_for(ps[5])  # a sixth: the cache (over 4) starts afresh with it
    book.key_for(ps[6])
    book.key_for(ps[0])
    assert derived == ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p0"]
    # a principal added again has a new salt, so a new key
    again = new_principal("p0", Caps())
    assert book.key_for(again) != keys[0]
