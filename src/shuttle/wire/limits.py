"""Named limits of the wire protocol, each with the reason for its value.

Every limit is enforced on both sides: a sender refuses to cross it
(:class:`~shuttle.errors.LimitExceededError`, the caller's fault) and a receiver
answers a peer that crossed it with a typed error response, or, where the stream can
no longer be trusted, with :class:`~shuttle.errors.RemoteProtocolError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: Protocol versions this build speaks. A peer must share at least one. Version 2
#: added the CHALLENGE frame before HELLO (authentication); version 1 peers cannot
#: take part in it, so they are not spoken any more.
PROTOCOL_VERSION_MIN: Final = 2
PROTOCOL_VERSION_MAX: Final = 2

#: Fixed bytes in front of every frame (magic, kind, flags, two lengths).
PREFIX_BYTES: Final = 12

#: The msgpack header carries operation arguments and small results (a stat, a page
#: of a listing). 1 MiB holds a listing page of 1,000 maximal 1 KiB keys; anything
#: bigger is a broken or hostile peer, and the bound keeps a node's memory bounded.
HEADER_BYTES_MAX: Final = 1 << 20

#: Raw payload bytes per frame. Large objects stream as many range requests, so a
#: frame never needs to be big; 16 MiB keeps per-connection buffering bounded while
#: staying far above the 1 MiB pieces the client streams with (a round trip per
#: 16 MiB is negligible even on loopback).
PAYLOAD_BYTES_MAX: Final = 16 << 20

#: Requests one connection may have outstanding. Deep enough to fill a fast link
#: with 1 MiB reads (256 MiB in flight), bounded so a client cannot queue unbounded
#: work on a node.
IN_FLIGHT_MAX: Final = 256

#: Bytes of the random nonce a node puts in its CHALLENGE (and a client in its
#: credentials). 32 bytes (256 bits) is the key size of the keyed hash that proves
#: knowledge of the cluster key: a node would have to serve about 2^128 connections
#: before two challenges repeat by chance, so a captured HELLO never answers a new
#: one. Exact, not a minimum: a shorter nonce from a peer is a broken peer.
NONCE_BYTES: Final = 32

#: Longest authentication scheme name in a CHALLENGE or HELLO (names are short
#: identifiers like ``blake3-keyed-v1``).
SCHEME_BYTES_MAX: Final = 64

#: Deepest nesting of lists and maps in a frame header. Real headers nest 3 deep (a
#: request's list, its argument map, a list argument); 64 leaves room for any
#: structured argument and keeps everything that walks a header (messages, handlers,
#: re-encoding) far from Python's recursion limit. A header of at most this many bytes
#: cannot nest deeper, so only longer headers are checked.
HEADER_DEPTH_MAX: Final = 64

#: Longest operation name (names are identifiers like ``read`` or ``object.invoke``).
OP_NAME_BYTES_MAX: Final = 128


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits one side enforces; a node announces its own in the handshake."""

    header_bytes_max: int = HEADER_BYTES_MAX
    payload_bytes_max: int = PAYLOAD_BYTES_MAX
    in_flight_max: int = IN_FLIGHT_MAX

    def to_wire(self) -> dict[str, int]:
        return {
            "header_bytes_max": self.header_bytes_max,
            "payload_bytes_max": self.payload_bytes_max,
            "in_flight_max": self.in_flight_max,
        }

    @classmethod
    def from_wire(cls, raw: object) -> Limits:
        """Read limits a peer announced; missing or bad fields keep our defaults."""
        if not isinstance(raw, dict):
            return cls()
        values: dict[str, int] = {}
        for name in ("header_bytes_max", "payload_bytes_max", "in_flight_max"):
            value = raw.get(name)
            if isinstance(value, int) and value > 0:
                values[name] = value
        return cls(**values)
