"""Cluster-key authentication: key files, proofs, and the handshake's decisions.

Pure functions, no sockets: the node (:mod:`shuttle.net.server`) and the clients
(:mod:`shuttle.net.blocking`, :mod:`shuttle.client.aio`) call them around the
sans-I/O handshake (see docs/protocol.md, "Authentication"):

1. the node opens every connection with a CHALLENGE carrying a fresh random nonce;
2. a client holding the cluster key answers with a HELLO whose credentials are
   ``{scheme, nonce: client_nonce, proof: client_proof(...)}`` (:func:`client_hello`);
3. the node recomputes the proof (:func:`check_hello`): a missing or wrong one is
   refused; a right one is answered with a WELCOME carrying the node's own proof
   over both nonces, which the client checks (:func:`check_welcome`).

A proof is a blake3 keyed hash (a MAC) of the challenge's nonce, so it answers one
connection only: a HELLO captured on the wire and replayed on a new connection
meets a new nonce and fails. The key never travels.

A client may instead hold a *principal's* key (:mod:`shuttle.net.principals`): its key
file names the principal, its HELLO's credentials carry the name
(``principal``), and both proofs use that principal's key, which the node derives
from the cluster key. Without a name, the key is the cluster key, as before.

On a TLS connection (:mod:`shuttle.net.tls`) both proofs also cover the channel's
binding (``binding``: ``tls-unique``), so a proof made on one TLS connection answers
no other: a peer in the middle, holding a TLS connection to each side, cannot relay
a client's HELLO to a node (its two connections have different bindings). TLS then
protects every frame after the handshake. On a plain connection the binding is
empty and the proofs are byte for byte what they were before TLS existed: the key
keeps out peers without it and replays, but an attacker on the path of a live plain
connection can still read it or take it over.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import blake3

from shuttle.errors import AuthenticationError, ConfigError, InvalidArgumentError, UsageError
from shuttle.net.principals import check_name
from shuttle.wire import (
    PROTOCOL_VERSION_MAX,
    PROTOCOL_VERSION_MIN,
    Challenge,
    Hello,
    Welcome,
)
from shuttle.wire.limits import NONCE_BYTES as NONCE_BYTES

#: Bytes of a cluster key: blake3's keyed mode takes exactly a 32-byte key, and 256
#: random bits are beyond guessing.
KEY_BYTES: Final = 32
# NONCE_BYTES (each nonce, the node's challenge and the client's own: 32 bytes) is
# imported from shuttle.wire.limits, where the wire checks it, and re-exported here.

#: The only scheme this build speaks; the version suffix lets a later scheme be told
#: apart on the wire (each side names the scheme it uses).
SCHEME: Final = "blake3-keyed-v1"
#: Environment variable naming the cluster key file of clients that have no cluster
#: file (``shuttle --node HOST:PORT``) or whose cluster file records no key.
KEY_FILE_ENV: Final = "SHUTTLE_KEY_FILE"
#: Mode bits a key file may have: read and write for its owner only. Anyone who can
#: read the key can join the cluster (and ship code to it).
KEY_FILE_MODE: Final = 0o600

# Domain separation: the two proofs hash the same nonces under the same key, so each
# starts with its own prefix. Without it a node's proof for one connection could be
# reflected back to that node as a client's proof.
_CLIENT_DOMAIN: Final = b"shuttle blake3-keyed-v1 client proof\x00"
_NODE_DOMAIN: Final = b"shuttle blake3-keyed-v1 node proof\x00"
# Marks the channel binding, after the name, in a proof made over TLS. A plain
# connection's proof has nothing after the name, so the two never hash the same bytes.
_BINDING_LABEL: Final = b"\x00tls-unique\x00"

#: Bytes a key file may hold: a principal's file is three short lines; more is not a key.
KEY_FILE_BYTES_MAX: Final = 4096
#: The first line of a principal's key file (comments start with ``#``).
PRINCIPAL_FILE_HEADER: Final = "# Shuttle principal key: keep it private (mode 0600)."

_HINT: Final = (
    "connect with the cluster file written by `shuttle cluster up` "
    f"(or --key-file / ${KEY_FILE_ENV})"
)


# --- keys and key files ----------------------------------------------------------------


def generate_key() -> bytes:
    """A fresh random cluster key (:data:`KEY_BYTES` bytes from the OS's CSPRNG)."""
    return os.urandom(KEY_BYTES)


def write_key_file(path: Path) -> bytes:
    """Create ``path`` holding a fresh key (hex and a newline, mode 0600, fsync'd);
    returns the key.

    Never overwrites: an existing file raises :class:`ConfigError` (a cluster's nodes
    may be running with that key). The file is created 0600 in one step (no moment
    where others could read it); on failure nothing is left behind.
    """
    key = generate_key()
    _create_private(
        path,
        key.hex().encode() + b"\n",
        "cluster key file",
        "nodes may be running with that key",
    )
    return key


def write_principal_key_file(path: Path, principal: str, key: bytes) -> None:
    """Create ``path`` holding principal ``principal``'s key (mode 0600, fsync'd)::

        # Shuttle principal key: keep it private (mode 0600).
        principal alice
        key 5f3a...(64 hex digits)

    Never overwrites (:class:`ConfigError`): the file may be someone's only copy."""
    check_name(principal)
    if len(key) != KEY_BYTES:
        raise InvalidArgumentError(f"a principal key is {KEY_BYTES} bytes, got {len(key)}")
    text = f"{PRINCIPAL_FILE_HEADER}\nprincipal {principal}\nkey {key.hex()}\n"
    _create_private(path, text.encode(), "key file", "it may be another principal's key")


def _create_private(path: Path, data: bytes, what: str, why: str) -> None:
    """Create ``path`` with ``data``, 0600 from the start (no moment where others could
    read it), durable; nothing is left behind on failure."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, KEY_FILE_MODE)
    except FileExistsError:
        raise ConfigError(
            f"{what} {path} already exists; refusing to overwrite it ({why}): use it, or "
            "remove it first"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot create {what} {path} ({exc.strerror or exc})") from None
    try:
        os.fchmod(fd, KEY_FILE_MODE)  # a strict umask must not make it unreadable to us
        os.write(fd, data)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(fd)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make a new directory entry durable (best effort: some filesystems refuse)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class Credentials:
    """What a client proves it holds: the cluster key (``principal`` None), or the key
    of principal ``principal``."""

    key: bytes
    principal: str | None = None

    def __repr__(self) -> str:  # never print a key by accident
        return f"Credentials(principal={self.principal!r}, key=<{len(self.key)} bytes>)"


def load_credentials(path: Path) -> Credentials:
    """The key in ``path`` and whose it is: a cluster key file (64 hex digits on one
    line, as ``cluster up`` writes it) or a principal's key file
    (:func:`write_principal_key_file`).

    Raises :class:`ConfigError` saying what to do if the file is missing, unreadable,
    readable or writable by group or others, or holds neither form.
    """
    lines = [
        line.strip()
        for line in _read_private(path).splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if len(lines) == 1 and " " not in lines[0]:
        return Credentials(_hex_key(lines[0], path))
    fields: dict[str, str] = {}
    for line in lines:
        name, _, value = line.partition(" ")
        if name not in ("principal", "key") or name in fields or not value.strip():
            fields.clear()
            break
        fields[name] = value.strip()
    if set(fields) != {"principal", "key"}:
        raise ConfigError(
            f"key file {path} is malformed: expected {2 * KEY_BYTES} hex digits on one line "
            "(the cluster key, as `shuttle cluster up` writes it), or a principal's key "
            "file (lines 'principal NAME' and 'key HEX', as `shuttle cluster user add` "
            "writes it)"
        )
    try:
        name = check_name(fields["principal"])
    except UsageError as exc:
        raise ConfigError(f"key file {path}: {exc}") from None
    return Credentials(_hex_key(fields["key"], path), name)


def load_key_file(path: Path) -> bytes:
    """The cluster key in ``path``, as :func:`write_key_file` wrote it (what a node
    needs). A principal's key file is refused: it opens no node."""
    credentials = load_credentials(path)
    if credentials.principal is not None:
        raise ConfigError(
            f"key file {path} is principal {credentials.principal!r}'s key, not the cluster "
            "key: a node needs the cluster key (ROOT/cluster.key of `shuttle cluster up`)"
        )
    return credentials.key


def _read_private(path: Path) -> str:
    """The text of key file ``path``, refused if others may read or write it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(
            f"key file {path} does not exist; `shuttle cluster up` writes the cluster's "
            "(ROOT/cluster.key) and `shuttle cluster user add` a principal's: point "
            "--key-file at the key you were given"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read key file {path} ({exc.strerror or exc}); run as the user who owns it"
        ) from None
    try:
        info = os.fstat(fd)  # the file we read, not whatever the path names later
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"key file {path} is not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"key file {path} is open to group or others (mode {mode:04o}): anyone "
                f"who can read it can act with its key; run `chmod 600 {path}`"
            )
        raw = os.read(fd, KEY_FILE_BYTES_MAX)
    finally:
        os.close(fd)
    return raw.decode("ascii", errors="replace")


def _hex_key(text: str, path: Path) -> bytes:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ConfigError(
            f"key file {path} is malformed: expected {2 * KEY_BYTES} hex digits "
            f"(a {KEY_BYTES}-byte key), as `shuttle cluster up` or `shuttle cluster user "
            "add` writes it; restore the key, or have a new one made"
        )
    return key


# --- proofs ----------------------------------------------------------------------------


def _message(
    domain: bytes, challenge_nonce: bytes, client_nonce: bytes, name: str, binding: bytes = b""
) -> bytes:
    """The bytes a proof hashes: domain, both nonces (fixed size), then the name with
    its length (so no two different inputs make the same message), then on a TLS
    connection the channel binding with its label and length."""
    for what, nonce in (("challenge nonce", challenge_nonce), ("client nonce", client_nonce)):
        if len(nonce) != NONCE_BYTES:
            raise InvalidArgumentError(f"{what} must be {NONCE_BYTES} bytes, got {len(nonce)}")
    encoded = name.encode()
    parts = [domain, challenge_nonce, client_nonce, len(encoded).to_bytes(4, "big"), encoded]
    if binding:
        parts += [_BINDING_LABEL, len(binding).to_bytes(4, "big"), binding]
    return b"".join(parts)


def _mac(key: bytes, message: bytes) -> bytes:
    if len(key) != KEY_BYTES:
        raise InvalidArgumentError(f"a cluster key is {KEY_BYTES} bytes, got {len(key)}")
    return blake3.blake3(message, key=key).digest()


def client_proof(
    key: bytes,
    challenge_nonce: bytes,
    client_nonce: bytes,
    client_name: str,
    binding: bytes = b"",
) -> bytes:
    """What a client sends to prove it holds ``key``: a keyed hash of the node's
    challenge nonce, its own nonce, the name it gives in its HELLO and, over TLS, the
    connection's channel ``binding``."""
    return _mac(key, _message(_CLIENT_DOMAIN, challenge_nonce, client_nonce, client_name, binding))


def node_proof(
    key: bytes, challenge_nonce: bytes, client_nonce: bytes, node_id: str, binding: bytes = b""
) -> bytes:
    """What a node sends back (in WELCOME) to prove it holds ``key`` too: a keyed hash
    of both nonces, its node id and, over TLS, the channel ``binding`` (the client's
    nonce makes it fresh for the client)."""
    return _mac(key, _message(_NODE_DOMAIN, challenge_nonce, client_nonce, node_id, binding))


def verify(expected: bytes, got: object) -> bool:
    """Whether ``got`` equals ``expected``, in time independent of where they differ
    (a timing leak would let a peer guess a proof byte by byte)."""
    return isinstance(got, bytes) and hmac.compare_digest(expected, got)


# --- the handshake's decisions -----------------------------------------------------------


def client_hello(
    challenge: Challenge,
    key: bytes | None,
    client_name: str,
    node: str,
    *,
    client_nonce: bytes | None = None,
    principal: str | None = None,
    binding: bytes = b"",
) -> tuple[Hello, bytes | None]:
    """The HELLO answering ``challenge`` from ``node`` (a name for messages), and the
    client nonce it used (None: no credentials sent). With ``principal``, ``key`` is
    that principal's and the credentials name it. ``binding``: the TLS channel's
    binding (b"" on a plain connection), covered by the proof.

    Raises :class:`AuthenticationError` without anything sent when the node requires
    a key and this client has none, or speaks a scheme this client does not.
    A keyless node gets credentials too if the client has a key (they are ignored).
    """
    if key is not None and challenge.scheme == SCHEME:
        nonce = client_nonce if client_nonce is not None else os.urandom(NONCE_BYTES)
        credentials = {
            "scheme": SCHEME,
            "nonce": nonce,
            "proof": client_proof(key, challenge.nonce, nonce, client_name, binding),
        }
        if principal is not None:
            credentials["principal"] = principal
        return Hello(PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX, client_name, credentials), nonce
    if challenge.key_required:
        if key is None:
            raise AuthenticationError(
                f"node {node} requires the cluster key and this client has none: {_HINT}"
            )
        raise AuthenticationError(
            f"node {node} authenticates with scheme {challenge.scheme!r}, this client only "
            f"with {SCHEME!r}; upgrade the older side"
        )
    return Hello(PROTOCOL_VERSION_MIN, PROTOCOL_VERSION_MAX, client_name), None


def check_welcome(
    welcome: Welcome,
    challenge: Challenge,
    key: bytes | None,
    client_nonce: bytes | None,
    node: str,
    *,
    binding: bytes = b"",
    require_proof: bool = False,
) -> None:
    """Client side: check the node's proof in ``welcome`` (over the TLS channel's
    ``binding``, b"" on a plain connection).

    Nothing to check when no credentials were sent, or when the node said it needs no
    key (a keyless node: data only), unless ``require_proof``: a peer whose TLS
    certificate this client could not check must prove it holds the key. Raises
    :class:`AuthenticationError` when a node that required the key (or had to prove
    it) sends no proof or a wrong one.
    """
    if key is None or client_nonce is None:
        return
    if welcome.proof is None and not challenge.key_required and not require_proof:
        return
    expected = node_proof(key, challenge.nonce, client_nonce, welcome.node_id, binding)
    if welcome.proof is None or not verify(expected, welcome.proof):
        raise AuthenticationError(
            f"node {node} did not prove it holds the cluster key; is the cluster file's key "
            "the right one? (or something else answers at that address)"
        )


def hello_principal(hello: Hello) -> str | None:
    """The principal a HELLO's credentials name (None: the cluster key's holder).

    Raises :class:`AuthenticationError` for a name that is not a string or not valid:
    the node refuses such a HELLO before looking anything up."""
    credentials = hello.credentials
    if credentials is None:
        return None
    name = credentials.get("principal")
    if name is None:
        return None
    if not isinstance(name, str):
        raise AuthenticationError("malformed credentials: the principal must be a name")
    try:
        return check_name(name)
    except UsageError as exc:
        raise AuthenticationError(f"malformed credentials: {exc}") from None


def check_hello(
    hello: Hello,
    key: bytes | None,
    challenge_nonce: bytes,
    node_id: str,
    *,
    binding: bytes = b"",
) -> bytes | None:
    """Node side: check the credentials of ``hello`` against this connection's
    ``challenge_nonce`` (and its TLS channel's ``binding``, b"" on a plain
    connection); returns the node's proof for WELCOME (None: the node has no key, or
    the keyless node got no credentials to answer).

    A node without a key accepts any HELLO. A node with one raises
    :class:`AuthenticationError` (to send back, then close) when the credentials are
    missing, malformed, of another scheme, or do not answer this challenge.
    """
    if key is None:
        return None
    credentials = hello.credentials
    if credentials is None:
        raise AuthenticationError(f"node {node_id} requires the cluster key: {_HINT}")
    scheme, nonce, proof = (credentials.get(k) for k in ("scheme", "nonce", "proof"))
    if scheme != SCHEME:
        raise AuthenticationError(
            f"node {node_id} authenticates with scheme {SCHEME!r}, the client sent "
            f"credentials for {scheme!r:.40}; upgrade the older side"
        )
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES or not isinstance(proof, bytes):
        raise AuthenticationError(
            f"node {node_id}: malformed credentials (expected a {NONCE_BYTES}-byte nonce and "
            "a proof); is the client a different Shuttle?"
        )
    if not verify(client_proof(key, challenge_nonce, nonce, hello.client_name, binding), proof):
        raise AuthenticationError(
            f"authentication failed at node {node_id}: the proof does not answer this "
            "connection's challenge — a wrong cluster key, or a HELLO replayed from another "
            "connection" + (" or relayed from another TLS channel" if binding else "")
        )
    return node_proof(key, challenge_nonce, nonce, node_id, binding)
