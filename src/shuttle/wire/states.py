"""Which event may be sent or received in which state: the connection's transition
table, for either end (h11's ``_state.py``, in Shuttle's terms).

:class:`~shuttle.wire.connection.Connection` applies it; anything not in it is an
error whose fault depends on the direction (sending it: ``LocalProtocolError``;
receiving it: ``RemoteProtocolError``).
"""

from __future__ import annotations

from enum import Enum, auto
from typing import Final

from shuttle.wire.events import (
    Challenge,
    ConnectionClosed,
    ErrorResponse,
    FrameKind,
    Goodbye,
    Hello,
    Request,
    RequestRejected,
    Response,
    Welcome,
)


class Role(Enum):
    CLIENT = auto()
    SERVER = auto()


class State(Enum):
    START = auto()
    #: The node sent its Challenge (server) / the client received it (client): the
    #: client's Hello, answering it, comes next.
    CHALLENGED = auto()
    #: Client sent Hello, waits for Welcome.
    AWAIT_WELCOME = auto()
    #: Server received Hello, must answer with Welcome (or an error).
    GREETING = auto()
    READY = auto()
    CLOSED = auto()
    ERROR = auto()


SEND, RECV = "send", "recv"
# Enum members and table keys named in the hot paths, bound once: on Python 3.11
# ``State.READY`` is a class attribute lookup through the enum's metaclass, several
# times dearer than a global.
REQUEST, RESPONSE = FrameKind.REQUEST, FrameKind.RESPONSE
READY, ERROR, CLOSED = State.READY, State.ERROR, State.CLOSED

_C, _S = Role.CLIENT, Role.SERVER
# Every connection is challenged: the node speaks first (a Challenge with a fresh
# nonce), so a Hello can only be an answer to this connection's challenge.
TRANSITIONS: dict[tuple[Role, State, str, type], State] = {
    (_C, State.START, RECV, Challenge): State.CHALLENGED,
    (_C, State.CHALLENGED, SEND, Hello): State.AWAIT_WELCOME,
    # The node refuses a connection whose client broke the protocol before its HELLO
    # (ERROR rid 0, then it closes); the client must be able to read why.
    (_C, State.CHALLENGED, RECV, ErrorResponse): State.CLOSED,
    (_C, State.AWAIT_WELCOME, RECV, Welcome): State.READY,
    (_C, State.AWAIT_WELCOME, RECV, ErrorResponse): State.CLOSED,
    (_C, State.READY, SEND, Request): State.READY,
    (_C, State.READY, RECV, Response): State.READY,
    (_C, State.READY, RECV, ErrorResponse): State.READY,
    (_S, State.START, SEND, Challenge): State.CHALLENGED,
    (_S, State.CHALLENGED, RECV, Hello): State.GREETING,
    # A node over its connection cap refuses right after its challenge (ERROR rid 0,
    # code "busy"), then closes.
    (_S, State.CHALLENGED, SEND, ErrorResponse): State.CLOSED,
    (_S, State.GREETING, SEND, Welcome): State.READY,
    (_S, State.GREETING, SEND, ErrorResponse): State.CLOSED,
    (_S, State.READY, RECV, Request): State.READY,
    (_S, State.READY, RECV, RequestRejected): State.READY,
    (_S, State.READY, SEND, Response): State.READY,
    (_S, State.READY, SEND, ErrorResponse): State.READY,
    # A client that broke the protocol (say, a request id already in flight) gets no
    # more of its bytes read, but every request the node took before is still answered
    # before the node closes: otherwise a request that ran would have no answer, and
    # its client could not tell whether it happened.
    (_S, State.ERROR, SEND, Response): State.ERROR,
    (_S, State.ERROR, SEND, ErrorResponse): State.ERROR,
}
# Goodbye and a clean EOF end the connection from any live state.
for _role in Role:
    for _state in (
        State.START,
        State.CHALLENGED,
        State.AWAIT_WELCOME,
        State.GREETING,
        State.READY,
    ):
        for _direction in (SEND, RECV):
            TRANSITIONS[(_role, _state, _direction, Goodbye)] = State.CLOSED
        TRANSITIONS[(_role, _state, RECV, ConnectionClosed)] = State.CLOSED

RECV_REQUEST: Final[tuple[str, type]] = (RECV, Request)
RECV_RESPONSE: Final[tuple[str, type]] = (RECV, Response)
SEND_REQUEST: Final[tuple[str, type]] = (SEND, Request)
SEND_RESPONSE: Final[tuple[str, type]] = (SEND, Response)

# The same table split by (role, state), so that applying a transition is one lookup
# keyed by (direction, event type). Enum members hash with a Python-level __hash__;
# a str and a type hash in C, which matters on the path of every request.
ALLOWED: dict[tuple[Role, State], dict[tuple[str, type], State]] = {
    (role, state): {} for role in Role for state in State
}
for (_role, _state, _direction, _kind), _new in TRANSITIONS.items():
    ALLOWED[(_role, _state)][(_direction, _kind)] = _new
