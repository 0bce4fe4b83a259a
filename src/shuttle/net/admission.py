"""What one node lets its clients hold: connections, descriptors, unsent replies and
time, each a named limit with the reason for its default (docs/operations.md).

A node serves clients it does not trust. Everything a connection can make the node
hold is bounded by something the node controls:

* **memory for requests**: a frame's payload costs the bytes that have arrived, not
  the length its prefix claims (:class:`~shuttle.wire.frames.FrameReader` on a node),
  and a frame that stops arriving is cut after :attr:`ServerLimits.frame_timeout_s`;
* **memory for replies**: a connection whose client does not read stops being served
  (its requests wait in the socket) once its unsent replies pass the write buffer's
  high mark, and it never has more than :attr:`ServerLimits.executing_max` requests
  running, so what it can pile up is bounded by a few replies;
* **descriptors**: the soft descriptor limit is raised to the hard one at start, and
  connections past :attr:`ServerLimits.connections_max` are refused with a
  ``busy`` error instead of taking the descriptors the store needs;
* **time**: a connection idle for :attr:`ServerLimits.idle_timeout_s` is closed
  (with GOODBYE; clients reconnect transparently);
* **before authentication**: a connection must finish its handshake (TLS, then
  CHALLENGE, HELLO, WELCOME) within :attr:`ServerLimits.handshake_timeout_s`, and at
  most :func:`unauthenticated_max` connections may be in their handshake at once: a
  new one past that closes the one that has waited longest. So peers without the key
  can hold a small, fixed share of the connection cap, never all of it, and each for
  seconds, not minutes.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from shuttle.errors import ConfigError

log = logging.getLogger("shuttle.node")

#: A frame (a request and its payload) must arrive whole within this long once its
#: first byte came. 16 MiB, the largest frame, needs 280 KB/s to make it: far below
#: any link a node serves (the slowest link profile moves 1 MiB pieces in seconds),
#: far above what a stalled or hostile peer should be allowed to hold.
FRAME_TIMEOUT_S = 60.0

#: A connection must finish its handshake (TLS, CHALLENGE, HELLO, WELCOME) within this
#: long of being accepted, or it is closed. A handshake is two or three round trips
#: and a few KB: under a second on the slowest link profile (1 Mbit/s, 300 ms round
#: trips), milliseconds on a LAN; a client's own connect timeout is 5 s. A peer that
#: sends nothing holds a descriptor only this long (the frame timeout, 60 s, starts
#: only once a frame has started to arrive).
HANDSHAKE_TIMEOUT_S = 10.0

#: Connections in their handshake at once, at most (fitted to a quarter of the
#: connection cap, :func:`unauthenticated_max`). A thousand clients can connect in the
#: same instant; more than that in flight at once are a flood. Past it, each new
#: connection closes the one that has waited longest, so a flood of connections that
#: never send HELLO cannot keep a key holder out: its handshake, a millisecond on a
#: LAN, would have to outlast this many newer connections.
UNAUTHENTICATED_MAX = 1024

#: A connection with nothing in flight and nothing arriving for this long is closed.
#: Clients keep connections in pools and reconnect on the next call, so closing an
#: idle one costs them one handshake; keeping thousands costs the node descriptors.
IDLE_TIMEOUT_S = 300.0

#: Connections served at once. Each costs a descriptor and a few KiB; 16,384 is far
#: above what a cluster's clients need, and under the hard descriptor limit of a stock
#: Debian (1,048,576; 20,000 on these machines); it is lowered to fit a smaller limit
#: (:func:`effective_connections_max`).
CONNECTIONS_MAX = 16_384

#: Descriptors kept for the node itself when the connection cap is fitted to a low
#: limit (at most half the limit): the store (journal, object files being written,
#: upload sessions), the thread pool's reads, hosted objects' workers and their pipes.
DESCRIPTORS_RESERVED = 512

#: Requests of one connection running at once in the thread pool (store operations;
#: inline requests run one at a time on the loop anyway, and the run-time's object
#: calls are not capped, since one may wait for another on the same connection). The
#: pool has 4 threads, so more would only queue there, and each finished request may
#: hold a reply of up to 16 MiB until its client reads it: 2 keeps a client that never
#: reads under ~50 MiB, and spreads the pool fairly over connections.
EXECUTING_MAX = 2

#: The same on a node whose store is RADOS (``--store rados:POOL``). Its requests wait
#: on the network, not on a disk: a streaming client's 1 MiB read is one round trip to
#: an OSD, and a stream runs only as fast as the reads the node keeps in flight for it.
#: Against librados keeping 8 aio reads in flight, in the same runs: 0.62-0.82 of it
#: with 2, 0.79-0.89 with 8 (benchmarks/README.md, "Shuttle on Ceph"). 8 is the client's
#: default window. The price: a client that never reads can make the node hold 8
#: finished replies instead of 2 (a stream's are 1 MiB each; 16 MiB reads, the largest,
#: make it ~130 MiB instead of ~50).
EXECUTING_MAX_RADOS = 8

#: Threads of a RADOS node's pool (a file node has ``server.EXECUTOR_THREADS``, 4): a
#: request holds a thread while it waits for its OSD, so 16 let two connections keep
#: their 8 reads each in flight. Waiting threads cost no CPU (librados releases the GIL).
EXECUTOR_THREADS_RADOS = 16

#: Unsent reply bytes of one connection above which its requests stop being taken
#: (asyncio's write buffer high mark). Low enough to bound a non-reading client,
#: high enough that a streaming client never waits for it (replies drain at once).
UNSENT_HIGH_BYTES = 4 << 20

#: Unsent reply bytes of all connections together above which connections that still
#: hold unsent bytes stop being taken (measured by the housekeeping sweep).
NODE_UNSENT_MAX_BYTES = 256 << 20

#: How often the housekeeping sweep looks at every connection (timeouts, node totals).
SWEEP_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """The admission limits one node enforces (flags of ``shuttle serve``)."""

    connections_max: int = CONNECTIONS_MAX
    frame_timeout_s: float = FRAME_TIMEOUT_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    executing_max: int = EXECUTING_MAX
    unsent_high_bytes: int = UNSENT_HIGH_BYTES
    node_unsent_max_bytes: int = NODE_UNSENT_MAX_BYTES
    sweep_interval_s: float = SWEEP_INTERVAL_S
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    #: Connections in their handshake at once (None: fitted to the connection cap).
    unauthenticated: int | None = None

    def __post_init__(self) -> None:
        if self.connections_max < 1:
            raise ConfigError(f"--connections-max must be ≥ 1, got {self.connections_max}")
        if self.handshake_timeout_s <= 0:
            raise ConfigError(
                f"--handshake-timeout must be positive seconds, got {self.handshake_timeout_s:g}"
            )
        if self.unauthenticated is not None and not 1 <= self.unauthenticated < max(
            2, self.connections_max
        ):
            raise ConfigError(
                f"--unauthenticated-max must be in 1..{max(1, self.connections_max - 1)} (below "
                f"--connections-max, so that peers without the key can never take every "
                f"connection), got {self.unauthenticated}"
            )
        if self.frame_timeout_s <= 0 or self.idle_timeout_s <= 0:
            raise ConfigError(
                "--frame-timeout and --idle-timeout must be positive seconds, got "
                f"{self.frame_timeout_s:g} and {self.idle_timeout_s:g}"
            )
        if self.executing_max < 1:
            raise ConfigError(
                f"requests executing per connection must be ≥ 1, got {self.executing_max}"
            )


def unauthenticated_max(limits: ServerLimits, connections_max: int) -> int:
    """How many connections may be in their handshake at once on a node serving at most
    ``connections_max``: the configured number, else :data:`UNAUTHENTICATED_MAX` fitted
    to a quarter of the cap (so at least three quarters stay for key holders)."""
    if limits.unauthenticated is not None:
        return max(1, min(limits.unauthenticated, connections_max - 1))
    return max(1, min(UNAUTHENTICATED_MAX, connections_max // 4))


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise this process's soft descriptor limit to its hard limit (idle connections
    must not starve the store of descriptors); returns the (soft, hard) now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # a container may forbid it
            log.warning("could not raise the descriptor limit %d to %d: %s", soft, hard, exc)
    return soft, hard


def effective_connections_max(requested: int, descriptor_limit: int) -> int:
    """The connection cap that fits ``descriptor_limit`` with the node's own reserve."""
    fitted = max(1, descriptor_limit - min(DESCRIPTORS_RESERVED, descriptor_limit // 2))
    if requested > fitted:
        log.warning(
            "serving at most %d connections (asked for %d): the descriptor limit is %d and "
            "%d are kept for the store; raise 'ulimit -n' to serve more",
            fitted,
            requested,
            descriptor_limit,
            DESCRIPTORS_RESERVED,
        )
        return fitted
    return requested
