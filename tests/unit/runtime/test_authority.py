"""Who an object's calls act for and what a principal may call, without nodes
(runtime/authority.py; docs/security.md, "Principals and capabilities"). The node's
own storage object is the anchored class checked here: its ``access`` table is the one
principals meet on a node."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

from shuttle.errors import InvalidArgumentError, NotPermittedError
from shuttle.net.principals import Caps, PrincipalBook, PrincipalTable, new_principal
from shuttle.objects.storage import StorageObject
from shuttle.runtime.authority import (
    ACTING,
    NOTHING,
    Needs,
    acting,
    acting_for,
    arg,
    check_call,
    current_principal,
    each,
    list_roots,
    needs,
)

CLUSTER_KEY = bytes(range(32))


def book(**caps: Caps) -> PrincipalBook:
    return PrincipalBook(
        CLUSTER_KEY, PrincipalTable(1, {n: new_principal(n, c) for n, c in caps.items()})
    )


BOOK = book(
    alice=Caps.of(read=["data/", "scratch/"], write=["scratch/", "logs/"]),
    bob=Caps.of(read=[""], write=[""]),
)


def call(
    name: str,
    method: str,
    *args: Any,
    owner: str | None = None,
    anchored: type | None = StorageObject,
    principals: PrincipalBook = BOOK,
    **kwargs: Any,
) -> None:
    check_call(principals, name, "r1", owner, anchored, "storage", method, args, kwargs)


# --- the acting principal --------------------------------------------------------------


def test_code_acts_for_nobody_until_told_and_the_old_principal_comes_back_after() -> None:
    assert acting() is None
    with acting_for("alice"):
        assert acting() == "alice"
        with acting_for(None):
            assert acting() is None
        assert acting() == "alice"
        with pytest.raises(RuntimeError), acting_for("bob"):
            raise RuntimeError("the method failed")
        assert acting() == "alice"  # restored on the way out of a failure too
    assert acting() is None


def test_the_acting_principal_is_per_thread() -> None:
    seen: list[str | None] = []
    with acting_for("alice"):
        t = threading.Thread(target=lambda: seen.append(acting()))
        t.start()
        t.join()
    assert seen == [None]


# --- the keys a method touches ---------------------------------------------------------


def test_a_named_parameter_gives_its_key_if_it_is_a_non_empty_string() -> None:
    keys = arg("key")
    assert list(keys({"key": "data/x"})) == ["data/x"]
    assert list(keys({"key": ""})) == []  # the store refuses an empty key itself
    assert list(keys({"key": 3})) == []
    assert list(keys({})) == []


def test_each_item_of_a_list_parameter_gives_the_key_at_its_index() -> None:
    keys = each("items")
    assert list(keys({"items": [["a/1", 0], ("a/2", 5), ["a/3"]]})) == ["a/1", "a/2", "a/3"]
    assert list(keys({"items": (["t/1", 0],)})) == ["t/1"]  # a tuple as a list
    assert list(keys({"items": [[], [7, 0], "a/4", ["a/5"]]})) == ["a/5"]  # malformed skipped
    assert list(keys({"items": "a/1"})) == [] and list(keys({})) == []
    second = each("items", 1)
    assert list(second({"items": [["x", "k/1"], ["y"], ["z", "k/2", 3]]})) == ["k/1", "k/2"]


def test_needs_takes_parameter_names_as_keys_and_keeps_functions_as_they_are() -> None:
    rule = needs(read=["key", each("items")], write=["record"], lists=True)
    bound = {"key": "k", "items": [["i"]], "record": "r"}
    assert [list(f(bound)) for f in rule.read] == [["k"], ["i"]]
    assert [list(f(bound)) for f in rule.write] == [["r"]]
    assert rule.lists
    plain = needs()
    assert (plain.read, plain.write, plain.lists) == ((), (), False)
    assert plain == NOTHING


# --- calls into a node's anchored objects ------------------------------------------------


def test_a_principal_may_call_an_anchored_method_on_keys_its_caps_cover() -> None:
    call("alice", "read", "data/x")
    call("alice", "read", key="data/x", offset=3)
    call("alice", "put", "scratch/y", b"v")
    call("alice", "swap", "scratch/y", 0, b"v", record="scratch/y.rec")
    call("alice", "list")  # filters the listing itself
    call("bob", "stripe_put", "any/rec", 0, "v1", "any/key", 0, b"")
    call("alice", "remove", "scratch/y")
    call("alice", "remove_many", ["scratch/y", "logs/z"])


@pytest.mark.parametrize(
    ("method", "args", "message"),
    [
        ("read", ("secret/x",), r"may not read 'secret/x' \(through storage.read\)"),
        ("put", ("data/x", b"v"), r"may not write 'data/x' \(through storage.put\)"),
        # swap reads its key and writes it and its record: each is checked
        ("swap", ("data/x", 0, b"", True, "scratch/r"), r"may not write 'data/x'"),
        ("swap", ("scratch/x", 0, b"", True, "data/r"), r"may not write 'data/r'"),
        ("swap", ("other/x", 0, b"", True, "scratch/r"), r"may not read 'other/x'"),
        ("stripe_read", ("other/r", 0, "data/k"), r"may not read 'other/r'"),
        ("stripe_read", ("data/r", 0, "other/k"), r"may not read 'other/k'"),
        ("remove", ("data/x",), r"may not write 'data/x' \(through storage.remove\)"),
        # every key of a removal is checked, not only the first
        ("remove_many", (["scratch/y", "data/x"],), r"may not write 'data/x'"),
    ],
)
def test_an_anchored_method_is_refused_on_a_key_the_caps_do_not_cover(
    method: str, args: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(NotPermittedError, match=message) as info:
        call("alice", method, *args)
    assert "principal 'alice'" in str(info.value)


def test_keys_passed_by_name_are_checked_like_keys_passed_in_place() -> None:
    with pytest.raises(NotPermittedError, match="'secret/x'"):
        call("alice", "read", key="secret/x")
    with pytest.raises(NotPermittedError, match="'data/r'"):
        call("alice", "swap", "scratch/x", 0, b"", record="data/r")


class Anchored:
    """An anchored class whose methods show the rules' edges: a key parameter with a
    default, a method that touches no key, and one left out of the table."""

    access: ClassVar[dict[str, Needs]] = {
        "fetch": needs(read=["key"]),
        "ping": NOTHING,
    }

    def fetch(self, key: str = "secret/default") -> bytes:
        return b""

    def ping(self) -> str:
        return "pong"

    def compact(self) -> None:
        pass


def test_a_key_left_to_its_default_is_checked_too() -> None:
    with pytest.raises(NotPermittedError, match="'secret/default'"):
        call("alice", "fetch", anchored=Anchored)
    call("alice", "fetch", "data/x", anchored=Anchored)


def test_a_method_left_out_of_the_access_table_is_closed_to_every_principal() -> None:
    for name in ("alice", "bob"):
        with pytest.raises(NotPermittedError) as info:
            call(name, "compact", anchored=Anchored)
        assert str(info.value) == (
            f"principal {name!r} may not call storage.compact: that method of a node's own "
            "object is not open to principals (the cluster key's holder may call it)"
        )


def test_a_class_met_for_the_first_time_is_checked_by_its_own_signature() -> None:
    # A class made here is new to every run, so its signature is read afresh (the
    # signatures of classes met before are kept).
    class Fresh:
        access: ClassVar[dict[str, Needs]] = {"get": needs(read=["path"])}

        def get(self, offset: int, path: str) -> None:
            pass

    call("alice", "get", 0, "data/x", anchored=Fresh)
    with pytest.raises(NotPermittedError, match="'secret/x'"):
        call("alice", "get", 0, "secret/x", anchored=Fresh)
    with pytest.raises(NotPermittedError, match="'secret/y'"):
        call("alice", "get", path="secret/y", offset=0, anchored=Fresh)


def test_a_class_without_an_access_table_is_closed_to_principals() -> None:
    class Bare:
        def ping(self) -> None:
            pass

    with pytest.raises(NotPermittedError, match="not open to principals"):
        call("bob", "ping", anchored=Bare)


def test_a_method_that_touches_no_key_is_open_to_every_principal_but_a_removed_one() -> None:
    call("alice", "ping", anchored=Anchored)
    call("bob", "list")
    with pytest.raises(
        NotPermittedError, match=r"'carol' may not call storage\.ping: it was removed"
    ):
        call("carol", "ping", anchored=Anchored)


def test_a_removed_principal_may_touch_no_key() -> None:
    with pytest.raises(NotPermittedError, match=r"'carol' may not read 'data/x'.*was removed"):
        call("carol", "read", "data/x")


def test_arguments_the_method_does_not_take_are_refused_naming_the_method() -> None:
    with pytest.raises(InvalidArgumentError, match=r"^StorageObject.read: .*unexpected keyword"):
        call("bob", "read", "k", colour="blue")
    with pytest.raises(InvalidArgumentError, match=r"^StorageObject.read: .*missing"):
        call("bob", "read")
    # and again, once its signature is cached
    with pytest.raises(InvalidArgumentError, match=r"^StorageObject.read: "):
        call("bob", "read", "k", 0, 1, 2)


def test_a_change_of_caps_applies_to_the_next_call() -> None:
    principals = book(alice=Caps.of(read=["data/"]))
    call("alice", "read", "data/x", principals=principals)
    principals.replace(principals.table.with_principal(new_principal("alice", Caps())))
    with pytest.raises(NotPermittedError):
        call("alice", "read", "data/x", principals=principals)


# --- calls into other objects: only the owner's ----------------------------------------


def test_an_object_may_be_called_by_its_owner_only() -> None:
    call("alice", "run", owner="alice", anchored=None)
    with pytest.raises(NotPermittedError) as info:
        call("alice", "run", owner="bob", anchored=None)
    assert str(info.value) == (
        "principal 'alice' may not call run of object r1 (storage): it belongs to "
        "principal 'bob', and an object acts with its owner's rights only"
    )
    with pytest.raises(NotPermittedError, match="belongs to the cluster key's holder"):
        call("alice", "run", owner=None, anchored=None)


def test_a_removed_principal_may_not_call_even_its_own_objects() -> None:
    with pytest.raises(
        NotPermittedError, match=r"'carol' may not call run of object r1: .*removed"
    ):
        call("carol", "run", owner="carol", anchored=None)


# --- the acting principal's view of listings -------------------------------------------


def test_unrestricted_code_sees_whole_listings_and_a_principal_its_own_prefixes() -> None:
    assert current_principal(BOOK) is None and list_roots(BOOK, "") is None
    with acting_for("alice"):
        principal = current_principal(BOOK)
        assert principal is not None and principal.name == "alice"
        assert list_roots(BOOK, "") == ["data/", "scratch/"]
        assert list_roots(BOOK, "data/") is None
        assert list_roots(BOOK, "logs/") == []  # write-only: nothing to list
        # a client's run-time has no book: its nodes check its connections instead
        assert current_principal(None) is None and list_roots(None, "") is None
    with acting_for("carol"):
        removed = current_principal(BOOK)
        assert removed is not None and removed.removed and list_roots(BOOK, "") == []
    assert ACTING.get() is None
