"""The Shuttle wire protocol, sans-I/O: bytes in, events out (see docs/protocol.md).

Layout:

* ``limits``      named limits (frame, header, in-flight) and protocol versions
* ``events``      one class per frame kind, plus ``RequestRejected`` and ``NEED_DATA``
* ``frames``      the frame layout: encoder and a bounded-memory reader
* ``states``      roles, states and the table of allowed transitions
* ``handshake``   the frames outside calls (CHALLENGE, HELLO, WELCOME, GOODBYE) as
  headers and back, and the protocol version a handshake settles on
* ``call_checks``  the checks every path of a call shares: the table's state, the
  limits, the request ids in flight
* ``connection``  the state machine of one end: the general path, the fast lanes and the
  read lane over those checks
* ``readlane``    a small read's request and reply as bytes (C in ``_readlane.c``)

There are no sockets in this package; ``shuttle.net`` moves the bytes.
"""

from shuttle.wire.connection import Connection
from shuttle.wire.events import (
    NEED_DATA,
    Challenge,
    ConnectionClosed,
    ErrorResponse,
    Event,
    FrameKind,
    Goodbye,
    Hello,
    NeedData,
    Request,
    RequestRejected,
    Response,
    Welcome,
)
from shuttle.wire.handshake import choose_version
from shuttle.wire.limits import (
    HEADER_BYTES_MAX,
    IN_FLIGHT_MAX,
    NONCE_BYTES,
    PAYLOAD_BYTES_MAX,
    PROTOCOL_VERSION_MAX,
    PROTOCOL_VERSION_MIN,
    Limits,
)
from shuttle.wire.states import Role, State

__all__ = [
    "HEADER_BYTES_MAX",
    "IN_FLIGHT_MAX",
    "NEED_DATA",
    "NONCE_BYTES",
    "PAYLOAD_BYTES_MAX",
    "PROTOCOL_VERSION_MAX",
    "PROTOCOL_VERSION_MIN",
    "Challenge",
    "Connection",
    "ConnectionClosed",
    "ErrorResponse",
    "Event",
    "FrameKind",
    "Goodbye",
    "Hello",
    "Limits",
    "NeedData",
    "Request",
    "RequestRejected",
    "Response",
    "Role",
    "State",
    "Welcome",
    "choose_version",
]
