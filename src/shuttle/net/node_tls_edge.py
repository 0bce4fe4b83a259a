"""TLS at the edge of a node's connection: ciphertext in, plaintext to the protocol.

On a TLS node a :class:`~shuttle.net.node_protocol.NodeProtocol` passes what arrives
through :func:`decrypt`, which drives the TLS handshake (its records written as they
are), then opens the Shuttle handshake, and afterwards turns each chunk into its
plaintext; everything after it, the read lane included, handles plaintext exactly as
on a plain node. A TLS failure sends the alert TLS made for it and closes.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
from typing import TYPE_CHECKING

from shuttle.net.node_handshake import challenge
from shuttle.net.tls import TlsChannel

if TYPE_CHECKING:
    from shuttle.net.node_protocol import NodeProtocol

log = logging.getLogger("shuttle.node")


def decrypt(proto: NodeProtocol, data: bytes) -> bytes:
    """A TLS connection's ciphertext in, its plaintext out (b"": nothing yet). Drives
    the TLS handshake, then opens the Shuttle one; a TLS failure closes the
    connection (after the alert that says why)."""
    tls = proto.tls
    if tls is None:
        server_tls = proto.server.tls
        assert server_tls is not None
        tls = proto.tls = TlsChannel(server_tls.context(), server_side=True)
    try:
        # The usual case is one call: decrypt what came.
        plain = tls.decrypt(data) if tls.established else _tls_handshake(proto, tls, data)
    except ssl.SSLError as exc:
        _tls_failed(proto, exc)
        return b""
    if tls.peer_closed:  # close_notify: the client ended its side
        if plain:
            proto.receive(plain)
        proto.eof_received()
        return b""
    return plain


def _tls_handshake(proto: NodeProtocol, tls: TlsChannel, data: bytes) -> bytes:
    """Advance the TLS handshake with ``data``; once it is done, open the Shuttle
    handshake and return any plaintext that came with the client's last flight."""
    tls.feed(data)
    done = tls.handshake()
    out = tls.output()
    if out:
        proto.write_raw(out)
    if not done:
        return b""
    proto.binding = tls.binding()
    challenge(proto)
    if proto.closed:
        return b""
    return tls.read()


def _tls_failed(proto: NodeProtocol, exc: ssl.SSLError) -> None:
    """Count and log a TLS failure, send the alert TLS made for it, and close."""
    server = proto.server
    server.counters.tls_failures += 1
    tls = proto.tls
    assert tls is not None
    reason = getattr(exc, "reason", None) or str(exc)
    if tls.established:
        log.warning(
            "closing %s: a TLS record failed its authentication (%s): bytes changed on the way?",
            proto.peer,
            reason,
        )
    elif server.counters.tls_failures % 1000 == 1:
        log.warning("TLS handshake with %s failed: %s", proto.peer, reason)
    with contextlib.suppress(ssl.SSLError):
        alert = tls.output()
        if alert and proto.transport is not None and not proto.closed:
            proto.transport.write(alert)
    proto.refused = True  # nothing more of its stream is read
    proto.server.authenticated(proto)
    proto.close()
