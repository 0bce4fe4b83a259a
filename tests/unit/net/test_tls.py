"""TLS without sockets: two :class:`TlsChannel` ends joined in memory, the cluster's
certificates, the channel binding in the key proofs, and the errors a client shows."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from shuttle.errors import AuthenticationError, ConfigError, TlsError
from shuttle.net import auth, certs
from shuttle.net.tls import ClientTls, ServerTls, TlsChannel, client_failure
from shuttle.wire import Challenge, Hello, Welcome

KEY = bytes(range(32))


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[certs.CertPair, certs.CertPair]:
    root = tmp_path_factory.mktemp("pki")
    ca = certs.make_ca(root / "ca")
    return ca, certs.make_node_cert(ca, root / "nodes", "n1", "127.0.0.1")


def _move(src: TlsChannel, dst: TlsChannel) -> None:
    out = src.output()
    if out:
        dst.feed(out)


def connect(
    pki: tuple[certs.CertPair, certs.CertPair], ca_file: Path | None = None, host: str = "127.0.0.1"
) -> tuple[TlsChannel, TlsChannel]:
    ca, node = pki
    server = TlsChannel(ServerTls(node.cert, node.key).context(), server_side=True)
    client = TlsChannel(
        ClientTls(ca_file or ca.cert).context(), server_side=False, server_hostname=host
    )
    for _ in range(4):
        client.handshake()
        _move(client, server)
        server.handshake()
        _move(server, client)
    assert client.established and server.established
    return client, server


def test_both_ends_agree_on_a_binding_no_other_connection_has(
    pki: tuple[certs.CertPair, certs.CertPair],
) -> None:
    c1, s1 = connect(pki)
    c2, s2 = connect(pki)
    assert c1.version == "TLSv1.3"
    assert c1.binding() == s1.binding() and len(c1.binding()) >= 32
    assert c2.binding() == s2.binding() != c1.binding()


def test_plaintext_crosses_in_records_and_a_close_notify_ends_it(
    pki: tuple[certs.CertPair, certs.CertPair],
) -> None:
    client, server = connect(pki)
    big = bytes(range(256)) * 4000  # ~1 MB: dozens of records
    server.feed(client.encrypt(big))
    assert server.read(100) == big[:100]
    assert server.read() == big[100:]
    client.feed(server.encrypt(b"x" * 50_000))
    into = memoryview(bytearray(50_000))
    assert client.read_into(into) == 50_000 and bytes(into) == b"x" * 50_000
    assert client.read() == b"" and not client.peer_closed  # nothing more, yet
    server.feed(client.close())
    assert server.read() == b"" and server.peer_closed


@pytest.mark.parametrize("where", [0, 3, 5, 20, -17, -1])
def test_a_changed_byte_anywhere_in_a_record_fails_it(
    pki: tuple[certs.CertPair, certs.CertPair], where: int
) -> None:
    client, server = connect(pki)
    record = bytearray(client.encrypt(b"a request header and its payload" * 10))
    record[where] ^= 0x01
    server.feed(bytes(record))
    with pytest.raises(ssl.SSLError):
        server.read()


def test_a_node_certificate_from_another_ca_fails_with_a_clear_error(
    pki: tuple[certs.CertPair, certs.CertPair], tmp_path: Path
) -> None:
    stranger = certs.make_ca(tmp_path / "stranger")
    with pytest.raises(ssl.SSLCertVerificationError) as exc:
        connect(pki, ca_file=stranger.cert)
    err = client_failure(exc.value, "127.0.0.1:7401", stranger.cert, None)
    assert isinstance(err, TlsError) and isinstance(err, AuthenticationError)
    assert "failed verification" in str(err) and str(stranger.cert) in str(err)


def test_a_certificate_for_another_name_fails(pki: tuple[certs.CertPair, certs.CertPair]) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        connect(pki, host="10.1.2.3")


def test_a_plain_node_s_answer_is_named_as_such(pki: tuple[certs.CertPair, certs.CertPair]) -> None:
    ca, _ = pki
    client = TlsChannel(ClientTls(ca.cert).context(), server_side=False, server_hostname="x")
    client.handshake()
    client.feed(b"SH\x07\x00\x00\x00\x00\x30" + b"\x00" * 60)  # a CHALLENGE frame
    with pytest.raises(ssl.SSLError) as exc:
        client.handshake()
    err = client_failure(exc.value, "127.0.0.1:7401", ca.cert, client)
    assert "does not speak TLS" in str(err) and "--no-tls" in str(err)


# --- the key proofs, bound to the channel ---------------------------------------------


def test_a_proof_bound_to_one_channel_answers_no_other() -> None:
    nonce, mine = bytes(32), bytes(range(32))
    bound = auth.client_proof(KEY, nonce, mine, "c", b"channel A")
    assert bound != auth.client_proof(KEY, nonce, mine, "c")  # plain: the old proof
    assert bound != auth.client_proof(KEY, nonce, mine, "c", b"channel B")
    assert auth.node_proof(KEY, nonce, mine, "n1", b"A") != auth.node_proof(KEY, nonce, mine, "n1")


def test_a_hello_relayed_to_another_channel_is_refused() -> None:
    challenge = Challenge(bytes(32), True, auth.SCHEME)
    hello, client_nonce = auth.client_hello(challenge, KEY, "c", "relay", binding=b"client-relay")
    assert client_nonce is not None
    with pytest.raises(AuthenticationError, match="relayed from another TLS channel"):
        auth.check_hello(hello, KEY, challenge.nonce, "n1", binding=b"relay-node")
    proof = auth.check_hello(hello, KEY, challenge.nonce, "n1", binding=b"client-relay")
    assert proof is not None
    welcome = Welcome(2, "n1", {}, proof)
    auth.check_welcome(welcome, challenge, KEY, client_nonce, "n1", binding=b"client-relay")
    with pytest.raises(AuthenticationError):
        auth.check_welcome(welcome, challenge, KEY, client_nonce, "n1", binding=b"other")


def test_a_peer_whose_certificate_is_not_checked_must_prove_the_key() -> None:
    """An application's run-time has no certificate from the CA: a node calling it takes
    its WELCOME proof instead, and a peer that claims to need no key has none."""
    challenge = Challenge(bytes(32), False, auth.SCHEME)
    hello, nonce = auth.client_hello(challenge, KEY, "node", "rt", binding=b"b")
    assert isinstance(hello, Hello)
    no_proof = Welcome(2, "c-rt", {}, None)
    auth.check_welcome(no_proof, challenge, KEY, nonce, "rt", binding=b"b")  # as before
    with pytest.raises(AuthenticationError, match="did not prove"):
        auth.check_welcome(no_proof, challenge, KEY, nonce, "rt", binding=b"b", require_proof=True)


# --- certificates --------------------------------------------------------------------


def test_the_ca_is_made_once_and_its_keys_are_private(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "tls")
    assert ca.key.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ConfigError, match="refusing to replace it"):
        certs.make_ca(tmp_path / "tls")
    node = certs.make_node_cert(ca, tmp_path / "tls", "n1", "127.0.0.1")
    assert node.key.stat().st_mode & 0o777 == 0o600
    assert not certs.needs_renewal(node.cert, "127.0.0.1", "n1", ca.cert)
    assert certs.needs_renewal(node.cert, "10.0.0.5", "n1", ca.cert)  # the node moved
    other = certs.make_ca(tmp_path / "other")
    assert certs.needs_renewal(node.cert, "127.0.0.1", "n1", other.cert)
    assert certs.needs_renewal(tmp_path / "missing.pem", "127.0.0.1", "n1", ca.cert)


def test_a_key_open_to_others_or_not_matching_is_refused(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "a")
    node = certs.make_node_cert(ca, tmp_path / "a", "n1", "127.0.0.1")
    node.key.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        ServerTls(node.cert, node.key)
    other = certs.make_ca(tmp_path / "b")
    with pytest.raises(ConfigError, match="does not belong"):
        certs.load_ca(certs.CertPair(ca.cert, other.key))
    with pytest.raises(ConfigError, match="does not exist"):
        ClientTls(tmp_path / "nowhere.pem")


def test_names_a_node_certificate_carries() -> None:
    assert [str(n.value) for n in certs.san_for("127.0.0.1", "n1")] == [
        "127.0.0.1",
        "n1",
        "localhost",
    ]
    assert [str(n.value) for n in certs.san_for("10.0.0.7", "node_1")] == ["10.0.0.7"]
