"""The checks every path of a call shares, and the state they keep: one end's place
in the transition table, its limits and the request ids in flight.

A request or a response goes by the general path (events), a fast lane (no event
object) or the read lane (bytes), and each is checked here, by the same methods,
whichever way it went: sending, :meth:`CallChecks._check_request` before it is
encoded and :meth:`CallChecks._requested` after (:meth:`~CallChecks._check_response`
and :meth:`~CallChecks._responded` for a response); receiving,
:meth:`CallChecks._take_request` and :meth:`CallChecks._take_response`. Which event
may be sent or received in which state is the table's
(:data:`shuttle.wire.states.TRANSITIONS`), applied by :meth:`CallChecks._transition`.

:class:`~shuttle.wire.connection.Connection` extends :class:`CallChecks` with the
paths themselves. A base class, not a mixin: compiled, the fields stay at fixed
offsets and the calls between the two stay direct, as they were in one class.
"""

from __future__ import annotations

from typing import Any

from shuttle.errors import LimitExceededError, LocalProtocolError, RemoteProtocolError
from shuttle.wire.events import Request, Response
from shuttle.wire.limits import OP_NAME_BYTES_MAX, Limits
from shuttle.wire.states import ALLOWED as _ALLOWED
from shuttle.wire.states import ERROR as _ERROR
from shuttle.wire.states import READY as _READY
from shuttle.wire.states import RECV_REQUEST as _RECV_REQUEST
from shuttle.wire.states import RECV_RESPONSE as _RECV_RESPONSE
from shuttle.wire.states import SEND, Role, State
from shuttle.wire.states import SEND_REQUEST as _SEND_REQUEST
from shuttle.wire.states import SEND_RESPONSE as _SEND_RESPONSE


class CallChecks:
    """One end's state, limits and requests in flight, and the checks on them.

    ``limits`` are what this end enforces on what it receives; the peer's limits
    (learned from the handshake on a client) bound what it sends.
    """

    def __init__(self, role: Role, limits: Limits | None = None) -> None:
        self.role = role
        #: The role as a plain bool: the hot paths test it, and an enum member costs a
        #: class attribute lookup (slow on Python 3.11) each time it is named.
        self._is_server = role is Role.SERVER
        self.state = State.START
        self.our_limits = limits or Limits()
        self.peer_limits = Limits()
        self.version: int | None = None
        #: Requests sent (client) or received (server) and not yet answered.
        self._in_flight: set[int] = set()
        #: The next request id, an int held as an object: the id is passed on to Python
        #: calls and set operations (the lane's packer and parser, ``_in_flight``), and
        #: compiled, each would box an ``int`` into a new object again.
        self._next_rid: Any = 1

    @property
    def state(self) -> State:
        return self._state

    @state.setter
    def state(self, state: State) -> None:
        self._state = state
        #: The transitions allowed from here: (direction, event type) -> next state.
        allowed = _ALLOWED[(self.role, state)]
        self._allowed = allowed
        # Whether each step of a call keeps this state (READY -> READY), asked of the
        # table once per state, not once per call: a tuple key is hashed per lookup.
        self._steady_send_request = allowed.get(_SEND_REQUEST) is state
        self._steady_send_response = allowed.get(_SEND_RESPONSE) is state
        self._steady_recv_request = allowed.get(_RECV_REQUEST) is state
        self._steady_recv_response = allowed.get(_RECV_RESPONSE) is state

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def next_request_id(self) -> Any:
        """A fresh request id (client side). Ids are positive; 0 means 'the connection'.
        An ``int``, typed ``Any`` so that the compiled build hands on the one object
        made here (see ``_next_rid``)."""
        rid = self._next_rid
        self._next_rid = rid + 1 if rid < 0xFFFFFFFF else 1
        return rid

    def _transition(self, direction: str, kind: type) -> None:
        """Apply the table to an event of type ``kind`` going ``direction``."""
        new_state = self._allowed.get((direction, kind))
        if new_state is None:
            what = f"{kind.__name__} in state {self._state.name} as {self.role.name}"
            if direction == SEND:
                raise LocalProtocolError(f"cannot send {what}")
            self.state = _ERROR
            raise RemoteProtocolError(f"peer sent {what}; closing the connection")
        if new_state is not self._state:
            self.state = new_state

    def _check_request(self, rid: Any) -> None:
        """Raise unless request ``rid`` may be sent now (every request path calls it;
        ``rid``: an int, kept boxed as in :meth:`_check_response`)."""
        in_flight = self._in_flight
        limits = self.peer_limits
        if rid in in_flight:
            raise LocalProtocolError(f"request id {rid} is already in flight")
        if len(in_flight) >= limits.in_flight_max:
            raise LimitExceededError(
                f"{len(in_flight)} requests already in flight, the node's limit is "
                f"{limits.in_flight_max}; wait for responses before sending more"
            )

    def _requested(self, rid: Any) -> None:
        """Request ``rid`` was encoded: apply the table and put it in flight (``rid``:
        an int, kept boxed as in :meth:`_check_response`)."""
        if not self._steady_send_request:
            self._transition(SEND, Request)  # not a READY -> READY step: raise or move
        self._in_flight.add(rid)

    def _check_response(self, rid: Any) -> None:
        """Raise unless request ``rid`` awaits its response (every response path; also
        after the client broke the protocol, when only requests taken before are
        answered). ``rid`` is an int, typed ``Any`` so that the compiled build keeps
        the object it is given: an ``int`` parameter is unboxed, and each set operation
        would box it again (an allocation for any id over 256)."""
        if (
            rid not in self._in_flight
            and self._is_server
            and (self._state is _READY or self._state is _ERROR)
        ):
            raise LocalProtocolError(f"no request {rid} is waiting for a response")

    def _responded(self, rid: Any) -> None:
        """The response to ``rid`` was encoded: apply the table, take it out of flight.
        (``rid``: an int, kept boxed as in :meth:`_check_response`.)"""
        if not self._steady_send_response:
            self._transition(SEND, Response)
        self._in_flight.discard(rid)

    def _take_request(self, h: Any) -> bool:
        """The request check, for every path: if ``h`` is the header of a request that
        this node accepts now (``[rid, op, args]``, well formed, a fresh id, within the
        limits, allowed by the table), put it in flight and return True; else False
        and nothing changed (:meth:`_refused_request` then says why)."""
        if type(h) is not list or len(h) != 3:
            return False
        rid, op, args = h
        return (
            type(rid) is int
            and rid > 0
            and type(args) is dict
            and type(op) is str
            and 0 < len(op) <= OP_NAME_BYTES_MAX
            and self._take_request_id(rid)
        )

    def _take_request_id(self, rid: Any) -> bool:
        """:meth:`_take_request` once the header is known to be a well-formed request
        (``rid`` a positive int, kept boxed as in :meth:`_check_response`: both callers
        check that it is, the read lane's parsers and :meth:`_take_request`)."""
        in_flight = self._in_flight
        held = len(in_flight)
        if held < self.our_limits.in_flight_max and self._steady_recv_request and self._is_server:
            # One hash lookup, not two ("not in", then "add"): a fresh id grows the set,
            # one already in flight leaves it as it was, and is refused.
            in_flight.add(rid)
            return len(in_flight) > held
        return False

    def _take_response(self, h: Any) -> int | None:
        """The response check, for every path: if ``h`` is the header of a response
        this client awaits (well formed, its id in flight, allowed by the table), take
        its id out of flight and return it; else None and nothing changed
        (:meth:`_from_wire` then says why)."""
        if type(h) is not list or len(h) != 2:
            return None
        rid = h[0]
        if type(rid) is int and self._take_response_id(rid):
            return rid
        return None

    def _take_response_id(self, rid: Any) -> bool:
        """:meth:`_take_response` once the header is known to be ``[rid, ...]``
        (``rid``: an int, kept boxed as in :meth:`_check_response`)."""
        in_flight = self._in_flight
        if self._steady_recv_response and not self._is_server:
            # One hash lookup, not two ("in", then "discard"): an id in flight shrinks
            # the set; any other leaves it as it was, and is refused.
            held = len(in_flight)
            in_flight.discard(rid)
            return len(in_flight) < held
        return False
