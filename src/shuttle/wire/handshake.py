"""The frames of a connection outside its calls, as headers and back: the handshake's
(CHALLENGE, HELLO, WELCOME) and GOODBYE; and the protocol version a handshake settles
on. No state here: :class:`~shuttle.wire.connection.Connection` decides when each
frame may pass (its table) and keeps what the handshake taught it (the version, the
peer's limits); these functions only say what a frame's map header holds, and refuse
a malformed one with :class:`RemoteProtocolError` naming what was wrong.
"""

from __future__ import annotations

from typing import Any

from shuttle.errors import LocalProtocolError, RemoteProtocolError
from shuttle.wire.events import Challenge, Event, FrameKind, Goodbye, Hello, Welcome
from shuttle.wire.frames import brief
from shuttle.wire.limits import (
    NONCE_BYTES,
    PROTOCOL_VERSION_MAX,
    PROTOCOL_VERSION_MIN,
    SCHEME_BYTES_MAX,
)


def choose_version(hello: Hello) -> int:
    """The highest protocol version both sides speak (server side of the handshake).

    Raises :class:`RemoteProtocolError` naming both ranges if there is none.
    """
    version = min(hello.version_max, PROTOCOL_VERSION_MAX)
    if version < max(hello.version_min, PROTOCOL_VERSION_MIN):
        raise RemoteProtocolError(
            f"no common protocol version: client speaks {hello.version_min}.."
            f"{hello.version_max}, node speaks {PROTOCOL_VERSION_MIN}..{PROTOCOL_VERSION_MAX}; "
            "upgrade the older side"
        )
    return version


def control_header(event: Event) -> tuple[FrameKind, dict[str, Any]]:
    """The frame kind and map header of a frame outside calls; raises
    :class:`LocalProtocolError` for an event that is not sent on the wire."""
    if isinstance(event, Hello):
        header: dict[str, Any] = {
            "version_min": event.version_min,
            "version_max": event.version_max,
            "client": event.client_name,
        }
        if event.credentials is not None:
            header["credentials"] = event.credentials
        return FrameKind.HELLO, header
    if isinstance(event, Welcome):
        welcome: dict[str, Any] = {
            "version": event.version,
            "node": event.node_id,
            "limits": event.limits,
        }
        if event.proof is not None:
            welcome["proof"] = event.proof
        return FrameKind.WELCOME, welcome
    if isinstance(event, Challenge):
        return (
            FrameKind.CHALLENGE,
            {
                "nonce": event.nonce,
                "key_required": event.key_required,
                "scheme": event.scheme,
            },
        )
    if isinstance(event, Goodbye):
        return FrameKind.GOODBYE, {"reason": event.reason}
    raise LocalProtocolError(f"{type(event).__name__} is not sent on the wire")


def control_event(kind: FrameKind, h: Any) -> Event:
    """The event a HELLO, WELCOME, CHALLENGE or GOODBYE frame with header ``h`` makes;
    :class:`RemoteProtocolError` if the header is malformed."""
    if not isinstance(h, dict):
        raise RemoteProtocolError(f"malformed {kind.name} header {brief(h)}")
    if kind is FrameKind.HELLO:
        vmin, vmax = h.get("version_min"), h.get("version_max")
        if not isinstance(vmin, int) or not isinstance(vmax, int):
            raise RemoteProtocolError(f"HELLO without integer versions: {brief(h)}")
        creds = h.get("credentials")
        return Hello(
            vmin, vmax, str(h.get("client", "")), creds if isinstance(creds, dict) else None
        )
    if kind is FrameKind.WELCOME:
        version, node, proof = h.get("version"), h.get("node"), h.get("proof")
        if (
            not isinstance(version, int)
            or not isinstance(node, str)
            or not (proof is None or isinstance(proof, bytes))
        ):
            raise RemoteProtocolError(f"malformed WELCOME header {brief(h)}")
        limits = h.get("limits")
        return Welcome(version, node, limits if isinstance(limits, dict) else {}, proof)
    if kind is FrameKind.CHALLENGE:
        return _challenge_from(h)
    # FrameKind.GOODBYE: the only kind left.
    return Goodbye(str(h.get("reason", "")))


def _challenge_from(h: dict[str, Any]) -> Challenge:
    """The :class:`Challenge` in a CHALLENGE header; :class:`RemoteProtocolError` if
    it is malformed (a nonce of the wrong size would weaken every proof over it)."""
    nonce, required, scheme = h.get("nonce"), h.get("key_required"), h.get("scheme")
    if (
        not isinstance(nonce, bytes)
        or len(nonce) != NONCE_BYTES
        or not isinstance(required, bool)
        or not isinstance(scheme, str)
        or not 0 < len(scheme) <= SCHEME_BYTES_MAX
    ):
        raise RemoteProtocolError(
            f"malformed CHALLENGE header {brief(h)} (expected a {NONCE_BYTES}-byte nonce, "
            "a boolean key_required and a scheme name); is the node a different Shuttle?"
        )
    return Challenge(nonce, required, scheme)
