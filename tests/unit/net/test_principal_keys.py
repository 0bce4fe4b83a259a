"""Principals' keys without sockets: derived from the cluster key, wrapped for an
administrator (and the documented bytes of both), principal key files, and the HELLO a
principal sends. Whole messages, golden bytes and limits at exactly their value are
here because mutation testing of net/principals.py asked for them: each failed against
a mutant every other test let through (docs/testing.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shuttle.errors import AuthenticationError, ConfigError, InvalidArgumentError
from shuttle.net import auth
from shuttle.net.principals import (
    Caps,
    PrincipalBook,
    PrincipalTable,
    derive_key,
    new_principal,
    unwrap_key,
    with_caps,
    wrap_key,
)
from shuttle.wire import Challenge
from tests.unit.net.principalhelp import ALICE, CLUSTER_KEY, OTHER_KEY


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


def test_a_principal_with_other_caps_keeps_its_name_and_key() -> None:
    wider = with_caps(ALICE, Caps.of(admin=True))
    assert (wider.name, wider.salt, wider.caps) == ("alice", ALICE.salt, Caps.of(admin=True))
    assert derive_key(CLUSTER_KEY, wider) == derive_key(CLUSTER_KEY, ALICE)
    assert ALICE.caps == Caps.of(read=["data/"], write=["scratch/"])  # unchanged


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
