"""The server's counters (the ``server`` part of ``node.stats``), compiled with the
node's hot path (:mod:`shuttle.compiled`): the read lane bumps several of them for
every request, and a compiled class's int fields cost a few instructions to bump where
an interpreted dataclass's cost hundreds each."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ServerCounters:
    """What the server has done since it started (the ``node.stats`` operation)."""

    started_at: float = field(default_factory=time.time)
    connections_total: int = 0
    connections_open: int = 0
    requests: int = 0
    errors: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    protocol_errors: int = 0
    #: Handshakes refused for missing or wrong credentials (or a replayed HELLO).
    auth_failures: int = 0
    #: Connections refused because the node served its maximum (``busy``).
    connections_refused: int = 0
    #: Connections closed because a frame stalled, or because they idled.
    frame_timeouts: int = 0
    idle_closed: int = 0
    #: Times a connection's requests were held back until its client read replies.
    holds: int = 0
    #: Connections dropped because their client took none of their replies for long.
    send_timeouts: int = 0
    #: Connections closed for not finishing their handshake (TLS, HELLO) in time.
    handshake_timeouts: int = 0
    #: Connections closed unauthenticated to make room for a newer one (over the cap of
    #: connections in their handshake at once).
    unauthenticated_evicted: int = 0
    #: TLS connections that failed: a handshake the peer broke (a plain client, a
    #: certificate it refused) or a record that failed its authentication.
    tls_failures: int = 0
    #: Requests a client pipelined after breaking the protocol were not taken; those
    #: it sent before were answered first (times a connection closed that way).
    drained_before_close: int = 0
    #: Requests answered on the event loop (cache hits, stats, pings).
    inline: int = 0
    #: Of those, reads taken and answered by the read lane (``wire/readlane.py``):
    #: counted here only, not in ``by_op`` (a ``Counter`` item costs the compiled
    #: build about a thousand instructions a read), and added to its ``read`` in
    #: :meth:`snapshot`.
    read_lane: int = 0
    #: Requests of operations that can run inline that went to the thread pool instead
    #: (a read not all in the block cache or over the inline size, a stat whose
    #: attributes are not in memory), by operation.
    inline_declined: Counter[str] = field(default_factory=Counter)
    #: Requests sent to the thread pool, and requests started on the event loop
    #: instead, to complete there without a thread (a RADOS store's read that missed
    #: its block cache: ``Operation.start``).
    threaded: int = 0
    started: int = 0
    by_op: Counter[str] = field(default_factory=Counter)
    errors_by_code: Counter[str] = field(default_factory=Counter)

    def snapshot(self) -> dict[str, Any]:
        by_op = dict(self.by_op)
        if self.read_lane:  # counted apart (see read_lane), reported with the rest
            by_op["read"] = by_op.get("read", 0) + self.read_lane
        return {
            "uptime_s": round(time.time() - self.started_at, 3),
            "connections_total": self.connections_total,
            "connections_open": self.connections_open,
            "requests": self.requests,
            "errors": self.errors,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "protocol_errors": self.protocol_errors,
            "auth_failures": self.auth_failures,
            "connections_refused": self.connections_refused,
            "frame_timeouts": self.frame_timeouts,
            "idle_closed": self.idle_closed,
            "holds": self.holds,
            "send_timeouts": self.send_timeouts,
            "handshake_timeouts": self.handshake_timeouts,
            "unauthenticated_evicted": self.unauthenticated_evicted,
            "tls_failures": self.tls_failures,
            "drained_before_close": self.drained_before_close,
            "inline": self.inline,
            "read_lane": self.read_lane,
            "inline_declined": dict(self.inline_declined),
            "threaded": self.threaded,
            "started": self.started,
            "by_op": by_op,
            "errors_by_code": dict(self.errors_by_code),
        }
