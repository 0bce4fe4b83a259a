"""TLS on Shuttle's connections: the contexts, and one connection's TLS as bytes in,
bytes out (no sockets).

Every connection of a cluster started with TLS (``cluster up --tls``, on by default
off loopback) is TLS 1.3, made by Python's :mod:`ssl` (OpenSSL): no cipher of our own.
:class:`TlsChannel` is the TLS state of one connection over two memory buffers
(:class:`ssl.MemoryBIO`): ciphertext from the socket goes in with :meth:`feed`,
plaintext comes out of :meth:`read`; plaintext to send goes through :meth:`encrypt`.
The node's protocol (:mod:`shuttle.net.node_protocol`) and the blocking client
(:mod:`shuttle.net.blocking`) move the ciphertext themselves, so everything they do on
a plain connection (kernel timeouts, backpressure, counting and closing connections
before their handshake, the node's read lane) is unchanged under TLS; the asyncio
client uses asyncio's own TLS streams.

**Who is checked.** A client verifies the node's certificate against the cluster's CA
(:class:`ClientTls`, the cluster file names ``ca.pem``) and that it was issued for
the host it dialled. An application's run-time in a TLS cluster listens with a
throwaway self-signed certificate (the CA's key stays with the cluster's owner); a
node that calls it cannot check that certificate against the CA, and requires
instead the run-time's proof that it holds the key, bound to this TLS channel
(:mod:`shuttle.net.auth`), before it sends anything but its HELLO.

**Channel binding.** The key proof of the handshake includes :meth:`TlsChannel.binding`,
so a proof made on one TLS connection cannot be relayed on another. Python 3.11's
:mod:`ssl` has no ``export_keying_material`` (RFC 9266's ``tls-exporter``); it gives
``get_channel_binding("tls-unique")``, which on a new session is the client's
Finished message on both ends (CPython picks the Finished the client sent, the
first one in TLS 1.2, for which it was written). In TLS 1.3 that is an HMAC over
the whole handshake transcript (both randoms, both key shares, the
node's certificate and its signature) under a key derived from this connection's
ECDHE secret, so no two connections share it, and a party in the middle, who holds
a TLS connection to each side, holds two different ones. RFC 5929 defined
``tls-unique`` for TLS 1.2, where the triple-handshake attack could make two
connections' Finished equal unless the extended master secret was used; TLS 1.3
hashes the whole transcript into every secret, and its RFC 8446 leaves
``tls-unique`` undefined because nothing was standardised for it, not because of a
known flaw. We require TLS 1.3 (:data:`TLS_VERSION_MIN`), so the binding is always
this one, and we send no session tickets (:data:`SESSION_TICKETS`): no resumption.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from pathlib import Path
from typing import Any, Final

from shuttle.errors import ConfigError, TlsError
from shuttle.net import certs

#: Only TLS 1.3: both ends are Shuttle, so no legacy peer needs 1.2; 1.3 encrypts the
#: node's certificate, has no renegotiation, and makes ``tls-unique`` sound (above).
TLS_VERSION_MIN: Final = ssl.TLSVersion.TLSv1_3
#: Session tickets a node sends after a handshake: none. Clients never resume (a
#: connection lives long), and a ticket is a record the client would have to read
#: before its first answer, and state a node would have to keep.
SESSION_TICKETS: Final = 0
#: The channel binding in every key proof made over TLS (see the module docstring).
CHANNEL_BINDING: Final = "tls-unique"
#: Plaintext bytes taken from the TLS object per read call: a TLS record holds at most
#: 16 KiB (2^14), and OpenSSL returns at most one record per call, so asking for more
#: would only allocate a larger buffer to shrink.
RECORD_BYTES: Final = 1 << 14
#: Environment variable naming the CA certificate of clients without a cluster file.
CA_FILE_ENV: Final = "SHUTTLE_CA_FILE"
#: Environment variable that turns TLS on (``1``) or off (``0``) for clients that are
#: not told otherwise (commands without a ``--tls`` flag: grep, fs, mount).
TLS_ENV: Final = "SHUTTLE_TLS"
#: The first bytes of every Shuttle frame: a TLS client that reads them talks to a
#: node that does not speak TLS.
_PLAIN_MAGIC: Final = b"SH"
#: What OpenSSL says when the first "record" it reads is not TLS at all (where the
#: bytes themselves are not at hand to look at: asyncio's TLS streams).
_PLAIN_PEER_REASONS: Final = frozenset(
    {"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"}
)


def _base(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = TLS_VERSION_MIN
    # Small records are sent as soon as they are written (no Nagle-like coalescing is
    # done by OpenSSL itself); compression is off in OpenSSL 3 builds by default.
    context.options |= ssl.OP_NO_COMPRESSION
    return context


class ClientTls:
    """How a client dials TLS: the CA certificate its nodes' certificates must chain
    to. Built once per client (the CA file is read here, so a bad one fails early).

    ``ca_file`` None: no CA, only :meth:`unverified` (an application's run-time called
    by a node; see the module docstring). Raises :class:`ConfigError` if the file
    cannot be read as a PEM certificate.
    """

    def __init__(self, ca_file: Path | None) -> None:
        self.ca_file = ca_file
        self._verified: ssl.SSLContext | None = None
        if ca_file is not None:
            context = _base(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
            try:
                context.load_verify_locations(cafile=str(ca_file))
            except FileNotFoundError:
                raise ConfigError(
                    f"CA certificate {ca_file} does not exist; the cluster file of `shuttle "
                    f"cluster up --tls` names it (or --ca-file / ${CA_FILE_ENV})"
                ) from None
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(f"cannot read CA certificate {ca_file}: {exc}") from None
            self._verified = context
        unverified = _base(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        unverified.check_hostname = False
        unverified.verify_mode = ssl.CERT_NONE
        self._unverified = unverified

    def context(self) -> ssl.SSLContext:
        """The context that verifies a node's certificate against the CA, and its name."""
        if self._verified is None:
            raise ConfigError(
                "TLS to a node needs the cluster's CA certificate: --ca-file FILE or "
                f"${CA_FILE_ENV} (the cluster file of `shuttle cluster up --tls` names it)"
            )
        return self._verified

    def unverified(self) -> ssl.SSLContext:
        """A context that checks no certificate: only for peers that must prove they
        hold the key over this very channel before anything is sent to them."""
        return self._unverified

    def __repr__(self) -> str:
        return f"ClientTls(ca_file={self.ca_file})"


class ServerTls:
    """What a listener presents: its certificate chain and private key (PEM files).

    Raises :class:`ConfigError` if either is missing, unreadable, the key is open to
    others, or they do not match."""

    def __init__(self, cert_file: Path, key_file: Path) -> None:
        self.cert_file, self.key_file = cert_file, key_file
        certs.check_private_key_file(key_file, "TLS key")
        context = _base(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
        context.num_tickets = SESSION_TICKETS
        try:
            context.load_cert_chain(str(cert_file), str(key_file))
        except FileNotFoundError as exc:
            missing = exc.filename or cert_file
            raise ConfigError(f"TLS certificate {missing} does not exist") from None
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"cannot load TLS certificate {cert_file} with key {key_file}: {exc} (do they "
                "belong together? PEM files expected)"
            ) from None
        self._context = context

    def context(self) -> ssl.SSLContext:
        return self._context

    def __repr__(self) -> str:
        return f"ServerTls(cert_file={self.cert_file})"


class TlsChannel:
    """The TLS state of one connection, sans-I/O: ciphertext in (:meth:`feed`), out
    (:meth:`output`, :meth:`encrypt`); plaintext in (:meth:`encrypt`), out
    (:meth:`read`, :meth:`read_into`).

    Errors are :class:`ssl.SSLError` (a record that fails its authentication, a
    handshake the peer broke); callers turn them into typed errors with the peer's
    name (:func:`client_failure`).
    """

    def __init__(
        self, context: ssl.SSLContext, *, server_side: bool, server_hostname: str | None = None
    ) -> None:
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(
            self._in, self._out, server_side=server_side, server_hostname=server_hostname
        )
        # The records of every request go through read, write and pending: call them on
        # the object ``ssl.SSLObject`` wraps, whose methods it calls unchanged (ssl.py),
        # and save a Python frame per call (about a microsecond a round trip on each
        # side). Anything else goes through the SSLObject.
        self._io: Any = getattr(self._obj, "_sslobj", self._obj)
        #: True once the handshake is complete.
        self.established = False
        #: True once the peer closed its side with a TLS close_notify.
        self.peer_closed = False
        #: The first ciphertext bytes received (for a clear error when the peer does
        #: not speak TLS at all).
        self.first_bytes = b""

    # --- ciphertext -------------------------------------------------------------------

    def feed(self, data: bytes | memoryview) -> None:
        """Ciphertext from the peer (b"": the end of its stream)."""
        if not data:
            self._in.write_eof()
            return
        if len(self.first_bytes) < 8:
            self.first_bytes += bytes(data[: 8 - len(self.first_bytes)])
        self._in.write(data)

    def output(self) -> bytes:
        """Ciphertext to send (handshake records, alerts, close_notify), or b""."""
        return self._out.read()

    # --- the handshake ------------------------------------------------------------------

    def handshake(self) -> bool:
        """Advance the handshake with what was fed; True once it is complete (send
        :meth:`output` either way). Raises :class:`ssl.SSLError` if it failed."""
        try:
            self._obj.do_handshake()
        except ssl.SSLWantReadError:
            return False
        self.established = True
        return True

    def binding(self) -> bytes:
        """This connection's channel binding (:data:`CHANNEL_BINDING`): what the key
        proofs include so they cannot be relayed to another connection."""
        value = self._obj.get_channel_binding(CHANNEL_BINDING)
        if not value:
            raise TlsError("TLS channel binding is not available before the handshake ends")
        return value

    @property
    def version(self) -> str | None:
        return self._obj.version()

    # --- plaintext ----------------------------------------------------------------------

    def encrypt(self, data: bytes | bytearray | memoryview) -> bytes:
        """The ciphertext that carries ``data`` (records of at most 16 KiB)."""
        self._io.write(data)
        return self._out.read()

    def pending(self) -> bool:
        """Whether :meth:`read` may return something without more ciphertext."""
        return self._io.pending() > 0 or self._in.pending > 0

    def decrypt(self, data: bytes, limit: int | None = None) -> bytes:
        """:meth:`feed` then :meth:`read` in one call (the hot paths' step): ``data``
        must not be empty."""
        if not self.established or len(self.first_bytes) < 8:
            self.feed(data)
        else:
            self._in.write(data)
        return self.read(limit)

    def read(self, limit: int | None = None) -> bytes:
        """Plaintext from what was fed, up to ``limit`` bytes (None: all of it); b"":
        none yet, or the peer closed. Raises :class:`ssl.SSLError` for a record that
        fails its authentication."""
        obj, incoming = self._io, self._in
        fed, decrypted = incoming.pending, obj.pending()
        if not (fed or decrypted):
            # Nothing fed and nothing decrypted: asking OpenSSL would raise
            # SSLWantReadError, which costs microseconds on every round trip.
            return b""
        first = RECORD_BYTES if limit is None else min(limit, RECORD_BYTES)
        if fed and not decrypted:
            # A record's plaintext is shorter than its ciphertext: a small request's
            # buffer is made at about its size, not at 16 KiB and then shrunk.
            first = min(first, fed)
        try:
            data: bytes = obj.read(first)
        except ssl.SSLWantReadError:
            return b""
        except ssl.SSLZeroReturnError:
            self.peer_closed = True
            return b""
        if not data:  # CPython answers a close_notify with b"", not SSLZeroReturnError
            self.peer_closed = True
            return b""
        if limit is None:
            limit = 1 << 62
        if len(data) >= limit or not (incoming.pending or obj.pending()):
            return data  # the usual case: one record held one whole message
        parts = [data]
        got = len(data)
        while got < limit:
            try:
                more: bytes = obj.read(min(limit - got, RECORD_BYTES))
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            if not more:
                self.peer_closed = True
                break
            parts.append(more)
            got += len(more)
            if not (incoming.pending or obj.pending()):
                break
        return b"".join(parts)

    def read_into(self, buffer: memoryview) -> int:
        """Plaintext into ``buffer`` (as much as was fed, up to its length); 0: none."""
        obj, incoming = self._io, self._in
        got = 0
        size = len(buffer)
        if not (incoming.pending or obj.pending()):
            return 0
        while got < size:
            try:
                n = int(obj.read(min(size - got, RECORD_BYTES), buffer[got:]))
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.peer_closed = True
                break
            if not n:
                self.peer_closed = True
                break
            got += n
            if not (incoming.pending or obj.pending()):
                break
        return got

    def close(self) -> bytes:
        """The close_notify to send before closing the socket (b"" if none is due)."""
        if not self.established:
            return b""
        # The peer's close_notify is not awaited (the socket closes next).
        with contextlib.suppress(ssl.SSLError, ValueError):
            self._obj.unwrap()
        return self._out.read()


def speaks_plain_shuttle(first_bytes: bytes) -> bool:
    """Whether a TLS peer's first bytes are a Shuttle frame: a node without TLS."""
    return first_bytes.startswith(_PLAIN_MAGIC)


def looks_like_tls(first_bytes: bytes) -> bool:
    """Whether a plain node's first bytes from a client are a TLS ClientHello (a
    handshake record: content type 22, version 3.x)."""
    return len(first_bytes) >= 2 and first_bytes[0] == 0x16 and first_bytes[1] == 0x03


def client_failure(
    exc: BaseException, address: str, ca_file: Path | None, channel: TlsChannel | None
) -> TlsError:
    """The typed error for a TLS failure on a client's connection to ``address``:
    what went wrong in the words of what to do about it."""
    first = channel.first_bytes if channel is not None else b""
    if channel is not None and not channel.established and speaks_plain_shuttle(first):
        return TlsError(
            f"node {address} does not speak TLS (it answered in plain Shuttle frames): it was "
            "started without --tls. Connect without TLS (--no-tls; loopback only), or restart "
            "the node with TLS (`shuttle cluster up --tls`)"
        )
    reason = getattr(exc, "reason", None) or str(exc)
    if channel is None and reason in _PLAIN_PEER_REASONS:
        return TlsError(
            f"node {address} does not speak TLS ({reason}): it was started without --tls. "
            "Connect without TLS (--no-tls; loopback only), or restart the node with TLS "
            "(`shuttle cluster up --tls`)"
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return TlsError(
            f"node {address}'s TLS certificate failed verification ({exc.verify_message}) "
            f"against the CA {ca_file}: is that the CA of this node's cluster, and was its "
            "certificate issued for this address? (`shuttle cluster up --tls` makes both; the "
            "cluster file names the CA)"
        )
    if channel is not None and channel.established:
        return record_failure(exc, address)
    return TlsError(
        f"TLS handshake with node {address} failed ({reason}); is it a Shuttle node with "
        "TLS, and does this client's TLS setting match it?"
    )


def record_failure(exc: BaseException, address: str) -> TlsError:
    """The typed error for an established TLS connection to ``address`` that failed:
    a record that did not authenticate (or an alert from the node saying one of ours
    did not)."""
    reason = getattr(exc, "reason", None) or str(exc)
    return TlsError(
        f"the TLS connection to node {address} failed ({reason}): a record did not "
        "authenticate, so bytes were changed on the way; nothing received on it was used"
    )


def tls_from_env() -> bool | None:
    """``$SHUTTLE_TLS`` as a setting: True, False, or None when unset; ConfigError for
    anything but 1/0/true/false/yes/no/on/off."""
    raw = os.environ.get(TLS_ENV, "").strip().lower()
    if not raw:
        return None
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"${TLS_ENV} must be 1 or 0 (TLS on or off), got {raw!r}")
