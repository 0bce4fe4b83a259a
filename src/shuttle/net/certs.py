"""The cluster's certificate authority and the nodes' certificates (``cluster up --tls``).

A cluster with TLS has a CA of its own: a self-signed certificate (``ca.pem``) and its
private key (``ca.key``, mode 0600) that ``shuttle cluster up`` makes once under
``ROOT/tls/`` and then uses to sign one certificate per node (``n1.pem`` and
``n1.key``). Clients verify a node's certificate against ``ca.pem`` (the cluster file
names it) and check that it was issued for the address they dialled; nodes present
theirs. The CA's key signs nothing else and never leaves ``ROOT/tls/``: a node needs
only its own certificate and key, and the CA's certificate to check other nodes.

Keys are ECDSA P-256 (the curve every TLS 1.3 stack speaks; a signature costs
microseconds, where RSA-2048 costs a millisecond per handshake). Anyone may bring a
CA of their own instead (docs/security.md, "Your own CA"): ``cluster up --ca-cert
--ca-key`` signs the nodes' certificates with it, and ``shuttle serve --tls-cert
--tls-key --ca-file`` takes certificates made by any tool.

Made with the ``cryptography`` package; nothing here opens a socket.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shuttle.errors import ConfigError

#: How long the cluster's CA certificate is valid. A cluster on one machine outlives
#: no CA of ten years; renewing it means new certificates for every node.
CA_VALID_DAYS: Final = 3650
#: How long a node's certificate is valid: a year, re-issued by ``cluster up`` when
#: less than :data:`RENEW_BEFORE_DAYS` remain (a restart renews it).
NODE_VALID_DAYS: Final = 365
RENEW_BEFORE_DAYS: Final = 30
#: Mode of every private key file: readable by its owner only (whoever reads the CA
#: key can mint node certificates; whoever reads a node's key can pose as that node).
KEY_FILE_MODE: Final = 0o600
#: Backdating of ``not_valid_before``, so a certificate made now is valid on a machine
#: whose clock is a little behind this one's.
CLOCK_SKEW: Final = datetime.timedelta(minutes=5)

CA_CERT_NAME: Final = "ca.pem"
CA_KEY_NAME: Final = "ca.key"

# A DNS name a certificate may carry (RFC 1123 labels): node ids like ``n1`` are, and
# are added to a node's certificate so a client may check either the address or the id.
_DNS_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?)+$")


@dataclass(frozen=True)
class CertPair:
    """A certificate file and its private key file (PEM)."""

    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_private(path: Path, data: bytes) -> None:
    """Create ``path`` 0600 in one step (no moment where others could read it); never
    overwrites (a running node may use the old one)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, KEY_FILE_MODE)
    except FileExistsError:
        raise ConfigError(f"{path} already exists; refusing to overwrite a private key") from None
    try:
        os.fchmod(fd, KEY_FILE_MODE)
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def check_private_key_file(path: Path, what: str) -> None:
    """Raise :class:`ConfigError` unless ``path`` is a regular file readable by its
    owner only (a key open to others is as good as published)."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path} ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"{what} {path} is open to group or others (mode {mode:04o}): anyone who can "
            f"read it can pose as its owner; run `chmod 600 {path}`"
        )


def make_ca(directory: Path, name: str = "shuttle cluster") -> CertPair:
    """Make a new CA in ``directory`` (``ca.pem`` and ``ca.key``, the key 0600).

    Raises :class:`ConfigError` if a CA key is already there (nodes may hold
    certificates it signed: use it, or remove the directory first)."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = CertPair(directory / CA_CERT_NAME, directory / CA_KEY_NAME)
    if pair.key.exists():
        raise ConfigError(
            f"a CA key already exists at {pair.key}; refusing to replace it (node "
            "certificates were signed with it): use it, or remove the directory first"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=CA_VALID_DAYS))
        # path_length 0: it signs node certificates, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(pair.key, _key_pem(key))
    _write_public(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    return pair


#: The CA keys that can sign node certificates here (``cluster up`` makes EC P-256).
SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def load_ca(pair: CertPair) -> tuple[x509.Certificate, SigningKey]:
    """The CA certificate and key of ``pair`` (checked: a CA, the key 0600, the two
    matching); :class:`ConfigError` saying what is wrong otherwise."""
    check_private_key_file(pair.key, "CA key")
    try:
        cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise ConfigError(f"CA file {exc.filename} does not exist") from None
    except ValueError as exc:
        raise ConfigError(
            f"cannot read the CA {pair.cert} / {pair.key} ({exc}): PEM certificate and "
            "unencrypted PEM key expected"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ConfigError(
            f"CA key {pair.key} is neither an EC nor an RSA key; sign node certificates "
            "with your own tools and start the nodes with --tls-cert/--tls-key"
        )
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        basic = None
    if basic is None or not basic.ca:
        raise ConfigError(f"{pair.cert} is not a CA certificate (no basicConstraints CA:TRUE)")
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise ConfigError(f"CA key {pair.key} does not belong to the certificate {pair.cert}")
    return cert, key


def san_for(host: str, node_id: str = "") -> list[x509.GeneralName]:
    """The names a node's certificate is issued for: the host it listens on (an IP
    address or a DNS name), its node id when that is a DNS name, and, for a node on
    loopback or every address, ``localhost`` and 127.0.0.1 too."""
    names: list[x509.GeneralName] = []
    seen: set[str] = set()

    def add(text: str) -> None:
        if not text or text in seen:
            return
        seen.add(text)
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(text)))
        except ValueError:
            if _DNS_NAME.match(text):
                names.append(x509.DNSName(text))

    add(host)
    add(node_id)
    if host in ("", "0.0.0.0", "::", "localhost") or host.startswith("127."):
        add("127.0.0.1")
        add("localhost")
    return names


def make_node_cert(
    ca: CertPair, directory: Path, node_id: str, host: str, *, valid_days: int = NODE_VALID_DAYS
) -> CertPair:
    """A certificate for node ``node_id`` listening on ``host``, signed by ``ca``, in
    ``directory`` (``NODE.pem`` and ``NODE.key``, the key 0600); an older pair there is
    replaced (its node is not running: ``cluster up`` calls this before starting it)."""
    ca_cert, ca_key = load_ca(ca)
    names = san_for(host, node_id)
    if not names:
        raise ConfigError(
            f"node {node_id!r} on {host!r}: neither is an IP address or a DNS name a "
            "certificate can carry"
        )
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id or host)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=valid_days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            # Server and client: a node also dials other nodes' run-times.
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pair = CertPair(directory / f"{node_id}.pem", directory / f"{node_id}.key")
    pair.key.unlink(missing_ok=True)
    _write_private(pair.key, _key_pem(key))
    _write_public(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    return pair


def needs_renewal(cert_file: Path, host: str, node_id: str, ca_file: Path) -> bool:
    """Whether the node certificate in ``cert_file`` should be made again: missing,
    unreadable, expiring within :data:`RENEW_BEFORE_DAYS`, issued for other names
    (the node moved), or not by the CA in ``ca_file``."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        ca = x509.load_pem_x509_certificate(ca_file.read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return True
    if cert.not_valid_after_utc - _now() < datetime.timedelta(days=RENEW_BEFORE_DAYS):
        return True
    if cert.issuer != ca.subject:
        return True
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception):  # InvalidSignature is not a ValueError
        return True
    return set(map(str, names)) != set(map(str, san_for(host, node_id)))


def self_signed(directory: Path, name: str, host: str) -> CertPair:
    """A throwaway self-signed certificate for ``host`` (an application's run-time in
    a TLS cluster listens with one; see :mod:`shuttle.net.tls`), key 0600."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64] or "shuttle")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=NODE_VALID_DAYS))
        .add_extension(
            x509.SubjectAlternativeName(san_for(host) or [x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    pair = CertPair(directory / "runtime.pem", directory / "runtime.key")
    _write_private(pair.key, _key_pem(key))
    _write_public(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    return pair
