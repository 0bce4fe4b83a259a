"""Principals without sockets: caps and the refusals they make, the table nodes store,
keys derived from the cluster key, keys wrapped for an administrator, guards, and
principal key files and HELLOs (docs/security.md, "Principals and capabilities")."""

from __future__ import annotations

import os
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
from shuttle.net import auth
from shuttle.net.principals import (
    Caps,
    PrincipalBook,
    PrincipalTable,
    admin_only,
    derive_key,
    new_principal,
    reads,
    reads_each,
    unwrap_key,
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
