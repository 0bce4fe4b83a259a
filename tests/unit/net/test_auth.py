"""Cluster-key authentication without sockets: key files, proofs, and the decisions
each end of the handshake takes, run through an in-memory pair of codec ends."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shuttle.errors import AuthenticationError, ConfigError, InvalidArgumentError
from shuttle.net import auth
from shuttle.wire import Challenge, Connection, ErrorResponse, Hello, Role, State, Welcome
from tests.unit.wire.test_codec import drain

keys = st.binary(min_size=auth.KEY_BYTES, max_size=auth.KEY_BYTES)
nonces = st.binary(min_size=auth.NONCE_BYTES, max_size=auth.NONCE_BYTES)
names = st.text(max_size=40)

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


# --- proofs ----------------------------------------------------------------------------


@given(key=keys, challenge=nonces, other=nonces, client_nonce=nonces, name=names)
def test_a_proof_answers_one_challenge_only(
    key: bytes, challenge: bytes, other: bytes, client_nonce: bytes, name: str
) -> None:
    assume(challenge != other)
    proof = auth.client_proof(key, challenge, client_nonce, name)
    assert auth.client_proof(key, challenge, client_nonce, name) == proof  # deterministic
    assert auth.client_proof(key, other, client_nonce, name) != proof
    assert auth.node_proof(key, challenge, client_nonce, name) != auth.node_proof(
        key, other, client_nonce, name
    )


@given(key=keys, other_key=keys, challenge=nonces, client_nonce=nonces, name=names)
def test_proofs_differ_per_key(
    key: bytes, other_key: bytes, challenge: bytes, client_nonce: bytes, name: str
) -> None:
    assume(key != other_key)
    assert auth.client_proof(key, challenge, client_nonce, name) != auth.client_proof(
        other_key, challenge, client_nonce, name
    )
    assert auth.node_proof(key, challenge, client_nonce, name) != auth.node_proof(
        other_key, challenge, client_nonce, name
    )


@given(key=keys, challenge=nonces, client_nonce=nonces, name=names, other_name=names)
def test_proofs_differ_per_client_name_and_client_nonce(
    key: bytes, challenge: bytes, client_nonce: bytes, name: str, other_name: str
) -> None:
    assume(name != other_name)
    proof = auth.client_proof(key, challenge, client_nonce, name)
    assert auth.client_proof(key, challenge, client_nonce, other_name) != proof
    flipped = bytes([client_nonce[0] ^ 1]) + client_nonce[1:]
    assert auth.client_proof(key, challenge, flipped, name) != proof


@given(key=keys, challenge=nonces, client_nonce=nonces, name=names)
def test_a_node_proof_is_never_a_client_proof(
    key: bytes, challenge: bytes, client_nonce: bytes, name: str
) -> None:
    # Domain separation: a node's proof cannot be reflected back as a client's.
    assert auth.node_proof(key, challenge, client_nonce, name) != auth.client_proof(
        key, challenge, client_nonce, name
    )


def test_proof_inputs_are_checked() -> None:
    with pytest.raises(InvalidArgumentError, match="32 bytes"):
        auth.client_proof(b"short", bytes(32), bytes(32), "c")
    with pytest.raises(InvalidArgumentError, match="challenge nonce must be 32 bytes"):
        auth.client_proof(KEY, b"n", bytes(32), "c")


def test_verify_compares_whole_proofs_of_bytes_only() -> None:
    proof = auth.client_proof(KEY, bytes(32), bytes(32), "c")
    assert auth.verify(proof, bytes(proof))
    assert not auth.verify(proof, proof[:-1])
    assert not auth.verify(proof, proof.hex())
    assert not auth.verify(proof, None)


# --- the handshake's decisions, over an in-memory pair ---------------------------------------


def run_handshake(
    node_key: bytes | None, client_key: bytes | None
) -> tuple[Connection, Connection, Welcome | ErrorResponse]:
    """Drive both codec ends through the handshake as the node and the clients do."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    nonce = os.urandom(auth.NONCE_BYTES)
    client.receive_data(server.send_bytes(Challenge(nonce, node_key is not None, auth.SCHEME)))
    [challenge] = drain(client)
    assert isinstance(challenge, Challenge)
    hello, client_nonce = auth.client_hello(challenge, client_key, "test-client", "n1")
    server.receive_data(client.send_bytes(hello))
    [received] = drain(server)
    assert isinstance(received, Hello)
    answer: Welcome | ErrorResponse
    try:
        proof = auth.check_hello(received, node_key, nonce, "n1")
        answer = Welcome(1, "n1", {}, proof)
    except AuthenticationError as exc:
        answer = ErrorResponse.from_exception(0, exc)
    client.receive_data(server.send_bytes(answer))
    [got] = drain(client)
    assert isinstance(got, Welcome | ErrorResponse)
    if isinstance(got, Welcome):
        auth.check_welcome(got, challenge, client_key, client_nonce, "n1")
    return client, server, got


def test_right_key_authenticates_both_ways() -> None:
    client, server, welcome = run_handshake(KEY, KEY)
    assert isinstance(welcome, Welcome) and welcome.proof is not None
    assert client.state is State.READY and server.state is State.READY


def test_keyless_node_serves_clients_with_or_without_a_key() -> None:
    for client_key in (None, KEY):
        client, _, welcome = run_handshake(None, client_key)
        assert isinstance(welcome, Welcome) and welcome.proof is None
        assert client.state is State.READY


def test_wrong_key_is_refused_by_the_node_with_a_clear_error() -> None:
    client, server, answer = run_handshake(KEY, OTHER_KEY)
    assert isinstance(answer, ErrorResponse) and answer.rid == 0
    error = answer.to_exception()
    assert isinstance(error, AuthenticationError) and error.exit_code == 7
    assert "wrong cluster key" in str(error) and "replayed" in str(error)
    assert client.state is State.CLOSED and server.state is State.CLOSED


def test_client_without_a_key_stops_before_sending_anything() -> None:
    challenge = Challenge(bytes(32), True, auth.SCHEME)
    with pytest.raises(AuthenticationError, match="requires the cluster key") as info:
        auth.client_hello(challenge, None, "c", "n1 (127.0.0.1:7401)")
    assert "shuttle cluster up" in str(info.value) and "--key-file" in str(info.value)


def test_node_refuses_a_hello_without_credentials_naming_the_fix() -> None:
    with pytest.raises(AuthenticationError, match="node n1 requires the cluster key") as info:
        auth.check_hello(Hello(2, 2, "c"), KEY, bytes(32), "n1")
    assert "SHUTTLE_KEY_FILE" in str(info.value)


def test_a_hello_answering_another_challenge_is_refused_as_a_replay() -> None:
    first, second = os.urandom(32), os.urandom(32)
    hello, _ = auth.client_hello(Challenge(first, True, auth.SCHEME), KEY, "c", "n1")
    assert auth.check_hello(hello, KEY, first, "n1") is not None
    with pytest.raises(AuthenticationError, match="replayed from another connection"):
        auth.check_hello(hello, KEY, second, "n1")


@pytest.mark.parametrize(
    "credentials, message",
    [
        ({"scheme": "rot13", "nonce": bytes(32), "proof": bytes(32)}, "scheme"),
        ({"scheme": auth.SCHEME, "nonce": b"short", "proof": bytes(32)}, "malformed"),
        ({"scheme": auth.SCHEME, "nonce": bytes(32), "proof": "hex"}, "malformed"),
        ({"scheme": auth.SCHEME, "nonce": bytes(32)}, "malformed"),
    ],
)
def test_malformed_credentials_are_refused(credentials: dict[str, object], message: str) -> None:
    with pytest.raises(AuthenticationError, match=message):
        auth.check_hello(Hello(2, 2, "c", credentials), KEY, bytes(32), "n1")


def test_the_client_refuses_a_node_that_proves_another_key() -> None:
    nonce = os.urandom(32)
    challenge = Challenge(nonce, True, auth.SCHEME)
    _, client_nonce = auth.client_hello(challenge, KEY, "c", "n1")
    assert client_nonce is not None
    forged = auth.node_proof(OTHER_KEY, nonce, client_nonce, "n1")
    with pytest.raises(AuthenticationError, match="did not prove it holds the cluster key"):
        auth.check_welcome(Welcome(1, "n1", {}, forged), challenge, KEY, client_nonce, "n1")
    # A node that claims to need the key must prove it: no proof is refused too.
    with pytest.raises(AuthenticationError, match="did not prove"):
        auth.check_welcome(Welcome(1, "n1", {}), challenge, KEY, client_nonce, "n1")
    good = auth.node_proof(KEY, nonce, client_nonce, "n1")
    auth.check_welcome(Welcome(1, "n1", {}, good), challenge, KEY, client_nonce, "n1")


def test_a_node_speaking_another_scheme_is_refused_if_it_requires_a_key() -> None:
    with pytest.raises(AuthenticationError, match="upgrade the older side"):
        auth.client_hello(Challenge(bytes(32), True, "future-v9"), KEY, "c", "n1")
    hello, nonce = auth.client_hello(Challenge(bytes(32), False, "future-v9"), KEY, "c", "n1")
    assert hello.credentials is None and nonce is None  # a keyless node: data only


# --- key files -------------------------------------------------------------------------


def test_a_key_file_is_written_0600_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "cluster.key"
    key = auth.write_key_file(path)
    assert len(key) == auth.KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == key.hex() + "\n"
    assert auth.load_key_file(path) == key
    assert auth.write_key_file(tmp_path / "another.key") != key


def test_an_existing_key_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "cluster.key"
    key = auth.write_key_file(path)
    with pytest.raises(ConfigError, match="already exists"):
        auth.write_key_file(path)
    assert auth.load_key_file(path) == key


def test_a_strict_umask_still_gives_an_owner_readable_file(tmp_path: Path) -> None:
    old = os.umask(0o777)
    try:
        auth.write_key_file(tmp_path / "cluster.key")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "cluster.key").stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620])
def test_a_key_file_open_to_others_is_refused_with_the_chmod_hint(
    tmp_path: Path, mode: int
) -> None:
    path = tmp_path / "cluster.key"
    auth.write_key_file(path)
    path.chmod(mode)
    with pytest.raises(ConfigError, match=re.escape(f"chmod 600 {path}")) as info:
        auth.load_key_file(path)
    assert f"{mode:04o}" in str(info.value)
    path.chmod(0o600)
    auth.load_key_file(path)


def test_a_missing_key_file_says_where_keys_come_from(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist.*shuttle cluster up"):
        auth.load_key_file(tmp_path / "nope.key")


def test_a_directory_is_not_a_key_file(tmp_path: Path) -> None:
    (tmp_path / "dir.key").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        auth.load_key_file(tmp_path / "dir.key")


@given(text=st.text(max_size=100) | st.just("ab" * 31) | st.just("zz" * 32))
def test_a_malformed_key_file_is_refused(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    assume(len(text.strip()) != 2 * auth.KEY_BYTES or not _is_hex(text.strip()))
    path = tmp_path_factory.mktemp("keys") / "bad.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, text.encode())
    os.close(fd)
    with pytest.raises(ConfigError, match="malformed: expected 64 hex digits"):
        auth.load_key_file(path)


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True
