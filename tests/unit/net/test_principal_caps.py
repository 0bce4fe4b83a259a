"""Principals' capabilities without sockets: read and write prefixes, names, ship and
admin, and the refusals caps make, each as its whole documented message
(docs/security.md, "Principals and capabilities"). Whole messages, golden bytes and
limits at exactly their value are here because mutation testing of net/principals.py
asked for them: each failed against a mutant every other test let through
(docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shuttle.errors import InvalidArgumentError, NotPermittedError
from shuttle.net.principals import Caps, Principal, PrincipalBook, new_principal
from tests.unit.net.principalhelp import ALICE, CLUSTER_KEY


def test_prefixes_are_plain_string_prefixes() -> None:
    caps = Caps.of(read=["data/"], write=["scratch/", "logs"])
    assert caps.may_read("data/x") and caps.may_read("data/sub/y")
    assert not caps.may_read("data") and not caps.may_read("database") and not caps.may_read("x")
    assert caps.may_write("logs") and caps.may_write("logs2/x") and not caps.may_write("data/x")
    assert Caps.of(read=[""]).may_read("anything/at/all")
    assert not Caps().may_read("x") and not Caps().may_write("x")


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (["/data/"], r"starts with '/'"),
        ([3], r"must be strings"),
        (["a\nb"], r"control characters"),
        ([f"p{i}/" for i in range(65)], r"at most 64"),
    ],
)
def test_malformed_prefixes_are_refused_naming_the_fix(bad: list[object], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Caps.of(read=bad)


def test_a_listing_is_whole_under_a_read_prefix_and_cut_to_the_prefixes_above_one() -> None:
    caps = Caps.of(read=["data/sub/", "data/sub/deeper/", "logs/2026/", "x"])
    assert caps.list_roots("data/sub/") is None
    assert caps.list_roots("data/sub/q") is None
    assert caps.list_roots("") == ["data/sub/", "logs/2026/", "x"]  # minimal: no covered one
    assert caps.list_roots("data/") == ["data/sub/"]
    assert caps.list_roots("secret/") == []


def test_a_refusal_names_the_principal_the_capability_the_key_and_the_command_to_grant_it() -> None:
    alice = new_principal("alice", Caps.of(read=["data/"], write=["scratch/"]))
    with pytest.raises(NotPermittedError) as info:
        alice.require_write("data/x.csv", "put")
    text = str(info.value)
    assert "principal 'alice' may not put 'data/x.csv' (the write capability)" in text
    assert "it may write under 'scratch/' only" in text
    assert "shuttle cluster user caps alice --read data/ --write data/ --write scratch/" in text
    with pytest.raises(NotPermittedError, match=r"lacks the ship capability.*--ship"):
        alice.require_ship()
    with pytest.raises(NotPermittedError, match=r"admin capability.*--admin"):
        alice.require_admin("call node.stats, a cluster operation")
    removed = PrincipalBook(CLUSTER_KEY).resolve("alice")
    with pytest.raises(NotPermittedError, match="was removed"):
        removed.require_read("data/x")


def test_an_invalid_name_is_refused_naming_the_rule() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        new_principal("-alice", Caps())
    assert str(info.value) == (
        "principal name '-alice' is not valid: 1 to 64 letters, digits, '.', '_', '@' or "
        "'-', starting with a letter or digit"
    )


@pytest.mark.parametrize(
    ("read", "write", "message"),
    [
        (
            ["a\x7fb"],
            [],
            "read prefix 'a\\x7fb' is not valid: at most 1024 bytes, no control characters",
        ),
        (
            [],
            ["x" * 1025],
            "write prefix '" + "x" * 59 + " is not valid: at most 1024 bytes, no control "
            "characters",
        ),
        (
            [],
            ["/data/"],
            "write prefix '/data/' starts with '/': keys never do (write 'data/', "
            "not '/data/'; '' covers every key)",
        ),
        ([b"data/"], [], "read prefixes must be strings, got b'data/'"),
        ([], [f"p{i}/" for i in range(65)], "at most 64 write prefixes, got 65"),
    ],
)
def test_a_malformed_prefix_is_refused_with_the_whole_message(
    read: list[object], write: list[object], message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Caps.of(read=read, write=write)
    assert str(info.value) == message


def test_prefixes_at_exactly_their_limits_are_kept() -> None:
    longest = "é" * 512  # 1,024 bytes of UTF-8
    caps = Caps.of(read=[longest], write=[f"p{i}/" for i in range(64)] + ["p0/"])
    assert caps.read == (longest,) and len(caps.write) == 64  # the repeat is dropped
    with pytest.raises(InvalidArgumentError, match="at most 1024 bytes"):
        Caps.of(read=[longest + "x"])


@pytest.mark.parametrize(("ship", "admin"), [(1, False), (False, "yes"), (None, None)])
def test_ship_and_admin_are_true_or_false(ship: object, admin: object) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        Caps.of(ship=ship, admin=admin)
    assert str(info.value) == "ship and admin are true or false"


def test_caps_describe_themselves_in_one_line_and_as_the_flags_that_grant_them() -> None:
    assert Caps().describe() == "no capabilities" and Caps().as_flags() == ""
    every = Caps.of(read=["data/", ""], write=["s/"], ship=True, admin=True)
    assert every.describe() == "read '' (every key), 'data/'; write 's/'; ship; admin"
    assert every.as_flags() == "--read '' --read data/ --write s/ --ship --admin"
    assert Caps.of(ship=True).describe() == "ship" and Caps.of(admin=True).describe() == "admin"
    assert Caps.of(write=["a b/"]).as_flags() == "--write 'a b/'"  # quoted for a shell


@pytest.mark.parametrize(
    ("attempt", "message"),
    [
        (
            lambda p: p.require_read("secret/x"),
            "principal 'alice' may not read 'secret/x' (the read capability): it may read "
            "under 'data/' only; an admin can grant it: shuttle cluster user caps alice "
            "--read data/ --read secret/ --write scratch/",
        ),
        (
            lambda p: p.require_write("data/a/b/c", via=" (through storage.put)"),
            "principal 'alice' may not write 'data/a/b/c' (through storage.put) (the write "
            "capability): it may write under 'scratch/' only; an admin can grant it: shuttle "
            "cluster user caps alice --read data/ --write data/a/b/ --write scratch/",
        ),
        (
            lambda p: p.require_read("top", "stat"),  # a key outside any directory
            "principal 'alice' may not stat 'top' (the read capability): it may read under "
            "'data/' only; an admin can grant it: shuttle cluster user caps alice --read "
            "data/ --read top --write scratch/",
        ),
        (
            lambda p: p.require_read(""),  # only the empty prefix covers the empty key
            "principal 'alice' may not read '' (the read capability): it may read under "
            "'data/' only; an admin can grant it: shuttle cluster user caps alice --read '' "
            "--read data/ --write scratch/",
        ),
        (
            lambda p: p.require_ship(),
            "principal 'alice' may not ship code (the ship capability): it lacks the ship "
            "capability (read 'data/'; write 'scratch/'); an admin can grant it: shuttle "
            "cluster user caps alice --read data/ --write scratch/ --ship",
        ),
        (
            lambda p: p.require_admin("call node.stats, a cluster operation"),
            "principal 'alice' may not call node.stats, a cluster operation (the admin "
            "capability): it lacks the admin capability (read 'data/'; write 'scratch/'); an "
            "admin can grant it: shuttle cluster user caps alice --read data/ --write "
            "scratch/ --admin",
        ),
    ],
)
def test_a_refusal_is_the_whole_documented_message(
    attempt: Callable[[Principal], None], message: str
) -> None:
    with pytest.raises(NotPermittedError) as info:
        attempt(ALICE)
    assert str(info.value) == message


def test_a_principal_without_caps_may_do_nothing_and_is_told_so() -> None:
    nobody = new_principal("nobody", Caps())
    with pytest.raises(NotPermittedError) as info:
        nobody.require_write("a/b")
    assert str(info.value) == (
        "principal 'nobody' may not write 'a/b' (the write capability): it may write under "
        "nothing only; an admin can grant it: shuttle cluster user caps nobody --write a/"
    )


def test_a_removed_principals_refusal_says_it_was_removed() -> None:
    removed = PrincipalBook(CLUSTER_KEY).resolve("carol")
    assert (removed.name, removed.caps, removed.salt, removed.removed) == (
        "carol",
        Caps(),
        b"",
        True,
    )
    with pytest.raises(NotPermittedError) as info:
        removed.require_admin("call node.stats")
    assert str(info.value) == (
        "principal 'carol' may not call node.stats: it was removed from the cluster "
        "(its objects and connections have no rights left)"
    )
