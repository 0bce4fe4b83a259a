"""Which table a node takes from its peers (:func:`newer_table`): the newest, only if
newer than its own, never one two peers disagree on."""

from __future__ import annotations

from shuttle.net.principals import Caps, PrincipalTable, new_principal
from shuttle.node.principal_peers import PeerTable, newer_table

BASE = PrincipalTable().with_principal(new_principal("alice", Caps.of(["data/"], [], False, False)))
REMOVED = BASE.without("alice")
OTHER = BASE.with_principal(new_principal("bob", Caps.of([], ["x/"], False, False)))


def test_a_newer_table_is_taken() -> None:
    answers = [PeerTable("n1", REMOVED), PeerTable("n3", None, "down")]
    assert newer_table(BASE, answers) is REMOVED


def test_the_highest_epoch_wins() -> None:
    newest = REMOVED.with_principal(new_principal("carol", Caps.of([], [], False, False)))
    answers = [PeerTable("n1", REMOVED), PeerTable("n3", newest)]
    assert newer_table(BASE, answers) is newest


def test_nothing_older_or_equal_is_taken() -> None:
    assert newer_table(REMOVED, [PeerTable("n1", BASE)]) is None
    assert newer_table(REMOVED, [PeerTable("n1", REMOVED)]) is None
    assert newer_table(BASE, []) is None
    assert newer_table(BASE, [PeerTable("n1", None, "unreachable")]) is None


def test_two_different_tables_at_the_newest_epoch_are_left_to_an_administrator() -> None:
    assert REMOVED.epoch == OTHER.epoch
    assert newer_table(BASE, [PeerTable("n1", REMOVED), PeerTable("n3", OTHER)]) is None
