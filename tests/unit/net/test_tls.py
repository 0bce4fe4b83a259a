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
    assert str(err) == (
        "node 127.0.0.1:7401 does not speak TLS (it answered in plain Shuttle frames): it was "
        "started without --tls. Connect without TLS (--no-tls; loopback only), or restart "
        "the node with TLS (`shuttle cluster up --tls`)"
    )


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
    with pytest.raises(ConfigError) as info:
        ServerTls(node.cert, node.key)
    assert str(info.value) == (
        f"TLS key {node.key} is open to group or others (mode 0644): anyone who can read it "
        f"can pose as its owner; run `chmod 600 {node.key}`"
    )
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


# --- what mutation testing asked for (docs/testing.md) ----------------------------------
#
# Whole messages, records read across their boundaries, and the small predicates: each
# test below failed against a mutant of net/tls.py that every other test let through.


def test_plaintext_of_several_records_is_read_up_to_its_limit(
    pki: tuple[certs.CertPair, certs.CertPair],
) -> None:
    client, server = connect(pki)
    three = bytes(range(256)) * 192  # 48 KiB: three full records
    server.feed(client.encrypt(three))
    assert server.pending()
    got = server.read(20_000)  # past the first record, inside the second
    assert got == three[:20_000] and not server.peer_closed  # the limit is not an end
    assert server.read(16_384) == three[20_000:36_384]
    assert server.read() == three[36_384:]
    assert not server.pending() and server.read() == b""
    # a limit below one record's plaintext, then the rest of that record
    server.feed(client.encrypt(b"abcdef"))
    assert server.read(2) == b"ab" and server.pending()
    assert server.read(100) == b"cdef"


def test_plaintext_is_read_into_a_buffer_across_records_up_to_its_size(
    pki: tuple[certs.CertPair, certs.CertPair],
) -> None:
    client, server = connect(pki)
    empty = memoryview(bytearray(10))
    assert server.read_into(empty) == 0  # nothing fed
    three = bytes(range(251)) * 200  # 50,200 bytes: four records
    server.feed(client.encrypt(three))
    buffer = memoryview(bytearray(40_000))
    assert server.read_into(buffer) == 40_000 and bytes(buffer) == three[:40_000]
    rest = memoryview(bytearray(20_000))
    assert server.read_into(rest) == 10_200 and bytes(rest[:10_200]) == three[40_000:]
    assert not server.peer_closed
    server.feed(client.close())
    assert server.read_into(memoryview(bytearray(10))) == 0 and server.peer_closed


def test_records_fed_in_pieces_are_decrypted_once_whole(
    pki: tuple[certs.CertPair, certs.CertPair],
) -> None:
    client, server = connect(pki)
    hello = server.first_bytes  # the client's first flight: a handshake record
    assert hello[:2] == b"\x16\x03" and len(hello) == 8
    record = client.encrypt(b"one request")
    assert server.decrypt(record[:5]) == b""  # a record's header only
    assert server.decrypt(record[5:]) == b"one request"
    assert server.first_bytes == hello  # kept from the first flight only
    two = client.encrypt(b"first") + client.encrypt(b"second")
    assert server.decrypt(two) == b"firstsecond"
    assert server.decrypt(client.encrypt(b"x" * 100), limit=10) == b"x" * 10


def test_the_first_bytes_of_a_peer_are_kept_for_its_error() -> None:
    channel = TlsChannel(ClientTls(None).unverified(), server_side=False)
    channel.feed(b"SH\x07")
    channel.feed(b"\x00\x00\x00\x00\x30\xff\xff")
    assert channel.first_bytes == b"SH\x07\x00\x00\x00\x00\x30"
    channel.feed(b"\x01\x02")
    assert channel.first_bytes == b"SH\x07\x00\x00\x00\x00\x30"


def test_a_channel_has_no_binding_and_sends_no_close_before_its_handshake() -> None:
    channel = TlsChannel(ClientTls(None).unverified(), server_side=False)
    with pytest.raises(TlsError) as info:
        channel.binding()
    assert str(info.value) == "TLS channel binding is not available before the handshake ends"
    assert channel.close() == b"" and channel.version is None


def test_only_a_frame_s_magic_is_plain_shuttle_and_only_a_handshake_record_is_tls() -> None:
    from shuttle.net.tls import looks_like_tls, speaks_plain_shuttle

    assert speaks_plain_shuttle(b"SH\x07\x00") and not speaks_plain_shuttle(b"S")
    assert not speaks_plain_shuttle(b"\x16\x03\x01")
    assert looks_like_tls(b"\x16\x03") and looks_like_tls(b"\x16\x03\x01\x02\x00")
    for other in (b"", b"\x16", b"\x17\x03", b"\x16\x02", b"SH\x07\x00"):
        assert not looks_like_tls(other), other


@pytest.mark.parametrize(
    ("value", "setting"),
    [
        ("", None),
        ("  ", None),
        ("1", True),
        ("true", True),
        (" Yes ", True),
        ("ON", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("Off", False),
    ],
)
def test_the_tls_setting_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, setting: bool | None
) -> None:
    from shuttle.net.tls import tls_from_env

    monkeypatch.setenv("SHUTTLE_TLS", value)
    assert tls_from_env() is setting


def test_a_tls_setting_that_is_not_one_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shuttle.net.tls import tls_from_env

    monkeypatch.delenv("SHUTTLE_TLS", raising=False)
    assert tls_from_env() is None
    monkeypatch.setenv("SHUTTLE_TLS", "maybe")
    with pytest.raises(ConfigError) as info:
        tls_from_env()
    assert str(info.value) == "$SHUTTLE_TLS must be 1 or 0 (TLS on or off), got 'maybe'"


def test_each_tls_failure_a_client_meets_is_the_whole_documented_message(
    pki: tuple[certs.CertPair, certs.CertPair], tmp_path: Path
) -> None:
    from shuttle.net.tls import record_failure

    ca, _ = pki
    address = "127.0.0.1:7401"
    plain = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    plain.reason = "WRONG_VERSION_NUMBER"  # type: ignore[misc]
    assert str(client_failure(plain, address, ca.cert, None)) == (
        "node 127.0.0.1:7401 does not speak TLS (WRONG_VERSION_NUMBER): it was started "
        "without --tls. Connect without TLS (--no-tls; loopback only), or restart the node "
        "with TLS (`shuttle cluster up --tls`)"
    )
    # the same reason on a channel whose first bytes are not a frame: a failed handshake
    channel = TlsChannel(ClientTls(ca.cert).context(), server_side=False, server_hostname="x")
    channel.feed(b"\x15\x03\x03\x00\x02\x02\x28")
    assert str(client_failure(plain, address, ca.cert, channel)) == (
        "TLS handshake with node 127.0.0.1:7401 failed (WRONG_VERSION_NUMBER); is it a "
        "Shuttle node with TLS, and does this client's TLS setting match it?"
    )
    other = ssl.SSLError(1, "something else")  # no reason: its text stands for it
    assert str(client_failure(other, address, ca.cert, None)) == (
        "TLS handshake with node 127.0.0.1:7401 failed (something else); is it a "
        "Shuttle node with TLS, and does this client's TLS setting match it?"
    )
    stranger = certs.make_ca(tmp_path / "stranger")
    with pytest.raises(ssl.SSLCertVerificationError) as verify:
        connect(pki, ca_file=stranger.cert)
    assert str(client_failure(verify.value, address, stranger.cert, None)) == (
        f"node 127.0.0.1:7401's TLS certificate failed verification "
        f"({verify.value.verify_message}) against the CA {stranger.cert}: is that the CA of "
        "this node's cluster, and was its certificate issued for this address? (`shuttle "
        "cluster up --tls` makes both; the cluster file names the CA)"
    )
    client, _ = connect(pki)
    broken = ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]")
    broken.reason = "DECRYPTION_FAILED_OR_BAD_RECORD_MAC"  # type: ignore[misc]
    expected = (
        "the TLS connection to node 127.0.0.1:7401 failed (DECRYPTION_FAILED_OR_BAD_RECORD_MAC)"
        ": a record did not authenticate, so bytes were changed on the way; nothing "
        "received on it was used"
    )
    assert str(client_failure(broken, address, ca.cert, client)) == expected
    assert str(record_failure(broken, address)) == expected
    assert str(record_failure(ValueError("no reason"), address)).startswith(
        "the TLS connection to node 127.0.0.1:7401 failed (no reason): "
    )


def test_a_ca_or_certificate_that_cannot_be_read_is_named(
    pki: tuple[certs.CertPair, certs.CertPair], tmp_path: Path
) -> None:
    ca, node = pki
    with pytest.raises(ConfigError) as info:
        ClientTls(tmp_path / "nowhere.pem")
    assert str(info.value) == (
        f"CA certificate {tmp_path / 'nowhere.pem'} does not exist; the cluster file of "
        "`shuttle cluster up --tls` names it (or --ca-file / $SHUTTLE_CA_FILE)"
    )
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    with pytest.raises(ConfigError, match=rf"^cannot read CA certificate {garbage}: "):
        ClientTls(garbage)
    with pytest.raises(ConfigError) as info:
        ClientTls(None).context()
    assert str(info.value) == (
        "TLS to a node needs the cluster's CA certificate: --ca-file FILE or $SHUTTLE_CA_FILE "
        "(the cluster file of `shuttle cluster up --tls` names it)"
    )
    assert repr(ClientTls(ca.cert)) == f"ClientTls(ca_file={ca.cert})"
    with pytest.raises(ConfigError) as info:
        ServerTls(tmp_path / "missing-cert.pem", node.key)
    assert str(info.value) == f"TLS certificate {tmp_path / 'missing-cert.pem'} does not exist"
    with pytest.raises(ConfigError) as info:
        ServerTls(ca.cert, node.key)  # the CA's certificate with the node's key
    assert str(info.value).startswith(
        f"cannot load TLS certificate {ca.cert} with key {node.key}: "
    )
    assert str(info.value).endswith(" (do they belong together? PEM files expected)")
    assert repr(ServerTls(node.cert, node.key)) == f"ServerTls(cert_file={node.cert})"


def test_contexts_speak_tls_1_3_only_without_compression_or_tickets(
    pki: tuple[certs.CertPair, certs.CertPair],
) -> None:
    ca, node = pki
    client = ClientTls(ca.cert)
    server = ServerTls(node.cert, node.key).context()
    defaults = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).options
    for context in (client.context(), client.unverified(), server):
        assert context.minimum_version is ssl.TLSVersion.TLSv1_3
        assert context.options & ssl.OP_NO_COMPRESSION
        assert context.options & defaults == defaults  # OpenSSL's own stay set
    assert client.unverified().protocol is ssl.PROTOCOL_TLS_CLIENT
    assert server.num_tickets == 0
    assert client.context().verify_mode is ssl.CERT_REQUIRED and client.context().check_hostname
    assert client.unverified().verify_mode is ssl.CERT_NONE
    assert not client.unverified().check_hostname


def test_what_came_before_a_partial_record_or_a_close_is_read_whole(
    pki: tuple[certs.CertPair, certs.CertPair],
) -> None:
    client, server = connect(pki)
    first, second = client.encrypt(b"whole record"), client.encrypt(b"cut record")
    server.feed(first + second[:7])  # the second record is not all here yet
    assert server.read() == b"whole record"
    server.feed(second[7:])
    assert server.read() == b"cut record"
    server.feed(client.encrypt(b"x" * 20_000) + client.encrypt(b"y")[:4])
    buffer = memoryview(bytearray(30_000))
    assert server.read_into(buffer) == 20_000 and not server.peer_closed
    client2, server2 = connect(pki)
    server2.feed(client2.encrypt(b"a" * 20_000) + client2.close())
    assert server2.read() == b"a" * 20_000 and server2.peer_closed
    client3, server3 = connect(pki)
    server3.feed(client3.encrypt(b"last words") + client3.close())
    assert server3.read_into(buffer) == 10 and server3.peer_closed


def test_a_handshake_says_when_it_is_complete(pki: tuple[certs.CertPair, certs.CertPair]) -> None:
    ca, node = pki
    server = TlsChannel(ServerTls(node.cert, node.key).context(), server_side=True)
    client = TlsChannel(
        ClientTls(ca.cert).context(), server_side=False, server_hostname="127.0.0.1"
    )
    assert client.handshake() is False and not client.established  # sent its hello
    server.feed(client.output())
    assert server.handshake() is False and not server.established  # awaits the Finished
    client.feed(server.output())
    assert client.handshake() is True and client.established
    server.feed(client.output())
    assert server.handshake() is True and server.established


def test_pending_counts_a_single_byte(pki: tuple[certs.CertPair, certs.CertPair]) -> None:
    client, server = connect(pki)
    record = client.encrypt(b"ab")
    assert not server.pending()
    server.feed(record[:1])  # one byte of ciphertext
    assert server.pending()
    server.feed(record[1:])
    assert server.read(1) == b"a" and server.pending()  # one byte of plaintext
    assert server.read() == b"b" and not server.pending()


def test_what_arrives_before_the_handshake_is_kept_as_the_peers_first_bytes(
    pki: tuple[certs.CertPair, certs.CertPair],
) -> None:
    ca, _ = pki
    client = TlsChannel(ClientTls(ca.cert).context(), server_side=False, server_hostname="x")
    client.handshake()
    frame = b"SH\x07\x00\x00\x00\x00\x30"
    with pytest.raises(ssl.SSLError):
        client.decrypt(frame + b"\x00" * 60)
    assert client.first_bytes == frame
