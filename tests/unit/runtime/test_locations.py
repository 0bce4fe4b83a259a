"""The location table's home side: commits, resolutions and the fence between them,
and hints that never go back in time."""

from __future__ import annotations

import pytest

from shuttle.errors import InvalidArgumentError, ObjectBusyError
from shuttle.runtime import locations
from shuttle.runtime.gate import Gate, GateState
from shuttle.runtime.hosted import Hosted
from shuttle.runtime.ids import ObjectId
from shuttle.runtime.locations import Commit, Hint, HomeEntry, LocationTable, Resolution

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


# --- the hosted side, hints and migrations (the mutation run's survivors, issue 27) ------


def hosted(
    rid: ObjectId = RID,
    *,
    staged: bool = False,
    epoch: int = 1,
    durable: bool = False,
    principal: str | None = None,
) -> Hosted:
    """A copy as the table sees it: an id, a gate, an epoch (no object behind it: the
    table never calls one)."""
    return Hosted(
        rid=rid,
        home_address="",
        impl=None,
        manager=None,
        type_label="counter",
        type_name="counter",
        code=None,
        migratable=True,
        policy="auto",
        gate=Gate(GateState.STAGED if staged else GateState.OPEN),
        durable=durable,
        epoch=epoch,
        principal=principal,
    )


def test_an_object_created_at_its_home_is_hosted_and_homed_at_its_first_epoch() -> None:
    table = LocationTable("c1")
    table.heard(RID, "n5", 9)  # a stale hint, replaced by the object itself
    copy = hosted(durable=True, principal="alice")
    table.created_here(copy)
    assert table.hosted(RID) is copy and table.hint(RID) is None
    assert table.hosted_items() == [(RID, copy)] and table.hosted_ids() == [RID]
    entry = table.home_entry(RID)
    assert entry is not None
    assert (entry.location, entry.type_label, entry.epoch, entry.durable, entry.principal) == (
        "c1",
        "counter",
        1,
        True,
        "alice",
    )
    assert entry.last_commit == "" and list(entry.fenced) == []
    assert table.homed_items() == [(RID, entry)]
    assert table.locate_here(RID) == ("c1", True, 1) and table.known_epoch(RID) == 1


def test_an_object_created_for_another_home_is_hosted_but_not_homed() -> None:
    table = LocationTable("n1")
    copy = hosted(epoch=4)
    table.anchored_here(copy)
    assert table.hosted(RID) is copy and table.home_entry(RID) is None
    # Hosted here: authoritative, at the copy's own epoch (there is no home entry).
    assert table.locate_here(RID) == ("n1", True, 4)


def test_an_id_is_taken_by_a_hosted_copy_or_by_a_home_entry_of_this_home() -> None:
    message = r"^object id c1/7 is taken here; every object needs an id of its own$"
    table = LocationTable("n1")
    table.created_here(hosted())
    with pytest.raises(InvalidArgumentError, match=message):
        table.created_here(hosted())
    home = LocationTable("c1")
    home.created_at(RID, "n2", "counter", durable=False)
    with pytest.raises(InvalidArgumentError, match=message):
        home.refuse_taken(RID)
    with pytest.raises(InvalidArgumentError, match=r"^object id c1/7 is taken here$"):
        home.created_at(RID, "n3", "counter", durable=False)
    # Another home's entry (an older peer's move told us) does not take the id here.
    other = LocationTable("n1")
    other.moved_elsewhere(RID, "n2")
    other.refuse_taken(RID)


def test_a_creation_elsewhere_is_homed_where_it_was_made_and_undone_if_it_failed() -> None:
    table = LocationTable("c1")
    table.created_at(RID, "n2", "counter", durable=True, principal="bob")
    entry = table.home_entry(RID)
    assert entry is not None
    assert (entry.location, entry.type_label, entry.epoch, entry.durable, entry.principal) == (
        "n2",
        "counter",
        1,
        True,
        "bob",
    )
    assert table.locate_here(RID) == ("n2", True, 1)
    table.creation_failed(RID)
    assert table.home_entry(RID) is None and table.locate_here(RID) == (None, False, 0)
    table.creation_failed(RID)  # twice: nothing left to undo


def test_a_home_entry_with_no_place_locates_nowhere_but_authoritatively() -> None:
    table = LocationTable("c1")
    table.restored_home(RID, HomeEntry("", "counter", epoch=5))
    assert table.locate_here(RID) == (None, True, 5)
    assert table.known_epoch(RID) == 5


def test_a_stage_replaces_a_stale_stage_but_never_a_serving_copy() -> None:
    table = LocationTable("n1")
    first = hosted(staged=True)
    table.staged(first)
    second = hosted(staged=True)
    table.staged(second)
    assert table.hosted(RID) is second
    assert not table.stage_dropped(first)  # not the one the table holds
    assert table.hosted(RID) is second
    assert table.stage_dropped(second) and table.hosted(RID) is None
    table.created_here(hosted())
    with pytest.raises(InvalidArgumentError, match=r"^object c1/7 is already hosted here$"):
        table.staged(hosted(staged=True))


def test_an_activated_stage_serves_at_the_new_epoch_and_forgets_its_hint() -> None:
    table = LocationTable("n1")
    table.heard(RID, "n2", 3)
    table.staged(hosted(staged=True, epoch=3))
    table.activated_here(RID, 4)
    copy = table.hosted(RID)
    assert copy is not None and copy.epoch == 4 and table.hint(RID) is None
    table.activated_here(ObjectId("c1", "8"), 2)  # nothing hosted: nothing to change
    assert table.hosted(ObjectId("c1", "8")) is None


def test_a_reactivation_replaces_a_stage_but_never_a_serving_copy() -> None:
    table = LocationTable("n1")
    table.staged(hosted(staged=True))
    back = hosted(epoch=2)
    table.reactivated_here(back)
    assert table.hosted(RID) is back
    with pytest.raises(ObjectBusyError, match=r"^object c1/7 is already hosted here$"):
        table.reactivated_here(hosted(epoch=3))
    empty = LocationTable("n2")
    again = hosted(epoch=3)
    empty.reactivated_here(again)
    assert empty.hosted(RID) is again


def test_a_copy_that_moved_out_leaves_and_drops_a_hint_heard_meanwhile() -> None:
    table = LocationTable("n1")
    table.heard(RID, "n2", 1)  # heard before its home brought it back here
    copy = hosted(epoch=2)
    table.reactivated_here(copy)
    assert table.hint(RID) == Hint("n2", 1)
    assert table.moved_out(copy, "n3", 3)
    assert table.hosted(RID) is None and table.hint(RID) is None
    assert not table.moved_out(copy, "n3", 3)  # gone already


def test_a_copy_that_moved_out_after_a_newer_arrival_leaves_the_newer_in_place() -> None:
    table = LocationTable("n1")
    old = hosted(staged=True)
    table.staged(old)
    newer = hosted(epoch=2)
    table.reactivated_here(newer)  # its home brought it back here meanwhile
    assert not table.moved_out(old, "n2", 2)
    assert table.hosted(RID) is newer


def test_a_copy_leaves_only_if_it_is_the_one_the_table_holds() -> None:
    table = LocationTable("n1")
    copy = hosted()
    table.created_here(copy)
    assert table.left(RID, hosted()) is None and table.hosted(RID) is copy
    assert table.left(RID, copy) is copy and table.hosted(RID) is None
    table.created_here(copy)
    assert table.left(RID) is copy and table.left(RID) is None


def test_a_hint_is_ignored_for_an_object_hosted_or_homed_here() -> None:
    table = LocationTable("n1")
    table.created_here(hosted())
    table.heard(RID, "n2", 5)
    assert table.hint(RID) is None and table.where(RID) == "n1"
    home = LocationTable("c1")
    home.created_at(RID, "n3", "counter", durable=False)
    home.heard(RID, "n2", 5)
    assert home.hint(RID) is None and home.where(RID) == "n3"


def test_a_hint_at_the_same_epoch_or_newer_replaces_the_old_one() -> None:
    table = LocationTable("c2")
    table.heard(RID, "n2", 3)
    table.heard(RID, "n4", 3)
    assert table.hint(RID) == Hint("n4", 3)
    table.heard(RID, "n5", 4)
    assert table.hint(RID) == Hint("n5", 4) and table.locate_here(RID) == ("n5", False, 4)
    fresh = LocationTable("c2")
    fresh.heard(RID, "n1")
    assert fresh.hint(RID) == Hint("n1", 0)


def test_hints_are_kept_up_to_their_bound_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(locations, "HINTS_MAX", 3)
    table = LocationTable("c2")
    ids = [ObjectId("c1", str(i)) for i in range(4)]
    for rid in ids[:3]:
        table.heard(rid, "n1", 1)
    table.heard(ids[0], "n2", 2)  # heard again: the newest now
    assert [table.hint(rid) is not None for rid in ids[:3]] == [True, True, True]
    table.heard(ids[3], "n1", 1)  # one past the bound: the oldest heard goes
    assert [table.hint(rid) is not None for rid in ids] == [True, False, True, True]


def test_one_migration_at_a_time_per_object() -> None:
    table = LocationTable("c1")
    assert table.migration_started(RID) and table.is_migrating(RID)
    assert not table.migration_started(RID)
    assert table.migrating_ids() == [RID]
    table.migration_ended(RID)
    assert not table.is_migrating(RID) and table.migrating_ids() == []
    table.migration_ended(RID)  # twice: nothing left
    assert table.migration_started(RID)


def test_a_commit_says_exactly_why_it_was_refused() -> None:
    table = table_with_object_at("n1")
    stranger = LocationTable("c9")
    assert stranger.commit_move(RID, "m1", "n1", 1, "n2") == Commit(
        False, 0, "", "c9 is not the home of c1/7"
    )
    assert table.commit_move(RID, "m1", "n9", 1, "n2") == Commit(
        False, 1, "n1", "the object runs on n1 at epoch 1, not on n9 at epoch 1"
    )
    assert table.commit_move(RID, "m1", "n1", 2, "n2") == Commit(
        False, 1, "n1", "the object runs on n1 at epoch 1, not on n1 at epoch 2"
    )
    table.resolve_move(RID, "m0")
    assert table.commit_move(RID, "m0", "n1", 1, "n2") == Commit(
        False, 1, "n1", "its source gave up on that move"
    )
    nowhere = LocationTable("c1")
    nowhere.restored_home(RID, HomeEntry("", "counter"))
    assert nowhere.commit_move(RID, "m1", "n1", 1, "n2") == Commit(
        False, 1, "", "the object runs on nowhere at epoch 1, not on n1 at epoch 1"
    )


def test_a_commit_records_the_move_and_a_repeat_answers_from_the_record() -> None:
    table = table_with_object_at("n1")
    assert table.commit_move(RID, "m1", "n1", 1, "n2") == Commit(True, 2, "n2")
    entry = table.home_entry(RID)
    assert entry is not None and (entry.location, entry.epoch, entry.last_commit) == (
        "n2",
        2,
        "m1",
    )
    assert table.commit_move(RID, "m1", "n1", 1, "n2") == Commit(True, 2, "n2")
    assert table.resolve_move(RID, "m1") == Resolution(True, 2, "n2")


def test_a_resolution_fences_a_move_once_and_answers_with_the_entry() -> None:
    table = table_with_object_at("n1")
    assert table.resolve_move(RID, "m1") == Resolution(False, 1, "n1")
    assert table.resolve_move(RID, "m1") == Resolution(False, 1, "n1")
    entry = table.home_entry(RID)
    assert entry is not None and list(entry.fenced) == ["m1"]
    assert LocationTable("c9").resolve_move(RID, "m1") == Resolution(False, 0, "", known=False)


def test_a_reactivation_is_the_next_epoch_at_the_new_place_and_clears_the_commit() -> None:
    table = table_with_object_at("n1")
    table.commit_move(RID, "m1", "n1", 1, "n2")
    assert table.reactivation(RID, "n3") == 3
    entry = table.home_entry(RID)
    assert entry is not None and (entry.location, entry.epoch, entry.last_commit) == (
        "n3",
        3,
        "",
    )
    # The move committed before is no longer the last: asked again, it is fenced.
    assert not table.resolve_move(RID, "m1").committed


def test_a_home_told_of_a_move_or_a_loss_updates_or_ends_its_entry() -> None:
    table = table_with_object_at("n1")
    table.moved_elsewhere(RID, "n4")
    entry = table.home_entry(RID)
    assert entry is not None and (entry.location, entry.type_label) == ("n4", "counter")
    table.moved_elsewhere(RID, "")
    assert table.home_entry(RID) is None
    table.moved_elsewhere(RID, "n5")  # an entry it did not have: made, its type unknown
    made = table.home_entry(RID)
    assert made is not None and (made.location, made.type_label, made.epoch) == ("n5", "?", 1)


def test_a_copy_hosted_at_its_home_is_located_at_the_home_s_epoch() -> None:
    """The home entry is the authority on the epoch, even over the copy here."""
    table = LocationTable("c1")
    table.created_here(hosted(epoch=1))
    table.reactivation(RID, "c1")  # the entry moves on before the copy hears
    assert table.locate_here(RID) == ("c1", True, 2)


def test_forgetting_what_is_not_known_is_no_error() -> None:
    """An end told twice (a retry, a loss reported by two hosts) changes nothing."""
    table = table_with_object_at("n1")
    table.forgotten(RID)
    table.forgotten(RID)
    table.moved_elsewhere(RID, "")
    table.hint_failed(RID)
    assert table.home_entry(RID) is None and table.locate_here(RID) == (None, False, 0)
