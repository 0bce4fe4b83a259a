"""A node's connection from its first bytes to WELCOME: the challenge, the HELLO, and
the connections refused on the way.

Functions of one :class:`~shuttle.net.node_protocol.NodeProtocol`: the node speaks
first (a CHALLENGE with a fresh nonce), a connection over the node's cap is answered
``busy`` and closed, one still in its handshake at the deadline or pushed out by newer
ones (``RpcServer.admit``) is closed, and a HELLO is answered with WELCOME (the node's
proof when it has a key) once its version, its credentials and its principal's share
of the node's connections allow, else with an ERROR (rid 0) and a close.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

from shuttle.errors import (
    AuthenticationError,
    NodeBusyError,
    RemoteProtocolError,
    ShuttleError,
)
from shuttle.net import auth
from shuttle.wire import (
    NONCE_BYTES,
    Challenge,
    ErrorResponse,
    Hello,
    Welcome,
    choose_version,
)

if TYPE_CHECKING:
    from shuttle.net.node_protocol import NodeProtocol

log = logging.getLogger("shuttle.node")


def challenge(proto: NodeProtocol) -> None:
    """Open the Shuttle handshake (the node speaks first), or refuse as ``busy``."""
    server = proto.server
    # A fresh nonce per connection, so a HELLO captured on another connection cannot
    # answer this one.
    proto.nonce = os.urandom(NONCE_BYTES)
    challenge = Challenge(proto.nonce, server.requires_key, auth.SCHEME)
    proto.write_frames(proto.conn.send(challenge))
    if server.counters.connections_open > server.connections_max:
        refuse_busy(proto)


def evict(proto: NodeProtocol, waiting_max: int) -> None:
    """Close this connection, still in its handshake, to make room for a newer one
    (the node's cap on connections in their handshake: see ``RpcServer.admit``)."""
    if proto.closed:
        return
    proto.server.counters.unauthenticated_evicted += 1
    if not proto.encrypted or (proto.tls is not None and proto.tls.established):
        busy = NodeBusyError(
            f"node {proto.server.node_id} has {waiting_max} connections in their handshake, "
            "and this one had waited longest; retry (a flood of connections that never "
            "authenticate may be under way)"
        )
        with contextlib.suppress(ShuttleError):
            proto.write_frames(proto.conn.send(ErrorResponse.from_exception(0, busy)))
        proto.close()
    else:
        proto.abort()  # it has not even finished TLS: nothing it could read


def handshake_expired(proto: NodeProtocol) -> None:
    """The deadline for the handshake passed: close the connection unless it is done."""
    proto.handshake_timer = None
    if proto.authenticated or proto.closed:
        return
    server = proto.server
    server.counters.handshake_timeouts += 1
    server.authenticated(proto)
    limit = server.admission.handshake_timeout_s
    log.info("closing %s: no handshake within %g s", proto.peer, limit)
    if proto.encrypted and (proto.tls is None or not proto.tls.established):
        proto.abort()
        return
    late = RemoteProtocolError(
        f"the handshake (HELLO) did not finish within {limit:g} s of connecting; "
        "closing the connection"
    )
    with contextlib.suppress(ShuttleError):
        proto.write_frames(proto.conn.send(ErrorResponse.from_exception(0, late)))
    proto.close()


def refuse_busy(proto: NodeProtocol) -> None:
    """Over the cap: say ``busy`` right after the challenge (where a client reads
    it, even if its HELLO then meets a closed socket) and close."""
    server = proto.server
    server.counters.connections_refused += 1
    proto.refused = True
    busy = NodeBusyError(
        f"node {server.node_id} is serving its maximum of {server.connections_max} "
        "connections; retry shortly, close idle connections, or start the node with a "
        "higher --connections-max"
    )
    if server.counters.connections_refused % 1000 == 1:
        log.warning("refusing %s: %s", proto.peer, busy)
    proto.write_frames(proto.conn.send(ErrorResponse.from_exception(0, busy)))
    # Closed at once (after the two frames are flushed): a refused connection must
    # give its descriptor back, or a flood of them would take what the cap protects.
    proto.close()


def greet(proto: NodeProtocol, hello: Hello) -> None:
    """Answer the HELLO: WELCOME (with the node's proof when it has a key), or an
    ERROR on the connection (rid 0) and close when versions or credentials fail."""
    server = proto.server
    try:
        version = choose_version(hello)
        key, principal = server.credentials_for(hello)
        proof = auth.check_hello(hello, key, proto.nonce, server.node_id, binding=proto.binding)
    except (RemoteProtocolError, AuthenticationError) as exc:
        if isinstance(exc, AuthenticationError):
            server.counters.auth_failures += 1
        log.warning("refusing %s (client %r): %s", proto.peer, hello.client_name[:80], exc)
        proto.write_frames(proto.conn.send(ErrorResponse.from_exception(0, exc)))
        proto.close()
        return
    if principal is not None:
        try:  # its share of the node's connections (net/principal_limits.py)
            server.load.take("connections", principal.name)
        except NodeBusyError as exc:
            log.info("refusing %s: %s", proto.peer, exc)
            proto.write_frames(proto.conn.send(ErrorResponse.from_exception(0, exc)))
            proto.close()
            return
        proto.load_name = principal.name
        proto.principal = principal
    welcome = Welcome(version, server.node_id, server.limits.to_wire(), proof)
    proto.write_frames(proto.conn.send(welcome))
    proto.authenticated = True
    server.authenticated(proto)
    if proto.handshake_timer is not None:
        proto.handshake_timer.cancel()
        proto.handshake_timer = None
