"""The cluster's certificates as files (net/certs.py): what a CA, a node's and a
run-time's certificate say, private keys written 0600 in one step, and what is wrong
with a CA or a key, named. TLS over them is tests/unit/net/test_tls.py."""

from __future__ import annotations

import datetime
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shuttle.errors import ConfigError
from shuttle.net import certs
from shuttle.net.tls import ServerTls

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> datetime.datetime:
    monkeypatch.setattr(certs, "_now", lambda: T0)
    return T0


def read(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_a_ca_certificate_may_sign_node_certificates_and_nothing_else(
    tmp_path: Path, frozen: datetime.datetime
) -> None:
    ca = certs.make_ca(tmp_path / "a" / "b")  # its directories are made
    cert = read(ca.cert)
    assert common_name(cert) == "shuttle cluster CA" and cert.issuer == cert.subject
    assert cert.not_valid_before_utc == frozen - datetime.timedelta(minutes=5)
    assert cert.not_valid_after_utc == frozen + datetime.timedelta(days=3650)
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value == x509.BasicConstraints(ca=True, path_length=0)
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical
    assert (usage.value.key_cert_sign, usage.value.crl_sign) == (True, True)
    for other in (
        "digital_signature",
        "content_commitment",
        "key_encipherment",
        "data_encipherment",
        "key_agreement",
    ):
        assert getattr(usage.value, other) is False, other
    assert not cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).critical
    assert stat.S_IMODE(ca.key.stat().st_mode) == 0o600
    assert common_name(read(certs.make_ca(tmp_path / "c", "lab").cert)) == "lab CA"
    with pytest.raises(ConfigError) as info:
        certs.make_ca(tmp_path / "a" / "b")
    assert str(info.value) == (
        f"a CA key already exists at {ca.key}; refusing to replace it (node certificates "
        "were signed with it): use it, or remove the directory first"
    )


def test_a_node_certificate_names_its_node_and_serves_and_dials(
    tmp_path: Path, frozen: datetime.datetime
) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    node = certs.make_node_cert(ca, tmp_path / "x" / "nodes", "n1", "10.0.0.7", valid_days=9)
    cert = read(node.cert)
    assert (node.cert.name, node.key.name) == ("n1.pem", "n1.key")
    assert common_name(cert) == "n1" and cert.issuer == read(ca.cert).subject
    assert cert.not_valid_after_utc == frozen + datetime.timedelta(days=9)
    assert cert.not_valid_before_utc == frozen - datetime.timedelta(minutes=5)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert not names.critical
    assert [str(n.value) for n in names.value] == ["10.0.0.7", "n1"]
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and not basic.value.ca
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage)
    assert not usage.critical
    assert list(usage.value) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
    assert not aki.critical
    assert stat.S_IMODE(node.key.stat().st_mode) == 0o600
    old_key = node.key.read_bytes()
    again = certs.make_node_cert(ca, tmp_path / "x" / "nodes", "n1", "10.0.0.7")
    assert again.key.read_bytes() != old_key  # an older pair is replaced
    unnamed = certs.make_node_cert(ca, tmp_path / "y", "", "10.0.0.8")
    assert common_name(read(unnamed.cert)) == "10.0.0.8"  # no id: the host


def test_a_node_with_no_name_a_certificate_can_carry_is_refused(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    with pytest.raises(ConfigError) as info:
        certs.make_node_cert(ca, tmp_path / "nodes", "node_1", "not a host")
    assert str(info.value) == (
        "node 'node_1' on 'not a host': neither is an IP address or a DNS name a "
        "certificate can carry"
    )


@pytest.mark.parametrize(
    ("host", "names"),
    [
        ("", ["127.0.0.1", "localhost"]),
        ("0.0.0.0", ["0.0.0.0", "127.0.0.1", "localhost"]),
        ("::", ["::", "127.0.0.1", "localhost"]),
        ("localhost", ["localhost", "127.0.0.1"]),
        ("127.0.0.5", ["127.0.0.5", "127.0.0.1", "localhost"]),
    ],
)
def test_a_node_on_loopback_or_every_address_is_also_localhost(host: str, names: list[str]) -> None:
    assert [str(n.value) for n in certs.san_for(host)] == names


def test_a_node_elsewhere_is_only_its_own_names() -> None:
    assert [str(n.value) for n in certs.san_for("10.0.0.7")] == ["10.0.0.7"]
    assert [str(n.value) for n in certs.san_for("node.example", "n2")] == ["node.example", "n2"]
    assert certs.san_for("not a host", "under_score") == []


def test_a_runtimes_certificate_is_its_own_and_names_its_host(
    tmp_path: Path, frozen: datetime.datetime
) -> None:
    pair = certs.self_signed(tmp_path / "a" / "rt", "app-1", "10.0.0.9")
    assert (pair.cert.name, pair.key.name) == ("runtime.pem", "runtime.key")
    assert stat.S_IMODE((tmp_path / "a" / "rt").stat().st_mode) == 0o700
    assert stat.S_IMODE(pair.key.stat().st_mode) == 0o600
    cert = read(pair.cert)
    assert common_name(cert) == "app-1" and cert.issuer == cert.subject
    assert cert.not_valid_before_utc == frozen - datetime.timedelta(minutes=5)
    assert cert.not_valid_after_utc == frozen + datetime.timedelta(days=365)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert not names.critical and [str(n.value) for n in names.value] == ["10.0.0.9"]
    cert.verify_directly_issued_by(cert)  # signed with its own key
    ServerTls(pair.cert, pair.key)  # the two belong together
    long = read(certs.self_signed(tmp_path / "b", "x" * 70, "not a host").cert)
    assert common_name(long) == "x" * 64
    names = long.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert [str(n.value) for n in names.value] == ["localhost"]  # no name of its host
    assert common_name(read(certs.self_signed(tmp_path / "c", "", "::1").cert)) == "shuttle"
    (tmp_path / "made").mkdir()  # a directory that is there already is used
    assert certs.self_signed(tmp_path / "made", "app", "::1").key.exists()


# --- private keys ----------------------------------------------------------------------


def test_a_private_key_file_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "k.key"
    path.write_bytes(b"the old key")
    with pytest.raises(ConfigError) as info:
        certs._write_private(path, b"new")
    assert str(info.value) == f"{path} already exists; refusing to overwrite a private key"
    assert path.read_bytes() == b"the old key"


def test_a_private_key_that_could_not_be_written_whole_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("os.fsync", fsync)
    with pytest.raises(OSError, match="Input/output error"):
        certs._write_private(tmp_path / "k.key", b"secret")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "TLS key {p} does not exist"),
        (lambda p: p.mkdir(), "TLS key {p} is not a regular file"),
    ],
)
def test_a_key_file_that_is_not_a_private_file_is_named(
    tmp_path: Path, make: object, message: str
) -> None:
    path = tmp_path / "node.key"
    make(path)  # type: ignore[operator]
    with pytest.raises(ConfigError) as info:
        certs.check_private_key_file(path, "TLS key")
    assert str(info.value) == message.format(p=path)


def test_a_key_file_that_cannot_be_looked_at_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").touch()
    path = tmp_path / "file" / "node.key"
    with pytest.raises(ConfigError) as info:
        certs.check_private_key_file(path, "CA key")
    assert str(info.value) == f"cannot read CA key {path} (Not a directory)"


# --- what is wrong with a CA ------------------------------------------------------------


def test_what_is_wrong_with_a_ca_is_named(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    missing = certs.CertPair(tmp_path / "nowhere.pem", ca.key)
    with pytest.raises(ConfigError) as info:
        certs.load_ca(missing)
    assert str(info.value) == f"CA file {tmp_path / 'nowhere.pem'} does not exist"
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not PEM")
    with pytest.raises(ConfigError) as info:
        certs.load_ca(certs.CertPair(garbage, ca.key))
    text = str(info.value)
    assert text.startswith(f"cannot read the CA {garbage} / {ca.key} (")
    assert text.endswith("): PEM certificate and unencrypted PEM key expected")
    ed_key = tmp_path / "ed.key"
    certs._write_private(
        ed_key,
        ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    with pytest.raises(ConfigError) as info:
        certs.load_ca(certs.CertPair(ca.cert, ed_key))
    assert str(info.value) == (
        f"CA key {ed_key} is neither an EC nor an RSA key; sign node certificates with your "
        "own tools and start the nodes with --tls-cert/--tls-key"
    )
    ca.key.chmod(0o640)
    with pytest.raises(ConfigError, match=rf"^CA key {ca.key} is open to group or others"):
        certs.load_ca(ca)


@pytest.mark.parametrize("kind", ["node", "runtime"])
def test_a_certificate_that_is_no_ca_cannot_sign(tmp_path: Path, kind: str) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    pair = (
        certs.make_node_cert(ca, tmp_path / "nodes", "n1", "127.0.0.1")
        if kind == "node"
        else certs.self_signed(tmp_path / "rt", "app", "127.0.0.1")  # no basicConstraints
    )
    with pytest.raises(ConfigError) as info:
        certs.load_ca(pair)
    assert str(info.value) == (f"{pair.cert} is not a CA certificate (no basicConstraints CA:TRUE)")


# --- renewal ----------------------------------------------------------------------------


def test_a_node_certificate_is_renewed_within_thirty_days_of_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [T0]
    monkeypatch.setattr(certs, "_now", lambda: now[0])
    ca = certs.make_ca(tmp_path / "ca")
    node = certs.make_node_cert(ca, tmp_path / "nodes", "n1", "127.0.0.1", valid_days=30)
    assert not certs.needs_renewal(node.cert, "127.0.0.1", "n1", ca.cert)  # 30 days left
    now[0] = T0 + datetime.timedelta(seconds=1)
    assert certs.needs_renewal(node.cert, "127.0.0.1", "n1", ca.cert)


def test_a_node_certificate_from_a_ca_of_another_name_is_renewed(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "ca")
    node = certs.make_node_cert(ca, tmp_path / "nodes", "n1", "127.0.0.1")
    other = certs.make_ca(tmp_path / "other", "another cluster")
    assert certs.needs_renewal(node.cert, "127.0.0.1", "n1", other.cert)
