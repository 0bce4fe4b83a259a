"""How a node's connection ends: a protocol error answered, the sweep's timeouts,
a revoked principal, GOODBYE.

Functions of one :class:`~shuttle.net.node_protocol.NodeProtocol`, as its handshake's
are (:mod:`shuttle.net.node_handshake`). A client that breaks the protocol gets
nothing more of its stream read, but every request taken before is answered before
the node says why (an ERROR with rid 0) and closes (:func:`fatal`, then
:func:`hang_up` once the last of them is answered), without resetting the connection
(:func:`linger`). The server's housekeeping sweep closes a connection whose frame
stalls, whose client stops reading or that idles (:func:`check_timeouts`); a
connection whose principal is removed is told why and closed (:func:`revoke`); one
with nothing in flight is closed with GOODBYE (:func:`goodbye`). The transport's own
close and abort stay the protocol's methods (``NodeProtocol.close``,
``NodeProtocol.abort``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from shuttle.errors import RemoteProtocolError, ShuttleError
from shuttle.net.admission import ServerLimits
from shuttle.net.tls import looks_like_tls
from shuttle.wire import ErrorResponse, Goodbye
from shuttle.wire.events import FrameKind
from shuttle.wire.frames import encode_frame

if TYPE_CHECKING:
    from shuttle.net.node_protocol import NodeProtocol

log = logging.getLogger("shuttle.node")

#: How long a connection hung up on for breaking the protocol keeps reading (and
#: dropping) what its client still sends after the error. Closing a socket with unread
#: bytes makes the kernel send a reset, which can reach the client before it has read
#: the error (its send fails with "connection reset" and the reason is lost), so the
#: node shuts its sending side and drains the rest, as web servers' lingering close
#: does; bounded in time, so a client that never stops sending cannot hold it.
LINGER_S = 5.0


def fatal(proto: NodeProtocol, exc: RemoteProtocolError) -> None:
    """The client broke the protocol (or its stream is corrupt): read nothing more of
    it, answer every request it sent before (they were taken, and may have run),
    then tell it why (rid 0) and hang up."""
    server = proto.server
    server.counters.protocol_errors += 1
    if not proto.encrypted and not proto.authenticated and looks_like_tls(proto.first_bytes):
        log.warning(
            "protocol error from %s: it speaks TLS, and this node serves without TLS "
            "(start it with --tls, or connect without TLS)",
            proto.peer,
        )
    else:
        log.warning("protocol error from %s: %s", proto.peer, exc)
    if proto.pending and not proto.closed and proto.failing is None:
        proto.failing = exc
        server.counters.drained_before_close += 1
        if proto.transport is not None:
            proto.transport.pause_reading()
        return
    hang_up(proto, exc)


def hang_up(proto: NodeProtocol, exc: RemoteProtocolError) -> None:
    """Send the connection's ERROR (rid 0) saying why, and close."""
    limits = proto.server.limits
    frame = encode_frame(
        FrameKind.ERROR,
        [0, exc.code, str(exc)],
        header_bytes_max=limits.header_bytes_max,
        payload_bytes_max=limits.payload_bytes_max,
    )
    if proto.transport is not None and not proto.closed:
        proto.send_bytes(b"".join(frame))
    if proto.failing is None:
        proto.failing = exc  # (so ``data_received`` drops what still arrives)
    linger(proto)


def linger(proto: NodeProtocol) -> None:
    """Close after a protocol error without resetting the connection: send what is
    buffered and the end of stream, then drop whatever still arrives (``failing``
    makes ``data_received`` ignore it) until the client's end of stream or
    ``LINGER_S`` (see there why)."""
    transport = proto.transport
    if transport is None or proto.closed or proto.lost or not transport.can_write_eof():
        proto.close()
        return
    if proto.tls is not None:
        proto.close()  # close_notify first; TLS has no half-close to linger in
        return
    proto.closed = True
    proto.lingering = True
    transport.write_eof()
    transport.resume_reading()
    asyncio.get_running_loop().call_later(LINGER_S, proto.abort)


def check_timeouts(proto: NodeProtocol, now: float, limits: ServerLimits) -> None:
    """Close the connection if a frame stopped arriving, its client stopped reading
    replies, or it idled (from the sweep)."""
    if proto.closed or proto.refused or proto.failing is not None:
        return  # (a failing one closes once the requests it had running are answered)
    # A partial frame with no byte arriving for the timeout (progress resets it:
    # a big upload on a slow link is never cut while it moves).
    partial = proto.conn.partial_frame
    if not partial or proto.bytes_in != proto.frame_bytes:
        proto.frame_since, proto.frame_bytes = now, proto.bytes_in
    elif not proto.held and now - proto.frame_since > limits.frame_timeout_s:
        proto.server.counters.frame_timeouts += 1
        fatal(
            proto,
            RemoteProtocolError(
                f"a frame has been incomplete with nothing arriving for over "
                f"{limits.frame_timeout_s:g} s ({proto.conn.buffered_bytes} bytes of it "
                "arrived); closing the connection"
            ),
        )
        return
    # Unsent replies over the high mark that have not drained to the low mark for
    # the timeout (nothing is added meanwhile): the client stopped reading.
    unsent = proto.unsent()
    if (
        proto.writing_paused_since is not None
        and now - proto.writing_paused_since > limits.frame_timeout_s
    ):
        proto.server.counters.send_timeouts += 1
        log.warning(
            "closing %s: its client has not read its %d unsent reply bytes for over %g s",
            proto.peer,
            unsent,
            limits.frame_timeout_s,
        )
        proto.abort()
        return
    if partial or proto.pending or proto.held or unsent or proto.idle_requests != proto.requests:
        proto.idle_since, proto.idle_requests = now, proto.requests
    elif proto.owns_sessions and proto.server.registry.owns_anything(proto.number):
        proto.idle_since = now  # a slow writer keeps its upload session
    elif now - proto.idle_since > limits.idle_timeout_s:
        proto.server.counters.idle_closed += 1
        log.info("closing %s: idle for over %g s", proto.peer, limits.idle_timeout_s)
        goodbye(proto, f"idle for over {limits.idle_timeout_s:g} s; reconnect when needed")


def revoke(proto: NodeProtocol, error: ShuttleError) -> None:
    """The principal it authenticated as is gone: say why (rid 0) and close. Replies
    of requests still running are dropped (their clients see the error)."""
    if proto.closed or proto.transport is None:
        return
    log.warning("closing %s: %s", proto.peer, error)
    with contextlib.suppress(ShuttleError):
        proto.write_frames(proto.conn.send(ErrorResponse.from_exception(0, error)))
    proto.close()


def goodbye(proto: NodeProtocol, reason: str) -> None:
    """Say GOODBYE and close: only when every request taken has been answered
    (clients may then send the unanswered ones again, safely)."""
    if proto.transport is None:
        return
    if proto.closed:
        if proto.lingering:
            proto.abort()  # after a protocol error: the node is going
        return
    if proto.encrypted and (proto.tls is None or not proto.tls.established):
        proto.abort()  # still in its TLS handshake: no frame could reach it
        return
    with contextlib.suppress(ShuttleError):
        proto.write_frames(proto.conn.send(Goodbye(reason)))
    proto.close()
