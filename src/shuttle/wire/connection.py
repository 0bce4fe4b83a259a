"""The protocol state machine of one connection, for either end. No sockets here.

Bytes in (:meth:`Connection.receive_data`), events out (:meth:`Connection.next_event`);
events in (:meth:`Connection.send`), bytes out. Which event may be sent or received in
which state is a table (:data:`shuttle.wire.states.TRANSITIONS`); anything not in it
is an error, whose fault depends on the direction: sending it is a
:class:`LocalProtocolError`, receiving it a :class:`RemoteProtocolError`.

The events of every call also have fast lanes (``send_request``, ``send_response``,
``receive_request``, ``receive_response``) that skip the event objects. They share
the general path's rules rather than copy them: a whole small frame comes out of
:meth:`FrameReader.whole_frame` (the reader's one fast lane), a request is taken by
:meth:`~shuttle.wire.call_checks.CallChecks._take_request` and a response by
:meth:`~shuttle.wire.call_checks.CallChecks._take_response` whichever path it came by
(the long way only adds *why* when they refuse), and frames are encoded by
:func:`~shuttle.wire.frames.encode_frame_fast`. Tests check the lanes against the
general path (tests/unit/wire/test_fast_lanes.py). Those checks, the state in the
transition table and the request ids in flight are :mod:`shuttle.wire.call_checks`'s,
whose class :class:`Connection` extends.

Request ids let many requests be in flight at once (pipelining); responses may come
back in any order. The client picks ids; the node answers each exactly once.

What the frames outside calls (the handshake's, GOODBYE) hold, and the version a
handshake settles on, are :mod:`shuttle.wire.handshake`'s: this module keeps the
state they change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shuttle.errors import (
    InvalidArgumentError,
    LimitExceededError,
    LocalProtocolError,
    RemoteProtocolError,
    ShuttleError,
)
from shuttle.wire.call_checks import CallChecks
from shuttle.wire.events import (
    NEED_DATA,
    ConnectionClosed,
    ErrorResponse,
    Event,
    FrameKind,
    NeedData,
    Payload,
    Request,
    RequestRejected,
    Response,
    Welcome,
)
from shuttle.wire.frames import (
    DIRECT_PAYLOAD_BYTES_MIN,
    FrameReader,
    RawFrame,
    brief,
    encode_frame,
    encode_frame_fast,
)
from shuttle.wire.handshake import control_event, control_header
from shuttle.wire.limits import OP_NAME_BYTES_MAX, PREFIX_BYTES, Limits
from shuttle.wire.readlane import (
    pack_read_reply,
    pack_read_request,
    parse_read_reply,
    parse_read_request,
)
from shuttle.wire.states import CLOSED as _CLOSED
from shuttle.wire.states import ERROR as _ERROR
from shuttle.wire.states import READY as _READY
from shuttle.wire.states import RECV, SEND, Role
from shuttle.wire.states import REQUEST as _REQUEST
from shuttle.wire.states import RESPONSE as _RESPONSE


class Connection(CallChecks):
    """One end of a Shuttle connection.

    ``limits`` are what this end enforces on what it receives; the peer's limits
    (learned from the handshake on a client) bound what it sends.
    """

    def __init__(self, role: Role, limits: Limits | None = None) -> None:
        super().__init__(role, limits)
        self._reader = FrameReader(
            header_bytes_max=self.our_limits.header_bytes_max,
            payload_bytes_max=self.our_limits.payload_bytes_max,
            # A node's peers are not trusted: a payload costs what has arrived of it.
            grow_payloads=self._is_server,
        )
        #: The node's read lane calls (``shuttle.wire.readlane``), held here: as module
        #: globals of a compiled module, each call would look its name up in a dict
        #: first. Their request tuple and ids stay Python objects (see
        #: :meth:`receive_read_request`).
        self._parse_read: Callable[[bytes, int], tuple[Any, ...] | None] = parse_read_request
        self._pack_read: Callable[[Any, bytes, Any, Any], bytes] = pack_read_reply
        #: The header limit the read lane's parser is given, held as the int object it
        #: is passed as: compiled, an ``int`` field is boxed into a new object (an
        #: allocation, for any value over 256) each time it is passed to a Python call.
        self._parse_read_header_max: Any = self.our_limits.header_bytes_max
        #: The client's read lane calls and the reply's payload limit, held the same
        #: way (the limit: what :meth:`receive_read_reply`, and a client receiving with
        #: :func:`~shuttle.wire.readlane.recv_read_reply`, take by the lane).
        self._pack_read_request: Callable[[Any, str, Any, Any, Any, bool], bytes | None] = (
            pack_read_request
        )
        self._parse_read_reply: Callable[[bytes, Any, Any], bytes | None] = parse_read_reply
        self.read_reply_payload_max: Any = min(
            self.our_limits.payload_bytes_max, DIRECT_PAYLOAD_BYTES_MIN - 1
        )
        #: The same limit as an int field (compared, not passed on).
        self.read_reply_payload_bytes: int = self.read_reply_payload_max
        self._eof = False

    # --- the stream -----------------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet turned into events (0: :meth:`next_event` would
        answer :data:`NEED_DATA` unless the stream has ended)."""
        return self._reader.buffered_bytes

    @property
    def partial_frame(self) -> bool:
        """True while part of a frame has arrived and the rest has not."""
        return self._reader.partial_frame

    @property
    def eof_received(self) -> bool:
        """True once :meth:`receive_data` was given the end of the stream."""
        return self._eof

    def pending(self) -> bool:
        """True if :meth:`next_event` may have something to say without new bytes (part
        of a frame is buffered, or the end of the stream was received)."""
        return self._eof or not self._reader.at_frame_boundary()

    # --- sending ------------------------------------------------------------------

    def send(self, event: Event) -> list[Payload]:
        """Encode ``event``; returns buffers to write in order (payloads not copied).

        Raises :class:`LocalProtocolError` if the event is not allowed now and
        :class:`LimitExceededError` if it crosses the peer's limits; in both cases
        nothing was sent and the connection is unchanged.
        """
        kind = type(event)
        if kind is Request:
            assert isinstance(event, Request)
            return self.send_request(event.rid, event.op, event.args, event.payload)
        if kind is Response:
            assert isinstance(event, Response)
            return self.send_response(event.rid, event.result, event.payload)
        limits = self.peer_limits
        frame_kind, header, payload = self._to_wire(event)
        if (
            kind is ErrorResponse
            and self._is_server
            and (self._state is _READY or self._state is _ERROR)
            and event.rid not in self._in_flight  # type: ignore[union-attr]
        ):
            raise LocalProtocolError(
                f"no request {event.rid} is waiting for a response"  # type: ignore[union-attr]
            )
        buffers = encode_frame(
            frame_kind,
            header,
            payload,
            header_bytes_max=limits.header_bytes_max,
            payload_bytes_max=limits.payload_bytes_max,
        )
        self._transition(SEND, kind)
        if isinstance(event, ErrorResponse):
            self._in_flight.discard(event.rid)
        elif isinstance(event, Welcome):
            self.version = event.version
        return buffers

    # The two calls below are :meth:`send` for the events on the path of every request,
    # without building the event object first; they check and do exactly the same.
    # ``join_below``: a payload shorter than this comes back joined with its frame's
    # prefix and header in one bytes object (one buffer to write, one segment on the
    # wire); longer ones are returned uncopied, as :meth:`send` does.

    def send_request(
        self,
        rid: int,
        op: str,
        args: dict[str, Any],
        payload: Payload = b"",
        *,
        join_below: int = 0,
    ) -> list[Payload]:
        """``send(Request(rid, op, args, payload))`` (client side)."""
        self._check_request(rid)
        limits = self.peer_limits
        buffers = encode_frame_fast(
            _REQUEST,
            [rid, op, args],
            payload,
            limits.header_bytes_max,
            limits.payload_bytes_max,
            join_below,
        )
        self._requested(rid)
        return buffers

    def send_response(
        self, rid: int, result: Any, payload: Payload = b"", *, join_below: int = 0
    ) -> list[Payload]:
        """``send(Response(rid, result, payload))`` (node side)."""
        self._check_response(rid)
        limits = self.peer_limits
        buffers = encode_frame_fast(
            _RESPONSE,
            [rid, result],
            payload,
            limits.header_bytes_max,
            limits.payload_bytes_max,
            join_below,
        )
        self._responded(rid)
        return buffers

    # The read lane (shuttle.wire.readlane): a small read's request and reply as bytes,
    # with no header objects, for the commonest request of all. Each is the call above
    # (or below) it stands for, with the same checks; where the lane does not take
    # something, it returns None and the caller uses that call, which decides.

    def send_read_request(
        self, rid: Any, key: str, offset: Any, length: Any, version: Any, direct: bool = False
    ) -> bytes | None:
        """``send_request(rid, "read", {...})`` as one bytes object, or None (then use
        :meth:`send_request`, which encodes or refuses it). ``rid``, ``offset``,
        ``length`` and ``version`` (an int or None): typed ``Any`` so that the compiled
        build passes the caller's objects on to the packer, not new boxes of them."""
        data = self._pack_read_request(rid, key, offset, length, version, direct)
        if data is None or len(data) - PREFIX_BYTES > self.peer_limits.header_bytes_max:
            return None
        self._check_request(rid)
        self._requested(rid)
        return data

    def send_read_reply(self, rid: Any, data: bytes, start: Any, stop: Any) -> bytes:
        """``send_response(rid, None, data[start:stop])`` joined into one bytes object,
        the range copied once, straight into the frame (``data`` is often a whole cached
        block). ``rid``: the int of :meth:`receive_read_request`'s tuple, and ``start``
        and ``stop`` the ints of the read's span, kept boxed as they are; the packer
        checks ``0 <= start <= stop <= len(data)``."""
        limit = self.peer_limits.payload_bytes_max
        if len(data) > limit and stop - start > limit:
            # raises the limit's error
            return b"".join(self.send_response(rid, None, data[start:stop]))
        if self._steady_send_response and self._is_server:
            # READY or ERROR, where a response needs its request in flight: pack, then
            # take the id out with one set operation, not two ("in", then "discard");
            # an id not in flight leaves the set as it was, and is refused (the reply
            # unsent, as when _check_response refuses it before packing).
            in_flight = self._in_flight
            reply = self._pack_read(rid, data, start, stop)
            held = len(in_flight)
            in_flight.discard(rid)
            if len(in_flight) == held:
                raise LocalProtocolError(f"no request {rid} is waiting for a response")
            return reply
        self._check_response(rid)
        reply = self._pack_read(rid, data, start, stop)
        self._responded(rid)
        return reply

    def send_bytes(self, event: Event) -> bytes:
        """:meth:`send`, joined into one bytes object (convenient for small frames)."""
        return b"".join(self.send(event))

    @staticmethod
    def _to_wire(event: Event) -> tuple[FrameKind, Any, Payload]:
        if isinstance(event, Request):
            return FrameKind.REQUEST, [event.rid, event.op, event.args], event.payload
        if isinstance(event, Response):
            return FrameKind.RESPONSE, [event.rid, event.result], event.payload
        if isinstance(event, ErrorResponse):
            return FrameKind.ERROR, [event.rid, event.code, event.message], b""
        kind, header = control_header(event)
        return kind, header, b""

    # --- receiving ----------------------------------------------------------------

    def receive_data(self, data: Payload) -> None:
        """Buffer bytes from the peer; an empty ``data`` means end of stream."""
        if not data:
            self._eof = True
            return
        if self._state is _ERROR:
            raise RemoteProtocolError("connection already failed; open a new one")
        self._reader.feed(data)

    def receive_event(self, data: Payload) -> Event | NeedData:
        """``receive_data(data)`` then ``next_event()`` in one call (``data`` not empty):
        the usual step of an I/O layer that just received some bytes.

        When nothing was pending and ``data`` is a ``bytes`` object holding exactly one
        whole small frame (a request reaching a node, its response reaching the
        client), the frame is decoded from ``data`` directly, never buffered."""
        if self._state is _ERROR:
            raise RemoteProtocolError("connection already failed; open a new one")
        frame = self._reader.whole_frame(data)
        if frame is None:
            self._reader.feed(data)
            return self.next_event()
        return self._event_from(frame)

    # The two calls below are :meth:`receive_event` for the frames of every call, for
    # I/O layers that want no event object: they accept only a ``bytes`` chunk that
    # is exactly one whole small frame of the expected kind (FrameReader.whole_frame),
    # taken by the same check as on the long way (_take_request, _take_response).
    # Anything else returns None with nothing consumed: give the chunk to
    # :meth:`receive_event` then, which takes it or says what is wrong with it.

    def receive_request(
        self, data: Payload
    ) -> tuple[int, str, dict[str, Any], bytes | bytearray] | None:
        """Node side: ``(rid, op, args, payload)`` of the request in ``data`` (its id is
        now in flight, to be answered like any), or None."""
        frame = self._reader.whole_frame(data)
        if frame is None or frame[0] is not _REQUEST:
            return None
        h = frame[1]
        if not self._take_request(h):
            return None
        return h[0], h[1], h[2], frame[2]

    def receive_read_request(self, data: bytes) -> tuple[Any, ...] | None:
        """Node side: ``(rid, key, offset, length, version, direct)`` of the ``read``
        request that is exactly ``data`` (its id is now in flight), or None: a
        :data:`~shuttle.wire.readlane.ReadRequest`, typed as a tuple of objects so that
        the compiled build passes the parser's tuple on as it is (a typed tuple is
        unpacked into a C struct, its ints unboxed, and boxed into a new tuple again
        on return: five allocations a read for nothing)."""
        if not self._reader.at_frame_boundary():
            return None
        read = self._parse_read(data, self._parse_read_header_max)
        if read is None or not self._take_request_id(read[0]):
            return None
        return read

    def receive_read_reply(self, data: bytes, rid: Any) -> bytes | None:
        """Client side: the payload of the answer to read ``rid`` that is exactly
        ``data`` (no longer in flight), or None. (``rid``: an int, kept boxed as in
        :meth:`_check_response`.)"""
        if not self._reader.at_frame_boundary():
            return None
        payload = self._parse_read_reply(data, rid, self.read_reply_payload_max)
        if payload is None or not self._take_response_id(rid):
            return None
        return payload

    def take_read_reply(self, rid: Any) -> bool:
        """Client side: the answer to read ``rid`` arrived whole by the read lane,
        received from the socket by :func:`~shuttle.wire.readlane.recv_read_reply`
        (exactly the reply's frame, no other byte): True, its id no longer in flight;
        or False, nothing changed (then give the frame to :meth:`receive_response`,
        which says what is wrong). ``rid``: as in :meth:`receive_read_reply`."""
        return self._reader.at_frame_boundary() and self._take_response_id(rid)

    def receive_response(self, data: Payload) -> Response | None:
        """Client side: the response in ``data`` (its id no longer in flight), or None."""
        frame = self._reader.whole_frame(data)
        if frame is None or frame[0] is not _RESPONSE:
            return None
        h = frame[1]
        rid = self._take_response(h)
        if rid is None:
            return None
        return Response(rid, h[1], frame[2])

    def receive_buffer(self) -> memoryview | None:
        """Where the rest of a large incoming payload should be received, if one is
        under way (``recv_into`` it, then call :meth:`received_into`): saves a copy."""
        return self._reader.payload_buffer()

    def received_into(self, nbytes: int) -> None:
        """``nbytes`` were written into :meth:`receive_buffer`'s view."""
        self._reader.payload_received(nbytes)

    def next_event(self) -> Event | NeedData:
        """The next event from buffered bytes, or :data:`NEED_DATA`.

        Raises :class:`RemoteProtocolError` if the peer broke the protocol; the
        connection is then in state ERROR and should be closed.
        """
        if self._state is _ERROR:
            raise RemoteProtocolError("connection already failed; open a new one")
        try:
            frame = self._reader.next_frame()
        except RemoteProtocolError:
            self.state = _ERROR
            raise
        if frame is not None:
            return self._event_from(frame)
        if not self._eof:
            return NEED_DATA
        if not self._reader.at_frame_boundary():
            self.state = _ERROR
            raise RemoteProtocolError(
                f"peer closed the connection in the middle of a frame "
                f"({self._reader.buffered_bytes} bytes of it received)"
            )
        if self._state is _CLOSED:
            return NEED_DATA
        self._transition(RECV, ConnectionClosed)
        return ConnectionClosed()

    def _event_from(self, frame: RawFrame) -> Event:
        """The event a frame makes, checked against the protocol and the table, with the
        bookkeeping done (request ids in flight, the peer's limits)."""
        kind, h, payload, refused = frame
        # The frames of every call, taken by the one check each (the fast lanes call
        # the same); whatever it refuses takes the long way, which says why.
        if not refused:
            if kind is _REQUEST:
                if self._take_request(h):
                    return Request(h[0], h[1], h[2], payload)
            elif kind is _RESPONSE:
                rid = self._take_response(h)
                if rid is not None:
                    return Response(rid, h[1], payload)
        try:
            event = self._from_wire(kind, h, payload, refused)
            event_kind = type(event)
            self._transition(RECV, event_kind)
        except RemoteProtocolError:
            self.state = _ERROR
            raise
        if event_kind is Request:
            self._in_flight.add(event.rid)  # type: ignore[union-attr]
        elif event_kind is Response or event_kind is ErrorResponse:
            self._in_flight.discard(event.rid)  # type: ignore[union-attr]
        elif event_kind is Welcome:
            assert isinstance(event, Welcome)
            self.version = event.version
            self.peer_limits = Limits.from_wire(event.limits)
        return event

    def _from_wire(
        self, kind: FrameKind, h: Any, payload: bytes | bytearray, refused: int
    ) -> Event:
        if kind is _REQUEST:
            return self._refused_request(h, payload, refused)
        if kind is FrameKind.RESPONSE or kind is FrameKind.ERROR:
            if self._is_server:
                raise RemoteProtocolError(f"a client sent a {kind.name} frame")
            expected = 2 if kind is FrameKind.RESPONSE else 3
            if type(h) is not list or len(h) != expected or type(h[0]) is not int:
                raise RemoteProtocolError(f"malformed {kind.name} header {brief(h)}")
            rid = h[0]
            # rid 0 is the connection's: only an ERROR may carry it.
            if rid not in self._in_flight and (rid != 0 or kind is FrameKind.RESPONSE):
                raise RemoteProtocolError(f"response for request {rid}, which is not in flight")
            if kind is FrameKind.ERROR:
                if not isinstance(h[1], str) or not isinstance(h[2], str):
                    raise RemoteProtocolError(f"malformed ERROR header {brief(h)}")
                return ErrorResponse(rid, h[1], h[2])
            if refused:
                return ErrorResponse(
                    rid,
                    LimitExceededError.code,
                    f"response payload of {refused} bytes is over this client's "
                    f"limit of {self.our_limits.payload_bytes_max}; request smaller ranges",
                )
            return Response(rid, h[1], payload)
        return control_event(kind, h)

    def _refused_request(self, h: Any, payload: bytes | bytearray, refused: int) -> Event:
        """What a REQUEST frame that :meth:`_take_request` did not take becomes: a
        protocol error, a :class:`RequestRejected` saying why (answered like any
        request), or a request the table refuses."""
        if not self._is_server:
            raise RemoteProtocolError("a node sent a REQUEST frame")
        if type(h) is not list or len(h) != 3 or type(h[0]) is not int or h[0] <= 0:
            raise RemoteProtocolError(f"malformed REQUEST header {brief(h)}")
        rid, op, args = h
        if self._state is not _READY:
            return Request(rid, str(op), {}, b"")  # the transition table refuses it
        if rid in self._in_flight:
            # Its answer could not be told from the first one's: the client is broken.
            self.state = _ERROR
            raise RemoteProtocolError(
                f"request id {rid} is already in flight on this connection; a client must "
                "not reuse an id before its answer arrives. Closing the connection"
            )
        error: ShuttleError
        if len(self._in_flight) >= self.our_limits.in_flight_max:
            error = LimitExceededError(
                f"more than {self.our_limits.in_flight_max} requests in flight on one "
                "connection; wait for responses before sending more"
            )
        elif refused:
            error = LimitExceededError(
                f"request payload of {refused} bytes is over the node's limit of "
                f"{self.our_limits.payload_bytes_max}; split it into smaller range writes"
            )
        elif type(op) is not str or not op or len(op) > OP_NAME_BYTES_MAX:
            error = InvalidArgumentError(f"operation name must be a short string, got {brief(op)}")
        elif type(args) is not dict:
            error = InvalidArgumentError(
                f"arguments of {op!r} must be a map, got {type(args).__name__}"
            )
        else:
            raise AssertionError(f"_take_request refused the well-formed request {brief(h)}")
        self._in_flight.add(rid)  # answered like any request, with an ErrorResponse
        return RequestRejected(rid, error)
