"""The location table's home side: commits, resolutions and the fence between them,
and hints that never go back in time."""

from __future__ import annotations

from shuttle.runtime.ids import ObjectId
from shuttle.runtime.locations import LocationTable

RID = ObjectId("c1", "7")


def table_with_object_at(location: str, epoch: int = 1) -> LocationTable:
    table = LocationTable("c1")
    table.created_at(RID, location, "counter", durable=False)
    for _ in range(epoch - 1):
        table.reactivation(RID, location)
    return table


def test_a_commit_moves_the_object_once_and_answers_a_repeat_the_same() -> None:
    table = table_with_object_at("n1")
    done = table.commit_move(RID, "m1", "n1", 1, "n2")
    assert done.ok and done.epoch == 2 and table.where(RID) == "n2"
    again = table.commit_move(RID, "m1", "n1", 1, "n2")
    assert again.ok and again.epoch == 2
    assert table.resolve_move(RID, "m1").committed


def test_a_resolution_before_the_commit_fences_it_for_good() -> None:
    table = table_with_object_at("n1")
    answer = table.resolve_move(RID, "m1")
    assert not answer.committed and (answer.location, answer.epoch) == ("n1", 1)
    late = table.commit_move(RID, "m1", "n1", 1, "n2")
    assert not late.ok and "gave up" in late.reason
    assert table.where(RID) == "n1"
    # A new move from the same place and epoch is another move: it may commit.
    assert table.commit_move(RID, "m2", "n1", 1, "n3").ok


def test_a_commit_from_a_stale_source_or_epoch_is_refused() -> None:
    table = table_with_object_at("n1")
    assert not table.commit_move(RID, "m1", "n9", 1, "n2").ok
    assert not table.commit_move(RID, "m1", "n1", 0, "n2").ok
    table.reactivation(RID, "n1")  # brought back: epoch 2
    refused = table.commit_move(RID, "m3", "n1", 1, "n2")
    assert not refused.ok and refused.epoch == 2


def test_a_home_that_forgot_the_object_says_so() -> None:
    table = table_with_object_at("n1")
    table.forgotten(RID)
    assert not table.resolve_move(RID, "m1").known
    assert not table.commit_move(RID, "m1", "n1", 1, "n2").ok


def test_hints_keep_the_newest_epoch_heard() -> None:
    table = LocationTable("c2")
    table.heard(RID, "n2", 3)
    table.heard(RID, "n1", 2)  # older news
    assert table.where(RID) == "n2" and table.known_epoch(RID) == 3
    table.heard(RID, "n3")  # no epoch said: the place, the epoch kept
    assert table.where(RID) == "n3" and table.known_epoch(RID) == 3
    table.hint_failed(RID)
    assert table.where(RID) is None and table.known_epoch(RID) == 0
