"""Principals without sockets: caps and the refusals they make, the table nodes store,
keys derived from the cluster key, keys wrapped for an administrator, guards, and
principal key files and HELLOs (docs/security.md, "Principals and capabilities")."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shuttle.errors import (
    AuthenticationError,
    ConfigError,
    InvalidArgumentError,
    NotPermittedError,
)
from shuttle.net import auth, principals
from shuttle.net.principals import (
    Caps,
    Guard,
    Principal,
    PrincipalBook,
    PrincipalTable,
    admin_only,
    all_of,
    derive_key,
    new_principal,
    reads,
    reads_each,
    unwrap_key,
    with_caps,
    wrap_key,
    writes,
    writes_each,
)
from shuttle.wire import Challenge

CLUSTER_KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))

names = st.from_regex(r"[a-z0-9][a-z0-9._@-]{0,20}", fullmatch=True)
prefixes = st.lists(st.sampled_from(["", "data/", "data", "scratch/", "a/b/", "é/"]), max_size=3)


# --- caps --------------------------------------------------------------------------------


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


# --- the table -------------------------------------------------------------------------


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


# --- keys --------------------------------------------------------------------------------


def test_a_principal_s_key_depends_on_the_cluster_key_its_name_and_its_salt() -> None:
    alice = new_principal("alice", Caps())
    key = derive_key(CLUSTER_KEY, alice)
    assert len(key) == auth.KEY_BYTES
    assert derive_key(CLUSTER_KEY, alice) == key  # every node derives the same
    assert derive_key(OTHER_KEY, alice) != key
    assert derive_key(CLUSTER_KEY, new_principal("alice", Caps())) != key  # re-added: new salt
    assert key not in (CLUSTER_KEY, OTHER_KEY)
    book = PrincipalBook(CLUSTER_KEY, PrincipalTable(1, {"alice": alice}))
    assert book.key_of("alice") == key and book.key_of("bob") is None


def test_a_wrapped_key_opens_only_with_the_caller_s_key_and_only_unchanged() -> None:
    key = os.urandom(32)
    reply = wrap_key(CLUSTER_KEY, "alice", key)
    assert key not in reply["wrapped"] + reply["nonce"] + reply["tag"]
    assert unwrap_key(CLUSTER_KEY, "alice", reply) == key
    with pytest.raises(InvalidArgumentError, match="did not arrive intact"):
        unwrap_key(OTHER_KEY, "alice", reply)
    with pytest.raises(InvalidArgumentError, match="did not arrive intact"):
        unwrap_key(CLUSTER_KEY, "bob", reply)
    flipped = dict(reply, wrapped=bytes([reply["wrapped"][0] ^ 1]) + reply["wrapped"][1:])
    with pytest.raises(InvalidArgumentError, match="did not arrive intact"):
        unwrap_key(CLUSTER_KEY, "alice", flipped)
    assert wrap_key(CLUSTER_KEY, "alice", key)["wrapped"] != reply["wrapped"]  # fresh nonce


# --- guards ------------------------------------------------------------------------------


def test_guards_check_the_keys_a_request_names() -> None:
    p = new_principal("p", Caps.of(read=["r/"], write=["w/"]))
    reads()(p, {"key": "r/x"})
    writes()(p, {"key": "w/x"})
    reads_each()(p, {"keys": ["r/a", "r/b"]})
    writes_each()(p, {"keys": ["w/a"]})
    reads()(p, {"key": 3})  # not a key: the operation refuses it, touching nothing
    for guard, args in [
        (reads(), {"key": "w/x"}),
        (writes(), {"key": "r/x"}),
        (reads_each(), {"keys": ["r/a", "w/b"]}),
        (writes_each(), {"keys": ["w/a", "r/b"]}),
        (admin_only("node.stats"), {}),
    ]:
        with pytest.raises(NotPermittedError):
            guard(p, args)
    admin_only("node.stats")(new_principal("root", Caps.of(admin=True)), {})


# --- key files and HELLOs ------------------------------------------------------------------


def test_a_principal_key_file_names_its_principal_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "alice.key"
    key = os.urandom(32)
    auth.write_principal_key_file(path, "alice", key)
    assert path.stat().st_mode & 0o777 == 0o600
    text = path.read_text()
    assert text.startswith("#") and "principal alice\n" in text and f"key {key.hex()}\n" in text
    assert auth.load_credentials(path) == auth.Credentials(key, "alice")
    assert "alice" in repr(auth.load_credentials(path)) and key.hex() not in repr(
        auth.load_credentials(path)
    )
    with pytest.raises(ConfigError, match="already exists"):
        auth.write_principal_key_file(path, "alice", key)
    with pytest.raises(ConfigError, match=r"principal 'alice'.*not the cluster key"):
        auth.load_key_file(path)  # a node needs the cluster key
    path.chmod(0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        auth.load_credentials(path)


def test_today_s_cluster_key_files_still_load(tmp_path: Path) -> None:
    path = tmp_path / "cluster.key"
    key = auth.write_key_file(path)
    assert auth.load_credentials(path) == auth.Credentials(key, None)
    assert auth.load_key_file(path) == key


@pytest.mark.parametrize(
    "text",
    [
        "principal alice\n",
        "key " + "ab" * 32 + "\n",
        "principal alice\nkey " + "ab" * 31 + "\n",
        "principal alice\nprincipal bob\nkey " + "ab" * 32 + "\n",
        "principal al ice\nkey " + "ab" * 32 + "\n",
        "user alice\nkey " + "ab" * 32 + "\n",
    ],
)
def test_a_malformed_principal_key_file_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, text.encode())
    os.close(fd)
    with pytest.raises(ConfigError, match=r"malformed|not valid"):
        auth.load_credentials(path)


def test_a_hello_names_its_principal_and_the_proof_uses_the_principal_s_key() -> None:
    alice = new_principal("alice", Caps.of(read=["data/"]))
    key = derive_key(CLUSTER_KEY, alice)
    challenge = Challenge(os.urandom(32), True, auth.SCHEME)
    hello, _ = auth.client_hello(challenge, key, "c", "n1", principal="alice")
    assert auth.hello_principal(hello) == "alice"
    proof = auth.check_hello(hello, key, challenge.nonce, "n1")  # the node derived the key
    assert proof is not None
    with pytest.raises(AuthenticationError, match="proof does not answer"):
        auth.check_hello(hello, CLUSTER_KEY, challenge.nonce, "n1")
    plain, _ = auth.client_hello(challenge, CLUSTER_KEY, "c", "n1")
    assert auth.hello_principal(plain) is None
    assert plain.credentials is not None and "principal" not in plain.credentials
    forged = plain.__class__(
        plain.version_min,
        plain.version_max,
        plain.client_name,
        {**plain.credentials, "principal": 7},
    )
    with pytest.raises(AuthenticationError, match="malformed credentials"):
        auth.hello_principal(forged)


# --- what mutation testing asked for (docs/testing.md) ----------------------------------
#
# Whole messages, golden bytes and limits at exactly their value: each test below
# failed against a mutant of net/principals.py that every other test let through.

ALICE = Principal(
    "alice", Caps.of(read=["data/"], write=["scratch/"]), bytes(range(16)), 1_700_000_000 * 10**9
)


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


def test_a_principal_records_when_it_was_made(monkeypatch: pytest.MonkeyPatch) -> None:
    assert new_principal("a", Caps(), now_ns=5).created_ns == 5
    monkeypatch.setattr("time.time_ns", lambda: 1234)
    assert new_principal("a", Caps()).created_ns == 1234


def test_a_table_entry_without_a_creation_time_reads_as_made_at_zero() -> None:
    entry = {"read": [], "write": [], "ship": False, "admin": False, "salt": "00" * 16}
    wire = {"format": 1, "epoch": 1, "principals": {"a": entry}}
    assert PrincipalTable.from_wire(wire, "test").principals["a"].created_ns == 0


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


# Guards are made inside the test (by these functions), not when the module is
# collected: a guard made then would keep the code it was made with.
GUARDS: list[tuple[Callable[[], Guard], dict[str, object], str]] = [
    (lambda: reads(), {"key": "w/x"}, "principal 'p' may not read 'w/x' (the read capability)"),
    (lambda: writes(), {"key": "r/x"}, "principal 'p' may not write 'r/x' (the write capability)"),
    (lambda: reads("src", "copy"), {"src": "w/x"}, "principal 'p' may not copy 'w/x' (the read"),
    (lambda: writes("dst", "move"), {"dst": "r/x"}, "principal 'p' may not move 'r/x' (the write"),
    (
        lambda: reads_each(),
        {"keys": ["r/a", 3, "w/b"]},
        "principal 'p' may not read 'w/b' (the read capability)",
    ),
    (
        lambda: reads_each("paths", "stat"),
        {"paths": ["w/b"]},
        "principal 'p' may not stat 'w/b' (the read",
    ),
    (
        lambda: writes_each(),
        {"keys": ["w/a", "r/b"]},
        "principal 'p' may not write 'r/b' (the write capability)",
    ),
    (
        lambda: writes_each("items", "remove"),
        {"items": ["r/b"]},
        "principal 'p' may not remove 'r/b' (the write",
    ),
    (
        lambda: admin_only("node.stats"),
        {},
        "principal 'p' may not call node.stats, a cluster operation (the admin capability)",
    ),
    (
        lambda: all_of(reads("src"), writes("dst")),
        {"src": "r/x", "dst": "r/y"},
        "principal 'p' may not write 'r/y' (the write capability)",
    ),
    (
        lambda: all_of(reads("src"), writes("dst")),
        {"src": "w/x", "dst": "w/y"},
        "principal 'p' may not read 'w/x' (the read capability)",
    ),
]


@pytest.mark.parametrize(("make", "args", "message"), GUARDS)
def test_a_guard_names_the_verb_and_key_it_refuses(
    make: Callable[[], Guard], args: dict[str, object], message: str
) -> None:
    p = new_principal("p", Caps.of(read=["r/"], write=["w/"]))
    with pytest.raises(NotPermittedError) as info:
        make()(p, dict(args))
    assert str(info.value).startswith(message)


def test_a_guard_of_several_checks_passes_when_each_does() -> None:
    p = new_principal("p", Caps.of(read=["r/"], write=["w/"]))
    all_of(reads("src"), writes("dst"))(p, {"src": "r/x", "dst": "w/y"})
    all_of()(p, {})
    writes_each()(p, {"keys": "w/not-a-list"})  # the handler refuses it, touching nothing


def test_a_principal_with_other_caps_keeps_its_name_and_key() -> None:
    wider = with_caps(ALICE, Caps.of(admin=True))
    assert (wider.name, wider.salt, wider.caps) == ("alice", ALICE.salt, Caps.of(admin=True))
    assert derive_key(CLUSTER_KEY, wider) == derive_key(CLUSTER_KEY, ALICE)
    assert ALICE.caps == Caps.of(read=["data/"], write=["scratch/"])  # unchanged


# --- golden bytes: keys and tables made by one version are read by the next -------------


def test_a_principal_key_is_the_documented_derivation() -> None:
    # blake3 keyed by the cluster key over b"shuttle principal key v1\0", the name's
    # length (4 bytes, big-endian), the name and the salt: every key file depends on it.
    assert derive_key(CLUSTER_KEY, ALICE).hex() == (
        "5a20e4d433cd991aaa6af5495c66306cbf23198199eac28106c1a0c70cdb7189"
    )


def test_a_wrapped_key_is_the_documented_bytes() -> None:
    # What a node of this version answers to principal.key: an older or newer CLI
    # unwraps it only if the mask and tag are computed the same way.
    reply = {
        "principal": "alice",
        "nonce": bytes(range(100, 116)),
        "wrapped": bytes.fromhex(
            "7f7bf0a929ad68fc339b117403ccf7fe9a83778e2975188a76a29f3fe68a33e6"
        ),
        "tag": bytes.fromhex("08382239f7c120feb9b5842a9899b408"),
    }
    assert unwrap_key(CLUSTER_KEY, "alice", reply) == bytes(range(32, 64))
    fresh = wrap_key(CLUSTER_KEY, "alice", bytes(range(32, 64)))
    assert set(fresh) == set(reply) and fresh["principal"] == "alice"
    assert (len(fresh["nonce"]), len(fresh["wrapped"]), len(fresh["tag"])) == (16, 32, 16)


@pytest.mark.parametrize(
    "change",
    [
        {"nonce": b"short"},
        {"nonce": None},
        {"wrapped": b"\0" * 31},
        {"wrapped": "not bytes"},
        {"tag": None},
        {"tag": "00" * 16},
    ],
)
def test_a_malformed_wrapped_key_is_refused_as_malformed(change: dict[str, object]) -> None:
    reply = {**wrap_key(CLUSTER_KEY, "alice", os.urandom(32)), **change}
    with pytest.raises(InvalidArgumentError) as info:
        unwrap_key(CLUSTER_KEY, "alice", reply)
    assert str(info.value) == "malformed wrapped key in the node's answer"


def test_a_changed_wrapped_key_says_nothing_was_written() -> None:
    reply = wrap_key(CLUSTER_KEY, "alice", os.urandom(32))
    with pytest.raises(InvalidArgumentError) as info:
        unwrap_key(OTHER_KEY, "alice", reply)
    assert str(info.value) == (
        "the key of principal 'alice' did not arrive intact (its tag does not match): "
        "nothing was written; run the command again"
    )


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


# --- a node's book ---------------------------------------------------------------------


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
