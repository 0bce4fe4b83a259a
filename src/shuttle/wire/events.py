"""The events a :class:`~shuttle.wire.connection.Connection` takes and produces.

One class per frame kind, plus two that never travel as themselves:
:class:`RequestRejected` (the codec refused a request, e.g. an oversized payload, and
the server should answer it with an :class:`ErrorResponse`) and :data:`NEED_DATA`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Final

from shuttle.errors import ShuttleError, error_from_code


class FrameKind(IntEnum):
    """The ``kind`` byte of a frame's prefix."""

    HELLO = 1
    WELCOME = 2
    REQUEST = 3
    RESPONSE = 4
    ERROR = 5
    GOODBYE = 6
    CHALLENGE = 7


Payload = bytes | bytearray | memoryview


@dataclass(slots=True)
class Challenge:
    """Node → client, the first frame of every connection: a fresh random ``nonce``
    the client's credentials must answer, whether the node requires them
    (``key_required``), and the authentication ``scheme`` it speaks."""

    nonce: bytes
    key_required: bool
    scheme: str


@dataclass(slots=True)
class Hello:
    """Client → node, answer to :class:`Challenge`: the versions the client speaks,
    who it is, and (with a cluster key) its credentials."""

    version_min: int
    version_max: int
    client_name: str = ""
    #: ``{scheme, nonce, proof}`` answering the challenge (see
    #: :mod:`shuttle.net.auth`); passed through by the codec, checked by the node.
    credentials: dict[str, Any] | None = None


@dataclass(slots=True)
class Welcome:
    """Node → client, answer to :class:`Hello`: the chosen version and node limits,
    and (a node with a cluster key, to a client that sent credentials) the node's
    own ``proof`` that it holds the key."""

    version: int
    node_id: str
    limits: dict[str, int] = field(default_factory=dict)
    proof: bytes | None = None


@dataclass(slots=True)
class Request:
    """A call of operation ``op`` with msgpack ``args`` and raw ``payload`` bytes."""

    rid: int
    op: str
    args: dict[str, Any] = field(default_factory=dict)
    payload: Payload = b""


@dataclass(slots=True)
class Response:
    """The successful result of request ``rid``; ``payload`` carries raw data."""

    rid: int
    result: Any = None
    payload: Payload = b""


@dataclass(slots=True)
class ErrorResponse:
    """Request ``rid`` failed with a typed error (``rid`` 0: the connection itself)."""

    rid: int
    code: str
    message: str

    def to_exception(self) -> ShuttleError:
        """The :class:`~shuttle.errors.ShuttleError` subclass named by ``code``."""
        return error_from_code(self.code, self.message)

    @classmethod
    def from_exception(cls, rid: int, exc: ShuttleError) -> ErrorResponse:
        return cls(rid, exc.code, str(exc))


@dataclass(slots=True)
class Goodbye:
    """Either side is closing the connection on purpose; ``reason`` says why."""

    reason: str = ""


@dataclass(slots=True)
class RequestRejected:
    """Server side only: the codec refused request ``rid`` (its bytes were consumed).

    Answer it with ``ErrorResponse.from_exception(rid, error)``; the connection
    stays usable.
    """

    rid: int
    error: ShuttleError


@dataclass(slots=True)
class ConnectionClosed:
    """The peer closed its side of the stream cleanly, between frames."""


class NeedData:
    """Sentinel: the buffered bytes hold no complete frame yet."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()

Event = (
    Challenge
    | Hello
    | Welcome
    | Request
    | Response
    | ErrorResponse
    | Goodbye
    | RequestRejected
    | ConnectionClosed
)
